package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// exposition is a node's /metrics with the two histograms: replication
// counts per bucket bound (seconds), and replica fsyncs beside a log one.
// Their sums make every replication 1.5 ms and every replica fsync 1 ms
// on average.
func exposition(repl, replicaFsync map[string]int) string {
	var b strings.Builder
	b.WriteString("# TYPE nereus_replication_seconds histogram\n")
	cum := 0
	for _, le := range []string{"0.001", "0.002", "0.004", "+Inf"} {
		cum += repl[le]
		fmt.Fprintf(&b, "nereus_replication_seconds_bucket{le=%q} %d\n", le, cum)
	}
	fmt.Fprintf(&b, "nereus_replication_seconds_sum %g\n", float64(cum)*0.0015)
	fmt.Fprintf(&b, "nereus_replication_seconds_count %d\n", cum)
	b.WriteString("# TYPE nereus_fsync_seconds histogram\n")
	cum = 0
	for _, le := range []string{"0.001", "0.002", "0.004", "+Inf"} {
		fmt.Fprintf(&b, "nereus_fsync_seconds_bucket{kind=\"log\",le=%q} 1000\n", le) // not a replica's: ignored
		cum += replicaFsync[le]
		fmt.Fprintf(&b, "nereus_fsync_seconds_bucket{kind=\"replica\",le=%q} %d\n", le, cum)
	}
	b.WriteString("nereus_fsync_seconds_sum{kind=\"log\"} 7\n")
	fmt.Fprintf(&b, "nereus_fsync_seconds_sum{kind=\"replica\"} %g\n", float64(cum)*0.001)
	return b.String()
}

func TestParseHistogramsSumOverProcesses(t *testing.T) {
	var h, r histogram
	for _, text := range []string{ // two processes
		exposition(map[string]int{"0.001": 2, "0.002": 2}, map[string]int{"0.004": 3}),
		exposition(map[string]int{"0.004": 4}, map[string]int{"+Inf": 1}),
	} {
		fsync, err := parseHistogram(strings.NewReader(text), metricFsync, fsyncKindReplica)
		if err != nil {
			t.Fatal(err)
		}
		repl, err := parseHistogram(strings.NewReader(text), metricReplication, "")
		if err != nil {
			t.Fatal(err)
		}
		h, r = h.add(fsync), r.add(repl)
	}
	if fmt.Sprint(h.bounds) != "[0.001 0.002 0.004 +Inf]" || fmt.Sprint(h.counts) != "[0 0 3 4]" {
		t.Fatalf("replica fsyncs: bounds %v counts %v", h.bounds, h.counts)
	}
	if fmt.Sprint(r.counts) != "[2 4 8 8]" {
		t.Fatalf("replication counts %v", r.counts)
	}
	if math.Abs(r.sum-0.012) > 1e-12 || math.Abs(h.mean()-0.001) > 1e-12 {
		t.Fatalf("sums: replication %v (want 0.012 s), replica fsync mean %v (want 1 ms; the log's are not the replicas')", r.sum, h.mean())
	}
	if _, err := parseHistogram(strings.NewReader(`nereus_replication_seconds_bucket{le="x"} 1`), metricReplication, ""); err == nil {
		t.Fatal("a bucket bound that is no number parsed")
	}
}

