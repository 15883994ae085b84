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
// its shard's log; compacted: the log no longer holds its SCHEDULE record
// (a state restored from a checkpoint after it).
type Find func(id uint64) (lane string, k sched.Key, ok, compacted bool)

// Equivalence applies one random record sequence (seeded) to a State that
// keeps everything resident and to one bounded to window with the spill
// newSpill returns, and fails t at the first observable difference: a
// record's result, the counters, a lane, its next due time, or a claim
// of a lane's next due schedules (the owner's) that the bounded state
// does not hold resident. It also fails if the bounded state keeps more
// than twice the window of a lane's pending schedules resident. A final
// drain claims and fires every pending schedule in order, so the spill
// must have held every one of them.
//
// The sequence also carries schedules (live ones and others) and
// checkpoints the state — some proposed too early (another record lands
// between the making and the append: void by CheckpointAtItsBase) or
// split by another record (void by CheckpointChunksTogether). The two
// states must make byte-identical checkpoints (the spill's schedules
// included). Halfway and after the drain, states restored at random log
// starts (Restore, then the log from there: what a restart or a rebuilt
// replica does) must equal the reference too, and so must their
// compaction limits, which never pass a live schedule's message. After
// every fourth record, the bounded state's listing, page by page, must be
// the reference's live schedules (compareListing).
func Equivalence(t testing.TB, seed uint64, steps, window int, newSpill func(Find) sched.Spill) {
	EquivalenceMutated(t, seed, steps, window, newSpill, sched.StateMutations{})
}

