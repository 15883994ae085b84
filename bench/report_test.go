package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sampleRows are three workload rows for the systems; the e2e row has no
// r1-always measurement, as after a failed case, and only pub_sync has the
// disk anchor. The replicated rows (JetStream R3 and failover) come last.
func sampleRows() []row {
	return []row{
		{System: systemNereus, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 50, MBPerS: 0.05, Runs: 1},
		{System: systemNereus, Mode: modeR1Proc, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 40, MBPerS: 0.04, Runs: 1},
		{System: systemNereus, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 20, MBPerS: 0.02, Runs: 1},
		{System: systemJetStream, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 100, MBPerS: 0.1, Runs: 1},
		{System: systemJetStream, Mode: modeR1Always, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 25, MBPerS: 0.025, Runs: 1},
		{System: systemNereus, Mode: modeR1, Workload: workloadE2E, SizeBytes: 1024, MsgsPerS: 2000, P50Us: 900, P99Us: 4000, Runs: 1},
		{System: systemJetStream, Mode: modeR1, Workload: workloadE2E, SizeBytes: 1024, MsgsPerS: 2000, P50Us: 300, P99Us: 1000, Runs: 1},
		{System: systemNereus, Mode: modeR1, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 3000, P50Us: 300, P99Us: 720, Runs: 1},
		{System: systemJetStream, Mode: modeR1Always, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 2500, P50Us: 400, P99Us: 900, Runs: 1},
		{System: systemDisk, Mode: modeFsync, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 5000, P50Us: 200, P99Us: 400, Runs: 1},
		{System: systemJetStream, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 40, MBPerS: 0.04, Runs: 1},
		{System: systemJetStream, Mode: modeR3Always, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 10, MBPerS: 0.01, Runs: 1},
		{System: systemNereus, Mode: modeR3, Workload: workloadFailover, SizeBytes: 1024, Messages: 5, P50Us: 800_000, P99Us: 1_500_000, P999Us: 1_500_000, MaxUs: 1_500_000, Runs: 1},
		{System: systemJetStream, Mode: modeR3, Workload: workloadFailover, SizeBytes: 1024, Messages: 5, P50Us: 4_000_000, P99Us: 6_000_000, P999Us: 6_000_000, MaxUs: 6_000_000, Runs: 1},
	}
}

var (
	sampleModesR1 = []string{modeR1, modeR1Always}
	sampleModesR3 = []string{modeR3, modeR3Always}
)

func sampleReport() report {
	rows := sampleRows()
	return report{
		Machine: machineInfo{Date: "2026-01-02T03:04:05Z", NumCPU: 2, GoVersion: "go1.26.8", GOOS: "linux", GOARCH: "amd64", DataDir: "/tmp/x", DataFS: "ext4", NereusCommit: "abc123+dirty"},
		Config:  runConfig{Quick: true, Runs: 1, TimeLimitS: 3, InflightMax: 256, BatchMax: 500, E2ERatePerS: 2000, E2ESeconds: 3, FailoverKills: 5},
		Rows:    rows,
		Ratios:  computeRatios(rows, sampleModesR1, sampleModesR3),
		Errors:  []string{"jetstream/r1-always/e2e/1024: boom"},
	}
}

