package node

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A bucket whose log a bit flip damaged, on a single node
// (KVAnswersOnlyWhenCaughtUp, DroppedNeverSkippedSilently). Its runner
// cannot apply past the damage, so it answers nothing — reads and writes
// get DATA_CORRUPT naming the repair — where it used to answer from the
// state before the damage: every later key "not found", a write
// OUTCOME_UNKNOWN. After `nereus repair` it steps over the dropped seq:
// every other key is back, writes are taken, and a watch from before the
// gap gets CURSOR_EXPIRED (the floor rose above it) instead of missing
// the lost write in silence, and so does a watch from past the gap (one
// that saw the lost write): the fence the leader writes after the
// repair expires every cursor up to it. A checkpoint after the gap holds the state
// as of its base, the lost write included: the bucket is rebuilt from it
// instead of stopping on its mismatch, and the write is back, watch
// included. Before, a bucket stopped at the
// repair's gap for good (its reads still answering from before it, its
// writes never answered).
func TestKVBucketDamageIsRefusedUntilRepaired(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool // a checkpoint follows the damaged write
		mutation   bool // KVAnswersBehind
	}{{"no checkpoint after the damage", false, false}, {"a checkpoint after the damage", true, false}, {"answers behind", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.Mutations.KVAnswersBehind = tc.mutation
				c.ScrubBytesPerSecond = -1 // the runner's read finds it
				if tc.checkpoint {
					c.KVCheckpointMinBytes = 512
				}
			}
			h.restart()
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "cfg", History: 1}); err != nil {
				t.Fatal(err)
			}
			value := func(i int) string { return fmt.Sprintf("v%02d-%s", i, strings.Repeat("x", 40)) }
			revs := make([]uint64, 20)
			for i := range revs {
				revs[i] = kvPut(t, h.node, "cfg", fmt.Sprintf("k%02d", i), value(i))
			}
			if _, base := kvRunnerState(t, h.node, "cfg"); tc.checkpoint != (base >= revs[5]) {
				t.Fatalf("latest checkpoint at %d, k05 written at %d: the case proves nothing", base, revs[5])
			}
			h.node.Close()
			flipInSegments(t, h.fs, "/data/topics/__kv.cfg/0", []byte("v05-"))
			h.open()

			got, err := kvGet(t, h.node, "cfg", "k19", 0)
			if tc.mutation {
				if err != nil || got.Found {
					t.Fatalf("answering behind: get k19 = %+v, %v; want the old wrong answer, not found", got, err)
				}
				return
			}
			for _, k := range []string{"k04", "k19"} {
				_, err := kvGet(t, h.node, "cfg", k, 0)
				wantCode(t, err, wire.CodeDataCorrupt)
				if !strings.Contains(err.Error(), "nereus repair") {
					t.Fatalf("get %s: %v, want the repair named", k, err)
				}
			}
			_, err = kvWrite(t, h.node, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("new"), Value: []byte("1")})
			wantCode(t, err, wire.CodeDataCorrupt) // definite: nothing was proposed

			h.node.Close()
			if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
				t.Fatal(err)
			}
			h.open()
			for i := range revs {
				k := fmt.Sprintf("k%02d", i)
				got, err := kvGet(t, h.node, "cfg", k, 0)
				if err != nil {
					t.Fatalf("get %s after the repair: %v", k, err)
				}
				lost := i == 5 && !tc.checkpoint // else the checkpoint holds it
				if got.Found == lost || (!lost && string(got.Entry.Value) != value(i)) {
					t.Fatalf("get %s after the repair = %+v, want found=%v", k, got, !lost)
				}
			}
			if _, err := kvWrite(t, h.node, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("new"), Value: []byte("1")}); err != nil {
				t.Fatalf("write after the repair: %v", err)
			}
			rec := &watchRecorder{}
			w, err := h.node.KVStartWatch(&wire.KVWatch{Bucket: "cfg", FromRevision: revs[4], Credit: 100}, rec)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Cancel()
			if tc.checkpoint {
				// Rebuilt from the checkpoint: the lost write is a revision
				// again, and the watch goes through it without a gap (seen).
				want := fmt.Sprintf("%d:put:k05=%s", revs[5], value(5))
				eventually(t, "the watch from before the gap delivers "+want, func() bool {
					got, _ := rec.seen(t, revs[4])
					return len(got) > 1 && got[1] == want
				})
				return
			}
			eventually(t, "the watch from before the gap ends", func() bool { _, end := rec.seen(t, revs[4]); return end != nil })
			if _, end := rec.seen(t, revs[4]); end.Code != wire.CodeCursorExpired {
				t.Fatalf("watch from %d, before the dropped seq: %v, want CURSOR_EXPIRED", revs[4], end)
			}
			// A watcher that saw the lost write — its cursor past the gap,
			// or past every write before the repair — is told too: the
			// leader's fence expired every cursor up to it
			// (LossExpiresEveryCursor).
			for _, from := range []uint64{revs[6], revs[19] + 1} {
				rec := &watchRecorder{}
				w, err := h.node.KVStartWatch(&wire.KVWatch{Bucket: "cfg", FromRevision: from, Credit: 100}, rec)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Cancel()
				eventually(t, fmt.Sprintf("the watch from %d ends", from), func() bool { _, end := rec.seen(t, from); return end != nil })
				if _, end := rec.seen(t, from); end.Code != wire.CodeCursorExpired {
					t.Fatalf("watch from %d, past the dropped seq: %v, want CURSOR_EXPIRED", from, end)
				}
			}
			// A restart replays the gap and then the fence: no other.
			type point struct{ applied, floor uint64 }
			at := func() point {
				return kvOnRunner(t, h.node, "cfg", func(r *kvRunner) point {
					if r.state == nil || len(r.lost) > 0 || r.fencing {
						return point{}
					}
					return point{r.applied, r.state.Floor()}
				})
			}
			eventually(t, "the fence applied", func() bool { return at() != point{} })
			before := at()
			h.node.Close()
			h.open()
			eventually(t, "the bucket replayed after a restart", func() bool { return at().applied >= before.applied })
			if after := at(); after != before {
				t.Fatalf("after a restart: applied and floor %+v, before it %+v (fenced again?)", after, before)
			}
		})
	}
}