// EquivalenceMutated is Equivalence with every state broken by mut.
func EquivalenceMutated(t testing.TB, seed uint64, steps, window int, newSpill func(Find) sched.Spill, mut sched.StateMutations) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	keys := map[uint64]struct {
		lane string
		k    sched.Key
	}{}
	findFrom := func(start uint64) Find {
		return func(id uint64) (string, sched.Key, bool, bool) {
			if id < start {
				return "", sched.Key{}, false, true
			}
			e, ok := keys[id]
			return e.lane, e.k, ok, false
		}
	}
	ref, got := sched.NewState(), sched.NewState()
	ref.Mutations, got.Mutations = mut, mut
	got.SetSpill(newSpill(findFrom(0)), window)
	topics := []string{"a", "b", "c"}
	var seq uint64
	var log []sched.Record
	apply := func(r sched.Record) {
		t.Helper()
		seq++
		log = append(log, r)
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
	live := func() []sched.Entry {
		var es []sched.Entry
		for _, e := range ref.Entries(0) {
			es = append(es, e)
		}
		return es
	}
	checkpoint := func() {
		t.Helper()
		chunk := 1 + rng.IntN(4)
		want, err := ref.Checkpoint(chunk)
		if err != nil {
			t.Fatalf("seed %d seq %d: reference checkpoint: %v", seed, seq, err)
		}
		have, err := got.Checkpoint(chunk)
		if err != nil {
			t.Fatalf("seed %d seq %d: bounded checkpoint: %v", seed, seq, err)
		}
		if a, b := encodeAll(t, want, 1<<20), encodeAll(t, have, 1<<20); !slices.Equal(a, b) {
			t.Fatalf("seed %d seq %d: the bounded state's checkpoint differs from the reference's", seed, seq)
		}
		recs := want
		switch rng.IntN(6) {
		case 0: // made too early: a schedule lands first
			apply(sched.Record{Kind: sched.KindSchedule, Schedule: sched.Schedule{DeliverAtMs: int64(rng.IntN(400)), Topic: "a", Incarnation: 1}})
		case 1: // split by a schedule
			if len(recs) > 1 {
				i := 1 + rng.IntN(len(recs)-1)
				for _, r := range recs[:i] {
					apply(r)
				}
				recs = recs[i:]
				apply(sched.Record{Kind: sched.KindSchedule, Schedule: sched.Schedule{DeliverAtMs: int64(rng.IntN(400)), Topic: "b", Incarnation: 1}})
			}
		}
		for _, r := range recs {
			apply(r)
		}
	}
	loaded := 0
	restored := func() {
		t.Helper()
		for range 3 {
			start := 2 + rng.Uint64N(seq)
			st := sched.NewState()
			st.Mutations = mut
			st.SetSpill(newSpill(findFrom(start)), window)
			st.Restore(start)
			for i := start; i <= seq; i++ {
				if _, err := st.Apply(i, &log[i-1]); err != nil {
					t.Fatalf("seed %d: restored at %d: entry %d: %v", seed, start, i, err)
				}
			}
			if st.Restoring() {
				if ref.LastCheckpoint() >= start-1 && !mut.CheckpointAnyBase && !mut.CheckpointGaps {
					t.Fatalf("seed %d: restored at %d: no checkpoint loaded, though one has base %d", seed, start, ref.LastCheckpoint())
				}
				continue
			}
			compare(t, seed, seq, ref, st, window)
			loaded++
		}
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
		case x < 90:
			apply(sched.Record{Kind: sched.KindCancel, IDs: []uint64{1 + rng.Uint64N(seq+1), 1 + rng.Uint64N(seq+1)}})
		case x < 94:
			// Carries: of live schedules (pending and firing) and of
			// schedules no longer live (a no-op).
			if es := live(); len(es) > 0 && x < 93 {
				e := es[rng.IntN(len(es))]
				apply(sched.Record{Kind: sched.KindCarry, Carry: sched.Carry{ID: e.ID, Topic: e.Topic, DeliverAtMs: e.DeliverAtMs, Partition: e.Partition, From: e.At}})
			} else if id := 1 + rng.Uint64N(seq+1); keys[id].lane != "" {
				k := keys[id]
				apply(sched.Record{Kind: sched.KindCarry, Carry: sched.Carry{ID: id, Topic: k.lane, DeliverAtMs: k.k.DeliverAtMs, Partition: k.k.Partition, From: id}})
			}
		case x < 96:
			checkpoint()
		default:
			ops := []sched.LaneOp{sched.LanePause, sched.LaneResume, sched.LaneClose, sched.LaneResume, sched.LaneRetire}
			op := ops[rng.IntN(len(ops))]
			if op == sched.LaneRetire && rng.IntN(4) != 0 {
				op = sched.LanePause // retire is terminal: rarer
			}
			apply(sched.Record{Kind: sched.KindLane, Lane: sched.LaneCommand{Op: op, Topic: lane, Incarnation: 1}})
		}
	}
	checkpoint()
	restored()
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
	checkpoint()
	restored()
	if loaded == 0 {
		t.Fatalf("seed %d: no restored state loaded a checkpoint", seed)
	}
}

// encodeAll encodes records, each within bytesMax.
func encodeAll(t testing.TB, recs []sched.Record, bytesMax int) []byte {
	t.Helper()
	var out []byte
	for _, r := range recs {
		b, err := r.Encode()
		if err != nil || len(b) > bytesMax {
			t.Fatalf("encode %v: %d bytes, %v", r.Kind, len(b), err)
		}
		out = append(out, b...)
	}
	return out
}

