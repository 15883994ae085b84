package partition

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// snapHistory is a random committed log of idempotent publishes: few
// producers (so the LRU bound evicts), small windows (so they fill and
// raise floors), retries out of order, epochs rising.
type snapEntry struct{ seq, epoch, id, pseq uint64 }

func snapHistory(rng *rand.Rand, n int) []snapEntry {
	var h []snapEntry
	next := map[uint64]uint64{}
	holes := map[uint64][]uint64{} // sequences skipped, to come late
	epoch := uint64(1)
	for seq := uint64(1); seq <= uint64(n); seq++ {
		if rng.IntN(50) == 0 {
			epoch++
		}
		id := 1 + rng.Uint64N(7)
		var pseq uint64
		switch hs := holes[id]; {
		case len(hs) > 0 && rng.IntN(3) == 0: // a retry appended late, after a leader change
			i := rng.IntN(len(hs))
			pseq = hs[i]
			holes[id] = append(hs[:i], hs[i+1:]...)
		case rng.IntN(5) == 0:
			holes[id] = append(hs, next[id])
			next[id]++
			fallthrough
		default:
			pseq = next[id]
			next[id]++
		}
		h = append(h, snapEntry{seq, epoch, id, pseq}) // each identity at most once
	}
	return h
}

// verdicts asks p about every sequence of every producer around where the
// history went, so two tables that answer anything differently differ here.
func verdicts(p *Producers) string {
	var b strings.Builder
	for id := uint64(1); id <= 8; id++ {
		for pseq := uint64(0); pseq < 80; pseq++ {
			v, seq, epoch := p.Check(id, pseq)
			b.WriteByte(byte('0' + v))
			if v == VerdictDuplicate {
				b.WriteString(string(rune(seq)) + string(rune(epoch)))
			}
		}
	}
	return b.String()
}

// SnapshotStandsForTheLog: a member restored from a snapshot at any point
// of a history and then applying the rest answers every publish exactly as
// one that applied the whole history — evictions, floors, seals and the
// recency order included — and so does a single node's state.
func TestSnapshotStandsForTheLog(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := snapHistory(rng, 60+rng.IntN(100))
		cut := rng.IntN(len(h) + 1)
		whole := NewMember[int](cfg, 1, Mutations{})
		for _, e := range h {
			whole.Apply(Entry{Seq: e.seq, Epoch: e.epoch, ProducerID: e.id, ProducerSeq: e.pseq})
		}
		first := NewMember[int](cfg, 1, Mutations{})
		var epochAtCut uint64
		for _, e := range h[:cut] {
			first.Apply(Entry{Seq: e.seq, Epoch: e.epoch, ProducerID: e.id, ProducerSeq: e.pseq})
			epochAtCut = e.epoch
		}
		b, err := first.AppendSnapshot(nil, epochAtCut)
		if err != nil {
			t.Fatal(err)
		}
		s, err := DecodeSnapshot(b, cfg)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		again, _ := appendSnapshot(nil, s.Applied, s.Epoch, s.producers, s.groups)
		if !bytes.Equal(again, b) {
			t.Fatalf("seed %d: the decoded snapshot encodes differently", seed)
		}
		restored := NewMember[int](cfg, 1, Mutations{})
		if cut > 0 && !restored.Restore(s) {
			t.Fatalf("seed %d: restore at %d refused", seed, cut)
		}
		for _, e := range h {
			restored.Apply(Entry{Seq: e.seq, Epoch: e.epoch, ProducerID: e.id, ProducerSeq: e.pseq})
		}
		if restored.Applied() != whole.Applied() || verdicts(restored.producers) != verdicts(whole.producers) {
			t.Fatalf("seed %d: restored at %d of %d answers differently from the whole log", seed, cut, len(h))
		}
		// Sealed alike after retention.
		restored.producers.SealHistory()
		whole.producers.SealHistory()
		if verdicts(restored.producers) != verdicts(whole.producers) {
			t.Fatalf("seed %d: sealed, restored at %d answers differently", seed, cut)
		}

		// A single node's state: replay with a snapshot in the middle.
		st := NewState(cfg, h[len(h)-1].epoch+1, uint64(len(h))+1)
		ref := NewState(cfg, h[len(h)-1].epoch+1, uint64(len(h))+1)
		if cut > 0 {
			s, _ := DecodeSnapshot(b, cfg) // the member owns the first
			st.Restore(s)
		}
		for i, e := range h {
			ref.Replay(e.seq, e.epoch, e.id, e.pseq)
			if i >= cut {
				st.Replay(e.seq, e.epoch, e.id, e.pseq)
			}
		}
		if verdicts(st.producers) != verdicts(ref.producers) {
			t.Fatalf("seed %d: a state restored at %d answers differently", seed, cut)
		}
	}
}

