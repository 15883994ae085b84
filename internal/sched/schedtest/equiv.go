// Package schedtest holds checks shared by the tests of the scheduler
// kernel and of the shells' spills.
package schedtest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/sched"
)

// Find resolves a schedule id to its lane and key, as a shell does from
// its shard's log.
type Find func(id uint64) (lane string, k sched.Key, ok bool)

// Equivalence applies one random record sequence (seeded) to a State that
// keeps everything resident and to one bounded to window with the spill
// newSpill returns, and fails t at the first observable difference: a
// record's result, the counters, a lane, its next due time, or a claim
// of a lane's next due schedules (the owner's) that the bounded state
// does not hold resident. It also fails if the bounded state keeps more
// than twice the window of a lane's pending schedules resident. A final
// drain claims and fires every pending schedule in order, so the spill
// must have held every one of them.
func Equivalence(t *testing.T, seed uint64, steps, window int, newSpill func(Find) sched.Spill) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	keys := map[uint64]struct {
		lane string
		k    sched.Key
	}{}
	find := func(id uint64) (string, sched.Key, bool) {
		e, ok := keys[id]
		return e.lane, e.k, ok
	}
	ref, got := sched.NewState(), sched.NewState()
	got.SetSpill(newSpill(find), window)
	topics := []string{"a", "b", "c"}
	var seq uint64
	apply := func(r sched.Record) {
		t.Helper()
		seq++
		if r.Kind == sched.KindSchedule {
			keys[seq] = struct {
				lane string
				k    sched.Key
			}{r.Schedule.Topic, sched.Key{DeliverAtMs: r.Schedule.DeliverAtMs, ID: seq, Partition: r.Schedule.Partition}}
		}
		want, err := ref.Apply(seq, &r)
		if err != nil {
			t.Fatalf("seed %d seq %d: reference: %v", seed, seq, err)
		}
		res, err := got.Apply(seq, &r)
		if err != nil {
			t.Fatalf("seed %d seq %d (%v): bounded: %v", seed, seq, r.Kind, err)
		}
		if fmt.Sprint(res) != fmt.Sprint(want) {
			t.Fatalf("seed %d seq %d (%v): result %v, want %v", seed, seq, r.Kind, res, want)
		}
		compare(t, seed, seq, ref, got, window)
	}
	pending := func(lane string) []sched.Entry {
		var es []sched.Entry
		for _, e := range ref.Entries(0) {
			if e.Topic == lane && e.Status == sched.StatusPending {
				es = append(es, e)
			}
		}
		return es
	}
	firing := func() []sched.Entry {
		var es []sched.Entry
		for _, e := range ref.Entries(0) {
			if e.Status == sched.StatusFiring {
				es = append(es, e)
			}
		}
		return es
	}
	claim := func(lane string, k int) bool {
		es := pending(lane)
		if len(es) == 0 {
			return false
		}
		var in []sched.Intent
		for _, e := range es[:min(k, len(es))] {
			in = append(in, sched.Intent{ID: e.ID, Partition: e.Partition, FireSeq: ref.LastFire(lane, e.Partition) + 1 + uint64(len(in))})
		}
		apply(sched.Record{Kind: sched.KindIntent, Epoch: 1, Incarnation: 1, Intents: in})
		return true
	}
	for range steps {
		lane := topics[rng.IntN(len(topics))]
		switch x := rng.IntN(100); {
		case x < 50:
			// Due times collide often, and some come before everything
			// resident (a burst of earlier ones pushes the window's far
			// half out).
			apply(sched.Record{Kind: sched.KindSchedule, Schedule: sched.Schedule{DeliverAtMs: int64(rng.IntN(400)), Topic: lane, Incarnation: 1, Partition: uint32(rng.IntN(2))}})
		case x < 70:
			if !claim(lane, 1+rng.IntN(3)) {
				// A claim of a schedule that is not pending is skipped.
				apply(sched.Record{Kind: sched.KindIntent, Epoch: 1, Incarnation: 1, Intents: []sched.Intent{{ID: 1 + rng.Uint64N(seq+1), FireSeq: 1 << 40}}})
			}
		case x < 83:
			if fs := firing(); len(fs) > 0 {
				e := fs[rng.IntN(len(fs))]
				if x < 80 {
					apply(sched.Record{Kind: sched.KindFired, Fired: []sched.Fired{{ID: e.ID, DestSeq: 1}}})
				} else {
					apply(sched.Record{Kind: sched.KindUnknown, IDs: []uint64{e.ID}})
				}
			}
		case x < 96:
			apply(sched.Record{Kind: sched.KindCancel, IDs: []uint64{1 + rng.Uint64N(seq+1), 1 + rng.Uint64N(seq+1)}})
		default:
			ops := []sched.LaneOp{sched.LanePause, sched.LaneResume, sched.LaneClose, sched.LaneResume, sched.LaneRetire}
			op := ops[rng.IntN(len(ops))]
			if op == sched.LaneRetire && rng.IntN(4) != 0 {
				op = sched.LanePause // retire is terminal: rarer
			}
			apply(sched.Record{Kind: sched.KindLane, Lane: sched.LaneCommand{Op: op, Topic: lane, Incarnation: 1}})
		}
	}
	// Drain: every pending schedule, claimed in order, then fired.
	fireAll := func() {
		for _, e := range firing() {
			apply(sched.Record{Kind: sched.KindFired, Fired: []sched.Fired{{ID: e.ID, DestSeq: 1}}})
		}
	}
	fireAll()
	for _, lane := range topics {
		for claim(lane, 1+rng.IntN(5)) {
			fireAll()
		}
	}
	if ref.Live() != 0 || got.Live() != 0 || got.Spilled() != 0 {
		t.Fatalf("seed %d: after the drain: live %d and %d, spilled %d", seed, ref.Live(), got.Live(), got.Spilled())
	}
}

