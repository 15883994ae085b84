package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// The KV workloads (issue 15): the same operations on a Nereus bucket
// (client.KV) and on a NATS KV bucket (nats.go jetstream.KeyValue), with
// the same value size, the same key space and the same client-side
// concurrency on both sides. Neither SDK has an asynchronous put (nats.go's
// KeyValue.Put waits for the PubAck; Nereus's KV.Put for KV_WRITE_OK), so
// concurrency is kvConcurrency goroutines sharing one connection, each
// waiting for its answer before its next request.
//
// Bounds of the KV workloads.
const (
	// kvConcurrency is how many puts or gets one connection keeps in
	// flight in kv_put, kv_get and kv_watch's writer.
	kvConcurrency = 16
	// kvKeys is the key space of kv_put_sync, kv_put and kv_get (each
	// bucket keeps one revision per key).
	kvKeys = 1000
	// kvWatchers is how many watchers (each its own connection) kv_watch
	// opens.
	kvWatchers = 10
	// kvWatchDrain bounds the wait for the watchers after the writer's
	// last put.
	kvWatchDrain = 10 * time.Second
	// kvWatchHeaderBytes is the prefix of a kv_watch value: the put's send
	// time (ns since the run's start, monotonic) and the update's index.
	kvWatchHeaderBytes = 16
	// kvWarmupKey and kvEndKey are the unmeasured updates that open and
	// close kv_watch's timed phase; every measured key starts with
	// kvWatchKeyPrefix.
	kvWarmupKey      = "bench-warmup"
	kvEndKey         = "bench-end"
	kvWatchKeyPrefix = "w-"
)

// kvSystem is a broker that serves key-value buckets: nereusSystem
// (kv_nereus.go) and jetStreamSystem (kv_jetstream.go).
type kvSystem interface {
	// CreateBucket creates an empty bucket that keeps one revision per
	// key, on file storage, with the system's replication factor, and
	// returns once its leader answers requests.
	CreateBucket(ctx context.Context, bucket string) error
	// NewKVClient opens a connection of its own to bucket (in a cluster
	// to the bucket's leader first).
	NewKVClient(ctx context.Context, bucket, name string) (kvClient, error)
}

// kvClient is one connection's handle on a bucket. Put and Get may be
// called from several goroutines at once.
type kvClient interface {
	// Put writes value under key and returns once the broker acknowledged
	// it, with its revision.
	Put(ctx context.Context, key string, value []byte) (revision uint64, err error)
	// Get returns key's current value (an error when it has none).
	Get(ctx context.Context, key string) ([]byte, error)
	// Watch watches every key of the bucket for the updates written after
	// it started, in revision order, until ctx ends or Stop.
	Watch(ctx context.Context) (kvWatcher, error)
	Close() error
}

// kvWatcher delivers one watch's updates; one goroutine calls Next.
type kvWatcher interface {
	// Next returns the next update; an error when ctx ends or the watch
	// ended.
	Next(ctx context.Context) (kvUpdate, error)
	Stop() error
}

// kvUpdate is one put a watcher received.
type kvUpdate struct {
	Key      string
	Value    []byte
	Revision uint64
}

// isKV reports whether w is a KV workload.
func (w workload) isKV() bool {
	switch w {
	case workloadKVPutSync, workloadKVPut, workloadKVGet, workloadKVWatch:
		return true
	}
	return false
}

// kvKey is key i of the key space.
func kvKey(i int64) string { return fmt.Sprintf("k-%04d", i%kvKeys) }

