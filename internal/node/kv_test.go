package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// kvCall waits for one asynchronous KV answer (bounded by waitMax).
func kvCall[T any](t *testing.T, what string, start func(done func(T, error))) (T, error) {
	t.Helper()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	start(func(v T, err error) { ch <- res{v, err} })
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(waitMax):
		t.Fatalf("%s: no answer", what)
		var zero T
		return zero, nil
	}
}

func kvCreate(t *testing.T, n *Node, c wire.KVBucketConfig) (bool, error) {
	t.Helper()
	return kvCall(t, "create "+c.Bucket, func(done func(bool, error)) {
		n.KVCreateBucket(c, func(_ wire.KVBucketConfig, created bool, err error) { done(created, err) })
	})
}

func kvWrite(t *testing.T, n *Node, w wire.KVWrite) (uint64, error) {
	t.Helper()
	return kvCall(t, "write", func(done func(uint64, error)) { n.KVWrite(&w, done) })
}

func kvPut(t *testing.T, n *Node, bucket, key, value string) uint64 {
	t.Helper()
	rev, err := kvWrite(t, n, wire.KVWrite{Bucket: bucket, Op: wire.KVOpPut, Key: []byte(key), Value: []byte(value)})
	if err != nil {
		t.Fatalf("put %s=%s: %v", key, value, err)
	}
	return rev
}

func kvGet(t *testing.T, n *Node, bucket, key string, at uint64) (*wire.KVGetOK, error) {
	t.Helper()
	return kvCall(t, "get "+key, func(done func(*wire.KVGetOK, error)) {
		n.KVGet(&wire.KVGet{Bucket: bucket, Key: []byte(key), Revision: at}, done)
	})
}

func wantCode(t *testing.T, err error, code wire.Code) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("err = %v, want %s", err, code)
	}
}

// watchRecorder is a KVWatchSink that keeps what it got.
type watchRecorder struct {
	mu     sync.Mutex
	events []wire.KVEvent
	end    *wire.Error
}

func (w *watchRecorder) SendEvent(ev *wire.KVEvent) {
	w.mu.Lock()
	w.events = append(w.events, *ev)
	w.mu.Unlock()
}

func (w *watchRecorder) End(err *wire.Error) {
	w.mu.Lock()
	w.end = err
	w.mu.Unlock()
}

// seen lists the put/del events as "rev:op:key=value", and checks that
// every event continues where the previous one ended (no gap, no repeat).
func (w *watchRecorder) seen(t *testing.T, from uint64) ([]string, *wire.Error) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	next := from
	for _, ev := range w.events {
		switch ev.Kind {
		case wire.KVEventSkipped:
			if ev.From != next || ev.To < ev.From {
				t.Fatalf("SKIPPED %d..%d, expected from %d", ev.From, ev.To, next)
			}
			next = ev.To + 1
		default:
			if ev.Entry.Revision != next {
				t.Fatalf("event at %d, expected %d", ev.Entry.Revision, next)
			}
			op := "put"
			if ev.Kind == wire.KVEventDelete {
				op = "del"
			}
			out = append(out, fmt.Sprintf("%d:%s:%s=%s", ev.Entry.Revision, op, ev.Entry.Key, ev.Entry.Value))
			next++
		}
	}
	return out, w.end
}

