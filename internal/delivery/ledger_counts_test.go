package delivery

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
)

// A cursor rebuilt from the counts its predecessor returned (TakeCounts,
// and MaxDeliver for each TakeDead) continues the count instead of
// starting again at 1, and never redelivers a seq that used up MaxDeliver.
func TestReplayedCountsKeepMaxDeliverAcrossRestart(t *testing.T) {
	c := newTestCursor(t, 3)
	var recorded []SeqCount
	record := func() {
		recorded = append(recorded, c.TakeCounts()...)
		for _, seq := range c.TakeDead() {
			recorded = append(recorded, SeqCount{Seq: seq, Count: 3})
		}
	}
	c.Next(0, 2, 0) // seq 1, count 1
	c.Next(0, 2, 0) // seq 2, count 1
	c.Expire(100)
	record()
	if want := []SeqCount{{1, 1}, {2, 1}}; !slices.Equal(recorded, want) {
		t.Fatalf("recorded %v, want %v", recorded, want)
	}
	if again := c.TakeCounts(); len(again) != 0 {
		t.Fatalf("counts taken twice: %v", again)
	}
	r1, _ := c.Next(100, 2, 0) // seq 1, count 2
	c.Nack(100, r1.Seq, r1.DeliveryID, 0)
	record()
	r2, _ := c.Next(100, 2, 0) // seq 2, count 2
	r1, _ = c.Next(100, 2, 0)  // seq 1, count 3: the last
	if r2.Seq != 2 || r2.Count != 2 || r1.Seq != 1 || r1.Count != 3 {
		t.Fatalf("redeliveries %+v %+v", r2, r1)
	}
	c.Expire(200)
	record()
	// Seq 2 waits for its third delivery; seq 1 is dead.
	if want := []SeqCount{{2, 2}, {1, 3}}; !slices.Equal(recorded[len(recorded)-2:], want) {
		t.Fatalf("recorded %v", recorded)
	}
	if got, want := c.Counts(), []SeqCount{{1, 3}, {2, 2}}; !slices.Equal(got, want) {
		t.Fatalf("Counts %v, want %v", got, want)
	}

	restarted, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 3, InflightMax: 3}, 1, 8<<40)
	for _, sc := range recorded {
		restarted.ReplayCount(sc.Seq, sc.Count)
	}
	if got, want := restarted.Counts(), c.Counts(); !slices.Equal(got, want) {
		t.Fatalf("replayed Counts %v, want %v", got, want)
	}
	if dead := restarted.TakeDead(); !slices.Equal(dead, []uint64{1}) {
		t.Fatalf("replayed dead %v, want [1]", dead)
	}
	d, ok := restarted.Next(0, 2, 0)
	if !ok || d.Seq != 2 || d.Count != 3 {
		t.Fatalf("after replay delivered %+v, want seq 2 as delivery 3", d)
	}
	if _, ok := restarted.Next(0, 2, 0); ok {
		t.Fatal("the dead-lettered seq was delivered again after replay")
	}
	// A delivery in flight counts the deliveries before it.
	if got, want := restarted.Counts(), []SeqCount{{1, 3}, {2, 2}}; !slices.Equal(got, want) {
		t.Fatalf("Counts with seq 2 in flight %v, want %v", got, want)
	}
}

// An ack or dead-lettered record wins over counts recorded before it (or,
// in a checkpoint, after it): the seq is done and never delivered again.
func TestReplayedAckWinsOverCount(t *testing.T) {
	for _, order := range []string{"count then ack", "ack then count"} {
		c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 2, InflightMax: 3}, 1, 0)
		if order == "count then ack" {
			c.ReplayCount(1, 1)
			c.ReplayCount(2, 2)
			c.ReplayAck(1)
			c.ReplayAck(2)
		} else {
			c.ReplayAck(1)
			c.ReplayAck(2)
			c.ReplayCount(1, 1)
			c.ReplayCount(2, 2)
		}
		if d, ok := c.Next(0, 2, 0); ok {
			t.Fatalf("%s: delivered %+v", order, d)
		}
		if dead := c.TakeDead(); len(dead) != 0 || len(c.Counts()) != 0 {
			t.Fatalf("%s: dead %v counts %v", order, dead, c.Counts())
		}
		if c.AckFloor() != 3 {
			t.Fatalf("%s: floor %d", order, c.AckFloor())
		}
	}
}

// Retention that removes a seq waiting for its dead letter settles it: it
// can no longer be read, so it is not offered again.
func TestTruncationDropsPendingDeadLetters(t *testing.T) {
	c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 1, InflightMax: 3}, 1, 0)
	c.ReplayCount(1, 1)
	c.Truncated(2)
	if dead := c.TakeDead(); len(dead) != 0 {
		t.Fatalf("dead %v below the log start", dead)
	}
}

func TestCountsRoundTrip(t *testing.T) {
	for _, counts := range [][]SeqCount{nil, {{0, 1}}, {{1, 2}, {2, 1}, {1 << 40, math.MaxUint32}},
		{{math.MaxUint64 - 1, 1}, {math.MaxUint64, 7}}} {
		got, err := DecodeCounts(AppendCounts(nil, counts))
		if err != nil || !slices.Equal(got, counts) {
			t.Fatalf("round trip of %v: %v %v", counts, got, err)
		}
	}
	for name, b := range map[string][]byte{
		"empty":      nil,
		"version":    {2, 0},
		"zero count": {countsVersion, 1, 5, 0},
		"too many":   {countsVersion, 9, 1, 1},
		"trailing":   {countsVersion, 0, 0},
		"overflow":   append(AppendCounts(nil, []SeqCount{{math.MaxUint64, 1}}), 0),
	} {
		if _, err := DecodeCounts(b); !errors.Is(err, ErrBadCounts) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeCounts checks that the decoder never panics, bounds its
// allocation by its input, and accepts only sorted positive counts in
// their one encoding.
func FuzzDecodeCounts(f *testing.F) {
	f.Add(AppendCounts(nil, []SeqCount{{3, 1}, {9, 4}}))
	f.Add([]byte{countsVersion, 1, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		counts, err := DecodeCounts(b)
		if err != nil {
			if !errors.Is(err, ErrBadCounts) {
				t.Fatalf("error %v does not match ErrBadCounts", err)
			}
			return
		}
		if cap(counts) > len(b)/countBytesMin {
			t.Fatalf("%d counts allocated for %d bytes", cap(counts), len(b))
		}
		for i, sc := range counts {
			if sc.Count == 0 || (i > 0 && sc.Seq <= counts[i-1].Seq) {
				t.Fatalf("decoded invalid counts %v", counts)
			}
		}
		if again := AppendCounts(nil, counts); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x, input %x", again, b)
		}
	})
}
