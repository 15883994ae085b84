package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBenchPhases(t *testing.T) {
	ok := benchFlags{size: 1024, count: 10, duration: time.Second, inflight: 256, partitions: 1}
	for mode, want := range map[string]int{"all": 3, "pub-sync": 1, "pub-async": 1, "consume": 1} {
		fl := ok
		fl.mode = mode
		if ph, err := fl.phases(); err != nil || len(ph) != want {
			t.Errorf("mode %s: %v, %v", mode, ph, err)
		}
	}
	bad := []func(*benchFlags){
		func(f *benchFlags) { f.mode = "nope" },
		func(f *benchFlags) { f.count = 0 },
		func(f *benchFlags) { f.inflight = 10000 },
		func(f *benchFlags) { f.duration = 0 },
		func(f *benchFlags) { f.size = -1 },
	}
	for i, mutate := range bad {
		fl := ok
		fl.mode = "all"
		mutate(&fl)
		if _, err := fl.phases(); err == nil {
			t.Errorf("bad flags %d accepted: %+v", i, fl)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1000; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	for p, want := range map[float64]float64{50: 500, 99: 990, 99.9: 999, 100: 1000} {
		if got := percentileUs(ds, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if percentileUs(nil, 50) != 0 {
		t.Error("empty percentile")
	}
	if got := percentileUs([]time.Duration{time.Millisecond}, 99.9); got != 1000 {
		t.Errorf("single sample p99.9 = %v", got)
	}
}

func TestBenchResultOutput(t *testing.T) {
	rs := []benchResult{
		newBenchResult("pub-sync", 100, 2*time.Second, 1000),
		newBenchResult("consume", 50, time.Second, 1000),
	}
	rs[0].P50Us, rs[0].P99Us, rs[0].P999Us = 100, 900, 1500
	var out bytes.Buffer
	if err := writeBenchResults(&out, rs, true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || lines[0] != `{"phase":"pub-sync","messages":100,"seconds":2,"msgs_per_sec":50,"mb_per_sec":0.05,"p50_us":100,"p99_us":900,"p999_us":1500}` {
		t.Fatalf("json output:\n%s", out.String())
	}
	out.Reset()
	if err := writeBenchResults(&out, rs, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "PHASE") || !strings.Contains(out.String(), "1.5ms") {
		t.Fatalf("table:\n%s", out.String())
	}
}