// A bucket on a single node: writes answered with their revision, CAS
// linearizable against them, reads of the latest value and of a kept
// revision, keys and history, a watch from revision 1 that sees every
// write in order, and all of it rebuilt from the log after a restart.
func TestKVBucketOnASingleNode(t *testing.T) {
	h := newHarness(t)
	n := h.node
	created, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "cfg", History: 3})
	if err != nil || !created {
		t.Fatalf("create: %v, %v", created, err)
	}
	if created, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "cfg", History: 3}); err != nil || created {
		t.Fatalf("identical create again: %v, %v", created, err)
	}
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "cfg", History: 4})
	wantCode(t, err, wire.CodeTopicConflict)

	r1 := kvPut(t, n, "cfg", "a/x", "1")
	r2 := kvPut(t, n, "cfg", "a/y", "2")
	if r2 <= r1 {
		t.Fatalf("revisions %d then %d", r1, r2)
	}
	// CAS: expected revision r1 holds; a second CAS on r1 does not.
	r3, err := kvWrite(t, n, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("a/x"), Value: []byte("3"), Conditional: true, Expected: r1})
	if err != nil {
		t.Fatalf("CAS on %d: %v", r1, err)
	}
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("a/x"), Value: []byte("4"), Conditional: true, Expected: r1})
	wantCode(t, err, wire.CodeRevisionMismatch)
	var we *wire.Error
	errors.As(err, &we)
	if cur, ok := wire.MismatchCurrent(we); !ok || cur != r3 {
		t.Fatalf("mismatch names current %d (%v), want %d: %v", cur, ok, r3, err)
	}
	// Create-only CAS: refused on a live key, taken on a new one.
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("a/y"), Value: []byte("x"), Conditional: true})
	wantCode(t, err, wire.CodeRevisionMismatch)
	r4, err := kvWrite(t, n, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("b"), Value: []byte("new"), Conditional: true})
	if err != nil {
		t.Fatalf("create-only CAS: %v", err)
	}
	r5, err := kvWrite(t, n, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpDelete, Key: []byte("a/y")})
	if err != nil {
		t.Fatalf("delete: %v", err)
	}

	check := func(when string) {
		t.Helper()
		got, err := kvGet(t, n, "cfg", "a/x", 0)
		if err != nil || !got.Found || string(got.Entry.Value) != "3" || got.Entry.Revision != r3 {
			t.Fatalf("%s: get a/x = %+v, %v", when, got, err)
		}
		if got, err := kvGet(t, n, "cfg", "a/y", 0); err != nil || got.Found {
			t.Fatalf("%s: get of a deleted key = %+v, %v", when, got, err)
		}
		if got, err := kvGet(t, n, "cfg", "a/x", r1); err != nil || string(got.Entry.Value) != "1" {
			t.Fatalf("%s: get a/x at %d = %+v, %v", when, r1, got, err)
		}
		_, err = kvGet(t, n, "cfg", "a/x", r2) // a revision of another key
		wantCode(t, err, wire.CodeNotFound)
		keys, err := kvCall(t, "keys", func(done func(*wire.KVKeysOK, error)) {
			n.KVKeys(&wire.KVKeys{Bucket: "cfg", Prefix: []byte("a/")}, done)
		})
		if err != nil || len(keys.Keys) != 1 || string(keys.Keys[0]) != "a/x" {
			t.Fatalf("%s: keys a/ = %+v, %v", when, keys, err)
		}
		hist, err := kvCall(t, "history", func(done func(*wire.KVHistoryOK, error)) {
			n.KVHistory(&wire.KVHistory{Bucket: "cfg", Key: []byte("a/y")}, done)
		})
		if err != nil || len(hist.Entries) != 2 || hist.Entries[1].Op != wire.KVOpDelete || hist.Entries[1].Revision != r5 {
			t.Fatalf("%s: history a/y = %+v, %v", when, hist, err)
		}
		infos, err := n.KVBuckets("")
		if err != nil || len(infos) != 1 || infos[0].Config.History != 3 || infos[0].Revision != r5 || infos[0].Keys != 2 {
			t.Fatalf("%s: buckets = %+v, %v", when, infos, err)
		}
		// A watch from 1 sees every write, in order, then the rest as it commits.
		rec := &watchRecorder{}
		w, err := n.KVStartWatch(&wire.KVWatch{Bucket: "cfg", FromRevision: 1, Credit: 100}, rec)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Cancel()
		want := []string{fmt.Sprintf("%d:put:a/x=1", r1), fmt.Sprintf("%d:put:a/y=2", r2), fmt.Sprintf("%d:put:a/x=3", r3),
			fmt.Sprintf("%d:put:b=new", r4), fmt.Sprintf("%d:del:a/y=", r5)}
		eventually(t, when+": the watch sees every write", func() bool { s, _ := rec.seen(t, 1); return len(s) == len(want) })
		if s, end := rec.seen(t, 1); strings.Join(s, " ") != strings.Join(want, " ") || end != nil {
			t.Fatalf("%s: watch saw %v (end %v), want %v", when, s, end, want)
		}
	}
	check("before restart")
	h.restart()
	n = h.node
	check("after restart")
	r6 := kvPut(t, n, "cfg", "a/x", "6")
	if r6 <= r5 {
		t.Fatalf("revision after restart %d, last before %d", r6, r5)
	}
}

