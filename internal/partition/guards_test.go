package partition

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/acklog"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// A window that evicts keeps the floor its seal raised: producer_seqs
// between the lowest remembered and the seal stay TOO_OLD. Pins insert's
// max(w.floor, lowest+1).
func TestEvictionKeepsTheSealedFloor(t *testing.T) {
	p := NewProducers(2, 4)
	p.Record(7, 1, 1, 1)
	p.Record(7, 5, 2, 1)
	p.SealHistory() // floor 5: 2-4 may have landed in the deleted log
	p.Record(7, 6, 3, 1)
	for _, ps := range []uint64{2, 3, 4} {
		if v, _, _ := p.Check(7, ps); v != VerdictTooOld {
			t.Errorf("producer_seq %d after the seal and an eviction: %v, want TooOld", ps, v)
		}
	}
}

// The floor itself is provably new: every producer_seq below it was
// evicted or sealed, none at it. Pins Check's producerSeq < w.floor.
func TestTheFloorItselfIsNew(t *testing.T) {
	p := NewProducers(2, 4)
	p.Record(7, 1, 1, 1)
	p.Record(7, 3, 2, 1)
	p.Record(7, 4, 3, 1) // evicts 1: floor 2
	if v, _, _ := p.Check(7, 2); v != VerdictNew {
		t.Fatalf("producer_seq 2 at the floor, never appended: %v, want New", v)
	}
	if v, _, _ := p.Check(7, 1); v != VerdictTooOld {
		t.Fatalf("producer_seq 1, evicted: %v, want TooOld", v)
	}
}

// A carry holds at most carryProducersMax producers, so that it decodes;
// the rest go in the next. Pins appendCarry's len(ws) < carryProducersMax.
func TestACarryHoldsAtMostCarryProducersMax(t *testing.T) {
	cfg := Config{DedupWindowMax: 2, ProducersMax: carryProducersMax + 10}
	m := NewMember[int](cfg, 1, Mutations{})
	n := uint64(carryProducersMax + 1)
	for id := uint64(1); id <= n; id++ {
		m.Apply(published(id, 1, id, 0))
	}
	b, ok := m.AppendCarry(nil, n)
	if !ok {
		t.Fatal("no carry")
	}
	ps, err := decodeCarry(b, n+1, 1)
	if err != nil {
		t.Fatalf("the carry does not decode: %v", err)
	}
	if len(ps) != carryProducersMax || ps[0].id != 1 || ps[len(ps)-1].id != carryProducersMax {
		t.Fatalf("carried %d producers (%d to %d), want the %d mentioned longest ago", len(ps), ps[0].id, ps[len(ps)-1].id, carryProducersMax)
	}
	if err := m.Apply(Entry{Seq: n + 1, Epoch: 1, Carry: b}); err != nil {
		t.Fatal(err)
	}
	b, ok = m.AppendCarry(nil, n) // producer n alone is mentioned through n now
	if ps, err = decodeCarry(b, n+2, 1); !ok || err != nil || len(ps) != 1 || ps[0].id != n {
		t.Fatalf("the next carry: ok %v, %v, %d producers, want producer %d alone", ok, err, len(ps), n)
	}
}

// With no producer to carry, AppendCarry appends nothing. Pins
// appendCarry's return on len(ws) == 0.
func TestNoCarryAppendsNothing(t *testing.T) {
	m := NewMember[int](Config{DedupWindowMax: 2, ProducersMax: 2}, 1, Mutations{})
	m.Apply(published(1, 1, 7, 0))
	prefix := []byte("shell")
	if b, ok := m.AppendCarry(prefix, 0); ok || !bytes.Equal(b, prefix) {
		t.Fatalf("nothing mentioned through 0: ok %v, %q, want the prefix alone", ok, b)
	}
}

// carryBytes encodes a carry by hand: version, a producer count, then
// each producer's id, entry count and entries, as given.
type carryProducerSpec struct {
	id      uint64
	k       int // the entry count written (len(entries) when -1)
	entries []dedupEntry
}

