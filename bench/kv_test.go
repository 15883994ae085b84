package main

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kvRows are KV rows of Nereus r1 and r3 and of three JetStream modes
// (r3-always did not run, as after a failed case), after a pub_async row.
func kvRows() []row {
	return []row{
		{System: systemNereus, Mode: modeR1, Workload: workloadPubAsync, SizeBytes: 1024, MsgsPerS: 50},
		{System: systemNereus, Mode: modeR1, Workload: workloadKVPutSync, SizeBytes: 128, MsgsPerS: 2000, P50Us: 400, P99Us: 2000},
		{System: systemJetStream, Mode: modeR1, Workload: workloadKVPutSync, SizeBytes: 128, MsgsPerS: 20000, P50Us: 40, P99Us: 100},
		{System: systemJetStream, Mode: modeR1Always, Workload: workloadKVPutSync, SizeBytes: 128, MsgsPerS: 1000, P50Us: 800, P99Us: 1000},
		{System: systemNereus, Mode: modeR1, Workload: workloadKVGet, SizeBytes: 128, MsgsPerS: 60000},
		{System: systemJetStream, Mode: modeR1, Workload: workloadKVGet, SizeBytes: 128, MsgsPerS: 40000},
		{System: systemNereus, Mode: modeR3, Workload: workloadKVWatch, SizeBytes: 128, MsgsPerS: 5000, P50Us: 2000, P99Us: 9000},
		{System: systemJetStream, Mode: modeR3, Workload: workloadKVWatch, SizeBytes: 128, MsgsPerS: 4000, P50Us: 4000, P99Us: 9000},
	}
}

