package partition

import (
	"math/rand/v2"
	"testing"
)

func TestPublishAssignsConsecutiveSeqs(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 10}, 3, 5)
	for want := uint64(5); want < 10; want++ {
		d := s.Publish(0, 0)
		if d.Verdict != VerdictNew || d.Seq != want || d.Epoch != 3 {
			t.Fatalf("publish = %+v, want new at %d epoch 3", d, want)
		}
	}
	if s.CommitSeq() != 4 {
		t.Fatalf("nothing committed yet, commit = %d", s.CommitSeq())
	}
	s.Committed(7)
	if s.CommitSeq() != 7 {
		t.Fatalf("commit = %d", s.CommitSeq())
	}
	s.Committed(6) // never moves back
	if s.CommitSeq() != 7 {
		t.Fatalf("commit moved back to %d", s.CommitSeq())
	}
}

func TestCommitBeyondAssignedPanics(t *testing.T) {
	s := NewState(DefaultConfig, 1, 1)
	defer func() {
		if recover() == nil {
			t.Fatal("commit of an unassigned seq must panic")
		}
	}()
	s.Committed(1)
}

func TestDuplicateReturnsOriginalSeqAndEpoch(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 8, ProducersMax: 10}, 1, 1)
	first := s.Publish(42, 7)
	again := s.Publish(42, 7)
	if again.Verdict != VerdictDuplicate || again.Seq != first.Seq || again.Epoch != 1 {
		t.Fatalf("replay = %+v, first = %+v", again, first)
	}
	if other := s.Publish(43, 7); other.Verdict != VerdictNew {
		t.Fatalf("another producer's seq 7 is %v", other.Verdict)
	}
}

func TestWindowFloorMakesEvictedSeqsUnprovable(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 3, ProducersMax: 10}, 1, 1)
	for ps := uint64(10); ps <= 14; ps++ { // 10 and 11 are evicted
		s.Publish(1, ps)
	}
	cases := []struct {
		ps   uint64
		want Verdict
	}{
		{10, VerdictTooOld}, {11, VerdictTooOld}, {12, VerdictDuplicate}, {14, VerdictDuplicate},
		{15, VerdictNew}, {9, VerdictTooOld},
	}
	for _, c := range cases {
		if v, _, _ := s.producers.Check(1, c.ps); v != c.want {
			t.Errorf("producer_seq %d: %v, want %v", c.ps, v, c.want)
		}
	}
	// A gap above the floor that was never appended is provably new.
	s.Publish(1, 20)
	if v, _, _ := s.producers.Check(1, 17); v != VerdictNew {
		t.Errorf("unappended seq inside the window: %v", v)
	}
}

// Sequences appended out of order (retries, leader changes) must not push
// the floor over a lower one still in flight: a full window forgets its
// lowest producer_seq, not the one appended first.
func TestOutOfOrderAppendsKeepInFlightSeqsProvable(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 10}, 1, 1)
	for _, ps := range []uint64{10, 1, 2, 3, 4} { // 10 came early (say, a retry of a later message)
		s.Publish(1, ps)
	}
	cases := []struct {
		ps   uint64
		want Verdict
	}{
		{1, VerdictTooOld}, // forgotten: the lowest
		{2, VerdictDuplicate}, {4, VerdictDuplicate}, {10, VerdictDuplicate},
		{5, VerdictNew}, // still in flight, never appended: provably new
	}
	for _, c := range cases {
		if v, _, _ := s.producers.Check(1, c.ps); v != c.want {
			t.Errorf("producer_seq %d: %v, want %v", c.ps, v, c.want)
		}
	}
	// Recording the window's lowest sequence again keeps the original.
	s.producers.Record(1, 2, 99, 1)
	if v, _, _ := s.producers.Check(1, 2); v != VerdictDuplicate {
		t.Errorf("2 after recording it below the window: %v", v)
	}
}

func TestReplayRebuildsDedupAndSealsTruncatedHistory(t *testing.T) {
	s := NewState(DefaultConfig, 2, 101)
	s.Replay(50, 1, 9, 5)
	s.Replay(51, 1, 9, 6)
	s.ReplayDone(true)
	if d := s.Publish(9, 6); d.Verdict != VerdictDuplicate || d.Seq != 51 || d.Epoch != 1 {
		t.Fatalf("replay of rebuilt seq: %+v", d)
	}
	if d := s.Publish(9, 4); d.Verdict != VerdictTooOld {
		t.Fatalf("seq older than the retained log: %v, want TooOld", d.Verdict)
	}
	if d := s.Publish(9, 7); d.Verdict != VerdictNew || d.Seq != 101 || d.Epoch != 2 {
		t.Fatalf("new publish after replay: %+v", d)
	}
}

func TestProducerTableEvictsLeastRecentlyUsed(t *testing.T) {
	s := NewState(Config{DedupWindowMax: 4, ProducersMax: 2}, 1, 1)
	s.Publish(1, 1)
	s.Publish(2, 1)
	s.Publish(1, 2) // producer 1 is now the most recent
	s.Publish(3, 1) // evicts producer 2
	if s.Producers() != 2 {
		t.Fatalf("%d producers, bound is 2", s.Producers())
	}
	if v, _, _ := s.producers.Check(1, 1); v != VerdictDuplicate {
		t.Fatalf("recent producer evicted: %v", v)
	}
	if _, ok := s.producers.byID[2]; ok {
		t.Fatal("least recent producer kept")
	}
}

// The window invariant under random append orders: every producer_seq at
// or above the floor that was appended is remembered (so "New" is never
// wrong), and the floor never passes a sequence with fewer than windowMax
// higher ones appended.
func TestWindowInvariantUnderRandomOrders(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		const window = 8
		p := NewProducers(window, 10)
		appended := map[uint64]bool{}
		for i := 0; i < 60; i++ {
			ps := uint64(rng.IntN(80))
			if v, _, _ := p.Check(1, ps); v != VerdictNew {
				continue
			}
			if appended[ps] {
				t.Fatalf("round %d: %d judged new but was appended", round, ps)
			}
			p.Record(1, ps, uint64(i+1), 1)
			appended[ps] = true
		}
		w := p.byID[1]
		for ps := range appended {
			higher := 0
			for q := range appended {
				if q > ps {
					higher++
				}
			}
			if v, _, _ := p.Check(1, ps); v != VerdictDuplicate && (ps >= w.floor || higher < window) {
				t.Fatalf("round %d: appended %d (floor %d, %d higher) is %v", round, ps, w.floor, higher, v)
			}
		}
	}
}