// createBucket creates bucket on sys within setupTimeout.
func createBucket(ctx context.Context, sys system, bucket string) error {
	ks, ok := sys.(kvSystem)
	if !ok {
		return fmt.Errorf("%T serves no KV buckets", sys)
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := ks.CreateBucket(sctx, bucket); err != nil {
		return fmt.Errorf("create bucket %s: %w", bucket, err)
	}
	return nil
}

// runKV runs the KV workload w on bucket, which createBucket created.
func runKV(ctx context.Context, sys system, w workload, bucket string, payload []byte, lim limits, prog *progress) (runResult, error) {
	ks, ok := sys.(kvSystem)
	if !ok {
		return runResult{}, fmt.Errorf("%T serves no KV buckets", sys)
	}
	switch w {
	case workloadKVPutSync:
		return runKVPut(ctx, ks, bucket, payload, 1, lim.countMax(lim.PubSyncCountMax, len(payload)), lim, prog)
	case workloadKVPut:
		return runKVPut(ctx, ks, bucket, payload, kvConcurrency, lim.countMax(lim.PubAsyncCountMax, len(payload)), lim, prog)
	case workloadKVGet:
		return runKVGet(ctx, sys, ks, bucket, payload, lim, prog)
	case workloadKVWatch:
		return runKVWatch(ctx, ks, bucket, payload, lim, prog)
	}
	return runResult{}, fmt.Errorf("%s is no KV workload", w)
}

// newKVClient opens a KV client within setupTimeout.
func newKVClient(ctx context.Context, ks kvSystem, bucket, name string) (kvClient, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	c, err := ks.NewKVClient(sctx, bucket, name)
	if err != nil {
		return nil, fmt.Errorf("new kv client: %w", err)
	}
	return c, nil
}

// runKVPut puts payload under the keys of the key space in turn from
// workers goroutines on one connection, at most countMax puts, for
// lim.TimeLimit; latencies are per put.
func runKVPut(ctx context.Context, ks kvSystem, bucket string, payload []byte, workers, countMax int, lim limits, prog *progress) (runResult, error) {
	c, err := newKVClient(ctx, ks, bucket, "bench-kv-put")
	if err != nil {
		return runResult{}, err
	}
	defer c.Close()
	prog.phase(fmt.Sprintf("put, %d in flight", workers))
	return runClosedLoop(ctx, workers, countMax, lim.TimeLimit, prog, func(ctx context.Context, i int64) error {
		_, err := c.Put(ctx, kvKey(i), payload)
		return err
	})
}

// runKVGet fills the key space (untimed, kvConcurrency puts in flight),
// then gets its keys in turn from kvConcurrency goroutines on one
// connection for lim.TimeLimit; each get must return the value put. The
// CPU is measured over the gets only.
func runKVGet(ctx context.Context, sys system, ks kvSystem, bucket string, payload []byte, lim limits, prog *progress) (runResult, error) {
	c, err := newKVClient(ctx, ks, bucket, "bench-kv-get")
	if err != nil {
		return runResult{}, err
	}
	defer c.Close()
	prog.phase(prefillProgressName)
	fill, err := runClosedLoop(ctx, kvConcurrency, kvKeys, lim.PrefillTimeLimit, prog, func(ctx context.Context, i int64) error {
		_, err := c.Put(ctx, kvKey(i), payload)
		return err
	})
	if err != nil {
		return runResult{}, fmt.Errorf("prefill: %w", err)
	}
	if fill.Messages != kvKeys {
		return runResult{}, fmt.Errorf("prefill: %d of %d keys put in %s", fill.Messages, kvKeys, lim.PrefillTimeLimit)
	}
	prog.phase(fmt.Sprintf("get, %d in flight", kvConcurrency))
	cpu := measureCPU(sys)
	res, err := runClosedLoop(ctx, kvConcurrency, math.MaxInt, lim.TimeLimit, prog, func(ctx context.Context, i int64) error {
		v, err := c.Get(ctx, kvKey(i))
		if err == nil && !bytes.Equal(v, payload) {
			err = fmt.Errorf("get %s: %d bytes, not the %d put", kvKey(i), len(v), len(payload))
		}
		return err
	})
	res.CPU = cpu()
	return res, err
}

// kvWatchTally is what one watcher received of kv_watch's updates.
type kvWatchTally struct {
	latencies []time.Duration
	// last is the receipt of its last measured update, since the start.
	last time.Duration
	// seen marks the update indexes received.
	seen []bool
	got  int
}

// runKVWatch opens kvWatchers watchers, each on its own connection, and
// one writer connection that puts one update and waits until every
// watcher received it (the watches are live). Then the writer puts up to
// lim.KVWatchCountMax updates, each under a key of its own (so that no
// update overwrites another and every watcher must receive every one),
// kvConcurrency in flight, for at most lim.TimeLimit; a put in flight at
// the time limit completes and counts. Each value carries its send time
// and index. Last it puts an end marker, after every update was acked, so
// each watcher stops once it received that: by then it must have received
// each acknowledged update exactly once, in revision order.
//
// The row's messages are the updates, its elapsed time runs from the
// first put to the last update's receipt by the last watcher (msgs_per_s
// is updates delivered to all watchers per second), and its latencies
// are one per update and watcher: receipt − send.
func runKVWatch(ctx context.Context, ks kvSystem, bucket string, payload []byte, lim limits, prog *progress) (runResult, error) {
	if len(payload) < kvWatchHeaderBytes {
		return runResult{}, fmt.Errorf("kv_watch needs values of at least %d bytes", kvWatchHeaderBytes)
	}
	writer, err := newKVClient(ctx, ks, bucket, "bench-kv-writer")
	if err != nil {
		return runResult{}, err
	}
	defer writer.Close()
	prog.phase(fmt.Sprintf("open %d watchers", kvWatchers))
	wctx, cancel := context.WithTimeout(ctx, setupTimeout+lim.TimeLimit+kvWatchDrain)
	defer cancel()
	watchers := make([]kvWatcher, 0, kvWatchers)
	defer func() {
		for _, w := range watchers {
			w.Stop()
		}
	}()
	for i := range kvWatchers {
		c, err := newKVClient(ctx, ks, bucket, fmt.Sprintf("bench-kv-watcher-%d", i))
		if err != nil {
			return runResult{}, err
		}
		defer c.Close()
		w, err := c.Watch(wctx)
		if err != nil {
			return runResult{}, fmt.Errorf("watch: %w", err)
		}
		watchers = append(watchers, w)
	}
	if _, err := writer.Put(ctx, kvWarmupKey, payload); err != nil {
		return runResult{}, fmt.Errorf("put the warm-up update: %w", err)
	}
	for i, w := range watchers {
		if err := awaitKVUpdate(wctx, w, kvWarmupKey); err != nil {
			return runResult{}, fmt.Errorf("watcher %d: %w", i, err)
		}
	}

	prog.phase(fmt.Sprintf("put, %d in flight, %d watchers", kvConcurrency, kvWatchers))
	countMax := lim.countMax(lim.KVWatchCountMax, len(payload))
	start := time.Now()
	tallies := make([]kvWatchTally, len(watchers))
	errs := make([]error, len(watchers))
	var wg sync.WaitGroup
	for i, w := range watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tallies[i], errs[i] = tallyKVWatch(wctx, w, start, countMax)
		}()
	}
	// The puts run on ctx, not on the time limit's context: one in flight
	// when the time is up completes (and its watchers must receive it).
	written, putErr := runClosedLoop(ctx, kvConcurrency, countMax, lim.TimeLimit, prog, func(_ context.Context, i int64) error {
		buf := make([]byte, len(payload))
		copy(buf, payload)
		binary.LittleEndian.PutUint64(buf, uint64(time.Since(start)))
		binary.LittleEndian.PutUint64(buf[8:], uint64(i))
		_, err := writer.Put(ctx, kvWatchKey(i), buf)
		return err
	})
	if putErr == nil {
		_, putErr = writer.Put(ctx, kvEndKey, payload)
	}
	if putErr != nil {
		cancel() // the watchers would wait for an end that does not come
	}
	wg.Wait()
	if putErr != nil {
		return runResult{}, fmt.Errorf("put: %w", putErr)
	}
	n := int(written.Messages)
	res := runResult{Messages: written.Messages}
	for i, t := range tallies {
		if errs[i] != nil {
			return runResult{}, fmt.Errorf("watcher %d after %d of %d updates: %w", i, t.got, n, errs[i])
		}
		if t.got != n {
			return runResult{}, fmt.Errorf("watcher %d received %d of the %d updates acknowledged", i, t.got, n)
		}
		res.Latencies = append(res.Latencies, t.latencies...)
		res.Elapsed = max(res.Elapsed, t.last)
	}
	return res, ctx.Err()
}