// A write to a bucket whose partition went corrupt while its runner had
// applied everything (the scrubber found damage in a sealed segment) is
// refused at once with DATA_CORRUPT: nothing is proposed, so the answer
// is definite. It used to be proposed, refused by the partition, and
// answered OUTCOME_UNKNOWN ("may or may not commit"). Reads go on: the
// bucket's state is whole.
func TestKVWriteToACorruptPartitionIsRefused(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { c.SegmentBytesMax, c.ScrubBytesPerSecond = 4<<10, -1 }
	h.restart()
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "cfg", History: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		kvPut(t, h.node, "cfg", fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d-%s", i, strings.Repeat("x", 40)))
	}
	topic := wire.KVTopic("cfg")
	if segs := segmentsOf(t, h.fs, topic, 0); len(segs) < 2 {
		t.Fatalf("%d segments: none sealed", len(segs))
	}
	flipInSegments(t, h.fs, "/data/topics/"+topic+"/0", []byte("v05-")) // in the first, sealed segment
	s := &scrubber{n: h.node, from: map[*partitionRunner]uint64{}}
	for range 10 {
		s.step(1 << 30)
	}
	if st := partitionState(h, topic, 0); st != wire.PartitionStateCorrupt {
		t.Fatalf("state %q after scrubbing, want corrupt", st)
	}
	_, err := kvWrite(t, h.node, wire.KVWrite{Bucket: "cfg", Op: wire.KVOpPut, Key: []byte("new"), Value: []byte("1")})
	wantCode(t, err, wire.CodeDataCorrupt)
	if got, err := kvGet(t, h.node, "cfg", "k05", 0); err != nil || !got.Found {
		t.Fatalf("get k05 = %+v, %v: the bucket's state is whole", got, err)
	}
}