// A prefix watch with little credit: events only for its keys, SKIPPED
// for the rest, never more put/deletes than its credit until it gets more.
func TestKVWatchPrefixAndCredit(t *testing.T) {
	h := newHarness(t)
	n := h.node
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "w", History: 1}); err != nil {
		t.Fatal(err)
	}
	rec := &watchRecorder{}
	w, err := n.KVStartWatch(&wire.KVWatch{Bucket: "w", Prefix: []byte("p/"), Credit: 2}, rec)
	if err != nil {
		t.Fatal(err)
	}
	var mine []uint64
	for i := 0; i < 6; i++ {
		kvPut(t, n, "w", fmt.Sprintf("q/%d", i), "other")
		mine = append(mine, kvPut(t, n, "w", fmt.Sprintf("p/%d", i), "mine"))
	}
	eventually(t, "two events", func() bool { s, _ := rec.seen(t, 1); return len(s) == 2 })
	w.AddCredit(10)
	eventually(t, "all six", func() bool { s, _ := rec.seen(t, 1); return len(s) == 6 })
	s, _ := rec.seen(t, 1)
	for i, e := range s {
		if want := fmt.Sprintf("%d:put:p/%d=mine", mine[i], i); e != want {
			t.Fatalf("event %d = %s, want %s", i, e, want)
		}
	}
}

// Bad input is refused with a clear code, and nothing is created.
func TestKVRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	n := h.node
	_, err := kvGet(t, n, "nope", "k", 0)
	wantCode(t, err, wire.CodeNotFound)
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "__x"})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "a/b"})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "b", History: wire.KVHistoryMax + 1})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "b", TombstoneTTLMs: -1})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvCreate(t, n, wire.KVBucketConfig{Bucket: "b", Replicas: 3})
	wantCode(t, err, wire.CodeInvalidArgument)
	if infos, _ := n.KVBuckets(""); len(infos) != 0 {
		t.Fatalf("refused creates made %+v", infos)
	}
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "b"}); err != nil {
		t.Fatal(err)
	}
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: make([]byte, wire.KVKeyBytesMax+1)})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "b", Op: wire.KVOpPut})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: make([]byte, wire.KVValueBytesMax+1)})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = kvWrite(t, n, wire.KVWrite{Bucket: "b", Op: wire.KVOpDelete, Key: []byte("k"), Value: []byte("v")})
	wantCode(t, err, wire.CodeInvalidArgument)
	// A client may not reach the bucket's topic directly.
	_, perr := publishOn(t, n, &wire.Pub{Topic: wire.KVTopic("b"), Partition: wire.PartitionAuto, Value: []byte("x")})
	wantCode(t, perr, wire.CodeInvalidArgument)
	if md := n.Metadata(nil); len(md) != 0 {
		t.Fatalf("METADATA of every topic lists a bucket's topic: %+v", md)
	}
}

// Deleting a bucket drops its keys and ends its watches; its name can be
// created again, empty, with another configuration; and a restart keeps
// all of that.
func TestKVBucketDeleteAndCreateAgain(t *testing.T) {
	h := newHarness(t)
	n := h.node
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "d", History: 2}); err != nil {
		t.Fatal(err)
	}
	kvPut(t, n, "d", "k", "v")
	rec := &watchRecorder{}
	if _, err := n.KVStartWatch(&wire.KVWatch{Bucket: "d", Credit: 10}, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := kvCall(t, "delete", func(done func(struct{}, error)) {
		n.KVDeleteBucket("d", func(err error) { done(struct{}{}, err) })
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch ends", func() bool { _, end := rec.seen(t, 1); return end != nil })
	if _, end := rec.seen(t, 1); end.Code != wire.CodeNotFound {
		t.Fatalf("watch ended with %v", end)
	}
	_, err := kvGet(t, n, "d", "k", 0)
	wantCode(t, err, wire.CodeNotFound)
	if created, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "d", History: 5}); err != nil || !created {
		t.Fatalf("create again: %v, %v", created, err)
	}
	for _, restart := range []bool{false, true} {
		if restart {
			h.restart()
			n = h.node
		}
		if got, err := kvGet(t, n, "d", "k", 0); err != nil || got.Found {
			t.Fatalf("restart=%v: the re-created bucket holds %+v, %v", restart, got, err)
		}
		if infos, err := n.KVBuckets("d"); err != nil || infos[0].Config.History != 5 {
			t.Fatalf("restart=%v: %+v, %v", restart, infos, err)
		}
	}
}