// appendSpecWindow appends a window's entry count (k, or the entries'
// when k < 0) and its entries, as carries and snapshots lay them out.
func appendSpecWindow(b []byte, k int, entries []dedupEntry) []byte {
	if k < 0 {
		k = len(entries)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(k))
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint64(b, e.producerSeq)
		b = binary.LittleEndian.AppendUint64(b, e.seq)
		b = binary.LittleEndian.AppendUint64(b, e.epoch)
	}
	return b
}

func carryBytes(version byte, count int, ps []carryProducerSpec) []byte {
	b := []byte{version}
	b = binary.LittleEndian.AppendUint32(b, uint32(count))
	for _, p := range ps {
		b = binary.LittleEndian.AppendUint64(b, p.id)
		b = appendSpecWindow(b, p.k, p.entries)
	}
	return b
}

// Every field of a carry is checked against the carry's seq and epoch:
// a bad one refuses the whole carry. Pins decodeCarry's version, producer
// count (0, above carryProducersMax), id (0, out of order, twice), entry
// count (0, above carryEntriesMax), entry seq (0, at or after the
// carry), epoch (0, above the carry's), producer_seq order and trailing
// bytes.
func TestDecodeCarryRefusesEachBadField(t *testing.T) {
	const seq, epoch = 100, 5
	e := func(ps, s, ep uint64) dedupEntry { return dedupEntry{producerSeq: ps, seq: s, epoch: ep} }
	good := func(id uint64) carryProducerSpec {
		return carryProducerSpec{id: id, k: -1, entries: []dedupEntry{e(1, 10, 1), e(2, 99, 5)}}
	}
	eight := make([]dedupEntry, carryEntriesMax+1)
	for i := range eight {
		eight[i] = e(uint64(i), uint64(1+i), 1)
	}
	if ps, err := decodeCarry(carryBytes(carryVersion, 2, []carryProducerSpec{good(3), good(4)}), seq, epoch); err != nil || len(ps) != 2 {
		t.Fatalf("the good carry: %v", err)
	}
	if _, err := decodeCarry(carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: eight[:carryEntriesMax]}}), seq, epoch); err != nil {
		t.Fatalf("a carry of %d entries: %v", carryEntriesMax, err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"version", carryBytes(carryVersion+1, 1, []carryProducerSpec{good(3)})},
		{"no producer", carryBytes(carryVersion, 0, nil)},
		{"id 0", carryBytes(carryVersion, 1, []carryProducerSpec{good(0)})},
		{"ids out of order", carryBytes(carryVersion, 2, []carryProducerSpec{good(4), good(3)})},
		{"an id twice", carryBytes(carryVersion, 2, []carryProducerSpec{good(3), good(3)})},
		{"no entry", carryBytes(carryVersion, 2, []carryProducerSpec{{id: 3, k: -1}, good(4)})}, // bytes enough for two
		{"too many entries", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: eight}})},
		{"seq 0", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(1, 0, 1)}}})},
		{"seq at the carry", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(1, seq, 1)}}})},
		{"epoch 0", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(1, 10, 0)}}})},
		{"epoch above the carry's", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(1, 10, epoch+1)}}})},
		{"producer_seqs out of order", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(2, 10, 1), e(1, 11, 1)}}})},
		{"a producer_seq twice", carryBytes(carryVersion, 1, []carryProducerSpec{{id: 3, k: -1, entries: []dedupEntry{e(2, 10, 1), e(2, 11, 1)}}})},
		{"trailing bytes", append(carryBytes(carryVersion, 1, []carryProducerSpec{good(3)}), 0)},
	} {
		if ps, err := decodeCarry(tc.b, seq, epoch); err == nil {
			t.Errorf("%s: decoded %v", tc.name, ps)
		} else if !strings.Contains(err.Error(), "partition:") {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// A count above carryProducersMax is refused even when the bytes hold
// that many producers. Pins decodeCarry's n > carryProducersMax.
func TestDecodeCarryRefusesMoreThanCarryProducersMax(t *testing.T) {
	ps := make([]carryProducerSpec, carryProducersMax+1)
	for i := range ps {
		ps[i] = carryProducerSpec{id: uint64(1 + i), k: -1, entries: []dedupEntry{{producerSeq: 1, seq: 1, epoch: 1}}}
	}
	if _, err := decodeCarry(carryBytes(carryVersion, len(ps), ps), 10, 1); err == nil {
		t.Fatalf("a carry of %d producers decoded", len(ps))
	}
	if _, err := decodeCarry(carryBytes(carryVersion, len(ps)-1, ps[:len(ps)-1]), 10, 1); err != nil {
		t.Fatalf("a carry of %d producers: %v", len(ps)-1, err)
	}
}

// A carry that names producers this table does not know learns them
// within ProducersMax, evicting the least recently mentioned. Pins
// applyCarry's len(p.byID) >= p.producersMax and its eviction.
func TestACarryLearnsProducersWithinTheBound(t *testing.T) {
	cfg := Config{DedupWindowMax: 2, ProducersMax: 2}
	leader := NewMember[int](Config{DedupWindowMax: 2, ProducersMax: 4}, 1, Mutations{})
	leader.Apply(published(1, 1, 5, 0))
	leader.Apply(published(2, 1, 6, 0))
	b, ok := leader.AppendCarry(nil, 2)
	if !ok {
		t.Fatal("no carry")
	}
	m := NewMember[int](cfg, 3, Mutations{})
	m.Apply(published(3, 1, 7, 0))
	m.Apply(published(4, 1, 8, 0))
	if err := m.Apply(Entry{Seq: 5, Epoch: 1, Carry: b}); err != nil {
		t.Fatal(err)
	}
	if n := m.producers.Len(); n != 2 {
		t.Fatalf("%d producers after a carry of two, want ProducersMax 2", n)
	}
	for id, want := range map[uint64]Verdict{5: VerdictDuplicate, 6: VerdictDuplicate, 7: VerdictNew, 8: VerdictNew} {
		if v, _, _ := m.Lookup(id, 0); v != want {
			t.Errorf("producer %d: %v, want %v", id, v, want)
		}
	}
}

// A member whose log starts at seq 1 has its whole history: its table
// is not sealed, and a producer_seq below one appended out of order is
// new. Pins NewMember's truncated: startSeq > 1.
func TestAMemberFromSeqOneIsNotSealed(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 1, Mutations{})
	m.Apply(install(1, 1))
	m.Apply(published(2, 1, 7, 2))
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	if d := m.Publish(v, 7, 1, "r"); d.Action != Propose {
		t.Fatalf("producer_seq 1, never appended, below 2: %v, want Propose", d.Action)
	}
}

// A member whose log starts at seq 2 misses seq 1: its table is sealed
// before it takes publishes. Pins NewMember's truncated: startSeq > 1
// (not > 2).
func TestAMemberFromSeqTwoIsSealed(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 2, Mutations{})
	m.Apply(install(2, 1))
	m.Apply(published(3, 1, 7, 2))
	v := View{Leader: true, Epoch: 1, InstallSeq: 2}
	if d := m.Publish(v, 7, 1, "r"); d.Action != AnswerTooOld {
		t.Fatalf("producer_seq 1, maybe appended at seq 1: %v, want AnswerTooOld", d.Action)
	}
}

