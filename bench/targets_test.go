package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// targetRows measure some of the targets' rows: the 1 KiB async row and
// the failover max at exactly their bounds, a sync p99 above its bound
// (JetStream R3's sync row, not the anchor, would give other ratios), the
// 64 KiB row short of its bound with the floor short of it too, consume
// without its anchor.
func targetRows() []row {
	return []row{
		{System: systemNereus, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 60},
		{System: systemJetStream, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 40},
		{System: systemFloor, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 90},
		{System: systemNereus, Mode: modeR3, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 900, P50Us: 800, P99Us: 3000},
		{System: systemJetStream, Mode: modeR3, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 1500, P50Us: 600, P99Us: 1500},
		{System: systemJetStream, Mode: modeR3Always, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 500, P50Us: 1000, P99Us: 2000},
		{System: systemNereus, Mode: modeR1Proc, Workload: workloadPubAsync, SizeBytes: 64 << 10, MsgsPerS: 100},
		{System: systemNereus, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 64 << 10, MsgsPerS: 30},
		{System: systemFloor, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 64 << 10, MsgsPerS: 40},
		{System: systemNereus, Mode: modeR3, Workload: workloadConsume, SizeBytes: 1024, MsgsPerS: 1000},
		{System: systemNereus, Mode: modeR3, Workload: workloadFailover, SizeBytes: 1024, P50Us: 800_000, MaxUs: 1_500_000},
		{System: systemJetStream, Mode: modeR3, Workload: workloadFailover, SizeBytes: 1024, P50Us: 4_000_000, MaxUs: 1_500_000},
	}
}

func TestComputeTargets(t *testing.T) {
	got := computeTargets(computeRatios(targetRows(), sampleModesR1, sampleModesR3))
	type want struct {
		workload workload
		size     int
		metric   string
		ratio    float64
		met      bool
		floor    float64
		floorMet bool
	}
	wants := []want{
		{workloadPubAsync, 1024, "msgs_per_s", 1.5, true, 2.25, true}, // at the bound: met
		{workloadPubSync, 1024, "p50_us", 0.8, true, 0, false},
		{workloadPubSync, 1024, "p99_us", 1.5, false, 0, false},
		{workloadPubAsync, 64 << 10, "msgs_per_s", 0.3, false, 0.4, false},
		{workloadFailover, 1024, "p50_us", 0.2, true, 0, false},
		{workloadFailover, 1024, "max_us", 1, true, 0, false}, // at the bound: met
	}
	if len(got) != len(wants) {
		t.Fatalf("%d targets, want %d (consume has no anchor): %+v", len(got), len(wants), got)
	}
	for i, w := range wants {
		g := got[i]
		if g.Workload != w.workload || g.SizeBytes != w.size || g.Metric != w.metric {
			t.Fatalf("target %d is %s/%d/%s, want %s/%d/%s", i, g.Workload, g.SizeBytes, g.Metric, w.workload, w.size, w.metric)
		}
		if math.Abs(g.Ratio-w.ratio) > 1e-9 || g.Met != w.met || math.Abs(g.Floor-w.floor) > 1e-9 || g.FloorMet != w.floorMet {
			t.Errorf("%s/%d/%s: ratio %v met %v floor %v floor met %v, want %v %v %v %v",
				w.workload, w.size, w.metric, g.Ratio, g.Met, g.Floor, g.FloorMet, w.ratio, w.met, w.floor, w.floorMet)
		}
	}
}

func TestTargetsInTheReport(t *testing.T) {
	rows := targetRows()
	ratios := computeRatios(rows, sampleModesR1, sampleModesR3)
	rep := report{Rows: rows, Ratios: ratios, Targets: computeTargets(ratios)}
	md := rep.markdown()
	for _, line := range []string{
		"## Targets of the replicated path",
		"| pub_async | 1 KiB | msgs/s | 60.0 | jetstream r3 | 40.0 | 1.50× | – | ≥ 1.5× | yes | 2.25× | yes |",
		"| pub_sync | 1 KiB | p99 µs | 3000 | jetstream r3-always | 2000 | 1.50× | – | ≤ 1× | no | – | – |",
		"| pub_async | 64 KiB | msgs/s | 30.0 | nereus r1-proc | 100 | 0.30× | – | ≥ 0.5× | no | 0.40× | no |",
		"| failover | 1 KiB | max ms | 1500 | jetstream r3 | 1500 | 1.00× | – | ≤ 1× | yes | – | – |",
	} {
		if !strings.Contains(md, line) {
			t.Errorf("markdown lacks %q:\n%s", line, md)
		}
	}
	js, err := rep.jsonBytes()
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Targets []target `json:"targets"`
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Targets) != len(rep.Targets) || back.Targets[3].Anchor != anchorR1Proc || back.Targets[3].Met {
		t.Fatalf("latest.json's targets: %+v", back.Targets)
	}
	if md := (report{Rows: rows[:1], Ratios: computeRatios(rows[:1], sampleModesR1, sampleModesR3)}).markdown(); strings.Contains(md, "## Targets") {
		t.Fatal("a run without any anchor has a targets section")
	}
}

// Each run's ratio beside the medians': run k of Nereus r3 against run k
// of the anchor, in run order; a row that a run lacks gives that run no
// ratio.
func TestRunRatios(t *testing.T) {
	rows := targetRows()
	ratios := computeRatios(rows, sampleModesR1, sampleModesR3)
	targets := computeTargets(ratios)
	run2 := append([]row(nil), rows...)
	run2[0].MsgsPerS = 50                   // the 1 KiB async row: 50 ÷ 40
	run3 := append([]row(nil), rows[1:]...) // no Nereus 1 KiB async row
	addRunRatios(targets, [][]row{rows, run2, run3}, sampleModesR1, sampleModesR3)
	if got := targets[0].Runs; len(got) != 2 || math.Abs(got[0]-1.5) > 1e-9 || math.Abs(got[1]-1.25) > 1e-9 {
		t.Fatalf("1 KiB async runs %v, want [1.5 1.25]", got)
	}
	if got := targets[1].Runs; len(got) != 3 {
		t.Fatalf("sync p50 runs %v, want three", got)
	}
	md := report{Rows: rows, Ratios: ratios, Targets: targets}.markdown()
	if line := "| pub_async | 1 KiB | msgs/s | 60.0 | jetstream r3 | 40.0 | 1.50× | 1.50×, 1.25× | ≥ 1.5× | yes | 2.25× | yes |"; !strings.Contains(md, line) {
		t.Errorf("markdown lacks %q:\n%s", line, md)
	}
}
