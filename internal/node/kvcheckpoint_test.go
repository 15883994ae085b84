package node

import (
	"bytes"
	"errors"
	"fmt"
	iofs "io/fs"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Checkpoints and truncation of a bucket's log (kv.go, internal/kv
// checkpoint.go), on a single node and in a cluster.

// kvCheckpointTune makes checkpoints and truncation bite in a short test:
// 4 KiB segments, a checkpoint once 1 KiB of log follows the last one (or
// the state's size, if larger), retention checked every 20 ms.
func kvCheckpointTune(c *Config) {
	c.SegmentBytesMax, c.KVCheckpointMinBytes, c.RetentionCheckMs = 4096, 1024, 20
}

// kvOnRunner runs fn on the goroutine of n's runner of bucket and
// returns what it returns.
func kvOnRunner[T any](t *testing.T, n *Node, bucket string, fn func(r *kvRunner) T) T {
	t.Helper()
	n.kv.mu.Lock()
	r := n.kv.runners[bucket]
	n.kv.mu.Unlock()
	if r == nil {
		t.Fatalf("no runner of bucket %s", bucket)
	}
	ch := make(chan T, 1)
	r.post(func() { ch <- fn(r) })
	select {
	case v := <-ch:
		return v
	case <-time.After(waitMax):
		t.Fatalf("bucket %s's runner does not answer", bucket)
		var zero T
		return zero
	}
}

// kvRunnerState is what a node's runner of bucket holds: the bucket's
// snapshot encoding (nil: no bucket) and the base of its latest
// checkpoint.
func kvRunnerState(t *testing.T, n *Node, bucket string) (snapshot []byte, checkpoint uint64) {
	t.Helper()
	type state struct {
		snapshot   []byte
		checkpoint uint64
	}
	st := kvOnRunner(t, n, bucket, func(r *kvRunner) state {
		if r.state == nil {
			return state{}
		}
		return state{kv.AppendSnapshot(nil, r.state.Snapshot()), r.state.LastCheckpoint()}
	})
	return st.snapshot, st.checkpoint
}

// kvLogOnDisk is the number and total size of the segment files of a
// bucket's log in a node's data dir.
func kvLogOnDisk(t *testing.T, fs *vfs.MemFS, dataDir, bucket string) (segments int, bytes int64) {
	t.Helper()
	dir := path.Join(dataDir, "topics", wire.KVTopic(bucket), "0")
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.HasSuffix(name, ".log") {
			continue
		}
		size, err := fs.Stat(path.Join(dir, name))
		if errors.Is(err, iofs.ErrNotExist) {
			continue // deleted since the listing
		}
		if err != nil {
			t.Fatal(err)
		}
		segments++
		bytes += size
	}
	return segments, bytes
}

// kvOverwrites writes count values to keys keys of bucket at n (a value
// of about 40 bytes each), and returns the last value of each key.
func kvOverwrites(t *testing.T, n *Node, bucket string, keys, count int, want map[string]string) {
	t.Helper()
	for i := range count {
		key, value := fmt.Sprintf("key-%d", i%keys), fmt.Sprintf("value %06d of a run of overwrites", i)
		kvPut(t, n, bucket, key, value)
		want[key] = value
	}
}

// checkKVValues reads every key of want at n.
func checkKVValues(t *testing.T, n *Node, bucket string, want map[string]string) {
	t.Helper()
	for key, value := range want {
		got, err := kvGet(t, n, bucket, key, 0)
		if err != nil || !got.Found || string(got.Entry.Value) != value {
			t.Fatalf("get %s = %+v, %v; want %q", key, got, err, value)
		}
	}
}