// A bucket whose log lost every checkpoint to a repair (its log truncated
// up to the latest one, which a bit flip damaged): its runner rebuilds
// from a checkpoint and has none left, so it cannot be rebuilt. It says
// so — DATA_CORRUPT naming the lost seqs and the way out — instead of
// "rebuilding; retry" for good, and takes a delete of the bucket (refused
// before, like every request), after which the bucket is created again.
// Before the repair the bucket answers its partition's DATA_CORRUPT, not
// NOT_LEADER "no replica on this node" (its only replica, here, did not
// open).
func TestKVBucketThatLostItsCheckpointSaysSo(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { kvCheckpointTune(c); c.ScrubBytesPerSecond = -1 }
	h.restart()
	kvOverwrittenBucket(t, h)
	eventually(t, "the bucket's log is truncated to its checkpoint", func() bool {
		return h.node.topics[wire.KVTopic("b")].partitions[0].startSeq.Load() > 1
	})
	h.node.Close()
	chunks := flipBucketBatches(t, h.fs, "b", -1, func(w kv.Write, _ *storage.Record) bool { return w.Op == kv.OpCheckpoint })
	if chunks == 0 {
		t.Fatal("no checkpoint chunk in the bucket's log")
	}
	h.open()
	_, err := kvGet(t, h.node, "b", "k0", 0)
	wantCode(t, err, wire.CodeDataCorrupt)
	h.node.Close()
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatal(err)
	}
	h.open()
	eventually(t, "the bucket says it cannot be rebuilt", func() bool {
		_, err := kvGet(t, h.node, "b", "k0", 0)
		var we *wire.Error
		return errors.As(err, &we) && we.Code == wire.CodeDataCorrupt && strings.Contains(we.Message, "delete the bucket")
	})
	_, err = kvWrite(t, h.node, wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("new"), Value: []byte("1")})
	wantCode(t, err, wire.CodeDataCorrupt)
	if _, err := kvCall(t, "delete b", func(done func(bool, error)) {
		h.node.KVDeleteBucket("b", func(err error) { done(true, err) })
	}); err != nil {
		t.Fatalf("delete of the lost bucket: %v", err)
	}
	if created, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil || !created {
		t.Fatalf("create again: %v, %v", created, err)
	}
	kvPut(t, h.node, "b", "new", "1")
	if got, err := kvGet(t, h.node, "b", "new", 0); err != nil || !got.Found {
		t.Fatalf("get new = %+v, %v", got, err)
	}
}

