package acklog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// guardScenario runs steps on a fresh harness whose checkpoints may be up
// to recordBytesMax bytes.
func guardScenario(t *testing.T, recordBytesMax int, steps []step) {
	t.Helper()
	if err := runLog(recordBytesMax, Mutations{}, steps); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesAConfigWithoutEncoderOrRecordBound pins New's check of
// its Config (EncodeCheckpoint set, RecordBytesMax > 0): a log without a
// bound would propose checkpoints of any size.
func TestNewRefusesAConfigWithoutEncoderOrRecordBound(t *testing.T) {
	encode := func(Checkpoint) []byte { return nil }
	for _, c := range []struct {
		name   string
		cfg    Config
		panics bool
	}{
		{"no encoder", Config{RecordBytesMax: 10}, true},
		{"bound 0", Config{RecordBytesMax: 0, EncodeCheckpoint: encode}, true},
		{"bound -1", Config{RecordBytesMax: -1, EncodeCheckpoint: encode}, true},
		{"bound 1", Config{RecordBytesMax: 1, EncodeCheckpoint: encode}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if r := recover(); (r != nil) != c.panics {
					t.Fatalf("New(%+v): panic %v, want a panic: %v", c.cfg, r, c.panics)
				}
			}()
			New[string](c.cfg, 0)
		})
	}
}

// TestReAckOfASeqBatchedWithOthersWaitsForItsRecord pins inflightHolds'
// scan of the whole record (held || a == k): a seq that is not the last
// of its record in flight is held by it too.
func TestReAckOfASeqBatchedWithOthersWaitsForItsRecord(t *testing.T) {
	guardScenario(t, 1<<20, []step{
		{ack{1, "a"}, "new record"},
		{ack{2, "b"}, "new record"},
		{flush{}, "propose #1 ack[1 2]"},
		{ack{1, "c"}, "record again"}, // not "no record": #1 may yet fail
		{flush{}, "propose #2 ack[1]"},
		{flush{done: []fin{{1, errLost}}}, "NotCommitted lost [a b]"},
		{flush{done: []fin{{2, nil}}}, "Durable [c]"},
	})
}

// TestFloorsAreNotDurableWhileAnAckAnsweredQuorumLostIsInFlight pins the
// Degraded branch's markUndurable: an ack answered QuorumLost is not
// durable while its record is in flight, so another record's commit does
// not let the shell publish the floors (FloorsDurable) nor checkpoint.
func TestFloorsAreNotDurableWhileAnAckAnsweredQuorumLostIsInFlight(t *testing.T) {
	guardScenario(t, 1<<20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{degraded: true}, "QuorumLost [a]"},
		{dead(2), ""},
		{flush{}, "propose #2 count"},
		{flush{done: []fin{{2, nil}}, compact: 1}, "ready [2]"}, // no floors, no checkpoint
		{flush{done: []fin{{1, nil}}, compact: 1}, "propose #3 checkpoint floor=2 ranges=[]; floors"},
	})
}

// TestTooLargeCheckpointIsNotRetriedWhenQuietOrPinned pins
// maybeCheckpoint's "&& l.retryBytes == 0": after a checkpoint too large
// for a record, neither a quiet group nor a pinned one tries again before
// another threshold of records.
func TestTooLargeCheckpointIsNotRetriedWhenQuietOrPinned(t *testing.T) {
	guardScenario(t, 10, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, nil}}, compact: 20}, "Durable [a]; floors; too large 21"},
		{flush{compact: 20, quiet: true}, "-"},
	})
	h := newHarness(10, Mutations{})
	in := Input[string]{CompactBytes: 20, Cursors: []*delivery.Cursor{h.cursor}, Pinned: true}
	if eff := h.log.Flush(in); eff.CheckpointTooLargeBytes == 0 {
		t.Fatalf("pinned: %+v, want a checkpoint too large", eff)
	}
	if eff := h.log.Flush(in); eff.CheckpointTooLargeBytes != 0 || len(eff.Propose) != 0 {
		t.Fatalf("pinned again with no record since: %+v, want nothing", eff)
	}
}