func compare(t testing.TB, seed, seq uint64, ref, got *sched.State, window int) {
	t.Helper()
	if ref.Counts() != got.Counts() || ref.Live() != got.Live() {
		t.Fatalf("seed %d seq %d: counts %+v live %d, want %+v live %d", seed, seq, got.Counts(), got.Live(), ref.Counts(), ref.Live())
	}
	if ref.Applied() != got.Applied() || ref.LastCheckpoint() != got.LastCheckpoint() || ref.SinceCheckpoint() != got.SinceCheckpoint() ||
		ref.CompactLimit() != got.CompactLimit() {
		t.Fatalf("seed %d seq %d: applied %d, checkpoint %d (%d since, limit %d), want %d, %d (%d, %d)", seed, seq,
			got.Applied(), got.LastCheckpoint(), got.SinceCheckpoint(), got.CompactLimit(),
			ref.Applied(), ref.LastCheckpoint(), ref.SinceCheckpoint(), ref.CompactLimit())
	}
	for _, e := range ref.Entries(0) {
		if limit := ref.CompactLimit(); limit >= e.At {
			t.Fatalf("seed %d seq %d: compaction through %d would take schedule %d's message at %d", seed, seq, limit, e.ID, e.At)
		}
	}
	for _, lane := range ref.Lanes() {
		for p := range uint32(2) {
			if ref.LastFire(lane, p) != got.LastFire(lane, p) {
				t.Fatalf("seed %d seq %d: lane %s partition %d last fire %d, want %d", seed, seq, lane, p, got.LastFire(lane, p), ref.LastFire(lane, p))
			}
		}
	}
	if !slices.Equal(ref.Lanes(), got.Lanes()) {
		t.Fatalf("seed %d seq %d: lanes %v, want %v", seed, seq, got.Lanes(), ref.Lanes())
	}
	all := ref.Entries(0)
	resident := got.Entries(0)
	for _, lane := range ref.Lanes() {
		rl, _ := ref.Lane(lane)
		gl, _ := got.Lane(lane)
		if rl.Topic != gl.Topic || rl.Gate != gl.Gate || rl.Incarnation != gl.Incarnation || rl.Pending != gl.Pending ||
			!slices.Equal(rl.Refusing(), gl.Refusing()) {
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
	if seq%4 == 0 { // a quarter of the records: the check costs as much as the rest
		compareListing(t, seed, seq, ref, got)
	}
}

// compareListing pages through got's live schedules (List) — of one lane
// or of all, a page size and a lane drawn from seq — and fails unless
// the pages hold exactly ref's live schedules, in order, each once (the
// bounded state's spilled ones included), the last page saying no more
// follow.
func compareListing(t testing.TB, seed, seq uint64, ref, got *sched.State) {
	t.Helper()
	lanes := append([]string{""}, ref.Lanes()...)
	topic := lanes[int(seq/3)%len(lanes)]
	pageSize := 1 + int(seq%5)
	var want []sched.Entry
	for _, e := range ref.Entries(0) {
		if topic == "" || e.Topic == topic {
			want = append(want, view(e))
		}
	}
	var have []sched.Entry
	var cursor sched.ListCursor
	for pages := 0; ; pages++ {
		page, more, err := got.List(topic, cursor, pageSize)
		if err != nil {
			t.Fatalf("seed %d seq %d: list %q after %+v: %v", seed, seq, topic, cursor, err)
		}
		if len(page) > pageSize || (more && len(page) < pageSize) || pages > len(want)+1 {
			t.Fatalf("seed %d seq %d: list %q: page of %d (size %d), more %v, page %d", seed, seq, topic, len(page), pageSize, more, pages)
		}
		for _, e := range page {
			have = append(have, view(e))
		}
		if !more {
			break
		}
		last := page[len(page)-1]
		cursor = sched.ListCursor{DeliverAtMs: last.DeliverAtMs, ID: last.ID}
	}
	if !slices.Equal(have, want) {
		t.Fatalf("seed %d seq %d: listing %q by pages of %d:\n%v\nwant\n%v", seed, seq, topic, pageSize, have, want)
	}
}

// view is what a State says of a schedule (not where it keeps it).
func view(e sched.Entry) sched.Entry {
	return sched.Entry{ID: e.ID, DeliverAtMs: e.DeliverAtMs, Topic: e.Topic, Partition: e.Partition,
		Status: e.Status, FireSeq: e.FireSeq, Epoch: e.Epoch, Incarnation: e.Incarnation, At: e.At}
}

func laneOf(es []sched.Entry, lane string, st sched.Status) []sched.Entry {
	var out []sched.Entry
	for _, e := range es {
		if e.Topic == lane && e.Status == st {
			out = append(out, view(e))
		}
	}
	return out
}