// A bucket whose few keys are overwritten many times keeps its log on
// disk bounded (checkpoints, then truncation of whole segments), and a
// restart — which reads only the log from the last checkpoint on —
// rebuilds the bucket exactly: same snapshot encoding, same values, and
// a watch from revision 1 delivers every kept revision (no
// CURSOR_EXPIRED: truncation moves no floor, the checkpoint keeps them).
func TestKVCheckpointBoundsTheLogAcrossRestarts(t *testing.T) {
	h := newHarness(t)
	h.tune = kvCheckpointTune
	h.restart()
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
		t.Fatal(err)
	}
	const keys, rounds, perRound = 10, 10, 200
	want := map[string]string{}
	var maxSegments int
	var maxBytes, written int64
	for round := range rounds {
		kvOverwrites(t, h.node, "b", keys, perRound, want)
		written += perRound * 80
		// Truncation runs in the background: wait for it to catch up,
		// then measure.
		var segments int
		var bytes int64
		eventually(t, fmt.Sprintf("round %d: the bucket's log is truncated to at most 4 segments", round), func() bool {
			segments, bytes = kvLogOnDisk(t, h.fs, "/data", "b")
			return segments <= 4
		})
		maxSegments, maxBytes = max(maxSegments, segments), max(maxBytes, bytes)
	}
	state, base := kvRunnerState(t, h.node, "b")
	t.Logf("%d writes (about %d bytes of records) to %d keys: the state is %d bytes; at most %d segments, %d bytes on disk after each round; latest checkpoint at %d",
		rounds*perRound, written, keys, len(state), maxSegments, maxBytes, base)
	if base == 0 {
		t.Fatal("no checkpoint was written")
	}
	if written < 20*int64(len(state)) {
		t.Fatalf("only %d bytes written for a %d-byte state", written, len(state))
	}
	start := h.node.topics[wire.KVTopic("b")].partitions[0].startSeq.Load()
	if start <= 1 {
		t.Fatalf("the log was never truncated (latest checkpoint at %d)", base)
	}

	// Metrics: every write acknowledged, the checkpoints written.
	if v, _, _ := sample(t, h.node.metrics, "nereus_kv_writes_total", map[string]string{"bucket": "b"}); v != rounds*perRound {
		t.Fatalf("nereus_kv_writes_total = %v, want %d", v, rounds*perRound)
	}
	if v, _, _ := sample(t, h.node.metrics, "nereus_kv_checkpoints_total", map[string]string{"bucket": "b"}); v < 1 {
		t.Fatalf("nereus_kv_checkpoints_total = %v with a checkpoint at %d", v, base)
	}

	h.restart()
	var again []byte
	eventually(t, "the restarted node rebuilds the bucket", func() bool {
		again, _ = kvRunnerState(t, h.node, "b")
		return again != nil
	})
	if v, _, _ := sample(t, h.node.metrics, "nereus_kv_rebuilds_total", map[string]string{"bucket": "b"}); v != 1 {
		t.Fatalf("nereus_kv_rebuilds_total = %v after the restart's rebuild, want 1", v)
	}
	if !bytes.Equal(again, state) {
		t.Fatalf("the bucket after the restart differs:\n got %x\nwant %x", again, state)
	}
	checkKVValues(t, h.node, "b", want)
	rec := &watchRecorder{}
	if _, err := h.node.KVStartWatch(&wire.KVWatch{Bucket: "b", FromRevision: 1, Credit: 100}, rec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch from 1 delivers the live keys", func() bool { s, end := rec.seen(t, 1); return len(s) == keys || end != nil })
	seen, end := rec.seen(t, 1)
	if end != nil || len(seen) != keys {
		t.Fatalf("watch from 1 (below the log's start %d): %v, end %v; want the %d kept revisions", start, seen, end, keys)
	}
	for _, s := range seen {
		_, kv, _ := strings.Cut(s, ":put:")
		key, value, _ := strings.Cut(kv, "=")
		if want[key] != value {
			t.Fatalf("watch delivered %s; the key's value is %q", s, want[key])
		}
	}
	// Writes go on after the rebuild.
	kvOverwrites(t, h.node, "b", keys, 50, want)
	checkKVValues(t, h.node, "b", want)
}

// stopKVFollower stops a follower of bucket (not leader) once it applied
// writes of a bucket whose history is history (0: any), and returns it
// and the end of its log.
func (tc *testCluster) stopKVFollower(bucket, leader string, history int) (string, uint64) {
	tc.t.Helper()
	var follower string
	for id := range tc.nodes {
		if id != leader {
			follower = id
			break
		}
	}
	eventually(tc.t, follower+" applies the first writes", func() bool {
		infos, err := tc.nodes[follower].KVBuckets(bucket)
		return err == nil && (history == 0 || int(infos[0].Config.History) == history) && infos[0].Revision > 0
	})
	fp := tc.nodes[follower].topics[wire.KVTopic(bucket)].partitions[0]
	tc.stop(follower)
	return follower, fp.readLog.Load().NextSeq() - 1
}

