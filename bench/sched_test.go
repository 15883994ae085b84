package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

func TestComputeSchedSummary(t *testing.T) {
	if computeSchedSummary(sampleRows()) != nil {
		t.Fatal("a summary without sched rows")
	}
	rows := []row{
		{System: systemNereus, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 100_000},
		{System: systemNereus, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 16, MsgsPerS: 1},
		{System: systemNereus, Mode: modeR1, Workload: workloadE2E, SizeBytes: 1024, P50Us: 500, P99Us: 4000},
		{System: systemNereus, Mode: modeR1, Workload: workloadSchedIntake, SizeBytes: 1024, MsgsPerS: 10_000, Messages: 30_000},
		{System: systemNereus, Mode: modeR1, Workload: workloadSchedFire, SizeBytes: 1024, MsgsPerS: 200, Messages: 2000},
		{System: systemNereus, Mode: modeR1, Workload: workloadSchedLateness, SizeBytes: 1024, P50Us: 2500, P99Us: 100_000, Messages: 2000},
		{System: systemNereus, Mode: modeR1, Workload: workloadSchedPending, SizeBytes: 1024, HeapBytesPerPending: 277, Seconds: 0.7, Messages: 100_000},
		{System: systemNereus, Mode: modeR3, Workload: workloadSchedFire, SizeBytes: 1024, MsgsPerS: 800, Messages: 2000},
	}
	got := computeSchedSummary(rows)
	type flat struct {
		mode, measurement string
		value, anchor     float64
		ratio             float64
	}
	want := []flat{
		{modeR1, "intake: SCHEDULE answered", 10_000, 100_000, 0.1},
		{modeR1, "burst due at one instant: fired", 200, 100_000, 0.002},
		{modeR1, "lateness p50 (receipt − deliver_at)", 2.5, 0.5, 5},
		{modeR1, "lateness p99 (receipt − deliver_at)", 100, 4, 25},
		{modeR1, "heap in use per pending schedule (after GC)", 277, 0, 0},
		{modeR1, "restart until every shard ACTIVE_FOR_COMMANDS", 700, 0, 0},
		{modeR3, "burst due at one instant: fired", 800, 0, 0}, // r3 ran no pub_async
	}
	if len(got) != len(want) {
		t.Fatalf("%d measurements, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Mode != w.mode || g.Measurement != w.measurement || !near(g.Value, w.value) || !near(g.AnchorValue, w.anchor) || !near(g.Ratio, w.ratio) {
			t.Errorf("measurement %d: %+v, want %+v", i, g, w)
		}
	}
	if got[4].Anchor != "" || got[6].Anchor == "" || got[0].Count != 30_000 || got[5].Count != 100_000 {
		t.Errorf("anchors and counts: %+v", got)
	}

	var b strings.Builder
	writeSchedMarkdown(&b, got, runConfig{SchedIntakeClients: 16, SchedFireCount: 2000, SchedLatenessRate: 500, SchedLatenessSeconds: 4,
		SchedLatenessMinS: 1, SchedLatenessSpreadS: 2, SchedPendingCount: 100_000})
	for _, want := range []string{"## Scheduled delivery", "16 goroutines", "2000 schedules all due at one instant", "an upper bound on the fire's lateness",
		"due 1–3 s after", "| nereus | r1 | intake: SCHEDULE answered | 30000 | 10000 | schedules/s | pub_async 1 KiB msgs/s | 100000 | 0.10× |",
		"| nereus | r1 | heap in use per pending schedule (after GC) | 100000 | 277 | bytes | – | – | – |",
		"| nereus | r1 | restart until every shard ACTIVE_FOR_COMMANDS | 100000 | 700 | ms | – | – | – |",
		"| nereus | r3 | burst due at one instant: fired | 2000 | 800 | msgs/s | pub_async 1 KiB msgs/s | – | – |",
		"| nereus | r1 | burst due at one instant: fired | 2000 | 200 | msgs/s | pub_async 1 KiB msgs/s | 100000 | 0.002× |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the sched section lacks %q:\n%s", want, b.String())
		}
	}

	rep := sampleReport()
	rep.Rows = append(rep.Rows, rows[3:]...)
	rep.Sched = got
	if !strings.Contains(rep.markdown(), "## Scheduled delivery") {
		t.Error("the report has no sched section")
	}
	js, err := rep.jsonBytes()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows  []map[string]any `json:"rows"`
		Sched []map[string]any `json:"sched"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Sched) != 7 || doc.Sched[0]["measurement"] != "intake: SCHEDULE answered" || doc.Sched[0]["ratio"] != 0.1 {
		t.Errorf("json sched: %v", doc.Sched)
	}
	if doc.Rows[len(doc.Rows)-2]["heap_bytes_per_pending"] != 277.0 {
		t.Errorf("json row: %v", doc.Rows[len(doc.Rows)-2])
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestSummarizeSchedPendingHasNoRate(t *testing.T) {
	c := benchCase{System: systemNereus, Mode: modeR1, Workload: workloadSchedPending, SizeBytes: 1024}
	r := summarize(c, runResult{Messages: 1000, Elapsed: 500 * time.Millisecond, HeapBytesPerPending: 300})
	if r.MsgsPerS != 0 || r.MBPerS != 0 || r.Seconds != 0.5 || r.HeapBytesPerPending != 300 || r.Messages != 1000 {
		t.Fatalf("%+v", r)
	}
	m := medianRow([]row{r, {HeapBytesPerPending: 100}, {HeapBytesPerPending: 500}})
	if m.HeapBytesPerPending != 300 {
		t.Fatalf("median heap per pending: %v", m.HeapBytesPerPending)
	}
}

func TestSchedWorkloadsRunLonger(t *testing.T) {
	for _, w := range []workload{workloadSchedIntake, workloadSchedFire, workloadSchedLateness, workloadSchedPending} {
		if !w.isSched() {
			t.Errorf("%s is a sched workload", w)
		}
	}
	if workloadPubAsync.isSched() || !workloadSchedPending.createsStream() || workloadSchedFire.createsStream() {
		t.Error("isSched / createsStream")
	}
	for _, quick := range []bool{true, false} {
		lim := newLimits(quick)
		// A fill of the largest count stays within the case's bound, and
		// so does the wait for a burst at the floor rate.
		if fillTime(lim.SchedPendingCount)+schedRestartTimeout >= schedCaseTimeout ||
			fillTime(lim.SchedFireCount)+time.Duration(lim.SchedFireCount)*time.Second/schedFireRateFloor >= schedCaseTimeout {
			t.Errorf("quick=%v: the sched bounds exceed the case timeout", quick)
		}
	}
}

// BenchmarkSchedFireBurst runs the fire workload (-quick: 20,000 schedules due at
// one instant) against an in-process node, once per iteration, for a
// profile of the scheduler:
//
//	go test -run '^$' -bench SchedFireBurst -benchtime 1x -cpuprofile /tmp/fire.cpu
func BenchmarkSchedFireBurst(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), schedCaseTimeout)
	defer cancel()
	env := &environment{workDir: b.TempDir(), logf: b.Logf}
	sys, err := startNereusInProcess(ctx, env, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer sys.Close()
	lim := newLimits(true)
	prog := startProgress(io.Discard)
	defer prog.close()
	payload := make([]byte, 1024)
	for i := 0; b.Loop(); i++ {
		stream := "bench-fire-" + string(rune('a'+i%26)) + time.Now().Format("150405.000000")
		if err := sys.CreateStream(ctx, stream); err != nil {
			b.Fatal(err)
		}
		res, err := runSchedFire(ctx, sys, stream, payload, lim, prog, b.Logf)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(res.Messages)/res.Elapsed.Seconds(), "fired/s")
	}
}

// BenchmarkSchedIntakePending schedules up to 240,000 messages due in 24 h
// into an in-process node (2 shards), 256 in flight, in steps of 20,000
// (each bounded by fillTime), and reports the rate of the first step and
// of the last — with few and with many schedules pending — and the
// restart time with them pending. For a profile:
//
//	go test -run '^$' -bench SchedIntakePending -benchtime 1x -cpuprofile /tmp/intake.cpu
func BenchmarkSchedIntakePending(b *testing.B) {
	const steps, step = 12, 20_000
	ctx, cancel := context.WithTimeout(context.Background(), schedCaseTimeout)
	defer cancel()
	prog := startProgress(io.Discard)
	defer prog.close()
	payload := make([]byte, 1024)
	for b.Loop() {
		dir := b.TempDir()
		pn, err := openPendingNode(ctx, dir, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pn.c.DeclareTopic(ctx, client.TopicConfig{Name: "dst", Partitions: 1}); err != nil {
			b.Fatal(err)
		}
		at := time.Now().Add(schedFarFuture)
		var rates []float64
		var total int64
		for range steps {
			t0 := time.Now()
			n, err := fillSchedules(ctx, pn.c, "dst", step, schedFillInflight, fillTime(step),
				func(int) (client.Message, time.Time) { return client.Message{Value: payload}, at }, prog)
			if err != nil {
				b.Fatal(err)
			}
			rates = append(rates, float64(n)/time.Since(t0).Seconds())
			total += n // a step that outlasts fillTime stops short
		}
		b.ReportMetric(rates[0], "sched/s-first-20k")
		b.ReportMetric(rates[len(rates)-1], "sched/s-last-20k")
		b.Logf("schedules/s per step of %d: %.0f", step, rates)
		if err := pn.Close(); err != nil {
			b.Fatal(err)
		}
		// The restart with them pending, until every shard is active.
		t0 := time.Now()
		if pn, err = openPendingNode(ctx, dir, 0); err != nil {
			b.Fatal(err)
		}
		opened := time.Since(t0)
		for {
			pending, active, err := schedStatus(ctx, pn.c)
			if err == nil && active {
				if pending != total {
					b.Fatalf("after the restart %d pending, %d before", pending, total)
				}
				break
			}
			if err := sleepCtx(ctx, schedPollInterval); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(time.Since(t0).Seconds(), "restart-s")
		b.Logf("restart with %d pending: node.Open %s, every shard active at %s", total, opened, time.Since(t0))
		if err := pn.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFormatSmallRatio(t *testing.T) {
	for v, want := range map[float64]string{0: "–", 0.0038: "0.0038×", 0.012: "0.012×", 0.1: "0.10×", 4.3: "4.30×"} {
		if got := formatSmallRatio(v); got != want {
			t.Errorf("formatSmallRatio(%v) = %q, want %q", v, got, want)
		}
	}
}