func TestHistogramQuantileInterpolatesInItsBucket(t *testing.T) {
	h := histogram{bounds: []float64{0.001, 0.002, 0.004, math.Inf(1)}, counts: []float64{2, 4, 8, 9}}
	for _, c := range []struct{ q, want float64 }{
		{0.1, 0.00045}, // 0.9 of 2 in [0, 1 ms]
		{0.5, 0.00225}, // 4.5 of 9: 0.5 of the 4 in [2, 4 ms]
		{0.99, 0.004},  // in the +Inf bucket: its lower bound
	} {
		if got := h.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := (histogram{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("empty histogram's p50 %v, want NaN", got)
	}
	h.sum = 0.03
	before := histogram{bounds: h.bounds, counts: []float64{2, 2, 2, 2}, sum: 0.002}
	if d := h.since(before); fmt.Sprint(d.counts) != "[0 2 6 7]" || d.count() != 7 || math.Abs(d.mean()-0.004) > 1e-12 {
		t.Errorf("since: %v, mean %v (want 4 ms)", d.counts, d.mean())
	}
	if got := (histogram{}).mean(); !math.IsNaN(got) {
		t.Errorf("empty histogram's mean %v, want NaN", got)
	}
}

// fakeCluster is a system (none of whose methods the measurement calls)
// whose processes serve /metrics at addrs.
type fakeCluster struct {
	system
	addrs []string
}

func (f fakeCluster) metricsAddrs() []string { return f.addrs }

func TestMeasureReplicationReadsTheCase(t *testing.T) {
	var after atomic.Bool
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if after.Load() { // 10 proposals in [2, 4 ms], 3 fsyncs in [1, 2 ms]
			fmt.Fprint(w, exposition(map[string]int{"0.001": 5, "0.004": 10}, map[string]int{"0.002": 3}))
			return
		}
		fmt.Fprint(w, exposition(map[string]int{"0.001": 5}, nil))
	}))
	defer leader.Close()
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if after.Load() { // 3 fsyncs in [1, 2 ms]
			fmt.Fprint(w, exposition(nil, map[string]int{"0.002": 3}))
			return
		}
		fmt.Fprint(w, exposition(nil, nil))
	}))
	defer follower.Close()
	sys := fakeCluster{addrs: []string{strings.TrimPrefix(leader.URL, "http://"), strings.TrimPrefix(follower.URL, "http://")}}
	end := measureReplication(context.Background(), sys)
	after.Store(true)
	u := end()
	if u == nil {
		t.Fatal("no measurement")
	}
	if u.ReplicationP50 != 3*time.Millisecond || u.FsyncP50 != 1500*time.Microsecond || u.Fsyncs != 6 {
		t.Fatalf("measured %+v, want replication p50 3ms, fsync p50 1.5ms, 6 fsyncs", *u)
	}
	// p99: the 9.9th of the 10 proposals in [2, 4 ms], the 5.94th of the
	// 6 fsyncs in [1, 2 ms].
	if u.ReplicationP99 != 3980*time.Microsecond || u.FsyncP99 != 1990*time.Microsecond {
		t.Fatalf("measured %+v, want replication p99 3.98ms, fsync p99 1.99ms", *u)
	}
	if u.ReplicationMean != 1500*time.Microsecond || u.FsyncMean != time.Millisecond {
		t.Fatalf("measured %+v, want replication mean 1.5ms, fsync mean 1ms", *u)
	}
	// 128,000 msgs/s with the async window of 256: 2,000 µs in flight.
	r := summarize(benchCase{System: systemNereus, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024},
		runResult{Messages: 128_000, Elapsed: time.Second, Replication: u})
	if r.ReplicationP50Us != 3000 || r.ReplicaFsyncP50Us != 1500 || r.ReplicationP99Us != 3980 || r.ReplicaFsyncP99Us != 1990 ||
		r.ReplicationMeanUs != 1500 || r.ReplicaFsyncMeanUs != 1000 || r.ReplicaFsyncsPerMsg != 6.0/128_000 {
		t.Fatalf("row %+v", r)
	}
	// 500 msgs/s one at a time: 2,000 µs in flight too.
	s := summarize(benchCase{System: systemNereus, Mode: modeR3, Workload: workloadPubSync, SizeBytes: 1024},
		runResult{Messages: 500, Elapsed: time.Second, Latencies: []time.Duration{time.Millisecond}, Replication: u})
	var b strings.Builder
	writeReplicationMarkdown(&b, []row{r, s})
	for _, want := range []string{
		"| r3 | pub_async | 1 KiB | 3000 | 1500 | 2.00× | 3980 | 1990 | 0.000 |",
		"| r3 | pub_async | 1 KiB | 2000 | 1500 | 0.75× | 1000 | 0.50× |",
		"| r3 | pub_sync | 1 KiB | 2000 | 1500 | 0.75× | 1000 | 0.50× |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("markdown lacks %q:\n%s", want, b.String())
		}
	}
	if end := measureReplication(context.Background(), fakeCluster{}); end() != nil {
		t.Fatal("a system without metrics measured something")
	}
}