// kvReplicasAgree waits until every node holds the same bucket (equal
// snapshot encodings).
func (tc *testCluster) kvReplicasAgree(bucket string) {
	tc.t.Helper()
	var encodings [][]byte
	eventually(tc.t, "every replica holds the same bucket", func() bool {
		encodings = encodings[:0]
		for _, n := range tc.nodes {
			s, _ := kvRunnerState(tc.t, n, bucket)
			encodings = append(encodings, s)
		}
		return bytes.Equal(encodings[0], encodings[1]) && bytes.Equal(encodings[1], encodings[2])
	})
}

// A follower that was down while the leader checkpointed and truncated
// the bucket's log (past what the follower had) is reset to the leader's
// snapshot point, reads on to the checkpoint in the log, and ends with
// the same bucket as the others: equal snapshot encodings on every
// replica.
func TestKVFollowerRebuildsFromTheCheckpointInTheLog(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) {
		kvCheckpointTune(c)
		c.Cluster.Reservation = 200 * time.Millisecond
	})
	tc.kvCreate(wire.KVBucketConfig{Bucket: "b", History: 2, Replicas: 3})
	leader := tc.kvLeader("b")
	want := map[string]string{}
	kvOverwrites(t, tc.nodes[leader], "b", 8, 50, want)
	follower, behind := tc.stopKVFollower("b", leader, 2)
	// The two others go on: writes, checkpoints, truncation past what the
	// follower has.
	p := tc.nodes[leader].topics[wire.KVTopic("b")].partitions[0]
	// (The leader keeps what a silent follower needs for the
	// reservation, 200 ms.)
	eventually(t, "the leader truncates its log past what "+follower+" has", func() bool {
		kvOverwrites(t, tc.nodes[leader], "b", 8, 100, want)
		return p.startSeq.Load() > behind+1
	})
	t.Logf("the leader's log starts at %d; %s's log ended at %d", p.startSeq.Load(), follower, behind)
	tc.start(follower)
	last := kvPut(t, tc.nodes[leader], "b", "last", "write")
	want["last"] = "write"
	eventually(t, follower+" rebuilds the bucket and applies every write", func() bool {
		infos, err := tc.nodes[follower].KVBuckets("b")
		return err == nil && infos[0].Revision >= last && infos[0].Config.History == 2
	})
	tc.kvReplicasAgree("b")
	start := tc.nodes[follower].topics[wire.KVTopic("b")].partitions[0].startSeq.Load()
	if start <= behind+1 {
		t.Fatalf("%s's log starts at %d: it caught up from the log (its log ended at %d), not from a checkpoint", follower, start, behind)
	}
	checkKVValues(t, tc.nodes[leader], "b", want)
	// The rebuilt follower can lead: stop the others' leader.
	tc.stop(leader)
	next := tc.kvLeader("b")
	checkKVValues(t, tc.nodes[next], "b", want)
}

// A leader under a steady stream of pipelined writes still checkpoints
// and truncates: a due checkpoint holds new writes back until what is in
// flight commits, so its chunks land right after the state they carry —
// none is void (CheckpointBaseIsPrecedingSeq voids one proposed behind
// writes in flight). On a single node and in a cluster, where
// replication keeps writes in flight longer.
func TestKVCheckpointUnderPipelinedWrites(t *testing.T) {
	t.Run("single node", func(t *testing.T) {
		h := newHarness(t)
		h.tune = kvCheckpointTune
		h.restart()
		if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
			t.Fatal(err)
		}
		pipelinedCheckpoints(t, h.node)
	})
	t.Run("cluster", func(t *testing.T) {
		tc := newTestClusterWith(t, 3, kvCheckpointTune)
		tc.kvCreate(wire.KVBucketConfig{Bucket: "b", Replicas: 3})
		pipelinedCheckpoints(t, tc.nodes[tc.kvLeader("b")])
	})
}

