package partition

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// carryHistory is a leader's committed log: idempotent publishes of a few
// producers (a producer_seq skipped now and then), epoch changes, and the carries the leader proposes toward random
// compaction points. It returns the log and the leader that applied it.
func carryHistory(rng *rand.Rand, cfg Config, n int, mut Mutations) ([]Entry, *Member[int]) {
	leader := NewMember[int](cfg, 1, mut)
	var log []Entry
	next := map[uint64]uint64{}
	epoch := uint64(1)
	for seq := uint64(1); len(log) < n; seq++ {
		e := Entry{Seq: seq, Epoch: epoch}
		switch r := rng.IntN(20); {
		case r < 13:
			e.ProducerID = 1 + rng.Uint64N(7)
			next[e.ProducerID] += 1 + rng.Uint64N(2)
			e.ProducerSeq = next[e.ProducerID]
		case r < 18:
			b, ok := leader.AppendCarry(nil, 1+rng.Uint64N(seq))
			if !ok {
				seq--
				continue
			}
			e.Carry = b
		default:
			epoch++ // an install entry
			e.Epoch = epoch
		}
		if err := leader.Apply(e); err != nil {
			panic(err)
		}
		log = append(log, e)
	}
	return log, leader
}

// ProducersKeptInLog: a replica whose log starts anywhere the leader may
// compact through knows every producer the leader knows — sealed, it
// never takes a retry of an appended producer_seq for a new one, and a
// duplicate it names is where the entry landed.
func TestCarryKeepsProducersKnown(t *testing.T) {
	if err := checkCarries(Mutations{}, 300); err != nil {
		t.Fatal(err)
	}
	if checkCarries(Mutations{CompactForgetsProducers: true}, 300) == nil {
		t.Fatal("with CompactForgetsProducers every rebuilt replica still knew every producer")
	}
}

func checkCarries(mut Mutations, seeds uint64) error {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 11))
		log, leader := carryHistory(rng, cfg, 40+rng.IntN(120), mut)
		landed := map[[2]uint64]Entry{}
		for _, e := range log {
			if _, ok := landed[[2]uint64{e.ProducerID, e.ProducerSeq}]; e.ProducerID != 0 && !ok {
				landed[[2]uint64{e.ProducerID, e.ProducerSeq}] = e
			}
		}
		for start := uint64(2); start <= min(leader.CompactLimit(), uint64(len(log)))+1; start++ {
			r := NewMember[int](cfg, start, mut)
			for _, e := range log[start-1:] {
				if err := r.Apply(e); err != nil {
					return fmt.Errorf("seed %d: replica from %d refused entry %d: %v", seed, start, e.Seq, err)
				}
			}
			r.producers.SealHistory() // as Admit does before it takes publishes
			for k, e := range landed {
				lv, _, _ := leader.producers.Check(k[0], k[1])
				switch v, seq, epoch := r.producers.Check(k[0], k[1]); {
				case v == VerdictNew && lv != VerdictNew:
					return fmt.Errorf("seed %d: a replica from %d takes producer %d seq %d (at %d) for new", seed, start, k[0], k[1], e.Seq)
				case v == VerdictDuplicate && (seq != e.Seq || epoch != e.Epoch):
					return fmt.Errorf("seed %d: producer %d seq %d landed at %d@%d, replica from %d says %d@%d", seed, k[0], k[1], e.Seq, e.Epoch, start, seq, epoch)
				}
			}
		}
	}
	return nil
}

// A carry that does not decode changes nothing but still counts as
// applied, on every replica alike.
func TestCarryRefusedChangesNothing(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(published(1, 1, 7, 1))
	b, ok := m.AppendCarry(nil, 1)
	if !ok {
		t.Fatal("no carry for a producer mentioned only at 1")
	}
	before := verdicts(m.producers)
	if err := m.Apply(Entry{Seq: 2, Epoch: 1, Carry: b[:len(b)-1]}); err == nil {
		t.Fatal("a truncated carry applied")
	}
	if m.Applied() != 2 || verdicts(m.producers) != before || m.CompactLimit() != 0 {
		t.Fatalf("a refused carry changed the member: applied %d, limit %d", m.Applied(), m.CompactLimit())
	}
	if err := m.Apply(Entry{Seq: 3, Epoch: 1, Carry: b}); err != nil || m.CompactLimit() != 2 {
		t.Fatalf("the carry applied: %v, limit %d", err, m.CompactLimit())
	}
}

func FuzzDecodeCarry(f *testing.F) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 5}
	rng := rand.New(rand.NewPCG(1, 2))
	log, _ := carryHistory(rng, cfg, 80, Mutations{})
	for _, e := range log {
		if e.Carry != nil {
			f.Add(e.Carry)
		}
	}
	f.Add([]byte{carryVersion, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		const seq, epoch = 1000, 9
		p := NewProducers(cfg.DedupWindowMax, cfg.ProducersMax)
		if err := p.applyCarry(b, seq, epoch); err != nil {
			return
		}
		// What a carry teaches is a table a snapshot can hold.
		s, err := appendSnapshot(nil, seq, epoch, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeSnapshot(s, cfg); err != nil {
			t.Fatalf("a table learnt from a carry does not snapshot: %v", err)
		}
	})
}

// A replica configured with a smaller window than its leader's applies
// the leader's carry: it keeps the highest producer_seqs it has room for.
func TestCarryFitsASmallerWindow(t *testing.T) {
	leader := NewMember[int](Config{DedupWindowMax: 1024, ProducersMax: 5}, 1, Mutations{})
	for i := range uint64(10) {
		leader.Apply(published(1+i, 1, 7, i))
	}
	b, ok := leader.AppendCarry(nil, 10)
	if !ok {
		t.Fatal("no carry")
	}
	small := NewMember[int](Config{DedupWindowMax: 4, ProducersMax: 5}, 11, Mutations{})
	if err := small.Apply(Entry{Seq: 11, Epoch: 1, Carry: b}); err != nil {
		t.Fatalf("a carry of %d seqs refused by a window of 4: %v", carryEntriesMax, err)
	}
	small.producers.SealHistory()
	for pseq := range uint64(10) {
		v, seq, _ := small.producers.Check(7, pseq)
		switch {
		case pseq >= 6 && (v != VerdictDuplicate || seq != 1+pseq):
			t.Errorf("producer_seq %d: %v at %d, want a duplicate at %d", pseq, v, seq, 1+pseq)
		case pseq < 6 && v != VerdictTooOld:
			t.Errorf("producer_seq %d: %v, want TooOld", pseq, v)
		}
	}
}