// TestDegradedLeaderProposesNoCheckpoint pins maybeCheckpoint's
// "|| in.Degraded": a READ_ONLY_DEGRADED leader proposes no checkpoint,
// not even a due one with no ack undurable.
func TestDegradedLeaderProposesNoCheckpoint(t *testing.T) {
	h := newHarness(1<<20, Mutations{})
	in := Input[string]{CompactBytes: 1, Cursors: []*delivery.Cursor{h.cursor}, Pinned: true, Degraded: true}
	if eff := h.log.Flush(in); len(eff.Propose) != 0 {
		t.Fatalf("degraded: proposals %+v, want none", eff.Propose)
	}
	in.Degraded = false
	if eff := h.log.Flush(in); len(eff.Propose) != 1 || eff.Propose[0].Kind != KindCheckpoint {
		t.Fatalf("quorum back: proposals %+v, want the checkpoint", eff.Propose)
	}
}

// TestCheckpointOfExactlyRecordBytesMaxIsProposed pins maybeCheckpoint's
// "len(value) > RecordBytesMax": the bound is inclusive.
func TestCheckpointOfExactlyRecordBytesMaxIsProposed(t *testing.T) {
	value := []byte("0123456789")
	for _, c := range []struct {
		max      int
		proposed bool
	}{{len(value), true}, {len(value) - 1, false}} {
		l := New[string](Config{RecordBytesMax: c.max, EncodeCheckpoint: func(Checkpoint) []byte { return value }}, 100)
		eff := l.Flush(Input[string]{CompactBytes: 1})
		if got := len(eff.Propose) == 1; got != c.proposed || (!got && eff.CheckpointTooLargeBytes != len(value)) {
			t.Fatalf("RecordBytesMax %d, a checkpoint of %d bytes: %+v, want proposed: %v", c.max, len(value), eff, c.proposed)
		}
	}
}

// TestACompletionAnsweredTwiceIsIgnored pins complete's "i < 0" return: a
// completion of a proposal that completed already (or is not the log's)
// answers nothing again.
func TestACompletionAnsweredTwiceIsIgnored(t *testing.T) {
	guardScenario(t, 1<<20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, nil}}}, "Durable [a]; floors"},
		{flush{done: []fin{{1, nil}, {7, errLost}}}, "floors"},
	})
}

// TestFailedCheckpointLeavesItsRecordsCounted pins complete's "c.Err ==
// nil" before it resets the record bytes: the records a failed checkpoint
// covered still count, and the next one is due at once.
func TestFailedCheckpointLeavesItsRecordsCounted(t *testing.T) {
	guardScenario(t, 1<<20, []step{
		{ack{1, "a"}, "new record"},
		{flush{compact: 20}, "propose #1 ack[1]; propose #2 checkpoint floor=2 ranges=[]"},
		{flush{done: []fin{{1, nil}, {2, errLost}}, compact: 20}, "Durable [a]; propose #3 checkpoint floor=2 ranges=[]; floors"},
	})
}

// TestRetiredReignsCheckpointLeavesTheRecordsCounted pins complete's
// "p.gen == l.gen" before it resets the record bytes: a checkpoint of a
// retired reign that commits later does not count as this reign's.
func TestRetiredReignsCheckpointLeavesTheRecordsCounted(t *testing.T) {
	guardScenario(t, 1<<20, []step{
		{ack{1, "a"}, "new record"},
		{flush{compact: 20}, "propose #1 ack[1]; propose #2 checkpoint floor=2 ranges=[]"},
		{retire{}, "[a]"},
		{flush{done: []fin{{1, nil}, {2, nil}}, compact: 20}, "propose #3 checkpoint floor=2 ranges=[]; floors"},
	})
}

