package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sampleRows are three workload rows for the systems; the e2e row has no
// r1-always measurement, as after a failed case, and only pub_sync has the
// disk anchor.
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
	}
}

func sampleReport() report {
	rows := sampleRows()
	return report{
		Machine: machineInfo{Date: "2026-01-02T03:04:05Z", NumCPU: 2, GoVersion: "go1.26.8", GOOS: "linux", GOARCH: "amd64", DataDir: "/tmp/x", DataFS: "ext4", NereusCommit: "abc123+dirty"},
		Config:  runConfig{Quick: true, Runs: 1, TimeLimitS: 3, InflightMax: 256, BatchMax: 500, E2ERatePerS: 2000, E2ESeconds: 3},
		Rows:    rows,
		Ratios:  computeRatios(rows, []string{modeR1, modeR1Always}),
		Errors:  []string{"jetstream/r1-always/e2e/1024: boom"},
	}
}

func TestComputeRatios(t *testing.T) {
	got := computeRatios(sampleRows(), []string{modeR1, modeR1Always})
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
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
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
	// background + 6 legend swatches + bars: pub_async 5, e2e p50 2,
	// e2e p99 2, pub_sync msgs/s 2, p50 3 (with the disk), p99 3.
	if want := 1 + 6 + 17; rects != want {
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
	if len(doc.Rows) != 10 {
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
	if len(doc.Ratios) != 6 {
		t.Errorf("%d ratio rows, want 6", len(doc.Ratios))
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