// A deleted key's tombstone is purged by a compaction record once its TTL
// passed; the floor rises past it, and a watch from before the floor gets
// CURSOR_EXPIRED with the floor instead of silently missing the delete.
func TestKVCompactionRaisesTheFloorAndExpiresWatchers(t *testing.T) {
	h := newHarness(t)
	n := h.node
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "c", TombstoneTTLMs: 1000}); err != nil {
		t.Fatal(err)
	}
	kvPut(t, n, "c", "gone", "v")
	del, err := kvWrite(t, n, wire.KVWrite{Bucket: "c", Op: wire.KVOpDelete, Key: []byte("gone")})
	if err != nil {
		t.Fatal(err)
	}
	kept := kvPut(t, n, "c", "kept", "v")
	h.nowMs.Add(2000) // the tombstone's TTL passes (the runner's compaction check runs every second)
	eventually(t, "the floor passes the purged tombstone", func() bool {
		infos, err := n.KVBuckets("c")
		return err == nil && infos[0].Floor == del+1
	})
	rec := &watchRecorder{}
	if _, err := n.KVStartWatch(&wire.KVWatch{Bucket: "c", FromRevision: 1, Credit: 10}, rec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch from 1 ends", func() bool { _, end := rec.seen(t, 1); return end != nil })
	s, end := rec.seen(t, 1)
	if floor, ok := wire.ExpiredFloor(end); !ok || floor != del+1 || len(s) != 0 {
		t.Fatalf("watch from 1: events %v, end %v; want CURSOR_EXPIRED at floor %d", s, end, del+1)
	}
	if v, _, _ := sample(t, n.metrics, "nereus_kv_watch_expired_total", map[string]string{"bucket": "c"}); v != 1 {
		t.Fatalf("nereus_kv_watch_expired_total = %v, want 1", v)
	}
	// From the floor on, the live key is there.
	rec = &watchRecorder{}
	if _, err := n.KVStartWatch(&wire.KVWatch{Bucket: "c", FromRevision: del + 1, Credit: 10}, rec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch from the floor sees the live key", func() bool { s, _ := rec.seen(t, del+1); return len(s) == 1 })
	if s, _ := rec.seen(t, del+1); s[0] != fmt.Sprintf("%d:put:kept=v", kept) {
		t.Fatalf("saw %v", s)
	}
}

// kvCreate creates a bucket through any node, retrying what is
// retryable (an election running), until one creates it.
func (tc *testCluster) kvCreate(c wire.KVBucketConfig) {
	tc.t.Helper()
	eventually(tc.t, "bucket "+c.Bucket+" is created", func() bool {
		for _, n := range tc.nodes {
			created, err := kvCreate(tc.t, n, c)
			var we *wire.Error
			if err != nil && (!errors.As(err, &we) || !we.Code.Retryable()) {
				tc.t.Fatalf("create: %v", err)
			}
			if err == nil {
				return created
			}
		}
		return false
	})
}

// kvLeader waits for the node that answers reads of the bucket.
func (tc *testCluster) kvLeader(bucket string) string {
	tc.t.Helper()
	var at string
	eventually(tc.t, "a node answers for bucket "+bucket, func() bool {
		for id, n := range tc.nodes {
			if _, err := kvGet(tc.t, n, bucket, "probe", 0); err == nil {
				at = id
				return true
			}
		}
		return false
	})
	return at
}

// In a cluster a bucket is replicated: every replica applies its writes,
// only the partition's leader answers, and after the leader dies the new
// one holds every acknowledged write and decides CAS against it.
func TestKVBucketFailsOverInACluster(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.kvCreate(wire.KVBucketConfig{Bucket: "b", History: 2, Replicas: 3})
	leader := tc.kvLeader("b")
	for id, n := range tc.nodes {
		if id == leader {
			continue
		}
		// A follower names the leader once it heard from it (an election
		// that just ended may not have reached it yet).
		var err error
		eventually(t, id+" names the leader", func() bool {
			_, err = kvGet(t, n, "b", "k", 0)
			wantCode(t, err, wire.CodeNotLeader)
			return strings.Contains(err.Error(), "client-of-"+leader)
		})
	}
	var last uint64
	for i := 0; i < 10; i++ {
		last = kvPut(t, tc.nodes[leader], "b", "k", fmt.Sprint(i))
	}
	for id, n := range tc.nodes {
		eventually(t, id+" applies every write", func() bool {
			infos, err := n.KVBuckets("b")
			return err == nil && infos[0].Revision >= last && infos[0].Config.History == 2
		})
	}
	tc.stop(leader)
	next := tc.kvLeader("b")
	got, err := kvGet(t, tc.nodes[next], "b", "k", 0)
	if err != nil || string(got.Entry.Value) != "9" || got.Entry.Revision != last {
		t.Fatalf("new leader %s reads %+v, %v; want 9 at %d", next, got, err, last)
	}
	// CAS against the last acknowledged revision holds at the new leader.
	rev, err := kvWrite(t, tc.nodes[next], wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("10"), Conditional: true, Expected: last})
	if err != nil {
		t.Fatalf("CAS at the new leader: %v", err)
	}
	tc.start(leader)
	eventually(t, leader+" catches up after its restart", func() bool {
		infos, err := tc.nodes[leader].KVBuckets("b")
		return err == nil && infos[0].Revision >= rev
	})
}