// A truncated member seals its table once per epoch it leads: what it
// applies after the seal is all there is, so a producer_seq below one
// appended since is new. Pins Admit's m.sealedEpoch != v.Epoch and its
// m.sealedEpoch = v.Epoch.
func TestTheSealIsOncePerEpoch(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 2, Mutations{})
	m.Apply(install(2, 1))
	v := View{Leader: true, Epoch: 1, InstallSeq: 2}
	if r := m.Admit(v); r != RefusedNone {
		t.Fatal(r)
	}
	m.Apply(published(3, 1, 7, 2)) // appended under this epoch, after the seal
	if d := m.Publish(v, 7, 1, "r"); d.Action != Propose {
		t.Fatalf("producer_seq 1, never appended: %v, want Propose", d.Action)
	}
}

// snapBytes encodes a snapshot by hand, fields as given.
type snapGroupSpec struct {
	name string
	from uint64
}

type snapProducerSpec struct {
	id, floor, lastSeq, maxSeen uint64
	k                           int // the entry count written (len(entries) when -1)
	entries                     []dedupEntry
}

func snapBytes(version byte, applied, epoch uint64, groups []snapGroupSpec, count int, ps []snapProducerSpec) []byte {
	b := []byte{version}
	b = binary.LittleEndian.AppendUint64(b, applied)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(groups)))
	for _, g := range groups {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(g.name)))
		b = append(b, g.name...)
		b = binary.LittleEndian.AppendUint64(b, g.from)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(count))
	for _, p := range ps {
		b = binary.LittleEndian.AppendUint64(b, p.id)
		b = binary.LittleEndian.AppendUint64(b, p.floor)
		b = binary.LittleEndian.AppendUint64(b, p.lastSeq)
		b = binary.LittleEndian.AppendUint64(b, p.maxSeen)
		b = appendSpecWindow(b, p.k, p.entries)
	}
	return b
}