// A bucket of one replica whose latest checkpoint a bit flip damaged
// loses nothing (CheckpointDamageCostsNoBucket): its log goes back to the
// checkpoint before that one, so after `nereus repair` the bucket is
// rebuilt from it and the records that follow, every write there. It
// used to be compacted through the latest one, as a replicated bucket's
// is, and one flipped chunk cost the whole bucket ("delete the bucket
// and create it again": KVLoneKeepsOneCheckpoint).
func TestKVBucketOfOneReplicaSurvivesADamagedCheckpoint(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("keeps one checkpoint=%v", mutation), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				kvCheckpointTune(c)
				c.ScrubBytesPerSecond = -1
				c.Mutations.KVLoneKeepsOneCheckpoint = mutation
			}
			h.restart()
			want := kvOverwrittenBucket(t, h)
			// The log truncated: to the previous checkpoint, or (the
			// mutation) past its first chunk, so that only the latest
			// checkpoint can rebuild the bucket. More writes until then
			// (truncation goes by whole segments). Each look waits for the
			// runner to be done checkpointing: a checkpoint still due or in
			// flight when the node closes would be a later one than the one
			// flipped.
			var latest uint64
			truncated := func() bool {
				eventually(t, "the bucket's checkpoints settle", func() bool {
					return kvOnRunner(t, h.node, "b", func(r *kvRunner) bool {
						b, err := r.readyBucket()
						return err == nil && !r.checkpointing && r.proposing == 0 && !b.CheckpointDue(r.n.cfg.KVCheckpointMinBytes)
					})
				})
				type bases struct{ prev, latest uint64 }
				b := kvOnRunner(t, h.node, "b", func(r *kvRunner) bases { return bases{r.prevCheckpointBase, r.checkpointBase} })
				start := h.node.topics[wire.KVTopic("b")].partitions[0].startSeq.Load()
				latest = b.latest
				return b.prev > 0 && start > 1 && (!mutation || start > b.prev+1)
			}
			for i := 0; !truncated(); i++ {
				if i == 20 {
					t.Fatal("the bucket's log is not truncated as the case needs")
				}
				kvOverwrites(t, h.node, "b", 10, 50, want)
				time.Sleep(50 * time.Millisecond)
			}
			h.node.Close()
			if flipBucketBatches(t, h.fs, "b", 1, func(w kv.Write, _ *storage.Record) bool {
				return w.Op == kv.OpCheckpoint && w.Chunk.Base == latest
			}) == 0 {
				t.Fatalf("no chunk of the latest checkpoint (base %d) in the log", latest)
			}
			if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
				t.Fatal(err)
			}
			h.open()
			if mutation {
				eventually(t, "the bucket says it cannot be rebuilt", func() bool {
					_, err := kvGet(t, h.node, "b", "key-0", 0)
					var we *wire.Error
					return errors.As(err, &we) && we.Code == wire.CodeDataCorrupt && strings.Contains(we.Message, "delete the bucket")
				})
				return
			}
			eventually(t, "the bucket answers", func() bool { _, err := kvGet(t, h.node, "b", "key-0", 0); return err == nil })
			checkKVValues(t, h.node, "b", want)
		})
	}
}

// A bucket of one replica whose creation record a bit flip damaged
// (LostCreationIsSaid): after `nereus repair` its runner cannot know the
// bucket from the records that follow, so it rebuilds it from the next
// checkpoint (which carries the configuration; every write through its
// base back) or, with none, says it cannot be rebuilt — DATA_CORRUPT
// naming the way out — where it used to answer NOT_FOUND for a bucket its
// clients created (KVLostCreationSkipped).
func TestKVBucketThatLostItsCreationSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool // a checkpoint follows the creation
		mutation   bool
	}{{"no checkpoint", false, false}, {"a checkpoint after it", true, false}, {"creation skipped", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.ScrubBytesPerSecond = -1
				c.Mutations.KVLostCreationSkipped = tc.mutation
				if tc.checkpoint {
					kvCheckpointTune(c)
					// No retention pass: with two checkpoints written, one
					// truncates the log past the creation record the case
					// damages (under load it ran before the close).
					c.RetentionCheckMs = 3_600_000
				}
			}
			h.restart()
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			kvOverwrites(t, h.node, "b", 10, 100, want)
			if _, base := kvRunnerState(t, h.node, "b"); (base > 0) != tc.checkpoint {
				t.Fatalf("latest checkpoint at %d: the case proves nothing", base)
			}
			h.node.Close()
			if flipBucketBatches(t, h.fs, "b", 1, func(_ kv.Write, r *storage.Record) bool {
				return len(r.Headers) > 0 && r.Headers[0].Key == kvConfigHeader
			}) == 0 {
				t.Fatal("no creation record in the bucket's log")
			}
			if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
				t.Fatal(err)
			}
			h.open()
			var err error
			eventually(t, "the bucket answers", func() bool {
				_, err = kvGet(t, h.node, "b", "key-0", 0)
				var we *wire.Error
				return !errors.As(err, &we) || we.Code != wire.CodeUnavailable
			})
			switch {
			case tc.mutation:
				wantCode(t, err, wire.CodeNotFound)
			case tc.checkpoint:
				if err != nil {
					t.Fatalf("get after the repair: %v", err)
				}
				checkKVValues(t, h.node, "b", want)
			default:
				wantCode(t, err, wire.CodeDataCorrupt)
				if !strings.Contains(err.Error(), "may have held its creation") || !strings.Contains(err.Error(), "delete the bucket") {
					t.Fatalf("get after the repair: %v, want the lost creation and the way out named", err)
				}
			}
		})
	}
}