// The consumer groups' needs travel in the snapshot too, so compaction
// after a restart stays below what every group needs.
func TestSnapshotKeepsWhatGroupsNeed(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1, Group: "g", GroupKind: 1})
	m.Apply(Entry{Seq: 2, Epoch: 1, ProducerID: 9, ProducerSeq: 0})
	m.Apply(Entry{Seq: 3, Epoch: 1, Group: "h", GroupKind: 1})
	b, err := m.AppendSnapshot(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := DecodeSnapshot(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := NewMember[int](cfg, 1, Mutations{})
	if !r.Restore(s) {
		t.Fatal("restore refused")
	}
	if got := r.CompactLimit(); got != 0 {
		t.Fatalf("compact limit %d after restore, want 0 (group g needs seq 1)", got)
	}
	if from := r.GroupsFrom(); from["g"] != 1 || from["h"] != 3 || len(from) != 2 {
		t.Fatalf("groups %v after restore", from)
	}
	if v, seq, _ := r.producers.Check(9, 0); v != VerdictDuplicate || seq != 2 {
		t.Fatalf("producer 9 seq 0: %v at %d after restore, want a duplicate at 2", v, seq)
	}
}

// A snapshot stands for the log only while the log holds its last entry
// under its epoch, or starts right after it.
func TestSnapshotUsable(t *testing.T) {
	s := &Snapshot{Applied: 10, Epoch: 3}
	for _, c := range []struct {
		name           string
		start, epochAt uint64
		inLog, want    bool
	}{
		{"the log holds it", 1, 3, true, true},
		{"compacted up to it", 10, 3, true, true},
		{"starts right after it", 11, 0, false, true},
		{"starts past it: entries missing", 12, 0, false, false},
		{"another epoch at its seq", 1, 4, true, false},
		{"the log ends before it", 1, 0, false, false},
	} {
		if got := SnapshotUsable(s, c.start, c.epochAt, c.inLog); got != c.want {
			t.Errorf("%s: usable %v, want %v", c.name, got, c.want)
		}
	}
}

// A member takes a snapshot only ahead of what it applied and with
// nothing in flight; a state only one with nothing beyond its commit.
func TestSnapshotRestoreRefusals(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1, ProducerID: 1})
	b, _ := m.AppendSnapshot(nil, 1)
	s, err := DecodeSnapshot(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if m.Restore(s) {
		t.Fatal("a member took a snapshot of what it applied already")
	}
	fresh := NewMember[int](cfg, 1, Mutations{})
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	fresh.applied = 1
	fresh.Publish(v, 2, 0, 7)
	fresh.applied = 0
	if fresh.Restore(s) {
		t.Fatal("a member with a proposal in flight took a snapshot")
	}
	st := NewState(cfg, 2, 1)
	st.Publish(1, 0)
	if _, err := st.AppendSnapshot(nil, 2); err == nil {
		t.Fatal("a state snapshotted a seq not yet durable")
	}
	st.Committed(1)
	if _, err := st.AppendSnapshot(nil, 2); err != nil {
		t.Fatal(err)
	}
}