func TestComputeRatios(t *testing.T) {
	got := computeRatios(sampleRows(), sampleModesR1, sampleModesR3)
	type flat struct {
		workload workload
		metric   string
		mode     string
		ratio    float64
	}
	var flattened []flat
	for _, rr := range got {
		for _, v := range rr.Versus {
			flattened = append(flattened, flat{rr.Workload, rr.Metric, v.Mode, v.Ratio})
		}
	}
	want := []flat{
		{workloadPubAsync, "msgs_per_s", modeR1, 0.5},
		{workloadPubAsync, "msgs_per_s", modeR1Always, 2},
		{workloadE2E, "p50_us", modeR1, 3},
		{workloadE2E, "p99_us", modeR1, 4},
		{workloadPubSync, "msgs_per_s", modeR1Always, 1.2},
		{workloadPubSync, "p50_us", modeR1Always, 0.75},
		{workloadPubSync, "p99_us", modeR1Always, 0.8},
	}
	// Nereus r1 is compared with the one-replica modes only: the R3 rows
	// of JetStream and the failover rows (r3 only) add no r1 ratio.
	if len(flattened) != len(want) {
		t.Fatalf("got %+v, want %+v", flattened, want)
	}
	for i := range want {
		if flattened[i] != want[i] {
			t.Errorf("ratio %d = %+v, want %+v", i, flattened[i], want[i])
		}
	}
	if got[0].NereusR3 == nil || *got[0].NereusR3 != 20 || got[0].R3VersusProc != 0.5 || got[1].NereusR3 != nil {
		t.Errorf("r3 comparison: %+v / %+v", got[0], got[1])
	}
	if got[0].NereusProc == nil || *got[0].NereusProc != 40 || got[0].ProcVersusR1 != 0.8 || got[1].NereusProc != nil {
		t.Errorf("child-process comparison: %+v / %+v", got[0], got[1])
	}
	// The disk anchor compares latencies only, and only where it ran.
	if got[3].Disk != nil || got[4].Disk == nil || *got[4].Disk != 200 || got[4].VersusDisk != 1.5 || got[5].VersusDisk != 1.8 || got[1].Disk != nil {
		t.Errorf("disk comparison: %+v / %+v / %+v", got[3], got[4], got[5])
	}
	if !got[1].LowerIsBetter || got[0].LowerIsBetter {
		t.Errorf("latency ratios are lower-is-better, throughput ones are not: %+v", got)
	}
}

func TestComputeRatiosReplicated(t *testing.T) {
	got := computeRatios(sampleRows(), sampleModesR1, sampleModesR3)
	if len(got) != 8 {
		t.Fatalf("%d ratio rows, want 8 (pub_async, e2e ×2, pub_sync ×3, failover ×2): %+v", len(got), got)
	}
	// Nereus r3 (20 msgs/s) against JetStream R3 (40) and R3-always (10).
	want := []ratioVersus{{Mode: modeR3, JetStream: 40, Ratio: 0.5}, {Mode: modeR3Always, JetStream: 10, Ratio: 2}}
	if !slices.Equal(got[0].R3Versus, want) {
		t.Errorf("pub_async r3 ratios = %+v, want %+v", got[0].R3Versus, want)
	}
	for _, rr := range got[1:6] {
		if rr.R3Versus != nil {
			t.Errorf("%s %s: r3 ratios without a Nereus r3 row: %+v", rr.Workload, rr.Metric, rr.R3Versus)
		}
	}
	p50, maximum := got[6], got[7]
	if p50.Workload != workloadFailover || p50.Metric != "p50_us" || maximum.Metric != "max_us" || !p50.LowerIsBetter || !maximum.LowerIsBetter {
		t.Fatalf("failover ratio rows: %+v / %+v", p50, maximum)
	}
	if p50.Nereus != 0 || p50.Versus != nil || *p50.NereusR3 != 800_000 {
		t.Errorf("failover p50 row: %+v", p50)
	}
	if want := []ratioVersus{{Mode: modeR3, JetStream: 4_000_000, Ratio: 0.2}}; !slices.Equal(p50.R3Versus, want) {
		t.Errorf("failover p50 ratios = %+v, want %+v", p50.R3Versus, want)
	}
	if want := []ratioVersus{{Mode: modeR3, JetStream: 6_000_000, Ratio: 0.25}}; !slices.Equal(maximum.R3Versus, want) {
		t.Errorf("failover max ratios = %+v, want %+v", maximum.R3Versus, want)
	}
}

// A run of the replicated rows alone (-only '/r3') has ratio rows without
// a Nereus r1 value, and its report has no head-to-head r1 table.
func TestRatiosOfReplicatedRowsAlone(t *testing.T) {
	var rows []row
	for _, r := range sampleRows() {
		if r.Mode == modeR3 || r.Mode == modeR3Always {
			rows = append(rows, r)
		}
	}
	ratios := computeRatios(rows, sampleModesR1, sampleModesR3)
	if len(ratios) != 3 || ratios[0].Workload != workloadPubAsync || len(ratios[0].R3Versus) != 2 || ratios[0].Nereus != 0 {
		t.Fatalf("ratios: %+v", ratios)
	}
	md := report{Rows: rows, Ratios: ratios}.markdown()
	if strings.Contains(md, "## Nereus ÷ JetStream") || !strings.Contains(md, "## Replicated: Nereus r3 ÷ JetStream R3") ||
		!strings.Contains(md, "## Failover") {
		t.Errorf("sections:\n%s", md)
	}
}