// bareRunner is a bucket runner with no goroutine and no log behind it,
// for the decisions that need no I/O.
func bareRunner() *kvRunner {
	n := &Node{cfg: Config{RecordBytesMax: 8 << 20, Env: env.Env{Clock: env.Wall{}}}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics()}
	t := &topic{cfg: wire.TopicConfig{Name: wire.KVTopic("u"), Partitions: 1, Replicas: 1}}
	p := &partitionRunner{node: n, topic: t, done: make(chan struct{})}
	return &kvRunner{n: n, bucket: "u", t: t, p: p, wake: make(chan struct{}, 1),
		writes: map[uint64]func(uint64, error){}, results: map[uint64]kv.ApplyResult{}, watches: map[*KVWatch]*kvWatchState{}}
}

func applyAll(t *testing.T, r *kvRunner, recs ...storage.Record) {
	t.Helper()
	for _, rec := range recs {
		if err := r.apply(&storage.Entry{Seq: r.applied + 1, Record: rec}); err != nil {
			t.Fatalf("apply %d: %v", r.applied+1, err)
		}
	}
}

// The first config record creates the bucket and later ones change
// nothing (two creates racing: the first wins); a delete drops it and
// the next config record creates it again, empty, from its own seq.
func TestKVConfigRecordsFirstOneWins(t *testing.T) {
	r := bareRunner()
	put := storageRecord(kv.EncodeRecord(kv.Write{Op: kv.OpPut, Key: []byte("k"), Value: []byte("v")}))
	applyAll(t, r, kvBucketConf{History: 2, TombstoneTTLMs: 1000}.record(), kvBucketConf{History: 5, TombstoneTTLMs: 9}.record(), put)
	if r.conf.History != 2 || r.confSeq != 1 {
		t.Fatalf("config %+v from seq %d; want the first one", r.conf, r.confSeq)
	}
	if rev, ok := r.state.Get("k"); !ok || rev.Seq != 3 {
		t.Fatalf("k = %+v, %v", rev, ok)
	}
	applyAll(t, r, kvBucketConf{Deleted: true}.record(), put) // a write after the delete lands nowhere
	if r.state != nil {
		t.Fatal("a deleted bucket still holds state")
	}
	applyAll(t, r, kvBucketConf{History: 5, TombstoneTTLMs: 9}.record())
	if _, ok := r.state.Get("k"); ok || r.state.Applied() != 6 || r.conf.History != 5 {
		t.Fatalf("re-created bucket: applied %d, config %+v, k present %v", r.state.Applied(), r.conf, ok)
	}
	// A malformed KV record is not skipped: the cursor stays.
	bad := storage.Record{Headers: []storage.Header{{Key: kv.OpHeader, Value: []byte("bogus")}}}
	if err := r.apply(&storage.Entry{Seq: 7, Record: bad}); err == nil || r.applied != 6 {
		t.Fatalf("malformed record: err %v, applied %d", err, r.applied)
	}
}

