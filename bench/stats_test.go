package main

import (
	"testing"
	"time"
)

func TestPercentileMicros(t *testing.T) {
	us := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Microsecond
		}
		return out
	}
	tests := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    float64
	}{
		{"no samples", nil, 50, 0},
		{"one sample", us(7), 99.9, 7},
		{"median of ten is the fifth", us(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 50, 5},
		{"p99 of a hundred is the 99th", us(seq(1, 100)...), 99, 99},
		{"p99.9 of a hundred is the max", us(seq(1, 100)...), 99.9, 100},
		{"p100 is the max", us(3, 1, 2), 100, 3},
		{"tiny p is the min", us(3, 1, 2), 0.001, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentileMicros(tt.samples, tt.p); got != tt.want {
				t.Fatalf("percentileMicros(p=%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestMedian(t *testing.T) {
	tests := []struct {
		values []float64
		want   float64
	}{
		{nil, 0},
		{[]float64{4}, 4},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{100, 1, 1}, 1},
	}
	for _, tt := range tests {
		input := append([]float64(nil), tt.values...)
		if got := median(tt.values); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.values, got, tt.want)
		}
		for i := range input {
			if input[i] != tt.values[i] {
				t.Fatalf("median modified its input: %v", tt.values)
			}
		}
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		nereus, jetstream float64
		want              float64
		ok                bool
	}{
		{50, 100, 0.5, true},
		{300, 100, 3, true},
		{0, 100, 0, false},
		{100, 0, 0, false},
		{-1, 100, 0, false},
	}
	for _, tt := range tests {
		got, ok := ratio(tt.nereus, tt.jetstream)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ratio(%v, %v) = %v, %v; want %v, %v", tt.nereus, tt.jetstream, got, ok, tt.want, tt.ok)
		}
	}
}

func TestSummarize(t *testing.T) {
	c := benchCase{System: systemNereus, Mode: modeR1, Workload: workloadPubSync, SizeBytes: 1000}
	r := summarize(c, runResult{Messages: 2000, Elapsed: 2 * time.Second,
		Latencies: []time.Duration{time.Millisecond, 2 * time.Millisecond}})
	if r.MsgsPerS != 1000 || r.MBPerS != 1 || r.Runs != 1 || r.Seconds != 2 {
		t.Fatalf("throughput: %+v", r)
	}
	if r.P50Us != 1000 || r.P99Us != 2000 || r.P999Us != 2000 {
		t.Fatalf("latencies: %+v", r)
	}
	empty := summarize(c, runResult{})
	if empty.MsgsPerS != 0 || empty.P50Us != 0 {
		t.Fatalf("a run that measured nothing reports zeros: %+v", empty)
	}
}

func TestMedianRowTakesEachMetricsMedian(t *testing.T) {
	runs := []row{
		{System: systemJetStream, Mode: modeR1, MsgsPerS: 10, P50Us: 300, P99Us: 9, Messages: 5, Seconds: 1, Runs: 1},
		{System: systemJetStream, Mode: modeR1, MsgsPerS: 30, P50Us: 100, P99Us: 7, Messages: 7, Seconds: 3, Runs: 1},
		{System: systemJetStream, Mode: modeR1, MsgsPerS: 20, P50Us: 200, P99Us: 8, Messages: 6, Seconds: 2, Runs: 1},
	}
	got := medianRow(runs)
	want := row{System: systemJetStream, Mode: modeR1, MsgsPerS: 20, P50Us: 200, P99Us: 8, Messages: 6, Seconds: 2, Runs: 3}
	if got != want {
		t.Fatalf("medianRow = %+v\nwant        %+v", got, want)
	}
}

func TestLimitsCountMaxBoundsBytes(t *testing.T) {
	l := limits{RunBytesMax: 1 << 20}
	if got := l.countMax(1000, 64<<10); got != 16 {
		t.Errorf("64 KiB messages in 1 MiB: %d, want 16", got)
	}
	if got := l.countMax(1000, 16); got != 1000 {
		t.Errorf("small messages keep the count bound: %d", got)
	}
	if got := l.countMax(10, 0); got != 10 {
		t.Errorf("size 0: %d", got)
	}
}