// Every field of a snapshot is checked against its header and the
// partition's bounds: a bad one is an error, and the bounds themselves
// decode. Pins DecodeSnapshot's version, applied/epoch pairing, group
// (empty name, from 0 or beyond applied, twice), producer count, window
// size (0, above DedupWindowMax), latest mention (0, beyond applied),
// producer twice, recency order ((lastSeq, id) rising), entry (seq 0 or
// beyond applied, epoch 0 or beyond the snapshot's, producer_seq above
// the highest seen), the highest seen against the window (its highest
// entry; a floor at most one past it) and trailing bytes.
func TestDecodeSnapshotRefusesEachBadField(t *testing.T) {
	cfg := Config{DedupWindowMax: 2, ProducersMax: 2}
	const applied, epoch = 50, 4
	e := func(ps, s, ep uint64) dedupEntry { return dedupEntry{producerSeq: ps, seq: s, epoch: ep} }
	p := func(id, lastSeq uint64, es ...dedupEntry) snapProducerSpec {
		var maxSeen uint64
		for _, e := range es {
			maxSeen = max(maxSeen, e.producerSeq)
		}
		return snapProducerSpec{id: id, floor: 0, lastSeq: lastSeq, maxSeen: maxSeen, k: -1, entries: es}
	}
	with := func(sp snapProducerSpec, floor, maxSeen uint64) []snapProducerSpec {
		sp.floor, sp.maxSeen = floor, maxSeen
		return []snapProducerSpec{sp}
	}
	groups := []snapGroupSpec{{"a", 1}, {"b", applied}}
	// At every bound: a group needing the applied seq, a full window, an
	// entry at applied under epoch with producer_seq maxSeen, two
	// producers (ProducersMax) mentioned at the same seq in id order.
	good := []snapProducerSpec{p(3, applied, e(1, 10, 1), e(9, applied, epoch)), p(4, applied, e(2, 11, 2))}
	s, err := DecodeSnapshot(snapBytes(snapshotVersion, applied, epoch, groups, 2, good), cfg)
	if err != nil {
		t.Fatalf("the good snapshot: %v", err)
	}
	if v, seq, ep := s.producers.Check(3, 9); v != VerdictDuplicate || seq != applied || ep != epoch {
		t.Fatalf("the good snapshot's producer 3 seq 9: %v at %d@%d", v, seq, ep)
	}
	if _, err := DecodeSnapshot(snapBytes(snapshotVersion, 0, 0, nil, 0, nil), cfg); err != nil {
		t.Fatalf("the empty snapshot: %v", err)
	}
	if _, err := DecodeSnapshot(snapBytes(snapshotVersion, applied, epoch, nil, 1, with(p(3, 40, e(1, 10, 1), e(9, 11, 1)), 10, 9)), cfg); err != nil {
		t.Fatalf("a floor just past the highest seen: %v", err)
	}
	three := []snapProducerSpec{p(3, 40, e(1, 10, 1)), p(4, 41, e(1, 10, 1)), p(5, 42, e(1, 10, 1))}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"version", snapBytes(snapshotVersion+1, applied, epoch, groups, 2, good)},
		{"applied without an epoch", snapBytes(snapshotVersion, applied, 0, nil, 0, nil)},
		{"an epoch without applied", snapBytes(snapshotVersion, 0, epoch, nil, 0, nil)},
		{"a group without a name", snapBytes(snapshotVersion, applied, epoch, []snapGroupSpec{{"", 1}}, 2, good)},
		{"a group needing seq 0", snapBytes(snapshotVersion, applied, epoch, []snapGroupSpec{{"a", 0}}, 2, good)},
		{"a group needing beyond applied", snapBytes(snapshotVersion, applied, epoch, []snapGroupSpec{{"a", applied + 1}}, 2, good)},
		{"a group twice", snapBytes(snapshotVersion, applied, epoch, []snapGroupSpec{{"a", 1}, {"a", 2}}, 2, good)},
		{"more producers than ProducersMax", snapBytes(snapshotVersion, applied, epoch, nil, 3, three)},
		{"an empty window", snapBytes(snapshotVersion, applied, epoch, nil, 2, []snapProducerSpec{p(3, 40), p(4, 41, e(1, 10, 1))})},
		{"a window above DedupWindowMax", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 40, e(1, 10, 1), e(2, 11, 1), e(3, 12, 1))})},
		{"a latest mention at 0", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 0, e(1, 10, 1))})},
		{"a latest mention beyond applied", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, applied+1, e(1, 10, 1))})},
		{"a producer twice", snapBytes(snapshotVersion, applied, epoch, nil, 2, []snapProducerSpec{p(3, 40, e(1, 10, 1)), p(3, 41, e(2, 11, 1))})},
		{"mentions falling", snapBytes(snapshotVersion, applied, epoch, nil, 2, []snapProducerSpec{p(3, 41, e(1, 10, 1)), p(4, 40, e(1, 11, 1))})},
		{"ids falling at one mention", snapBytes(snapshotVersion, applied, epoch, nil, 2, []snapProducerSpec{p(4, 40, e(1, 10, 1)), p(3, 40, e(1, 11, 1))})},
		{"an entry at seq 0", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 40, e(1, 0, 1))})},
		{"an entry beyond applied", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 40, e(1, applied+1, 1))})},
		{"an entry under epoch 0", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 40, e(1, 10, 0))})},
		{"an entry under a later epoch", snapBytes(snapshotVersion, applied, epoch, nil, 1, []snapProducerSpec{p(3, 40, e(1, 10, epoch+1))})},
		{"an entry above the highest seen", snapBytes(snapshotVersion, applied, epoch, nil, 1, with(p(3, 40, e(10, 10, 1)), 0, 9))},
		{"a highest seen above the window", snapBytes(snapshotVersion, applied, epoch, nil, 1, with(p(3, 40, e(1, 10, 1), e(9, 11, 1)), 0, 12))},
		{"a floor past the highest seen + 1", snapBytes(snapshotVersion, applied, epoch, nil, 1, with(p(3, 40, e(1, 10, 1), e(9, 11, 1)), 11, 9))},
		{"trailing bytes", append(snapBytes(snapshotVersion, applied, epoch, groups, 2, good), 0)},
	} {
		if s, err := DecodeSnapshot(tc.b, cfg); err == nil {
			t.Errorf("%s: decoded (applied %d, %d producers)", tc.name, s.Applied, s.producers.Len())
		}
	}
}