// A leader answers nothing before it applied its reign's install entry
// (its bucket could miss a write an earlier leader acknowledged), and a
// log that starts after what the runner applied drops the bucket and
// answers nothing until a checkpoint in the log rebuilt it, rather than
// rebuild a bucket from part of the log.
func TestKVRunnerGuards(t *testing.T) {
	r := bareRunner()
	r.leading, r.reignStart, r.applied = true, 7, 6
	if err := r.ready(); err == nil || err.Code != wire.CodeUnavailable {
		t.Fatalf("before the install entry: %v", err)
	}
	r.applied = 7
	if err := r.ready(); err != nil {
		t.Fatalf("after the install entry: %v", err)
	}
	r = bareRunner()
	r.leading = true
	r.p.commitSeq.Store(10)
	applyAll(t, r, kvBucketConf{History: 1, TombstoneTTLMs: 1000}.record())
	r.p.startSeq.Store(4)
	r.catchUp()
	if err := r.ready(); err == nil || err.Code != wire.CodeUnavailable || !strings.Contains(err.Error(), "rebuilding") || r.applied != 3 || r.state != nil {
		t.Fatalf("log starting at 4: %v, applied %d, bucket %v", err, r.applied, r.state != nil)
	}
}

// A new reign gets a new overlay: the writes in flight in the previous
// one are answered OUTCOME_UNKNOWN (they may still commit, or not), and
// the new overlay starts at the new reign's install entry.
func TestKVNewReignDropsTheOldOverlay(t *testing.T) {
	r := bareRunner()
	applyAll(t, r, kvBucketConf{History: 1, TombstoneTTLMs: 1000}.record())
	r.p.readLog.Store(new(storage.Log)) // held: a single node's partition leads (epoch 0)
	r.followLeadership()
	first := r.leader
	if first == nil {
		t.Fatal("no overlay while leading")
	}
	var answered error
	r.writes[1] = func(_ uint64, err error) { answered = err }
	eff := first.Submit(r.state, kv.Request{ID: 1, Write: kv.Write{Op: kv.OpPut, Key: []byte("k")}}, 0)
	if len(eff.Propose) != 1 {
		t.Fatalf("submit: %+v", eff)
	}
	r.followLeadership() // same reign: the overlay stays
	if r.leader != first || answered != nil {
		t.Fatalf("same reign: overlay replaced (%v) or write answered (%v)", r.leader != first, answered)
	}
	r.epoch = 7 // as if the last round saw another reign
	r.followLeadership()
	if r.leader == first || r.leader == nil {
		t.Fatal("a new reign kept the old overlay")
	}
	var we *wire.Error
	if !errors.As(answered, &we) || we.Code != wire.CodeOutcomeUnknown {
		t.Fatalf("the old reign's write in flight answered %v, want OUTCOME_UNKNOWN", answered)
	}
}

// KV_LIST answers every live entry at one revision, in one answer; a
// listing beyond its bound is refused, not cut short.
func TestKVListIsOneAnswerOrRefused(t *testing.T) {
	h := newHarness(t)
	n := h.node
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "l"}); err != nil {
		t.Fatal(err)
	}
	list := func(prefix string) (*wire.KVListOK, error) {
		return kvCall(t, "list", func(done func(*wire.KVListOK, error)) {
			n.KVList(&wire.KVList{Bucket: "l", Prefix: []byte(prefix)}, done)
		})
	}
	kvPut(t, n, "l", "a/1", "x")
	last := kvPut(t, n, "l", "b/1", "y")
	got, err := list("a/")
	if err != nil || got.BucketRevision != last || len(got.Entries) != 1 || string(got.Entries[0].Value) != "x" {
		t.Fatalf("list a/ = %+v, %v", got, err)
	}
	big := strings.Repeat("v", wire.KVValueBytesMax)
	for i := 0; i*wire.KVValueBytesMax <= wire.KVListBytesMax; i++ {
		kvPut(t, n, "l", fmt.Sprintf("big/%d", i), big)
	}
	_, err = list("big/")
	wantCode(t, err, wire.CodeInvalidArgument)
	if got, err := list("a/"); err != nil || len(got.Entries) != 1 {
		t.Fatalf("a smaller listing after: %+v, %v", got, err)
	}
}

