package acklog

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// TestNeedsCarry: a carry is the group's checkpoint when no record of the
// group lies between its base and itself (CarryAtItsBase), and no record
// of the group at all otherwise; after Restore every group's latest
// record is taken to be at the snapshot's point.
func TestNeedsCarry(t *testing.T) {
	var n Needs
	n.Applied("g", 5, KindCheckpoint, 0)
	n.Applied("g", 9, KindAck, 0)
	v := n.Version()
	n.Applied("g", 30, KindCarry, 8) // folded up to 8: misses the ack at 9
	if n.From()["g"] != 5 || n.Version() != v {
		t.Fatalf("a carry based before the group's ack at 9: from %v (version %d -> %d), want 5 unchanged", n.From(), v, n.Version())
	}
	n.Applied("g", 31, KindCarry, 29) // the void carry at 30 is no record of g
	if n.From()["g"] != 31 || n.Version() == v {
		t.Fatalf("a carry based after the group's last record: from %v, want 31", n.From())
	}
	if n.Limit(40) != 30 {
		t.Fatalf("limit %d, want 30", n.Limit(40))
	}
	n.Applied("h", 32, KindCarry, 10) // a group not known yet
	if n.From()["h"] != 32 {
		t.Fatalf("a carry of an unknown group: from %v, want h at 32", n.From())
	}

	var r Needs
	r.Restore(map[string]uint64{"g": 5}, 20)
	r.Applied("g", 25, KindCarry, 19)
	if r.From()["g"] != 5 {
		t.Fatalf("after Restore at 20 a carry based at 19: from %v, want 5 (the snapshot does not say where g's last record is)", r.From())
	}
	r.Applied("g", 26, KindCarry, 20)
	if r.From()["g"] != 26 {
		t.Fatalf("after Restore at 20 a carry based at 20: from %v, want 26", r.From())
	}
}

// TestCarriedLogRebuilds, over random logs of one group's acks, fences,
// checkpoints and carries (some folded from a base that later acks
// passed, as a carry folded while the group's leader acked meanwhile),
// with another group's records between: the cursor rebuilt from the
// whole log, and the one rebuilt from where Needs says the group's
// records start, both hold exactly the acks of the log, and Needs and the
// rebuild judge every carry alike.
//
// Replay a failure with: go test ./internal/acklog -run TestCarriedLogRebuilds/seed=N
func TestCarriedLogRebuilds(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if err := carriedRun(seed); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

// carriedRecord is one record of the generated log.
type carriedRecord struct {
	group string
	kind  Kind
	value []byte
	base  uint64     // a carry's
	cp    Checkpoint // a checkpoint's or carry's
}

func carriedRun(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xca22))
	var log []carriedRecord // log[i] is at seq i+1
	acked := map[uint64]bool{}
	for len(log) < 60 {
		switch rng.IntN(6) {
		case 0, 1:
			s := 1 + rng.Uint64N(rebuildSeqsMax)
			acked[s] = true
			log = append(log, carriedRecord{group: "g", kind: KindAck, value: ackValue(Key{0, s})})
		case 2:
			log = append(log, carriedRecord{group: "other", kind: KindAck, value: ackValue(Key{0, 1 + rng.Uint64N(rebuildSeqsMax)})})
		case 3:
			log = append(log, carriedRecord{group: "g", kind: KindFence, value: FenceRecord(rng.Uint64N(5))})
		case 4, 5:
			// Folded from the log up to a base at most a few records back:
			// the records after the base are not in it.
			base := uint64(len(log)) - min(uint64(len(log)), rng.Uint64N(4))
			rb, err := rebuildCarried(log[:base], 1)
			if err != nil {
				return err
			}
			cp := CheckpointOf(rb.Cursors())
			cp.Fence = rb.Fence()
			kind := KindCarry
			if base == uint64(len(log)) && rng.IntN(3) == 0 {
				kind = KindCheckpoint // the group's own, made at the tail
			}
			log = append(log, carriedRecord{group: "g", kind: kind, base: base, cp: cp})
		}
	}
	var n Needs
	for i, r := range log {
		n.Applied(r.group, uint64(i+1), r.kind, r.base)
	}
	var want []uint64
	for s := uint64(1); s <= rebuildSeqsMax; s++ {
		if acked[s] {
			want = append(want, s)
		}
	}
	for _, from := range []uint64{1, n.From()["g"]} {
		rb, err := rebuildCarried(log, from)
		if err != nil {
			return err
		}
		if got := doneSeqs(rb.Cursors()[0].Snapshot()); !slices.Equal(got, want) {
			return fmt.Errorf("rebuilt from %d (Needs says %d): done %v, the log's acks %v", from, n.From()["g"], got, want)
		}
	}
	return nil
}

// rebuildCarried folds group g's records of log from seq from on.
func rebuildCarried(log []carriedRecord, from uint64) (*Rebuild, error) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, overheadBytes)
	if err != nil {
		return nil, err
	}
	for i := from - 1; i < uint64(len(log)); i++ {
		r, seq := log[i], i+1
		if r.group != "g" {
			continue
		}
		switch r.kind {
		case KindCheckpoint:
			err = rb.Checkpoint(seq, r.cp)
		case KindCarry:
			_, err = rb.Carry(seq, r.base, r.cp)
		default:
			err = rb.Record(seq, r.kind, r.value)
		}
		if err != nil {
			return nil, err
		}
	}
	return rb, nil
}

// TestPinnedCheckpoints: while retention would compact past the group's
// latest checkpoint, one is due at the tail though no record came since —
// one at a time.
func TestPinnedCheckpoints(t *testing.T) {
	h := newHarness(1<<20, Mutations{})
	eff := h.log.Flush(Input[string]{CompactBytes: 1 << 20, Cursors: []*delivery.Cursor{h.cursor}})
	if len(eff.Propose) != 0 {
		t.Fatalf("nothing pinned: proposals %+v", eff.Propose)
	}
	eff = h.log.Flush(Input[string]{CompactBytes: 1 << 20, Cursors: []*delivery.Cursor{h.cursor}, Pinned: true})
	if len(eff.Propose) != 1 || eff.Propose[0].Kind != KindCheckpoint {
		t.Fatalf("pinned: proposals %+v, want one checkpoint", eff.Propose)
	}
	eff = h.log.Flush(Input[string]{CompactBytes: 1 << 20, Cursors: []*delivery.Cursor{h.cursor}, Pinned: true})
	if len(eff.Propose) != 0 {
		t.Fatalf("pinned, a checkpoint in flight: proposals %+v, want none", eff.Propose)
	}
}
