package delivery

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func newTestCursor(t *testing.T, maxDeliver uint32) *Cursor {
	t.Helper()
	c, err := NewCursor(Config{AckWaitMs: 100, MaxDeliver: maxDeliver, InflightMax: 3}, 1, 7<<40)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDeliversOnlyVisibleInOrderWithinInflightBound(t *testing.T) {
	c := newTestCursor(t, 5)
	if _, ok := c.Next(0, 0, 0); ok {
		t.Fatal("delivered with nothing visible")
	}
	var got []uint64
	for {
		d, ok := c.Next(0, 10, 0)
		if !ok {
			break
		}
		if d.DeliveryID>>40 != 7 {
			t.Fatalf("delivery id %x lacks the incarnation", d.DeliveryID)
		}
		got = append(got, d.Seq)
	}
	if len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Fatalf("delivered %v, want [1 2 3] (inflight bound 3)", got)
	}
}

func TestAckFencingAndFloor(t *testing.T) {
	c := newTestCursor(t, 5)
	d1, _ := c.Next(0, 3, 0)
	d2, _ := c.Next(0, 3, 0)
	if _, err := c.Ack(d2.Seq, d1.DeliveryID); !errors.Is(err, ErrStale) {
		t.Fatalf("ack with another seq's id: %v", err)
	}
	if isNew, err := c.Ack(d2.Seq, d2.DeliveryID); err != nil || !isNew {
		t.Fatalf("ack d2: %v %v", isNew, err)
	}
	if c.AckFloor() != 1 {
		t.Fatalf("floor %d with seq 1 unacked", c.AckFloor())
	}
	c.Ack(d1.Seq, d1.DeliveryID)
	if c.AckFloor() != 3 {
		t.Fatalf("floor %d after acking 1 and 2", c.AckFloor())
	}
	// Re-acking a done seq is an idempotent success that persists nothing.
	if isNew, err := c.Ack(1, 12345); err != nil || isNew {
		t.Fatalf("re-ack: %v %v", isNew, err)
	}
	if _, err := c.Ack(9, 1); !errors.Is(err, ErrStale) {
		t.Fatalf("ack of undelivered seq: %v", err)
	}
}

func TestExpiryRedeliversWithNewIDThenDeadLetters(t *testing.T) {
	c := newTestCursor(t, 2)
	d1, _ := c.Next(0, 1, 0)
	if dl := c.NextDeadlineMs(); dl != 100 {
		t.Fatalf("deadline %d", dl)
	}
	c.Expire(99)
	if _, ok := c.Next(99, 1, 0); ok {
		t.Fatal("redelivered before the ack wait")
	}
	c.Expire(100)
	d2, ok := c.Next(100, 1, 0)
	if !ok || d2.Seq != 1 || d2.Count != 2 || d2.DeliveryID == d1.DeliveryID {
		t.Fatalf("redelivery %+v of %+v", d2, d1)
	}
	if _, err := c.Ack(1, d1.DeliveryID); !errors.Is(err, ErrStale) {
		t.Fatal("old delivery id still accepted")
	}
	c.Expire(200)
	if _, ok := c.Next(200, 1, 0); ok {
		t.Fatal("delivered beyond MaxDeliver")
	}
	dead := c.TakeDead()
	if len(dead) != 1 || dead[0] != 1 {
		t.Fatalf("dead %v", dead)
	}
	if again := c.TakeDead(); len(again) != 0 {
		t.Fatalf("dead seq offered twice: %v", again)
	}
	c.DeadLetterFailed(1)
	if again := c.TakeDead(); len(again) != 1 {
		t.Fatal("failed dead letter not offered again")
	}
	c.DeadLettered(1)
	if c.AckFloor() != 2 {
		t.Fatalf("floor %d after dead-lettering seq 1", c.AckFloor())
	}
}

func TestNackRedeliversAfterDelay(t *testing.T) {
	c := newTestCursor(t, 5)
	d, _ := c.Next(0, 1, 0)
	if err := c.Nack(0, d.Seq, d.DeliveryID+1, 0); !errors.Is(err, ErrStale) {
		t.Fatalf("nack with wrong id: %v", err)
	}
	if err := c.Nack(0, d.Seq, d.DeliveryID, 50); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Next(49, 1, 0); ok {
		t.Fatal("redelivered before nack delay")
	}
	if d2, ok := c.Next(50, 1, 0); !ok || d2.Seq != 1 || d2.Count != 2 {
		t.Fatalf("after delay: %+v %v", d2, ok)
	}
}