// kvWatchKey is the key of kv_watch's update i.
func kvWatchKey(i int64) string { return fmt.Sprintf("%s%07d", kvWatchKeyPrefix, i) }

// awaitKVUpdate receives w's updates until one of key.
func awaitKVUpdate(ctx context.Context, w kvWatcher, key string) error {
	for {
		u, err := w.Next(ctx)
		if err != nil {
			return fmt.Errorf("waiting for an update of %s: %w", key, err)
		}
		if u.Key == key {
			return nil
		}
	}
}

// tallyKVWatch receives w's updates until the end marker, and fails on an
// update received twice, out of revision order, or not put by the writer.
func tallyKVWatch(ctx context.Context, w kvWatcher, start time.Time, countMax int) (kvWatchTally, error) {
	t := kvWatchTally{seen: make([]bool, countMax), latencies: make([]time.Duration, 0, min(countMax, latencySamplesMax/kvWatchers))}
	var lastRevision uint64
	for {
		u, err := w.Next(ctx)
		if err != nil {
			return t, err
		}
		now := time.Since(start)
		if u.Revision <= lastRevision {
			return t, fmt.Errorf("revision %d after %d", u.Revision, lastRevision)
		}
		lastRevision = u.Revision
		if u.Key == kvEndKey {
			return t, nil
		}
		if !strings.HasPrefix(u.Key, kvWatchKeyPrefix) || len(u.Value) < kvWatchHeaderBytes {
			return t, fmt.Errorf("an update of %s (%d bytes) the writer did not put", u.Key, len(u.Value))
		}
		i := binary.LittleEndian.Uint64(u.Value[8:])
		if i >= uint64(countMax) || u.Key != kvWatchKey(int64(i)) {
			return t, fmt.Errorf("update %s carries index %d", u.Key, i)
		}
		if t.seen[i] {
			return t, fmt.Errorf("update %s received twice", u.Key)
		}
		t.seen[i] = true
		t.got++
		t.last = now
		if len(t.latencies) < cap(t.latencies) {
			t.latencies = append(t.latencies, now-time.Duration(binary.LittleEndian.Uint64(u.Value)))
		}
	}
}