// pipelinedCheckpoints writes to bucket b at n with 32 writes always in
// flight, and checks that n checkpointed with no void chunk (unless its
// reign ended meanwhile: an install entry voids a run cut short) and
// truncated its log.
func pipelinedCheckpoints(t *testing.T, n *Node) {
	const inflight, writes = 32, 4000
	p := n.topics[wire.KVTopic("b")].partitions[0]
	epoch := p.epoch.Load()
	slots := make(chan struct{}, inflight)
	failed := make(chan error, writes)
	for i := range writes {
		slots <- struct{}{}
		w := &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte(fmt.Sprintf("key-%d", i%10)), Value: []byte(fmt.Sprintf("value %06d of a run of overwrites", i))}
		n.KVWrite(w, func(_ uint64, err error) {
			if err != nil {
				failed <- err
			}
			<-slots
		})
	}
	for range inflight {
		slots <- struct{}{}
	}
	close(failed)
	for err := range failed {
		t.Fatalf("a write failed: %v", err)
	}
	void := kvOnRunner(t, n, "b", func(r *kvRunner) int { return r.voidChunks })
	_, base := kvRunnerState(t, n, "b")
	t.Logf("%d writes, %d in flight: latest checkpoint at %d, %d void chunks", writes, inflight, base, void)
	if base == 0 {
		t.Fatal("no checkpoint")
	}
	if void != 0 && p.epoch.Load() == epoch {
		t.Fatalf("%d checkpoint chunks were void", void)
	}
	eventually(t, "the log is truncated", func() bool { return p.startSeq.Load() > 1 })
}

// refusingStore refuses every publish at once (as a leader the partition
// no longer lets propose does), counting them.
type refusingStore struct {
	unhostedStore
	refused *int
}

func (s refusingStore) accept(r *pubReq) {
	*s.refused++
	r.answer(wire.PubOK{}, wire.Errorf(wire.CodeNotLeader, "refused"))
}