// Every field a snapshot carries is checked: a bad one is an error, never
// a table that answers wrongly.
func TestDecodeSnapshotRefusesInconsistentTables(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 2}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1, ProducerID: 1, ProducerSeq: 0})
	m.Apply(Entry{Seq: 2, Epoch: 2, ProducerID: 2, ProducerSeq: 5})
	good, _ := m.AppendSnapshot(nil, 2)
	if _, err := DecodeSnapshot(good, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeSnapshot(good, Config{DedupWindowMax: 4, ProducersMax: 1}); err == nil {
		t.Error("a snapshot with more producers than the bound decoded")
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x40
		s, err := DecodeSnapshot(bad, cfg)
		if err != nil {
			continue
		}
		// A flip that still decodes changed something the rules allow
		// (an id, a floor): it must not claim an entry beyond Applied.
		for _, w := range s.producers.byID {
			for _, e := range w.entries() {
				if e.seq > s.Applied {
					t.Errorf("byte %d flipped: entry at %d beyond applied %d", i, e.seq, s.Applied)
				}
			}
		}
	}
	if _, err := DecodeSnapshot(append(bytes.Clone(good), 0), cfg); err == nil {
		t.Error("trailing bytes decoded")
	}
	if _, err := DecodeSnapshot(good[:len(good)-1], cfg); err == nil {
		t.Error("a truncated snapshot decoded")
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1, Group: "g", GroupKind: 1})
	for i := range uint64(12) {
		m.Apply(Entry{Seq: 2 + i, Epoch: 1 + i/5, ProducerID: 1 + i%3, ProducerSeq: i})
	}
	b, _ := m.AppendSnapshot(nil, 3)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{snapshotVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b, cfg)
		if err != nil {
			return
		}
		again, err := appendSnapshot(nil, s.Applied, s.Epoch, s.producers, s.groups)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := DecodeSnapshot(again, cfg)
		if err != nil {
			t.Fatalf("a decoded snapshot re-encodes undecodably: %v", err)
		}
		if verdicts(s2.producers) != verdicts(s.producers) {
			t.Fatal("a decoded snapshot answers differently after a round trip")
		}
		r := NewMember[int](cfg, 1, Mutations{})
		if s.Applied > 0 && !r.Restore(s) {
			t.Fatal("a decoded snapshot was refused by a fresh member")
		}
		r.Apply(Entry{Seq: s.Applied + 1, Epoch: s.Epoch, ProducerID: 1, ProducerSeq: 1 << 40})
		// What a repair does to it decodes too (every third seq gone).
		if s.Applied%3 != 0 {
			out, err := ForgetGoneSeqs(b, func(seq uint64) bool { return seq%3 == 0 })
			if err == nil {
				_, err = DecodeSnapshot(out, cfg)
			}
			if err != nil {
				t.Fatalf("a decoded snapshot with seqs gone: %v", err)
			}
		}
	})
}