// TestLogCloneIsIndependent pins Clone's copies of the proposals in
// flight, their replies and the undurable acks: the model checker
// explores from clones, and a step of one must not move the other.
func TestLogCloneIsIndependent(t *testing.T) {
	h := newHarness(1<<20, Mutations{})
	for _, s := range []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, errLost}}}, "NotCommitted lost [a]"},
		{ack{2, "b"}, "new record"},
		{flush{}, "propose #2 ack[2]"},
	} {
		if got := h.step(s.event); got != s.want {
			t.Fatalf("%T%+v: got %q, want %q", s.event, s.event, got, s.want)
		}
	}
	orig := h.log
	for _, r := range []string{"x", "y"} { // #2's replies grow past their length
		orig.Flush(Input[string]{Replies: []string{r}})
	}
	answers := func(eff Effects[string]) string { return fmt.Sprint(eff.Answers) }
	clone := orig.Clone()
	orig.Flush(Input[string]{Replies: []string{"o"}})
	clone.Flush(Input[string]{Replies: []string{"c"}})
	clone.Flush(Input[string]{Acks: ackValue(Key{0, 1}), Replies: []string{"d"}})
	if got := answers(clone.Flush(Input[string]{Done: []Completion{{ID: 3}}})); got != "[{[d] Durable <nil>}]" {
		t.Fatalf("clone: #3 answered %s", got)
	}
	if got := answers(clone.Flush(Input[string]{Done: []Completion{{ID: 2}}})); got != "[{[b x y c] Durable <nil>}]" {
		t.Fatalf("clone: #2 answered %s", got)
	}
	if orig.Inflight() != 1 || orig.Undurable() != 1 || clone.Inflight() != 0 || clone.Undurable() != 0 {
		t.Fatalf("inflight %d and %d, undurable %d and %d; want the original's 1 and 1, the clone's 0 and 0",
			orig.Inflight(), clone.Inflight(), orig.Undurable(), clone.Undurable())
	}
	if got := answers(orig.Flush(Input[string]{Done: []Completion{{ID: 2}}})); got != "[{[b x y o] Durable <nil>}]" {
		t.Fatalf("original: #2 answered %s", got)
	}
}

// TestCarryValueRoundTripsAndRefusesAShortOne pins CarryOf's length guard
// and CarryBaseBytes: the base is the first 8 bytes, the checkpoint the
// rest, and a value too short for a base is no carry.
func TestCarryValueRoundTripsAndRefusesAShortOne(t *testing.T) {
	for _, cp := range [][]byte{nil, []byte("cp")} {
		base, got, ok := CarryOf(CarryRecord(0x0102030405060708, cp))
		if !ok || base != 0x0102030405060708 || !bytes.Equal(got, cp) {
			t.Fatalf("CarryOf(CarryRecord(base, %q)) = %x, %q, %v", cp, base, got, ok)
		}
	}
	if len(CarryRecord(1, nil)) != 8 {
		t.Fatalf("a carry of no checkpoint has %d bytes, want 8", len(CarryRecord(1, nil)))
	}
	for n := 0; n < 8; n++ {
		if base, cp, ok := CarryOf(make([]byte, n)); ok || base != 0 || cp != nil {
			t.Fatalf("CarryOf(%d bytes) = %d, %v, %v; want no carry", n, base, cp, ok)
		}
	}
}

// countValue is a count record of the counts, each partition, seq,
// count.
func countValue(counts ...[3]uint64) []byte {
	var b []byte
	for _, c := range counts {
		b = binary.BigEndian.AppendUint32(b, uint32(c[0]))
		b = binary.BigEndian.AppendUint64(b, c[1])
		b = binary.BigEndian.AppendUint32(b, uint32(c[2]))
	}
	return b
}

// twoCursors are partition 0, not covered (nil), and partition 1.
func twoCursors() ([]*delivery.Cursor, error) {
	c := newCursors()[0]
	return []*delivery.Cursor{nil, c}, nil
}

// TestRebuildReplaysCountRecords pins CountEntryBytes and ReplayCounts:
// its length check, its loop over the entries and its layout (partition
// u32, seq u64, count u32), and that a count of a partition not covered
// (a nil cursor, or none) is skipped: a rebuilt cursor redelivers a seq
// with its recorded count.
func TestRebuildReplaysCountRecords(t *testing.T) {
	rb, err := NewRebuild(twoCursors, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, KindCount, countValue([3]uint64{1, 2, 3}, [3]uint64{0, 4, 1}, [3]uint64{1, 9, 1}, [3]uint64{2, 5, 1})); err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(2, KindCount, nil); err != nil {
		t.Fatal(err)
	}
	if got := rb.Cursors()[1].Counts(); !slices.Equal(got, []delivery.SeqCount{{Seq: 2, Count: 3}, {Seq: 9, Count: 1}}) {
		t.Fatalf("counts %v, want seq 2 counted 3, seq 9 once", got)
	}
	if rb.RecordBytes() != 4*CountEntryBytes {
		t.Fatalf("record bytes %d, want %d", rb.RecordBytes(), 4*CountEntryBytes)
	}
}