// flipBucketBatches flips a bit in the middle of each batch of bucket's
// log (on a closed node) whose first record match takes (w: its KV
// decoding, zero if none), at most limit of them (-1: every one), and
// returns how many it flipped.
func flipBucketBatches(t *testing.T, fsys *vfs.MemFS, bucket string, limit int, match func(w kv.Write, r *storage.Record) bool) int {
	t.Helper()
	dir := path.Join("/data/topics", wire.KVTopic(bucket), "0")
	names, _ := fsys.List(dir)
	flipped := 0
	for _, n := range names {
		file := path.Join(dir, n)
		b, err := fsys.ReadFile(file)
		if err != nil || !strings.HasSuffix(n, ".log") {
			continue
		}
		for _, sb := range storage.SegmentBatches(b) {
			if flipped == limit {
				return flipped
			}
			r := &sb.Entries[0].Record
			w, _ := kv.DecodeRecord(kvRecord(r))
			if match(w, r) {
				if err := fsys.FlipBit(file, (sb.Offset+sb.End)/2, 3); err != nil {
					t.Fatal(err)
				}
				flipped++
			}
		}
	}
	return flipped
}

// kvOverwrittenBucket creates bucket b and overwrites 10 keys 1,000
// times; it returns their values.
func kvOverwrittenBucket(t *testing.T, h *harness) map[string]string {
	t.Helper()
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for range 5 {
		kvOverwrites(t, h.node, "b", 10, 200, want)
	}
	return want
}

// FenceAnswersOnlyItsGaps: a second repair drops a seq below the fence
// the first one's loss was answered with. Replayed, that fence answers
// the first gap only, so the leader fences again and a watcher that saw
// everything — the write the second repair dropped included — gets
// CURSOR_EXPIRED. With KVFenceAnswersAnyGap the replayed fence answers
// the new gap too, and that watcher goes on, its lost write kept.
func TestKVFenceAnswersOnlyItsGaps(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("any gap=%v", mutation), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.ScrubBytesPerSecond = -1
				c.Mutations.KVFenceAnswersAnyGap = mutation
			}
			h.restart()
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				kvPut(t, h.node, "b", fmt.Sprintf("k%d", i), fmt.Sprintf("first-%d", i))
			}
			dir := path.Join("/data/topics", wire.KVTopic("b"), "0")
			repairFlipping := func(victim string) {
				h.node.Close()
				flipInSegments(t, h.fs, dir, []byte(victim))
				if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
					t.Fatal(err)
				}
				h.open()
				eventually(t, "the bucket fenced its loss", func() bool {
					return kvOnRunner(t, h.node, "b", func(r *kvRunner) bool { return r.state != nil && len(r.lost) == 0 && !r.fencing })
				})
			}
			repairFlipping("first-7") // the first repair: fenced
			end := kvPut(t, h.node, "b", "after", "1")
			repairFlipping("first-3") // below that fence
			rec := &watchRecorder{}
			w, err := h.node.KVStartWatch(&wire.KVWatch{Bucket: "b", FromRevision: end + 1, Credit: 100}, rec)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Cancel()
			kvPut(t, h.node, "b", "later", "1")
			eventually(t, "the watch from past everything hears something", func() bool {
				got, end := rec.seen(t, end+1)
				return len(got) > 0 || end != nil
			})
			_, stop := rec.seen(t, end+1)
			if expired := stop != nil && stop.Code == wire.CodeCursorExpired; expired == mutation {
				t.Fatalf("a watcher that saw the write the second repair dropped: ended %v (the replayed fence answering any gap: %v)", stop, mutation)
			}
		})
	}
}