// A snapshot's window comes in any order and is sorted before it
// answers. Pins DecodeSnapshot's sort of the entries.
func TestDecodeSnapshotSortsTheWindow(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 2}
	b := snapBytes(snapshotVersion, 20, 1, nil, 1, []snapProducerSpec{{id: 3, lastSeq: 20, maxSeen: 9, k: -1,
		entries: []dedupEntry{{9, 20, 1}, {5, 12, 1}, {7, 15, 1}, {1, 10, 1}}}})
	s, err := DecodeSnapshot(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for ps, seq := range map[uint64]uint64{1: 10, 5: 12, 7: 15, 9: 20} {
		if v, at, _ := s.producers.Check(3, ps); v != VerdictDuplicate || at != seq {
			t.Errorf("producer_seq %d: %v at %d, want a duplicate at %d", ps, v, at, seq)
		}
	}
}

// A member rebuilt from a later log start forgets the publishes it
// answered NotApplied: their entries are before the new start and never
// applied here, and the kept log holds their producers' latest mention.
// A producer stays carried, not busy forever. Pins LogStart's
// clear(m.unapplied).
func TestLogStartForgetsWhatWasNotApplied(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 1, Mutations{})
	m.Apply(install(1, 1))
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	d := m.Publish(v, 7, 1, "r")
	if a, ok := m.Completed(d.Key, 5, 1, nil); !ok || a.Outcome != NotApplied {
		t.Fatalf("completed at 5 with 1 applied: %v %v", ok, a.Outcome)
	}
	if !m.LogStart(10) {
		t.Fatal("the log's start did not move")
	}
	m.Apply(published(10, 1, 7, 2)) // the kept log's mention of producer 7
	if b, ok := m.AppendCarry(nil, 10); !ok || len(b) == 0 {
		t.Fatal("producer 7 not carried: still held by a publish answered before the rebuild")
	}
}