// A request to a closed node is answered (UNAVAILABLE), never left
// waiting for a runner that stopped.
func TestKVAfterCloseIsUnavailable(t *testing.T) {
	h := newHarness(t)
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "z"}); err != nil {
		t.Fatal(err)
	}
	h.node.Close()
	_, err := kvGet(t, h.node, "z", "k", 0)
	wantCode(t, err, wire.CodeUnavailable)
}

// A leader cut off from its replicas stops answering reads once its lease
// lapses (another replica may lead by then and take writes it would not
// see); with the network back, reads are answered again.
func TestKVReadsNeedTheLeadersLease(t *testing.T) {
	peers := newMemNet()
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.Cluster.PeerListener.Close() // the in-memory network instead
		c.Cluster.PeerListener = nil
		c.Env.Peers = peers
	})
	eventually(t, "the bucket is created", func() bool {
		for _, n := range tc.nodes {
			if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "b", Replicas: 3}); err == nil {
				return true
			}
		}
		return false
	})
	leader := tc.kvLeader("b")
	kvPut(t, tc.nodes[leader], "b", "k", "v")
	peers.setCut(true)
	var err error
	eventually(t, "the cut-off leader stops answering reads", func() bool {
		_, err = kvGet(t, tc.nodes[leader], "b", "k", 0)
		return err != nil
	})
	t.Logf("cut off, %s answers: %v", leader, err)
	peers.setCut(false)
	tc.kvLeader("b")
}

// A watcher of a deleted bucket that resumes with its cursor on the
// bucket created again under that name gets CURSOR_EXPIRED
// (RecreationExpiresOldCursors): it holds the old bucket's keys, which
// the new one's events never delete. It used to go on silently, the new
// bucket's revisions on top of the old keys (KVRecreationKeepsFloor). A
// first watch from revision 1 of the new bucket is not expired by that.
func TestKVRecreatedBucketExpiresOldCursors(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("keeps floor=%v", mutation), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) { c.Mutations.KVRecreationKeepsFloor = mutation }
			h.restart()
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
				t.Fatal(err)
			}
			rev := kvPut(t, h.node, "b", "old", "1")
			if _, err := kvCall(t, "delete b", func(done func(bool, error)) {
				h.node.KVDeleteBucket("b", func(err error) { done(true, err) })
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
				t.Fatal(err)
			}
			fresh := kvPut(t, h.node, "b", "new", "1")
			for _, from := range []uint64{rev + 1, 1} {
				rec := &watchRecorder{}
				w, err := h.node.KVStartWatch(&wire.KVWatch{Bucket: "b", FromRevision: from, Credit: 100}, rec)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Cancel()
				eventually(t, fmt.Sprintf("the watch from %d hears something", from), func() bool {
					got, end := rec.seen(t, from)
					return len(got) > 0 || end != nil
				})
				got, end := rec.seen(t, from)
				switch {
				case from == 1 && (end != nil || len(got) == 0 || got[0] != fmt.Sprintf("%d:put:new=1", fresh)):
					t.Fatalf("a first watch from 1: %v, %v; want the new bucket's revisions", got, end)
				case from != 1 && !mutation && (end == nil || end.Code != wire.CodeCursorExpired):
					t.Fatalf("the old bucket's watcher resuming from %d: %v, %v; want CURSOR_EXPIRED", from, got, end)
				case from != 1 && mutation && end != nil:
					t.Fatalf("with the floor kept, the old watcher is not told: %v, %v", got, end)
				}
			}
		})
	}
}