// SnapshotForgetsOnlyGoneSeqs: after a repair drops random seqs of a
// history, every (producer, producer_seq) the snapshot answered as a
// duplicate at a dropped seq is new (a retry appends it again), every
// other answer stays — duplicates at kept seqs, floors' too-old, new —
// except that a producer whose every remembered seq was dropped is
// forgotten, and that a window sealed at a dropped top (after retention)
// is sealed past the highest kept: below that, too old. The result decodes under the writer's own bounds, keeps the
// groups, lowers no latest mention past the truth, is unchanged by a
// second pass, and takes further appends in recency order.
func TestForgetGoneSeqsForgetsOnlyThem(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		h := snapHistory(rng, 20+rng.IntN(100))
		m := NewMember[int](cfg, 1, Mutations{})
		m.Apply(Entry{Seq: 1, Epoch: 1, Group: "g", GroupKind: 1})
		seq := uint64(1)
		for _, e := range h {
			seq++
			m.Apply(Entry{Seq: seq, Epoch: e.epoch, ProducerID: e.id, ProducerSeq: e.pseq})
			if rng.IntN(6) == 0 { // a carry: latest mentions that are no appends
				if c, ok := m.AppendCarry(nil, 1+rng.Uint64N(seq)); ok {
					seq++
					if err := m.Apply(Entry{Seq: seq, Epoch: e.epoch, Carry: c}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if seed%2 == 0 {
			m.producers.SealHistory() // as a single node rebuilt after retention
		}
		last := snapEntry{seq: seq - 1, epoch: h[len(h)-1].epoch} // last.seq+1: the point
		b, err := m.AppendSnapshot(nil, last.epoch)
		if err != nil {
			t.Fatal(err)
		}
		if same, err := ForgetGoneSeqs(b, func(uint64) bool { return false }); err != nil || !bytes.Equal(same, b) {
			t.Fatalf("seed %d: nothing gone changed the snapshot (%v)", seed, err)
		}
		gone := map[uint64]bool{}
		for range 1 + rng.IntN(6) { // a few damaged ranges, never the point
			from := 2 + rng.Uint64N(last.seq)
			for s := from; s < min(from+1+rng.Uint64N(8), last.seq+1); s++ {
				gone[s] = true
			}
		}
		isGone := func(s uint64) bool { return gone[s] }
		out, err := ForgetGoneSeqs(b, isGone)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		s, err := DecodeSnapshot(out, cfg)
		if err != nil {
			t.Fatalf("seed %d: the rewritten snapshot does not decode: %v", seed, err)
		}
		if s.Applied != last.seq+1 || s.Epoch != last.epoch || s.groups["g"] != 1 {
			t.Fatalf("seed %d: point (%d, %d), groups %v", seed, s.Applied, s.Epoch, s.groups)
		}
		if again, err := ForgetGoneSeqs(out, isGone); err != nil || !bytes.Equal(again, out) {
			t.Fatalf("seed %d: a second pass changed the snapshot (%v)", seed, err)
		}
		before, after := m.producers, s.producers
		for id := uint64(1); id <= 8; id++ {
			bw, aw := before.byID[id], after.byID[id]
			forgotten := false
			if bw != nil {
				forgotten = true
				for i := range bw.n {
					forgotten = forgotten && gone[bw.at(i).seq]
				}
			}
			if forgotten != (bw != nil && aw == nil) || bw == nil && aw != nil {
				t.Fatalf("seed %d: producer %d forgotten=%v, yet it is %v after (%v before)", seed, id, forgotten, aw, bw)
			}
			if aw != nil {
				top := aw.at(aw.n - 1)
				wantLast := bw.lastSeq
				if top.producerSeq != bw.maxSeen || gone[bw.lastSeq] {
					wantLast = top.seq
				}
				if aw.maxSeen != top.producerSeq || aw.lastSeq != wantLast {
					t.Fatalf("seed %d: producer %d last mention %d (was %d), highest %d", seed, id, aw.lastSeq, bw.lastSeq, aw.maxSeen)
				}
			}
			floor := uint64(0) // a window sealed at a gone top: sealed past the highest kept
			if aw != nil {
				floor = min(bw.floor, aw.maxSeen+1)
			}
			for pseq := uint64(0); pseq < 80; pseq++ {
				v, seq, epoch := before.Check(id, pseq)
				want := v
				switch {
				case forgotten:
					want, seq, epoch = VerdictNew, 0, 0
				case v == VerdictDuplicate && !gone[seq]:
				case v != VerdictNew && pseq < floor:
					want, seq, epoch = VerdictTooOld, 0, 0
				case v != VerdictNew:
					want, seq, epoch = VerdictNew, 0, 0
				}
				if gv, gs, ge := after.Check(id, pseq); gv != want || gs != seq || ge != epoch {
					t.Fatalf("seed %d: producer %d seq %d: %v at %d/%d, want %v at %d/%d", seed, id, pseq, gv, gs, ge, want, seq, epoch)
				}
			}
		}
		// A retry appended again moves its producer's latest mention; the
		// recency list stays ordered (the next snapshot decodes).
		r := NewMember[int](cfg, 1, Mutations{})
		if !r.Restore(s) {
			t.Fatalf("seed %d: restore refused", seed)
		}
		r.Apply(Entry{Seq: last.seq + 2, Epoch: last.epoch, ProducerID: h[0].id, ProducerSeq: 1000})
		b2, err := r.AppendSnapshot(nil, last.epoch)
		if err == nil {
			_, err = DecodeSnapshot(b2, cfg)
		}
		if err != nil {
			t.Fatalf("seed %d: after an append: %v", seed, err)
		}
	}
	// The point itself gone: nothing can match the snapshot any more.
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1, ProducerID: 3, ProducerSeq: 0})
	b, _ := m.AppendSnapshot(nil, 1)
	if _, err := ForgetGoneSeqs(b, func(s uint64) bool { return s == 1 }); !errors.Is(err, ErrSnapshotPointGone) {
		t.Fatalf("a snapshot whose point is gone: %v", err)
	}
}