// TestReplayAcksSkipsPartitionsBeyondTheCursors pins cursorAt's bound
// (partition < len(cursors)): an ack of a partition the cursors do not
// reach is skipped, not a panic.
func TestReplayAcksSkipsPartitionsBeyondTheCursors(t *testing.T) {
	cursors, _ := twoCursors()
	if err := ReplayAcks(cursors, ackValue(Key{2, 1}, Key{1, 1}, Key{0, 3}, Key{7, 1})); err != nil {
		t.Fatal(err)
	}
	if got := doneSeqs(cursors[1].Snapshot()); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("partition 1 done %v, want [1]", got)
	}
}

// TestCheckpointCarriesEachPartitionsCounts pins CheckpointOf's Counts,
// one entry per cursor (nil for a partition not covered, so that the
// others keep their index), and Restore's bound on the partitions it
// holds: a checkpoint of fewer partitions than the cursors restores what
// it has and leaves the others fresh.
func TestCheckpointCarriesEachPartitionsCounts(t *testing.T) {
	cursors, _ := twoCursors()
	if err := ReplayAcks(cursors, ackValue(Key{1, 1})); err != nil {
		t.Fatal(err)
	}
	cursors[1].ReplayCount(3, 2)
	cp := CheckpointOf(cursors)
	if len(cp.States) != 2 || len(cp.Counts) != 2 || cp.Counts[0] != nil {
		t.Fatalf("checkpoint %+v: want two states and two counts, none for partition 0", cp)
	}
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) {
		c, _ := twoCursors()
		return append(c, newCursors()[0]), nil // the topic grew a partition since
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Checkpoint(5, cp); err != nil {
		t.Fatal(err)
	}
	c := rb.Cursors()[1]
	if got := c.Counts(); !slices.Equal(got, []delivery.SeqCount{{Seq: 3, Count: 2}}) || c.AckFloor() != 2 {
		t.Fatalf("restored partition 1: floor %d, counts %v; want 2 and seq 3 counted 2", c.AckFloor(), got)
	}
	if c := rb.Cursors()[2]; c.AckFloor() != 1 || len(c.Counts()) != 0 {
		t.Fatalf("partition 2, not in the checkpoint: floor %d, counts %v; want fresh", c.AckFloor(), c.Counts())
	}
}

// TestRebuildRefusesARecordOfNoKind pins the Kind numbering from 1: the
// zero Kind is no record kind, and Record refuses it.
func TestRebuildRefusesARecordOfNoKind(t *testing.T) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, Kind(0), ackValue(Key{0, 1})); err == nil {
		t.Fatal("a record of Kind 0 was taken")
	}
}

// TestCheckpointWithFewerCountsThanStatesRestores pins Restore's bound on
// the counts (i < len(cp.Counts)): a checkpoint whose counts stop short of
// its states restores the states without them.
func TestCheckpointWithFewerCountsThanStatesRestores(t *testing.T) {
	cp := Checkpoint{States: []delivery.DoneState{{Floor: 3}, {Floor: 4}}, Counts: [][]delivery.SeqCount{{{Seq: 5, Count: 1}}}}
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return append(newCursors(), newCursors()...), nil }, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Checkpoint(1, cp); err != nil {
		t.Fatal(err)
	}
	c0, c1 := rb.Cursors()[0], rb.Cursors()[1]
	if c0.AckFloor() != 3 || len(c0.Counts()) != 1 || c1.AckFloor() != 4 || len(c1.Counts()) != 0 {
		t.Fatalf("floors %d and %d, counts %v and %v; want 3 and 4, seq 5 counted once and none",
			c0.AckFloor(), c1.AckFloor(), c0.Counts(), c1.Counts())
	}
}

