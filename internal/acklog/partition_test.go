package acklog

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/delivery"
)

func ackValue(keys ...Key) []byte {
	var b []byte
	for _, k := range keys {
		b = binary.BigEndian.AppendUint32(b, k.Partition)
		b = binary.BigEndian.AppendUint64(b, k.Seq)
	}
	return b
}

// TestOnePartitionsLog: a log kept in partition 2's own log covers only
// partition 2's cursor (the others are nil): acks of other partitions are
// ignored, a checkpoint captures the others as nothing done, and the
// fence — the highest assignment epoch recorded — survives both fence
// records and checkpoints, never going down.
func TestOnePartitionsLog(t *testing.T) {
	fresh := func() ([]*delivery.Cursor, error) {
		c, err := delivery.NewCursor(delivery.Config{AckWaitMs: 1000, MaxDeliver: 5, InflightMax: 100}, 1, 0)
		return []*delivery.Cursor{nil, nil, c}, err
	}
	rb, err := NewRebuild(fresh, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(1, KindAck, ackValue(Key{2, 1}, Key{2, 3}, Key{0, 2})); err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(2, KindFence, FenceRecord(7)); err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(3, KindFence, []byte{1, 2}); err == nil {
		t.Fatal("a 2-byte fence record was taken")
	}
	if got := doneSeqs(rb.Cursors()[2].Snapshot()); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("partition 2 done %v, want [1 3]", got)
	}
	if rb.Fence() != 7 {
		t.Fatalf("fence %d, want 7", rb.Fence())
	}

	// The log checkpoints the fence the shell gives it.
	var cp Checkpoint
	l := New[string](Config{RecordBytesMax: 1 << 20, EncodeCheckpoint: func(c Checkpoint) []byte { cp = c; return []byte("cp") }}, 1000)
	eff := l.Flush(Input[string]{CompactBytes: 1, Cursors: rb.Cursors(), Fence: 9})
	if len(eff.Propose) != 1 || eff.Propose[0].Kind != KindCheckpoint {
		t.Fatalf("proposals %+v, want one checkpoint", eff.Propose)
	}
	if cp.Fence != 9 || len(cp.States) != 3 || cp.States[0].Floor != 0 || len(cp.States[0].Ranges) != 0 {
		t.Fatalf("checkpoint %+v: want fence 9 and nothing done for the uncovered partitions", cp)
	}

	// Rebuilt from the checkpoint alone (the fence records before it were
	// compacted), the fence is the checkpoint's; a lower fence after it
	// changes nothing.
	rb, _ = NewRebuild(fresh, 0)
	if err := rb.Checkpoint(10, cp); err != nil {
		t.Fatal(err)
	}
	if err := rb.Record(11, KindFence, FenceRecord(3)); err != nil {
		t.Fatal(err)
	}
	if got := doneSeqs(rb.Cursors()[2].Snapshot()); rb.Fence() != 9 || !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("rebuilt from the checkpoint: fence %d, done %v; want 9, [1 3]", rb.Fence(), got)
	}
}

// TestNeedsFrom: where each group's records start — its first record,
// then its latest checkpoint — and a version that moves exactly when
// that changes (the node publishes From for new leaders on a change).
func TestNeedsFrom(t *testing.T) {
	var n Needs
	v0 := n.Version()
	n.Applied("g", 5, KindAck, 0)
	n.Applied("g", 9, KindAck, 0) // not a checkpoint: g still needs 5
	n.Applied("h", 7, KindFence, 0)
	v1 := n.Version()
	if got := n.From(); got["g"] != 5 || got["h"] != 7 || len(got) != 2 || v1 == v0 {
		t.Fatalf("from %v, version %d -> %d", got, v0, v1)
	}
	n.Applied("g", 11, KindAck, 0)
	if n.Version() != v1 {
		t.Fatal("an ack that changes nothing moved the version")
	}
	from := n.From()
	n.Applied("g", 12, KindCheckpoint, 0)
	if from["g"] != 5 || n.From()["g"] != 12 || n.Version() == v1 {
		t.Fatalf("a checkpoint: from %v (the earlier copy %v), version %d", n.From(), from, n.Version())
	}
	if n.Limit(20) != 6 {
		t.Fatalf("limit %d, want 6 (h needs 7)", n.Limit(20))
	}
	v2 := n.Version()
	n.Reset()
	if len(n.From()) != 0 || n.Version() == v2 {
		t.Fatalf("after Reset: from %v, version %d", n.From(), n.Version())
	}
}