func TestReplayAndTruncationNeverRedeliverBelowFloor(t *testing.T) {
	c := newTestCursor(t, 5)
	c.ReplayAck(1)
	c.ReplayAck(3)
	if c.AckFloor() != 2 {
		t.Fatalf("floor %d", c.AckFloor())
	}
	d, _ := c.Next(0, 4, 0)
	if d.Seq != 2 {
		t.Fatalf("first delivery %d, want 2 (1 and 3 acked)", d.Seq)
	}
	d, _ = c.Next(0, 4, 0)
	if d.Seq != 4 {
		t.Fatalf("second delivery %d, want 4", d.Seq)
	}
	c.Truncated(10)
	if c.AckFloor() != 10 || c.Inflight() != 0 {
		t.Fatalf("after truncation floor %d inflight %d", c.AckFloor(), c.Inflight())
	}
	if d, _ := c.Next(0, 12, 0); d.Seq != 10 {
		t.Fatalf("delivery %d after truncation", d.Seq)
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := NewCursor(Config{}, 1, 0); err == nil {
		t.Fatal("zero config accepted")
	}
}

func TestReleaseRequeuesOnlyThatOwnersDeliveries(t *testing.T) {
	c := newTestCursor(t, 5)
	a, _ := c.Next(0, 3, 1)
	b, _ := c.Next(0, 3, 2)
	c.Release(10, 1)
	if _, err := c.Ack(a.Seq, a.DeliveryID); !errors.Is(err, ErrStale) {
		t.Fatalf("released delivery still ackable: %v", err)
	}
	if _, err := c.Ack(b.Seq, b.DeliveryID); err != nil {
		t.Fatalf("other owner's delivery: %v", err)
	}
	d, ok := c.Next(10, 3, 2)
	if !ok || d.Seq != a.Seq || d.Count != 2 {
		t.Fatalf("after release got %+v %v, want seq %d again at once", d, ok, a.Seq)
	}
}

func TestRetryAboveCommitWaitsUntilVisible(t *testing.T) {
	c := newTestCursor(t, 5)
	d, _ := c.Next(0, 5, 0)
	c.Nack(0, d.Seq, d.DeliveryID, 0)
	if got, ok := c.Next(1, 0, 0); ok {
		t.Fatalf("redelivered %+v while commit_seq is 0", got)
	}
	if got, ok := c.Next(1, 1, 0); !ok || got.Seq != d.Seq {
		t.Fatalf("retry not delivered once visible again: %+v %v", got, ok)
	}
}

// TestDoneRangesMatchASetModel drives markDone/isDone with random seqs and
// compares against a plain set: the range representation must agree, stay
// sorted and maximal, and never hold the floor.
func TestDoneRangesMatchASetModel(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		c := newTestCursor(t, 5)
		model := map[uint64]bool{}
		for i := 0; i < 400; i++ {
			seq := 1 + rng.Uint64N(120)
			c.markDone(seq)
			model[seq] = true
			floor := uint64(1)
			for model[floor] {
				floor++
			}
			if c.AckFloor() != floor {
				t.Fatalf("seed %d: floor %d, model %d", seed, c.AckFloor(), floor)
			}
			for s := uint64(1); s <= 121; s++ {
				if c.isDone(s) != model[s] {
					t.Fatalf("seed %d: isDone(%d) = %v, model %v (ranges %v)", seed, s, c.isDone(s), model[s], c.done)
				}
			}
			if err := c.Snapshot().Validate(); err != nil {
				t.Fatalf("seed %d: %v (ranges %v)", seed, err, c.done)
			}
		}
	}
}

func TestStuckFloorCostsOneRange(t *testing.T) {
	c := newTestCursor(t, 5)
	for seq := uint64(2); seq <= 1_000_000; seq++ {
		c.markDone(seq)
	}
	if c.AckFloor() != 1 || len(c.done) != 1 {
		t.Fatalf("floor %d with %d ranges, want floor 1 and one range", c.AckFloor(), len(c.done))
	}
	c.markDone(1)
	if c.AckFloor() != 1_000_001 || len(c.done) != 0 {
		t.Fatalf("after acking the stuck seq: floor %d, %d ranges", c.AckFloor(), len(c.done))
	}
}

// Untouched holds while nothing from the floor on was handed out: at the
// start, after every delivery is acked, and after a seq that is no
// message is marked done (ReplayAck); not while a delivery is in flight
// or waits for its retry.
func TestUntouched(t *testing.T) {
	c := newTestCursor(t, 5)
	if !c.Untouched() {
		t.Fatal("a fresh cursor is touched")
	}
	d, _ := c.Next(0, 10, 1)
	if c.Untouched() {
		t.Fatal("untouched with seq 1 in flight")
	}
	if _, err := c.Ack(d.Seq, d.DeliveryID); err != nil || !c.Untouched() {
		t.Fatalf("after the ack: %v, untouched %v", err, c.Untouched())
	}
	c.ReplayAck(2) // seq 2 is no message
	if !c.Untouched() || c.AckFloor() != 3 {
		t.Fatalf("after marking seq 2 done: untouched %v, floor %d", c.Untouched(), c.AckFloor())
	}
	d, _ = c.Next(0, 10, 1)
	if d.Seq != 3 {
		t.Fatalf("next delivery is seq %d, want 3", d.Seq)
	}
	if err := c.Nack(0, d.Seq, d.DeliveryID, 1000); err != nil || c.Untouched() {
		t.Fatalf("with seq 3 waiting for its retry: %v, untouched %v", err, c.Untouched())
	}
}