// TestRebuildRefusesAnInvalidCheckpoint pins Restore's and Checkpoint's
// error returns: a checkpoint whose done state breaks its invariants
// fails the rebuild, naming the partition.
func TestRebuildRefusesAnInvalidCheckpoint(t *testing.T) {
	rb, err := NewRebuild(twoCursors, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := Checkpoint{States: []delivery.DoneState{{}, {Floor: 5, Ranges: []delivery.SeqRange{{First: 3, Last: 4}}}}}
	if err := rb.Checkpoint(1, bad); !errors.Is(err, delivery.ErrBadDoneState) || !strings.Contains(err.Error(), "partition 1") {
		t.Fatalf("Checkpoint of an invalid done state: %v", err)
	}
}

// TestRebuildPassesOnFreshCursorsFailure pins NewRebuild's and
// Checkpoint's error returns of fresh: a rebuild that cannot make its
// cursors fails.
func TestRebuildPassesOnFreshCursorsFailure(t *testing.T) {
	errFresh := errors.New("no cursors")
	if rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return nil, errFresh }, 0); !errors.Is(err, errFresh) || rb != nil {
		t.Fatalf("NewRebuild: %v, %v; want the error of fresh", rb, err)
	}
	calls := 0
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) {
		if calls++; calls > 1 {
			return nil, errFresh
		}
		return newCursors(), nil
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, KindAck, ackValue(Key{0, 1})); err != nil {
		t.Fatal(err)
	}
	if err := rb.Checkpoint(2, CheckpointOf(newCursors())); !errors.Is(err, errFresh) {
		t.Fatalf("Checkpoint: %v, want the error of fresh", err)
	}
	if got := doneSeqs(rb.Cursors()[0].Snapshot()); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("after a failed Checkpoint done %v, want [1] (the cursors of before)", got)
	}
}

// TestRebuildFenceNeverGoesDown pins Checkpoint's max(r.fence, cp.Fence):
// a checkpoint with a lower fence than a fence record before it leaves
// the higher one.
func TestRebuildFenceNeverGoesDown(t *testing.T) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, KindFence, FenceRecord(9)); err != nil {
		t.Fatal(err)
	}
	cp := CheckpointOf(newCursors())
	cp.Fence = 3
	if err := rb.Checkpoint(2, cp); err != nil {
		t.Fatal(err)
	}
	if rb.Fence() != 9 {
		t.Fatalf("fence %d, want 9", rb.Fence())
	}
}

// TestFenceRecordsCountTowardTheNextCheckpoint pins Record's recordBytes
// of a fence record: it is a record after the checkpoint like the others.
func TestFenceRecordsCountTowardTheNextCheckpoint(t *testing.T) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, overheadBytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, KindFence, FenceRecord(2)); err != nil {
		t.Fatal(err)
	}
	if rb.RecordBytes() != overheadBytes+FenceEntryBytes {
		t.Fatalf("record bytes %d, want %d", rb.RecordBytes(), overheadBytes+FenceEntryBytes)
	}
}

// TestNeedsForgetDropsAGoneGroup pins Forget: a gone group no longer
// limits compaction, leaves no trace (its latest record neither: the
// state encodes like one that never saw it) and moves the version; a
// group not gone stays.
func TestNeedsForgetDropsAGoneGroup(t *testing.T) {
	var n, want Needs
	n.Applied("gone", 3, KindAck, 0)
	n.Applied("kept", 5, KindAck, 0)
	want.Applied("kept", 5, KindAck, 0)
	v := n.Version()
	n.Forget(func(g string) bool { return g == "gone" })
	if n.Limit(100) != 4 || n.Version() == v {
		t.Fatalf("after Forget: limit %d (want 4), version %d -> %d", n.Limit(100), v, n.Version())
	}
	if !bytes.Equal(n.AppendDigest(nil), want.AppendDigest(nil)) {
		t.Fatalf("after Forget: from %v, encoded unlike a Needs that never saw the group", n.From())
	}
	v = n.Version()
	n.Forget(func(string) bool { return false })
	if n.Version() != v || len(n.From()) != 1 {
		t.Fatalf("Forget of nothing: version %d -> %d, from %v", v, n.Version(), n.From())
	}
}

// TestNeedsRestoreMovesTheVersion pins Restore's version bump: what the
// groups need changed, and the node publishes From on a change.
func TestNeedsRestoreMovesTheVersion(t *testing.T) {
	var n Needs
	v := n.Version()
	n.Restore(map[string]uint64{"g": 5}, 9)
	if n.Version() == v || n.From()["g"] != 5 {
		t.Fatalf("after Restore: version %d -> %d, from %v", v, n.Version(), n.From())
	}
}
