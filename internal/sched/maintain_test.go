package sched

import (
	"slices"
	"testing"
)

// proposedKinds takes the owner's effects and returns the kinds it
// proposed, queueing them for commitAll.
func (w *world) proposedKinds() []Kind {
	var kinds []Kind
	for _, e := range w.o.TakeEffects() {
		if e.Propose != nil {
			kinds = append(kinds, e.Propose.Record.Kind)
			w.queue = append(w.queue, *e.Propose)
		}
	}
	return kinds
}

// The owner's upkeep: once enough was applied it checkpoints; after the
// next stretch it first carries the schedules whose messages lie at or
// below that checkpoint (CarryMax at a time), then checkpoints again, and
// the compaction limit passes their first records. Nothing is proposed
// with a proposal in flight or by an owner that is not active.
func TestMaintainCarriesThenCheckpoints(t *testing.T) {
	cfg := testConfig
	cfg.CheckpointEvery, cfg.CarryMax, cfg.CheckpointChunkEntries = 6, 2, 2
	w := newWorld(t, cfg)
	w.activate(1)
	far := []uint64{w.schedule("a", 1e9, 0), w.schedule("a", 1e9+1, 1), w.schedule("b", 1e9, 0)}
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 0 {
		t.Fatalf("proposed %v after %d entries, want nothing before %d", k, w.st.SinceCheckpoint(), cfg.CheckpointEvery)
	}
	for range 3 {
		w.schedule("b", 1e9+5, 0)
	}
	if _, err := w.o.Cancel(w.now, []uint64{w.st.Applied()}); err != nil {
		t.Fatal(err)
	}
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 1 || k[0] != KindCancel {
		t.Fatalf("proposed %v with a cancel in flight, want only the cancel", k)
	}
	w.commitAll()
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 3 || k[0] != KindCheckpoint {
		t.Fatalf("proposed %v, want a checkpoint of 5 live schedules in 3 chunks", k)
	}
	w.commitAll()
	base := w.st.LastCheckpoint()
	if base == 0 || w.st.CompactLimit() >= far[0] {
		t.Fatalf("checkpoint at %d, compaction limit %d: want one, and the limit below schedule %d", base, w.st.CompactLimit(), far[0])
	}
	// Traffic: schedules due now fire. Then the five live schedules
	// (the far ones and b's two) are carried (the probes proposedKinds dropped
	// are repeated after ProbeEveryMs).
	for range 6 {
		w.schedule("a", w.now, 0)
	}
	w.at(w.now + cfg.ProbeEveryMs)
	w.settle(true)
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 2 || k[0] != KindCarry {
		t.Fatalf("proposed %v, want 2 carries (CarryMax)", k)
	}
	w.commitAll()
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 2 || k[0] != KindCarry {
		t.Fatalf("proposed %v, want 2 more carries", k)
	}
	w.commitAll()
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 1 || k[0] != KindCarry {
		t.Fatalf("proposed %v, want the fifth and last carry", k)
	}
	w.commitAll()
	for _, id := range far {
		if e, _ := w.st.Entry(id); e.At <= base {
			t.Fatalf("schedule %d's message still at %d, below the checkpoint at %d", id, e.At, base)
		}
	}
	w.auth.GuardUntilMs = w.now // the lease gate closes
	w.o.SetAuthority(w.now, w.auth)
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 0 {
		t.Fatalf("a fenced owner proposed %v", k)
	}
	w.auth.GuardUntilMs = 2e9
	w.o.SetAuthority(w.now, w.auth)
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) == 0 || k[0] != KindCheckpoint {
		t.Fatalf("proposed %v, want a checkpoint", k)
	}
	w.commitAll()
	if limit := w.st.CompactLimit(); limit <= base || limit >= w.st.LastCheckpoint()+1 {
		t.Fatalf("compaction limit %d, want past the first checkpoint's base %d", limit, base)
	}
	for _, id := range far {
		if e, _ := w.st.Entry(id); w.st.CompactLimit() >= e.At || id > w.st.CompactLimit() {
			t.Fatalf("schedule %d (message at %d) with compaction limit %d", id, e.At, w.st.CompactLimit())
		}
	}
	// They fire with their messages where the carries put them.
	w.at(1e9 + 10)
	w.settle(true)
	for _, p := range w.published {
		if e := p.ID; (e == far[0] || e == far[1] || e == far[2]) && p.At <= base {
			t.Fatalf("schedule %d published from %d, below the checkpoint", e, p.At)
		}
	}
	w.expectDelivered("b", far[2], far[2]+1, far[2]+2)
}

// A carry round scans the live schedules once per carryScanFactor ×
// CarryMax carries, not once per CarryMax: at millions of live schedules
// a scan per batch kept a shard's runner busy for minutes. The carries
// still come lowest At first, each schedule once.
func TestCarryRoundScansRarely(t *testing.T) {
	cfg := testConfig
	cfg.CheckpointEvery, cfg.CarryMax, cfg.CheckpointChunkEntries = 6, 2, 64
	w := newWorld(t, cfg)
	w.activate(1)
	const live = 300
	for i := range live {
		w.schedule("a", 1e9+int64(i%7), 0)
	}
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) == 0 || k[0] != KindCheckpoint {
		t.Fatalf("proposed %v, want a checkpoint", k)
	}
	w.commitAll()
	base := w.st.LastCheckpoint()
	for range live {
		w.schedule("b", 1e9, 0) // half the live count since: the next round is due
	}
	w.at(w.now + cfg.ProbeEveryMs)
	w.settle(true)
	scans := w.st.carryScans
	var froms []uint64
	seen := map[uint64]bool{}
	for round := 0; ; round++ {
		w.o.Maintain(w.now)
		var carried bool
		for _, e := range w.o.TakeEffects() {
			if p := e.Propose; p != nil {
				w.queue = append(w.queue, *p)
				if p.Record.Kind == KindCarry {
					carried = true
					if seen[p.Record.Carry.ID] {
						t.Fatalf("schedule %d carried twice", p.Record.Carry.ID)
					}
					seen[p.Record.Carry.ID] = true
					froms = append(froms, p.Record.Carry.From)
				}
			}
		}
		w.commitAll()
		if !carried {
			break
		}
		if round > live {
			t.Fatal("the carry round does not end")
		}
	}
	if len(seen) != live {
		t.Fatalf("carried %d schedules, want the %d below the checkpoint at %d", len(seen), live, base)
	}
	if !slices.IsSorted(froms) {
		t.Fatal("carries not lowest At first")
	}
	// 300 carries at 2 a batch: 150 batches; one scan per 128 carries
	// (3), and one more that finds none left — not one per batch.
	if got, want := w.st.carryScans-scans, 5; got > want {
		t.Fatalf("%d scans of the live schedules for %d carries, want at most %d", got, live, want)
	}
}