// TornSeqsNotReused: a bucket's last write, flushed and acknowledged, is
// flipped before a crash's restart; no mark or snapshot stands for it, so
// it looks exactly like a torn write and is cut. A watcher had gone past
// it. The node keeps the seq the cut batch's header named (a gap) and
// the bucket's runner steps over it: the write is gone, a new one gets a
// revision above it, and the watcher resuming past it hears
// CURSOR_EXPIRED. With TornSeqsReused the new write took the lost one's
// revision: the watcher, resuming after it, never heard of it.
func TestKVTornTailSeqsAreNotReused(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("reused=%v", mutation), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.SyncedMarkMs = int64(time.Hour / time.Millisecond)
				c.Mutations.TornSeqsReused = mutation
			}
			h.restart()
			if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
				t.Fatal(err)
			}
			var last uint64
			for i := range 10 {
				last = kvPut(t, h.node, "b", fmt.Sprintf("k%d", i), fmt.Sprintf("value-%d", i))
			}
			h.crash()
			flipInSegments(t, h.fs, path.Join("/data/topics", wire.KVTopic("b"), "0"), []byte("value-9"))
			h.open()
			rev := kvPut(t, h.node, "b", "new", "after the restart")
			if mutation {
				if rev != last {
					t.Fatalf("reused: the new write got revision %d, want the lost write's %d again", rev, last)
				}
				return
			}
			if rev <= last {
				t.Fatalf("the new write got revision %d, at or below the lost write's %d", rev, last)
			}
			if got, err := kvGet(t, h.node, "b", "k9", 0); err != nil || got.Found {
				t.Fatalf("get k9 = %+v, %v; want it lost", got, err)
			}
			if end := watchEnd(t, h.node, "b", last+1); end.Code != wire.CodeCursorExpired {
				t.Fatalf("watch from %d, past the lost write: %v, want CURSOR_EXPIRED", last+1, end)
			}
			// The fence went before the first write after the restart
			// (FenceBeforeWrites): a watch from that write is not expired.
			seen, end := watchUntil(t, h.node, "b", rev, func(seen []string, end *wire.Error) bool { return len(seen) > 0 || end != nil })
			if want := fmt.Sprintf("%d:put:new=after the restart", rev); end != nil || seen[0] != want {
				t.Fatalf("watch from the write after the restart: %v, %v; want %s", seen, end, want)
			}
		})
	}
}

// watchEnd starts a watch of bucket from revision from, again while it
// is refused UNAVAILABLE (a bucket fencing its watchers after a loss
// starts none until the fence applies: FenceBeforeWatch), and returns
// how it ended.
func watchEnd(t *testing.T, n *Node, bucket string, from uint64) *wire.Error {
	t.Helper()
	_, end := watchUntil(t, n, bucket, from, func(_ []string, end *wire.Error) bool { return end != nil })
	return end
}

// watchUntil starts a watch of bucket from revision from, again while it
// is refused UNAVAILABLE, and returns what it saw once enough says so.
func watchUntil(t *testing.T, n *Node, bucket string, from uint64, enough func([]string, *wire.Error) bool) ([]string, *wire.Error) {
	t.Helper()
	var (
		seen []string
		end  *wire.Error
	)
	eventually(t, fmt.Sprintf("a watch of %s from %d is seen, not UNAVAILABLE", bucket, from), func() bool {
		rec := &watchRecorder{}
		w, err := n.KVStartWatch(&wire.KVWatch{Bucket: bucket, FromRevision: from, Credit: 100}, rec)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Cancel()
		deadline := time.Now().Add(waitMax)
		for seen, end = nil, nil; !enough(seen, end) && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			seen, end = rec.seen(t, from)
		}
		return enough(seen, end) && (end == nil || end.Code != wire.CodeUnavailable)
	})
	return seen, end
}