// Each idempotent publish answered NotApplied is remembered until its
// entry is applied: a second one does not drop the first. Pins
// Completed's m.unapplied == nil (the map is made once).
func TestEveryPublishAnsweredNotAppliedIsRemembered(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 1, Mutations{})
	m.Apply(install(1, 1))
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	d1, d2 := m.Publish(v, 7, 1, "a"), m.Publish(v, 8, 1, "b")
	for i, d := range []PublishDecision{d1, d2} {
		if a, ok := m.Completed(d.Key, uint64(2+i), 1, nil); !ok || a.Outcome != NotApplied {
			t.Fatalf("completed at %d with 1 applied: %v %v", 2+i, ok, a.Outcome)
		}
	}
	for _, id := range []uint64{7, 8} {
		if d := m.Publish(v, id, 1, "retry"); d.Action != Refuse || d.Refusal != RefusedNotApplied {
			t.Errorf("retry of producer %d, committed but not applied: %v %v, want Refuse NotApplied", id, d.Action, d.Refusal)
		}
	}
}

// A non-idempotent publish answered NotApplied leaves nothing behind:
// no retry can name it, and its entry would never clear it. Pins
// Completed's key.ProducerID != 0.
func TestANonIdempotentPublishNotAppliedIsNotKept(t *testing.T) {
	m := NewMember[string](Config{DedupWindowMax: 8, ProducersMax: 8}, 1, Mutations{})
	m.Apply(install(1, 1))
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	d := m.Publish(v, 0, 0, "a")
	if a, ok := m.Completed(d.Key, 2, 1, nil); !ok || a.Outcome != NotApplied {
		t.Fatalf("completed at 2 with 1 applied: %v %v", ok, a.Outcome)
	}
	m.Apply(Entry{Seq: 2, Epoch: 1})
	if len(m.unapplied) != 0 {
		t.Fatalf("%d publishes held as committed but not applied, want none", len(m.unapplied))
	}
}

// Replay records idempotent publishes only: non-idempotent entries take
// no room in the bounded table. Pins Replay's producerID != 0.
func TestReplayKeepsNonIdempotentEntriesOutOfTheTable(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 1}, 1, 4)
	s.Replay(1, 1, 7, 0)
	s.Replay(2, 1, 0, 0)
	s.Replay(3, 1, 0, 0)
	s.ReplayDone(false)
	if d := s.Publish(7, 0); d.Verdict != VerdictDuplicate || d.Seq != 1 {
		t.Fatalf("retry of producer 7's seq 0 after non-idempotent entries: %v at %d, want a duplicate at 1", d.Verdict, d.Seq)
	}
}

// A log replayed whole is not sealed: a producer_seq below one appended
// out of order is new. Pins ReplayDone's historyTruncated.
func TestReplayOfTheWholeLogIsNotSealed(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 4}, 1, 2)
	s.Replay(1, 1, 7, 2)
	s.ReplayDone(false)
	if d := s.Publish(7, 1); d.Verdict != VerdictNew {
		t.Fatalf("producer_seq 1, never appended: %v, want New", d.Verdict)
	}
}