func compare(t *testing.T, seed, seq uint64, ref, got *sched.State, window int) {
	t.Helper()
	if ref.Counts() != got.Counts() || ref.Live() != got.Live() {
		t.Fatalf("seed %d seq %d: counts %+v live %d, want %+v live %d", seed, seq, got.Counts(), got.Live(), ref.Counts(), ref.Live())
	}
	if !slices.Equal(ref.Lanes(), got.Lanes()) {
		t.Fatalf("seed %d seq %d: lanes %v, want %v", seed, seq, got.Lanes(), ref.Lanes())
	}
	all := ref.Entries(0)
	resident := got.Entries(0)
	for _, lane := range ref.Lanes() {
		rl, _ := ref.Lane(lane)
		gl, _ := got.Lane(lane)
		if rl.Topic != gl.Topic || rl.Gate != gl.Gate || rl.Incarnation != gl.Incarnation || rl.Pending != gl.Pending {
			t.Fatalf("seed %d seq %d: lane %+v, want %+v", seed, seq, gl, rl)
		}
		rd, rok := ref.NextDue(lane)
		gd, gok := got.NextDue(lane)
		if rd != gd || rok != gok {
			t.Fatalf("seed %d seq %d: lane %s next due %d %v, want %d %v", seed, seq, lane, gd, gok, rd, rok)
		}
		// The resident pending schedules are the lane's nearest ones.
		want := laneOf(all, lane, sched.StatusPending)
		have := laneOf(resident, lane, sched.StatusPending)
		if len(have) > 2*window || !slices.Equal(have, want[:min(len(have), len(want))]) {
			t.Fatalf("seed %d seq %d: lane %s resident %v, want a prefix of %v within %d", seed, seq, lane, have, want, 2*window)
		}
		if len(want) > 0 && len(have) == 0 {
			t.Fatalf("seed %d seq %d: lane %s has %d pending, none resident", seed, seq, lane, len(want))
		}
		if w, h := laneOf(all, lane, sched.StatusFiring), laneOf(resident, lane, sched.StatusFiring); !slices.Equal(w, h) {
			t.Fatalf("seed %d seq %d: lane %s firing %v, want %v", seed, seq, lane, h, w)
		}
	}
}

func laneOf(es []sched.Entry, lane string, st sched.Status) []sched.Entry {
	var out []sched.Entry
	for _, e := range es {
		if e.Topic == lane && e.Status == st {
			// What a State says of a schedule (not where it keeps it).
			out = append(out, sched.Entry{ID: e.ID, DeliverAtMs: e.DeliverAtMs, Topic: e.Topic, Partition: e.Partition,
				Status: e.Status, FireSeq: e.FireSeq, Epoch: e.Epoch, Incarnation: e.Incarnation})
		}
	}
	return out
}