// dueCheckpointLeader is a bare runner leading a single node's bucket
// whose checkpoint is due, on a test clock whose wall reading the test can
// step alone (clock.wallStepMs); its partition refuses every proposal at
// once and counts them in refused. lg is the partition's log.
func dueCheckpointLeader(t *testing.T) (r *kvRunner, lg *storage.Log, clock testClock, refused *int) {
	t.Helper()
	r = bareRunner()
	clock = testClock{nowMs: new(atomic.Int64), wallStepMs: new(atomic.Int64)}
	clock.nowMs.Store(1_000_000)
	r.n.cfg.Env.Clock = clock
	r.n.cfg.KVCheckpointMinBytes = 1
	refused = new(int)
	r.p.store = refusingStore{unhostedStore{r.p}, refused}
	lg, err := storage.Open(vfs.NewMem(), "/log", storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	recs := []storage.Record{kvBucketConf{History: 1, TombstoneTTLMs: 1000}.record()}
	for i := range 5 {
		recs = append(recs, storageRecord(kv.EncodeRecord(kv.Write{Op: kv.OpPut, Key: []byte("k"), Value: []byte(fmt.Sprint(i))})))
	}
	if _, err := lg.Append(1, recs); err != nil {
		t.Fatal(err)
	}
	applyAll(t, r, recs...)
	r.p.readLog.Store(lg) // held: a single node's partition leads
	r.followLeadership()
	if r.leader == nil || !r.state.CheckpointDue(1) {
		t.Fatalf("leader %v, checkpoint due %v", r.leader != nil, r.state.CheckpointDue(1))
	}
	return r, lg, clock, refused
}

// A leader whose checkpoint's chunks are refused at once does not propose
// them again before a tick: proposing again at the same instant, round
// after round, spun a simulated node (its Step never ended).
func TestKVRefusedCheckpointWaitsATick(t *testing.T) {
	r, _, clock, refused := dueCheckpointLeader(t)
	r.maybeCheckpoint()
	r.runInbox()
	first := *refused
	if first == 0 || r.checkpointing {
		t.Fatalf("%d chunks proposed, still checkpointing %v", first, r.checkpointing)
	}
	for range 10 { // rounds at the same instant
		r.maybeCheckpoint()
		r.runInbox()
	}
	if *refused != first {
		t.Fatalf("the refused checkpoint was proposed again at the same instant: %d chunks, then %d", first, *refused)
	}
	clock.nowMs.Add(kvTick.Milliseconds())
	r.maybeCheckpoint()
	r.runInbox()
	if *refused != 2*first {
		t.Fatalf("a tick later: %d chunks proposed in all, want %d", *refused, 2*first)
	}
}

// TestKVCheckpointWaitsRunOnTheMonotonicClock guards
// CheckpointWaitsAreMonotonic: a step of the wall clock an hour either
// way neither lets a refused checkpoint be proposed again before its
// tick, nor ends a checkpoint's drain (the writes it holds back while
// what is in flight commits) before kvCheckpointDrainMs. On the wall
// clock both waits gave up at once.
func TestKVCheckpointWaitsRunOnTheMonotonicClock(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		t.Run("retry "+step.String(), func(t *testing.T) {
			r, _, clock, refused := dueCheckpointLeader(t)
			r.maybeCheckpoint()
			r.runInbox()
			first := *refused
			if first == 0 {
				t.Fatal("setup: no checkpoint proposed")
			}
			clock.wallStepMs.Store(step.Milliseconds())
			r.maybeCheckpoint()
			r.runInbox()
			if *refused != first {
				t.Fatalf("the wall clock stepped %v: the refused checkpoint was proposed again before its tick (%d chunks, then %d)", step, first, *refused)
			}
			clock.nowMs.Add(kvTick.Milliseconds())
			r.maybeCheckpoint()
			r.runInbox()
			if *refused != 2*first {
				t.Fatalf("a tick later: %d chunks proposed in all, want %d", *refused, 2*first)
			}
		})
		t.Run("drain "+step.String(), func(t *testing.T) {
			r, lg, clock, refused := dueCheckpointLeader(t)
			// A record in the log that the runner has not applied yet: in
			// flight, so the due checkpoint drains.
			if _, err := lg.Append(1, []storage.Record{storageRecord(kv.EncodeRecord(kv.Write{Op: kv.OpPut, Key: []byte("k"), Value: []byte("in flight")}))}); err != nil {
				t.Fatal(err)
			}
			r.maybeCheckpoint()
			r.write(kv.Write{Op: kv.OpPut, Key: []byte("k"), Value: []byte("held")}, func(uint64, error) {})
			if r.drainSinceMs == 0 || len(r.held) != 1 || *refused != 0 {
				t.Fatalf("setup: draining since %d, %d writes held, %d proposed; want a drain holding the write", r.drainSinceMs, len(r.held), *refused)
			}
			clock.wallStepMs.Store(step.Milliseconds())
			clock.nowMs.Add(kvCheckpointDrainMs - 1)
			r.maybeCheckpoint()
			if len(r.held) != 1 || *refused != 0 {
				t.Fatalf("the wall clock stepped %v: the drain let its write go %d ms in, before %d ms", step, kvCheckpointDrainMs-1, kvCheckpointDrainMs)
			}
			clock.nowMs.Add(1)
			r.maybeCheckpoint()
			if len(r.held) != 0 || *refused != 1 {
				t.Fatalf("%d ms into the drain: %d writes held, %d proposed; want the write let go", kvCheckpointDrainMs, len(r.held), *refused)
			}
		})
	}
}