// A non-idempotent publish takes no room in the bounded table. Pins
// State.Publish's producerID != 0 before Record.
func TestANonIdempotentPublishIsNotRecorded(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 1}, 1, 1)
	first := s.Publish(7, 0)
	s.Publish(0, 0)
	if d := s.Publish(7, 0); d.Verdict != VerdictDuplicate || d.Seq != first.Seq {
		t.Fatalf("retry of producer 7's seq 0 after a non-idempotent publish: %v at %d, want a duplicate at %d", d.Verdict, d.Seq, first.Seq)
	}
	if n := s.Producers(); n != 1 {
		t.Fatalf("%d producers, want 1", n)
	}
}

// The same state encodes to the same bytes, whatever order the groups
// come out of their map in. Pins appendSnapshot's slices.Sort(names).
func TestASnapshotEncodesItsGroupsInOrder(t *testing.T) {
	m := NewMember[int](Config{DedupWindowMax: 2, ProducersMax: 2}, 1, Mutations{})
	for i := range uint64(8) {
		m.Apply(groupRec(1+i, fmt.Sprintf("g%d", i), acklog.KindAck))
	}
	first, err := m.AppendSnapshot(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if b, _ := m.AppendSnapshot(nil, 1); !bytes.Equal(b, first) {
			t.Fatal("one state encoded to two snapshots")
		}
	}
}

// A table that encodes to more than SnapshotBytesMax is not snapshotted
// (an error, no bytes); one of exactly SnapshotBytesMax is. Pins
// appendSnapshot's len(b) > SnapshotBytesMax, in the loop and after it.
func TestASnapshotAboveItsBoundIsRefused(t *testing.T) {
	m := NewMember[int](Config{DedupWindowMax: 2, ProducersMax: 4}, 1, Mutations{})
	for i := range uint64(3) {
		m.Apply(published(1+i, 1, 7+i, 0))
	}
	full, err := m.AppendSnapshot(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func(old int) { SnapshotBytesMax = old }(SnapshotBytesMax)
	for _, tc := range []struct {
		max int
		ok  bool
	}{{len(full), true}, {len(full) - 1, false}, {30, false}} {
		SnapshotBytesMax = tc.max
		b, err := m.AppendSnapshot(nil, 1)
		switch {
		case tc.ok && (err != nil || !bytes.Equal(b, full)):
			t.Errorf("bound %d, snapshot of %d bytes: %v", tc.max, len(full), err)
		case !tc.ok && (err != ErrSnapshotTooLarge || b != nil):
			t.Errorf("bound %d, snapshot of %d bytes: %d bytes, %v, want ErrSnapshotTooLarge", tc.max, len(full), len(b), err)
		}
	}
}

// Every proper prefix of a snapshot or a carry is refused: a field cut
// short is an error, never a zero. Pins snapDecoder.bytes's
// d.fail("truncated") and u16's b != nil.
func TestEveryTruncatedSnapshotOrCarryIsRefused(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 4}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(groupRec(1, "g", acklog.KindAck))
	m.Apply(published(2, 1, 7, 0))
	m.Apply(published(3, 1, 8, 0))
	snap, err := m.AppendSnapshot(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(snap) {
		if _, err := DecodeSnapshot(snap[:n], cfg); err == nil {
			t.Errorf("the snapshot's first %d of %d bytes decoded", n, len(snap))
		}
	}
	carry, ok := m.AppendCarry(nil, 3)
	if !ok {
		t.Fatal("no carry")
	}
	for n := range len(carry) {
		if _, err := decodeCarry(carry[:n], 10, 1); err == nil {
			t.Errorf("the carry's first %d of %d bytes decoded", n, len(carry))
		}
	}
}

// A log that does not hold the snapshot's last entry cannot stand for
// it, whatever epoch is passed. Pins SnapshotUsable's inLog.
func TestASnapshotBeyondTheLogIsNotUsable(t *testing.T) {
	s := &Snapshot{Applied: 5, Epoch: 2}
	if SnapshotUsable(s, 1, 2, false) {
		t.Fatal("a snapshot at 5 usable for a log that does not hold 5")
	}
	if !SnapshotUsable(s, 1, 2, true) {
		t.Fatal("a snapshot at 5 not usable for a log holding 5 under its epoch")
	}
}
