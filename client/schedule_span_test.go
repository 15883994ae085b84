package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestScheduleSequencesStayInsideTheDedupWindow: a schedule's sequence
// never runs SeqSpanMax or more ahead of the oldest schedule still in
// flight (a shard remembers the last 1,024 sequences of a producer; a
// retry below them could only be PRODUCER_SEQ_TOO_OLD). The next call
// waits until the oldest ends, or its context does.
func TestScheduleSequencesStayInsideTheDedupWindow(t *testing.T) {
	c := &Client{}
	ctx := context.Background()
	_, oldest, err := c.nextScheduleIdentity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range SeqSpanMax - 1 { // the others end at once
		_, seq, err := c.nextScheduleIdentity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.scheduleDone(seq)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, seq, err := c.nextScheduleIdentity(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sequence %d handed out %d ahead of %d, still in flight (err %v)", seq, seq-oldest, oldest, err)
	}
	got := make(chan uint64, 1)
	go func() {
		_, seq, err := c.nextScheduleIdentity(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- seq
	}()
	select {
	case seq := <-got:
		t.Fatalf("sequence %d handed out while %d is in flight", seq, oldest)
	case <-time.After(50 * time.Millisecond):
	}
	c.scheduleDone(oldest)
	select {
	case seq := <-got:
		if seq != oldest+SeqSpanMax {
			t.Fatalf("next sequence %d, want %d", seq, oldest+SeqSpanMax)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the oldest schedule ended")
	}
}
