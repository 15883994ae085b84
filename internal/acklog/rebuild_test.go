package acklog

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// Rebuild equivalence, over random runs of acks, re-acks, flushes,
// commits, lost records, quorum loss and checkpoints: after every flush the
// cursors rebuilt from the committed log hold exactly the seqs some
// committed ack record holds (a checkpoint never adds an uncommitted ack
// nor drops a committed one), and once nothing is in flight or undurable
// they equal the live cursors.
//
// Replay a failure with: go test ./internal/acklog -run TestRebuildEquivalence/seed=N
func TestRebuildEquivalence(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if err := rebuildRun(seed); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

const rebuildSeqsMax = 40

func rebuildRun(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	h := newHarness(1<<20, Mutations{})
	var inflight []uint64 // proposal ids, in log order
	// A log commits a prefix: once a record fails (its leader lost its
	// office), every record proposed before that in flight after it fails
	// too.
	doomed := map[uint64]bool{}
	for op := 0; op < 200; op++ {
		switch rng.IntN(3) {
		case 0, 1:
			h.step(ack{seq: 1 + rng.Uint64N(rebuildSeqsMax), reply: "r"})
		case 2:
			var fins []fin
			n := rng.IntN(len(inflight) + 1)
			for i, id := range inflight[:n] {
				f := fin{id: id}
				if doomed[id] || rng.IntN(5) == 0 {
					f.err = errLost
					for _, later := range inflight[i+1:] {
						doomed[later] = true
					}
				}
				fins = append(fins, f)
			}
			inflight = inflight[n:]
			before := len(h.proposed)
			h.step(flush{done: fins, degraded: rng.IntN(8) == 0, compact: []int64{0, 1, 60}[rng.IntN(3)]})
			for id := uint64(before + 1); id <= uint64(len(h.proposed)); id++ {
				inflight = append(inflight, id)
			}
			if err := h.checkRebuild(); err != nil {
				return fmt.Errorf("after op %d: %w", op, err)
			}
		}
	}
	var fins []fin
	for _, id := range inflight {
		f := fin{id: id}
		if doomed[id] {
			f.err = errLost
		}
		fins = append(fins, f)
	}
	h.step(flush{done: fins})
	if err := h.checkRebuild(); err != nil {
		return fmt.Errorf("at the end: %w", err)
	}
	if h.log.Inflight() == 0 && h.log.Undurable() == 0 {
		rb, _ := h.rebuild()
		if got, want := doneSeqs(rb.Cursors()[0].Snapshot()), doneSeqs(h.cursor.Snapshot()); !slices.Equal(got, want) {
			return fmt.Errorf("nothing in flight or undurable, yet rebuilt %v, live %v", got, want)
		}
	}
	return nil
}

// checkRebuild compares the rebuilt cursor with the seqs of the committed
// ack records.
func (h *harness) checkRebuild() error {
	rb, err := h.rebuild()
	if err != nil {
		return err
	}
	committed := map[uint64]bool{}
	for _, p := range h.committed {
		if p.Kind == KindAck {
			ForEachAck(p.Value, func(k Key) { committed[k.Seq] = true })
		}
	}
	var want []uint64
	for seq := uint64(1); seq <= rebuildSeqsMax; seq++ {
		if committed[seq] {
			want = append(want, seq)
		}
	}
	if got := doneSeqs(rb.Cursors()[0].Snapshot()); !slices.Equal(got, want) {
		return fmt.Errorf("rebuilt done seqs %v, committed ack records hold %v", got, want)
	}
	return nil
}

func doneSeqs(s delivery.DoneState) []uint64 {
	var seqs []uint64
	for seq := uint64(1); seq <= rebuildSeqsMax; seq++ {
		done := seq < s.Floor
		for _, r := range s.Ranges {
			done = done || (r.First <= seq && seq <= r.Last)
		}
		if done {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}