// DeletedBucketKeepsNoLog: a bucket deleted before it ever checkpointed
// kept its whole log. Now its log is compacted up to the delete record;
// a restart, whose log then starts after what it applied, rebuilds from
// that record — no bucket, NOT_FOUND rather than UNAVAILABLE while it
// looks for a checkpoint that will never come — and the name created
// again works and survives another restart.
func TestKVDeletedBucketKeepsNoLog(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) {
		kvCheckpointTune(c)
		c.KVCheckpointMinBytes = -1 // no checkpoint: only the delete frees the log
	}
	h.restart()
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
		t.Fatal(err)
	}
	kvOverwrites(t, h.node, "b", 10, 300, map[string]string{})
	before, _ := kvLogOnDisk(t, h.fs, "/data", "b")
	p := h.node.topics[wire.KVTopic("b")].partitions[0]
	time.Sleep(100 * time.Millisecond) // five retention checks
	if start := p.startSeq.Load(); start != 1 || before < 4 {
		t.Fatalf("before the delete: the log starts at %d over %d segments, want 1 over at least 4 (no checkpoint)", start, before)
	}
	if _, err := kvCall(t, "delete", func(done func(struct{}, error)) {
		h.node.KVDeleteBucket("b", func(err error) { done(struct{}{}, err) })
	}); err != nil {
		t.Fatal(err)
	}
	// The delete record is the log's last: the log may go up to it, and
	// keeps it (a rebuild starts there).
	del := p.readLog.Load().NextSeq() - 1
	eventually(t, "the limit reaches the delete record", func() bool { return p.kvCompactLimit.Load() >= del-1 })
	if limit := p.kvCompactLimit.Load(); limit != del-1 {
		t.Fatalf("compaction limit %d with the delete record at %d: want %d (the record kept)", limit, del, del-1)
	}
	eventually(t, "the deleted bucket's log is compacted to its last segment", func() bool {
		segments, _ := kvLogOnDisk(t, h.fs, "/data", "b")
		return segments <= 1
	})

	h.restart()
	p = h.node.topics[wire.KVTopic("b")].partitions[0]
	if p.startSeq.Load() <= 1 {
		t.Fatal("the log starts at 1 after the restart (the test is off)")
	}
	eventually(t, "the restarted node answers NOT_FOUND", func() bool {
		_, err := kvGet(t, h.node, "b", "key-0", 0)
		var we *wire.Error
		return errors.As(err, &we) && we.Code == wire.CodeNotFound
	})
	if created, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b", History: 3}); err != nil || !created {
		t.Fatalf("create again: %v, %v", created, err)
	}
	want := map[string]string{}
	kvOverwrites(t, h.node, "b", 3, 10, want)
	h.restart()
	eventually(t, "the re-created bucket is back after a restart", func() bool {
		infos, err := h.node.KVBuckets("b")
		return err == nil && infos[0].Config.History == 3
	})
	checkKVValues(t, h.node, "b", want)
}

// A follower down while its bucket was written (no checkpoint) and
// deleted, and the log compacted up to the delete past what it had: it is
// reset to the leader's snapshot point, rebuilds "no bucket" from the
// delete record, and applies the bucket created again like the others.
func TestKVFollowerRebuildsADeletedBucket(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) {
		kvCheckpointTune(c)
		c.KVCheckpointMinBytes = -1
		c.Cluster.Reservation = 200 * time.Millisecond
	})
	tc.kvCreate(wire.KVBucketConfig{Bucket: "b", Replicas: 3})
	leader := tc.kvLeader("b")
	kvOverwrites(t, tc.nodes[leader], "b", 8, 20, map[string]string{})
	follower, behind := tc.stopKVFollower("b", leader, 0)
	kvOverwrites(t, tc.nodes[leader], "b", 8, 200, map[string]string{})
	if _, err := kvCall(t, "delete", func(done func(struct{}, error)) {
		tc.nodes[leader].KVDeleteBucket("b", func(err error) { done(struct{}{}, err) })
	}); err != nil {
		t.Fatal(err)
	}
	p := tc.nodes[leader].topics[wire.KVTopic("b")].partitions[0]
	eventually(t, "the leader compacts past what "+follower+" has", func() bool { return p.startSeq.Load() > behind+1 })
	tc.start(follower)
	tc.kvCreate(wire.KVBucketConfig{Bucket: "b", History: 4, Replicas: 3})
	leader = tc.kvLeader("b")
	last := kvPut(t, tc.nodes[leader], "b", "after", "the re-create")
	eventually(t, follower+" applies the re-created bucket", func() bool {
		infos, err := tc.nodes[follower].KVBuckets("b")
		return err == nil && infos[0].Config.History == 4 && infos[0].Revision >= last
	})
	if start := tc.nodes[follower].topics[wire.KVTopic("b")].partitions[0].startSeq.Load(); start <= behind+1 {
		t.Fatalf("%s's log starts at %d: it caught up from the log (it ended at %d), not from the delete", follower, start, behind)
	}
	tc.kvReplicasAgree("b")
}
