package node

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/storage"
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
// the lost write in silence. A checkpoint after the gap holds the state
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
	if _, err := kvCreate(t, h.node, wire.KVBucketConfig{Bucket: "b"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for range 5 {
		kvOverwrites(t, h.node, "b", 10, 200, want)
	}
	eventually(t, "the bucket's log is truncated to its checkpoint", func() bool {
		return h.node.topics[wire.KVTopic("b")].partitions[0].startSeq.Load() > 1
	})
	h.node.Close()
	dir := path.Join("/data/topics", wire.KVTopic("b"), "0")
	names, _ := h.fs.List(dir)
	chunks := 0
	for _, n := range names {
		file := path.Join(dir, n)
		b, err := h.fs.ReadFile(file)
		if err != nil || !strings.HasSuffix(n, ".log") {
			continue
		}
		for _, sb := range storage.SegmentBatches(b) {
			if w, err := kv.DecodeRecord(kvRecord(&sb.Entries[0].Record)); err == nil && w.Op == kv.OpCheckpoint {
				if err := h.fs.FlipBit(file, (sb.Offset+sb.End)/2, 3); err != nil {
					t.Fatal(err)
				}
				chunks++
			}
		}
	}
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