func TestKVRatiosAndSection(t *testing.T) {
	rows := kvRows()
	ratios := computeRatios(rows, sampleModesR1, sampleModesR3)
	find := func(w workload, metric string) ratioRow {
		for _, rr := range ratios {
			if rr.Workload == w && rr.Metric == metric {
				return rr
			}
		}
		t.Fatalf("no ratio row %s %s in %+v", w, metric, ratios)
		return ratioRow{}
	}
	if rr := find(workloadKVPutSync, "p50_us"); rr.Nereus != 400 || len(rr.Versus) != 2 || rr.Versus[0].Ratio != 10 || rr.Versus[1].Ratio != 0.5 || !rr.LowerIsBetter {
		t.Errorf("kv_put_sync p50: %+v", rr)
	}
	if rr := find(workloadKVGet, "msgs_per_s"); rr.Versus[0].Ratio != 1.5 || metricLabel(rr) != "ops/s" {
		t.Errorf("kv_get: %+v (%s)", rr, metricLabel(rr))
	}
	if rr := find(workloadKVWatch, "msgs_per_s"); rr.Nereus != 0 || len(rr.R3Versus) != 1 || rr.R3Versus[0].Ratio != 1.25 || metricLabel(rr) != "updates/s" {
		t.Errorf("kv_watch: %+v (%s)", rr, metricLabel(rr))
	}

	rep := report{Config: runConfig{Runs: 1, KVConcurrency: 16, KVKeys: 1000, KVWatchers: 10, KVWatchCountMax: 20000}, Rows: rows, Ratios: ratios}
	md := rep.markdown()
	kvStart := strings.Index(md, "## KV buckets: Nereus ÷ NATS KV")
	if kvStart < 0 {
		t.Fatalf("no KV section:\n%s", md)
	}
	kv := md[kvStart:]
	kv = kv[:strings.Index(kv[3:], "\n## ")+3]
	for _, want := range []string{
		"16 goroutines on one connection", "10 watchers, each on its own connection", "up to 20000 updates",
		"deliveries are 10× that", "exactly once, in revision order",
		"Nereus r1 fsynced it", "within 2 min", "r1-always fsynced it", "direct get",
		"| workload | size | metric | nereus r1 | jetstream r1 | nereus ÷ r1 | jetstream r1-always | nereus ÷ r1-always |",
		"| kv_put_sync | 128 B | ops/s | 2000 | 20000 | 0.10× | 1000 | 2.00× |",
		"| kv_put_sync | 128 B | p99 µs | 2000 | 100 | 20.00× | 1000 | 2.00× |",
		"| kv_get | 128 B | ops/s | 60000 | 40000 | 1.50× | – | – |",
		"| workload | size | metric | nereus r3 | jetstream r3 | nereus r3 ÷ r3 |",
		"| kv_watch | 128 B | updates/s | 5000 | 4000 | 1.25× |",
		"| kv_watch | 128 B | p50 µs | 2000 | 4000 | 0.50× |",
	} {
		if !strings.Contains(kv, want) {
			t.Errorf("the KV section lacks %q:\n%s", want, kv)
		}
	}
	// The stream tables do not repeat the KV rows.
	if strings.Contains(md[:kvStart], "kv_") {
		t.Errorf("KV rows outside the KV section:\n%s", md[:kvStart])
	}
	if strings.Contains(kv, "pub_async") {
		t.Errorf("the KV section lists a stream row:\n%s", kv)
	}
	js, err := rep.jsonBytes()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"kv_concurrency": 16`, `"kv_watchers": 10`, `"workload": "kv_watch"`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("latest.json lacks %s", want)
		}
	}

	// Without KV rows there is no KV section.
	if md := sampleReport().markdown(); strings.Contains(md, "## KV buckets") {
		t.Error("a KV section without KV rows")
	}
}

// scriptedWatcher delivers its updates, then the error.
type scriptedWatcher struct {
	updates []kvUpdate
	err     error
}

func (w *scriptedWatcher) Next(context.Context) (kvUpdate, error) {
	if len(w.updates) == 0 {
		return kvUpdate{}, w.err
	}
	u := w.updates[0]
	w.updates = w.updates[1:]
	return u, nil
}

func (w *scriptedWatcher) Stop() error { return nil }

// watchUpdate is kv_watch's update i at revision rev, sent at the start.
func watchUpdate(i int64, rev uint64) kvUpdate {
	v := make([]byte, kvValueBytes)
	binary.LittleEndian.PutUint64(v[8:], uint64(i))
	return kvUpdate{Key: kvWatchKey(i), Value: v, Revision: rev}
}

func TestTallyKVWatchChecksEveryUpdate(t *testing.T) {
	end := kvUpdate{Key: kvEndKey, Value: make([]byte, kvValueBytes), Revision: 100}
	ended := errors.New("watch ended")
	tests := []struct {
		name    string
		updates []kvUpdate
		got     int
		wantErr string
	}{
		{"all in order", []kvUpdate{watchUpdate(0, 3), watchUpdate(2, 4), watchUpdate(1, 7), end}, 3, ""},
		{"received twice", []kvUpdate{watchUpdate(0, 3), watchUpdate(0, 4), end}, 1, "received twice"},
		{"out of revision order", []kvUpdate{watchUpdate(0, 5), watchUpdate(1, 4), end}, 1, "revision 4 after 5"},
		{"no end marker", []kvUpdate{watchUpdate(0, 3)}, 1, "watch ended"},
		{"a key not written", []kvUpdate{{Key: "other", Value: make([]byte, kvValueBytes), Revision: 3}, end}, 0, "did not put"},
		{"an index beyond the count", []kvUpdate{watchUpdate(9, 3), end}, 0, "carries index 9"},
		{"a key that does not match its index", []kvUpdate{{Key: kvWatchKey(1), Value: watchUpdate(2, 3).Value, Revision: 3}, end}, 0, "carries index 2"},
	}
	for _, tt := range tests {
		tally, err := tallyKVWatch(context.Background(), &scriptedWatcher{updates: tt.updates, err: ended}, time.Now(), 4)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.wantErr)
		}
		if tally.got != tt.got || len(tally.latencies) != tt.got {
			t.Errorf("%s: %d received, %d latencies, want %d", tt.name, tally.got, len(tally.latencies), tt.got)
		}
	}
}

// TestKVWorkloadsOnBothBrokers runs each KV case with small bounds
// against Nereus and JetStream in this process, through runCase (which
// creates the bucket and measures the CPU): every put, get and watch
// delivery is checked by the workloads themselves (a get must return the
// value put; every watcher must receive every acknowledged update once).
func TestKVWorkloadsOnBothBrokers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two brokers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := &environment{workDir: t.TempDir(), logf: t.Logf}
	defer env.children.closeAll()
	lim := newLimits(true)
	lim.TimeLimit, lim.PubSyncCountMax, lim.PubAsyncCountMax, lim.KVWatchCountMax = 200*time.Millisecond, 50, 500, 300
	prog := startProgress(io.Discard)
	defer prog.close()
	for _, spec := range []systemSpec{systemSpecs[0], systemSpecs[3]} { // nereus r1, jetstream r1
		sys, err := spec.start(ctx, env, t.TempDir())
		if err != nil {
			t.Fatalf("start %s/%s: %v", spec.System, spec.Mode, err)
		}
		defer sys.Close()
		for _, w := range []workload{workloadKVPutSync, workloadKVPut, workloadKVGet, workloadKVWatch} {
			c := benchCase{System: spec.System, Mode: spec.Mode, Workload: w, SizeBytes: kvValueBytes}
			id := c.ID()
			res, err := runCase(ctx, env, sys, c, lim, 1, prog)
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if res.Messages <= 0 || res.Elapsed <= 0 {
				t.Errorf("%s: %d operations in %s", id, res.Messages, res.Elapsed)
			}
			wantSamples := res.Messages
			switch w {
			case workloadKVPutSync:
				if res.Messages > int64(lim.PubSyncCountMax) {
					t.Errorf("%s: %d puts, bound %d", id, res.Messages, lim.PubSyncCountMax)
				}
			case workloadKVWatch:
				wantSamples = res.Messages * kvWatchers
				if res.Messages > int64(lim.KVWatchCountMax) {
					t.Errorf("%s: %d updates, bound %d", id, res.Messages, lim.KVWatchCountMax)
				}
			}
			if res.CPU == nil {
				t.Errorf("%s: no CPU measured", id)
			}
			if int64(len(res.Latencies)) != wantSamples {
				t.Errorf("%s: %d latency samples for %d operations", id, len(res.Latencies), wantSamples)
			}
		}
	}
}

// BenchmarkKVInProcess runs kv_put, kv_get and kv_watch (-quick bounds)
// against Nereus in this process, for a profile of the KV path:
//
//	go test -run '^$' -bench KVInProcess/kv_put -benchtime 1x -cpuprofile /tmp/kv.cpu
func BenchmarkKVInProcess(b *testing.B) {
	for _, w := range []workload{workloadKVPut, workloadKVGet, workloadKVWatch} {
		b.Run(string(w), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			env := &environment{workDir: b.TempDir(), logf: b.Logf}
			sys, err := startNereusInProcess(ctx, env, b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer sys.Close()
			prog := startProgress(io.Discard)
			defer prog.close()
			for i := 0; b.Loop(); i++ {
				bucket := "bench-" + strings.ReplaceAll(string(w), "_", "-") + "-" + strconv.Itoa(i)
				if err := createBucket(ctx, sys, bucket); err != nil {
					b.Fatal(err)
				}
				res, err := runKV(ctx, sys, w, bucket, make([]byte, kvValueBytes), newLimits(true), prog)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.Messages)/res.Elapsed.Seconds(), "ops/s")
			}
		})
	}
}