func TestMarkdown(t *testing.T) {
	md := sampleReport().markdown()
	for _, want := range []string{
		"2 CPU", "linux/amd64", "go1.26.8", "ext4", "Nereus built from abc123+dirty",
		"| workload | size | metric | nereus r1 | jetstream r1 | nereus ÷ r1 | jetstream r1-always | nereus ÷ r1-always |",
		"| pub_async | 1 KiB | msgs/s | 50.0 | 100 | 0.50× | 25.0 | 2.00× |",
		"| e2e | 1 KiB | p50 µs | 900 | 300 | 3.00× | – | – |",
		"| nereus | r1 | e2e | 1 KiB | 2000 | – | 900 | 4000 | – | 0 | 0.00 | 1 |",
		"- jetstream/r1-always/e2e/1024: boom",
		"| pub_async | 1 KiB | msgs/s | 50.0 | 40.0 | 0.80× | 20.0 | 0.50× |",
		"| pub_sync | 1 KiB | p50 µs | 200 | 300 | 1.50× | – | – | 400 | 2.00× |",
		"| workload | size | metric | nereus r3 | jetstream r3 | nereus r3 ÷ r3 | jetstream r3-always | nereus r3 ÷ r3-always |",
		"| pub_async | 1 KiB | msgs/s | 20.0 | 40.0 | 0.50× | 10.0 | 2.00× |",
		"5 kills per run",
		"| metric | nereus r3 ms | jetstream r3 ms | nereus ÷ r3 |",
		"| p50 | 800 | 4000 | 0.20× |",
		"| max | 1500 | 6000 | 0.25× |",
		"| nereus | r3 | failover | 1 KiB | – | – | 800000 | 1500000 | 1500000 | 5 | 0.00 | 1 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Failover times appear in the failover table only, in ms.
	for _, table := range []string{"## Nereus ÷ JetStream", "## Replicated", "## Nereus: in the harness"} {
		section := md[strings.Index(md, table):]
		section = section[:strings.Index(section[3:], "\n## ")+3]
		if strings.Contains(section, "failover") {
			t.Errorf("%s lists failover:\n%s", table, section)
		}
	}
	// Every table line of one table has the same number of cells.
	for _, table := range strings.Split(md, "\n\n") {
		cells := -1
		for _, line := range strings.Split(table, "\n") {
			if !strings.HasPrefix(line, "|") {
				continue
			}
			n := strings.Count(line, "|")
			if cells >= 0 && n != cells {
				t.Errorf("ragged table line %q", line)
			}
			cells = n
		}
	}
}

func TestFailoverTableSaysWhatAMedianOfRunsIs(t *testing.T) {
	rep := sampleReport()
	if md := rep.markdown(); strings.Contains(md, "median of the runs' p50 and max") {
		t.Errorf("one run, yet the failover table speaks of medians:\n%s", md)
	}
	rep.Config.Runs = 3
	if md := rep.markdown(); !strings.Contains(md, "p50 and max are each the median of the runs' p50 and max.\n\n| metric | nereus r3 ms |") {
		t.Errorf("three runs, and the failover table does not say how they combine:\n%s", md)
	}
}

func TestSVGIsWellFormedWithOneBarPerValue(t *testing.T) {
	svg := sampleReport().svg()
	dec := xml.NewDecoder(strings.NewReader(svg))
	rects := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "rect" {
			rects++
		}
	}
	// background + 8 legend swatches + bars: pub_async 7, e2e p50 2,
	// e2e p99 2, pub_sync msgs/s 2, p50 3 (with the disk), p99 3,
	// failover p50 2 and max 2 (no Nereus r1 bar: it did not run).
	if want := 1 + 8 + 23; rects != want {
		t.Errorf("%d rects, want %d", rects, want)
	}
	// The largest bar of a group spans the full width.
	if !regexp.MustCompile(`width="520"`).MatchString(svg) {
		t.Errorf("no full-width bar in\n%s", svg)
	}
}

func TestJSONHasTheDocumentedFields(t *testing.T) {
	b, err := sampleReport().jsonBytes()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Machine map[string]any   `json:"machine"`
		Rows    []map[string]any `json:"rows"`
		Ratios  []map[string]any `json:"ratios"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"nproc", "go_version", "goos", "goarch", "date"} {
		if _, ok := doc.Machine[k]; !ok {
			t.Errorf("machine lacks %q: %v", k, doc.Machine)
		}
	}
	if len(doc.Rows) != 14 {
		t.Fatalf("%d rows", len(doc.Rows))
	}
	for _, k := range []string{"system", "mode", "workload", "size", "msgs_per_s", "p50_us", "p99_us"} {
		if _, ok := doc.Rows[0][k]; !ok {
			t.Errorf("row lacks %q: %v", k, doc.Rows[0])
		}
	}
	if doc.Rows[5]["workload"] != "e2e" || doc.Rows[5]["p99_us"] != 4000.0 || doc.Rows[0]["p50_us"] != 0.0 {
		t.Errorf("row values: %v / %v", doc.Rows[5], doc.Rows[0])
	}
	if len(doc.Ratios) != 8 {
		t.Errorf("%d ratio rows, want 8", len(doc.Ratios))
	}
	if _, ok := doc.Rows[0]["max_us"]; ok || doc.Rows[12]["max_us"] != 1_500_000.0 {
		t.Errorf("max_us only where latencies were sampled: %v / %v", doc.Rows[0], doc.Rows[12])
	}
	r3, _ := doc.Ratios[0]["r3_versus"].([]any)
	if len(r3) != 2 || r3[0].(map[string]any)["mode"] != modeR3 || r3[0].(map[string]any)["ratio"] != 0.5 {
		t.Errorf("r3_versus: %v", doc.Ratios[0]["r3_versus"])
	}
	if doc.Ratios[4]["versus_disk_fsync"] != 1.5 || doc.Ratios[0]["r1_proc_versus_r1"] != 0.8 || doc.Ratios[0]["r3_versus_r1_proc"] != 0.5 {
		t.Errorf("ratio fields: %v / %v", doc.Ratios[4], doc.Ratios[0])
	}
}

func TestWriteReportWritesThreeFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	if err := writeReport(dir, sampleReport()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"latest.md", "latest.svg", "latest.json"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int]string{16: "16 B", 1024: "1 KiB", 64 << 10: "64 KiB", 1500: "1500 B", 1 << 20: "1 MiB"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestFloorTable: the floor's rows join the ratio rows of the same
// workload and size, and the table divides each broker by the floor of
// its replication factor.
func TestFloorTable(t *testing.T) {
	rows := append(sampleRows(),
		row{System: systemFloor, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 80, Runs: 1},
		row{System: systemFloor, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 40, Runs: 1},
		row{System: systemFloor, Mode: modeR3, Workload: workloadPubSync, SizeBytes: 1024, MsgsPerS: 1000, P50Us: 100, P99Us: 360, Runs: 1})
	ratios := computeRatios(rows, sampleModesR1, sampleModesR3)
	if len(ratios) != 8 {
		t.Fatalf("%d ratio rows, want 8: the floor adds none of its own", len(ratios))
	}
	if r := ratios[0]; r.FloorR1 == nil || *r.FloorR1 != 80 || r.FloorR3 == nil || *r.FloorR3 != 40 {
		t.Fatalf("pub_async ratio row: %+v", r)
	}
	md := report{Rows: rows, Ratios: ratios}.markdown()
	for _, want := range []string{
		"## Against the floor",
		// r1-proc 40 of 80; r3 20 of 40; JetStream R3 40 of 40; the floor
		// halves with replication, Nereus too.
		"| pub_async | 1 KiB | msgs/s | 80.0 | 40.0 | 0.50× | 40.0 | 20.0 | 0.50× | 40.0 | 1.00× | 0.50× | 0.50× |",
		"| pub_sync | 1 KiB | p50 µs | – | – | – | 100 | – | – | – | – | – | – |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| e2e | 1 KiB | p50 µs | – |") {
		t.Errorf("a workload the floor did not run has a floor line:\n%s", md)
	}
	if strings.Contains(sampleReport().markdown(), "## Against the floor") {
		t.Error("a run without the floor has its table")
	}
}
