package delivery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// TestConfigValidationChecksEachBound pins each clause of
// Config.Validate: AckWaitMs and InflightMax must be positive, MaxDeliver
// at least 1; the smallest valid config is accepted.
func TestConfigValidationChecksEachBound(t *testing.T) {
	ok := Config{AckWaitMs: 1, MaxDeliver: 1, InflightMax: 1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	for _, set := range []func(*Config){
		func(c *Config) { c.AckWaitMs = 0 },
		func(c *Config) { c.AckWaitMs = -1 },
		func(c *Config) { c.MaxDeliver = 0 },
		func(c *Config) { c.InflightMax = 0 },
		func(c *Config) { c.InflightMax = -1 },
	} {
		cfg := ok
		set(&cfg)
		if _, err := NewCursor(cfg, 1, 0); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// TestCursorStartingAtSeqZeroStartsAtOne pins NewCursor's "startSeq ==
// 0" guard: seq 0 is no message, the floor starts at 1.
func TestCursorStartingAtSeqZeroStartsAtOne(t *testing.T) {
	for _, start := range []uint64{0, 1} {
		c, err := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 3}, start, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := c.Next(0, 5, 0); c.AckFloor() != 1 || !ok || d.Seq != 1 {
			t.Fatalf("start %d: floor %d, first delivery %+v %v; want floor 1, seq 1", start, c.AckFloor(), d, ok)
		}
	}
}

// TestReplayedCountOfOneAndOfZero pins ReplayCount's "count == 0"
// guard: a count of 0 (no delivery ended) changes nothing, a count of 1
// queues the seq's second delivery.
func TestReplayedCountOfOneAndOfZero(t *testing.T) {
	c := newTestCursor(t, 5)
	c.ReplayCount(2, 0)
	c.ReplayCount(3, 1)
	if got := c.Counts(); !slices.Equal(got, []SeqCount{{Seq: 3, Count: 1}}) {
		t.Fatalf("counts %v, want seq 3 counted once", got)
	}
	var got []Delivery
	for d, ok := c.Next(0, 3, 0); ok; d, ok = c.Next(0, 3, 0) {
		got = append(got, d)
	}
	if len(got) != 3 || got[0].Seq != 3 || got[0].Count != 2 || got[1].Seq != 1 || got[2].Seq != 2 || got[2].Count != 1 {
		t.Fatalf("deliveries %+v: want seq 3 as delivery 2, then 1 and 2 as first deliveries", got)
	}
}

// TestReplayedCountsKeepTheHighestWhateverTheirOrder pins ReplayCount's
// max(count, r.count) and its "already dead" return: a lower count
// replayed after a higher one (a checkpoint's counts, then an older
// record's) neither lowers the count nor brings a dead seq back.
func TestReplayedCountsKeepTheHighestWhateverTheirOrder(t *testing.T) {
	c := newTestCursor(t, 3)
	c.ReplayCount(2, 2)
	c.ReplayCount(2, 1)
	c.ReplayCount(4, 3) // used up MaxDeliver: dead
	c.ReplayCount(4, 1)
	if got := c.Counts(); !slices.Equal(got, []SeqCount{{Seq: 2, Count: 2}, {Seq: 4, Count: 3}}) {
		t.Fatalf("counts %v, want seq 2 counted 2 and seq 4 dead (3)", got)
	}
	if dead := c.TakeDead(); !slices.Equal(dead, []uint64{4}) {
		t.Fatalf("dead %v, want [4]", dead)
	}
	c.ReplayCount(4, 2) // after TakeDead: still dead, not offered again
	if dead := c.TakeDead(); len(dead) != 0 {
		t.Fatalf("dead offered again: %v", dead)
	}
	d, ok := c.Next(0, 4, 0)
	if !ok || d.Seq != 2 || d.Count != 3 {
		t.Fatalf("first delivery %+v %v, want seq 2 as delivery 3", d, ok)
	}
	for d, ok := c.Next(0, 4, 0); ok; d, ok = c.Next(0, 4, 0) {
		if d.Seq == 4 {
			t.Fatalf("the dead seq 4 was delivered: %+v", d)
		}
	}
}

// TestReplayedAckForgetsOnlyItsOwnRetry pins forget's "r.seq == seq": a
// replayed ack drops its seq's retry and keeps the others'.
func TestReplayedAckForgetsOnlyItsOwnRetry(t *testing.T) {
	c := newTestCursor(t, 5)
	c.ReplayCount(2, 1)
	c.ReplayCount(3, 1)
	c.ReplayAck(2)
	if got := c.Counts(); !slices.Equal(got, []SeqCount{{Seq: 3, Count: 1}}) {
		t.Fatalf("counts %v, want seq 3 counted once", got)
	}
	if d, ok := c.Next(0, 3, 0); !ok || d.Seq != 3 || d.Count != 2 {
		t.Fatalf("first delivery %+v %v, want seq 3's retry", d, ok)
	}
}

// TestCountsOfADeliveryInFlightAreThoseBeforeIt pins Counts' "in.count >
// 1": a first delivery in flight has no count yet, a second one counts
// the first.
func TestCountsOfADeliveryInFlightAreThoseBeforeIt(t *testing.T) {
	c := newTestCursor(t, 5)
	d, _ := c.Next(0, 1, 0)
	if got := c.Counts(); len(got) != 0 {
		t.Fatalf("counts %v with a first delivery in flight, want none", got)
	}
	if err := c.Nack(0, d.Seq, d.DeliveryID, 0); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Next(0, 1, 0); !ok || d.Count != 2 {
		t.Fatalf("redelivery %+v %v", d, ok)
	}
	if got := c.Counts(); !slices.Equal(got, []SeqCount{{Seq: 1, Count: 1}}) {
		t.Fatalf("counts %v with a second delivery in flight, want seq 1 counted once", got)
	}
}

// TestReplayedFloorMovesTheNextNewSeq pins ReplayFloor's nextNew =
// max(nextNew, ackFloor): a cursor whose floor was replayed ahead is the
// cursor that starts there (Next does not walk the done seqs below it),
// and a floor replayed behind what was delivered does not make the cursor
// untouched.
func TestReplayedFloorMovesTheNextNewSeq(t *testing.T) {
	cfg := Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 3}
	moved, _ := NewCursor(cfg, 1, 0)
	moved.ReplayFloor(1 << 40)
	started, _ := NewCursor(cfg, 1<<40, 0)
	if !bytes.Equal(moved.AppendDigest(nil), started.AppendDigest(nil)) {
		t.Fatalf("floor replayed to 2^40: floor %d, next new %d; want the cursor that starts there", moved.AckFloor(), moved.nextNew)
	}
	c, _ := NewCursor(cfg, 1, 0)
	c.Next(0, 5, 0)
	c.Next(0, 5, 0)
	if err := c.Restore(DoneState{Floor: 1}); err != nil {
		t.Fatal(err)
	}
	if c.Untouched() {
		t.Fatal("untouched with seqs 1 and 2 in flight after a Restore of floor 1")
	}
	if d, ok := c.Next(0, 5, 0); !ok || d.Seq != 3 {
		t.Fatalf("next delivery %+v %v, want seq 3", d, ok)
	}
}

// TestRestoreRefusesAnInvalidDoneState pins Cursor.Restore's Validate
// return: an invalid state is refused and changes nothing.
func TestRestoreRefusesAnInvalidDoneState(t *testing.T) {
	c := newTestCursor(t, 5)
	bad := DoneState{Floor: 5, Ranges: []SeqRange{{First: 3, Last: 4}}}
	if err := c.Restore(bad); !errors.Is(err, ErrBadDoneState) {
		t.Fatalf("Restore(%+v): %v, want ErrBadDoneState", bad, err)
	}
	if c.AckFloor() != 1 || len(c.Snapshot().Ranges) != 0 {
		t.Fatalf("after a refused Restore: %+v", c.Snapshot())
	}
}

// TestRestoreMergesWithTheDoneSeqsItFinds pins mergeRanges: the union of
// the cursor's done ranges and the state's, sorted, with overlapping,
// contained and adjacent runs merged (the first two included).
func TestRestoreMergesWithTheDoneSeqsItFinds(t *testing.T) {
	c := newTestCursor(t, 5)
	for _, seq := range []uint64{3, 4, 9, 10, 11, 20, 30} {
		c.ReplayAck(seq)
	}
	s := DoneState{Floor: 1, Ranges: []SeqRange{{5, 5}, {7, 7}, {10, 10}, {12, 13}, {21, 22}, {25, 26}}}
	if err := c.Restore(s); err != nil {
		t.Fatal(err)
	}
	want := []SeqRange{{3, 5}, {7, 7}, {9, 13}, {20, 22}, {25, 26}, {30, 30}}
	if got := c.Snapshot(); got.Floor != 1 || !slices.Equal(got.Ranges, want) {
		t.Fatalf("restored %+v, want floor 1 and %v", got, want)
	}
}

// TestCountsEncodingIsStable pins countsVersion and the layout of
// AppendCounts: the bytes are on disk.
func TestCountsEncodingIsStable(t *testing.T) {
	b := AppendCounts(nil, []SeqCount{{Seq: 3, Count: 2}, {Seq: 5, Count: 1}})
	if want := []byte{1, 2, 3, 2, 1, 1}; !bytes.Equal(b, want) {
		t.Fatalf("encoded %v, want %v", b, want)
	}
}

// TestDecodeCountsRefusesABadCountOrAClaimBeyondItsBytes pins
// DecodeCounts' check of the count's varint (d.err) and its bound on the
// count against the bytes (countBytesMin), checked before it allocates.
func TestDecodeCountsRefusesABadCountOrAClaimBeyondItsBytes(t *testing.T) {
	for name, b := range map[string][]byte{
		"no count":          {countsVersion},
		"truncated count":   {countsVersion, 0x80},
		"2^60 counts":       binary.AppendUvarint([]byte{countsVersion}, 1<<60),
		"3 counts, 5 bytes": {countsVersion, 3, 0, 1, 0, 1, 0},
	} {
		if got, err := DecodeCounts(b); !errors.Is(err, ErrBadCounts) || got != nil {
			t.Errorf("%s: %v %v, want ErrBadCounts", name, got, err)
		}
	}
	_, err := DecodeCounts([]byte{countsVersion, 3, 0, 1, 0, 1, 0})
	if err == nil || !strings.Contains(err.Error(), "3 counts in 5 bytes") {
		t.Fatalf("3 counts in 5 bytes: %v, want refused by the size bound", err)
	}
}

// TestDecodeCountsAllocatesExactlyItsCounts pins DecodeCounts' allocation
// of n entries up front ("n > 0"): grown by append instead, 3 or 5
// counts would take 4 or 8 entries, past the len(b)/2 it promises.
func TestDecodeCountsAllocatesExactlyItsCounts(t *testing.T) {
	for n := 1; n <= 20; n++ {
		var counts []SeqCount
		for i := range n {
			counts = append(counts, SeqCount{Seq: uint64(i + 1), Count: 1})
		}
		b := AppendCounts(nil, counts)
		got, err := DecodeCounts(b)
		if err != nil || cap(got) != n || cap(got) > len(b)/countBytesMin {
			t.Fatalf("%d counts in %d bytes: cap %d, %v; want cap %d", n, len(b), cap(got), err, n)
		}
	}
}

// TestTruncationDropsWhatLiesBelowTheNewStart pins Truncated's three
// filters (retries, deliveries in flight, dead letters: s < startSeq):
// what lies below the new start is dropped — a retry kept there would be
// delivered below the floor — and what lies at it is kept.
func TestTruncationDropsWhatLiesBelowTheNewStart(t *testing.T) {
	c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 10}, 1, 0)
	ids := map[uint64]uint64{}
	for d, ok := c.Next(0, 6, 0); ok; d, ok = c.Next(0, 6, 0) {
		ids[d.Seq] = d.DeliveryID
	}
	for _, seq := range []uint64{1, 3} {
		if err := c.Nack(0, seq, ids[seq], 0); err != nil {
			t.Fatal(err)
		}
	}
	c.Truncated(3) // drops the retry of 1 and the delivery of 2
	if got := c.Counts(); c.Inflight() != 3 || !slices.Equal(got, []SeqCount{{Seq: 3, Count: 1}}) {
		t.Fatalf("after Truncated(3): %d in flight, counts %v; want 4, 5, 6 in flight and the retry of 3", c.Inflight(), got)
	}
	c.Truncated(4) // drops the retry of 3
	if got := c.Counts(); c.Inflight() != 3 || len(got) != 0 {
		t.Fatalf("after Truncated(4): %d in flight, counts %v; want 4, 5, 6 in flight and no retry", c.Inflight(), got)
	}
	if d, ok := c.Next(0, 6, 0); ok {
		t.Fatalf("delivered %+v below the new start or in flight", d)
	}

	dead, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 1, InflightMax: 10}, 1, 0)
	dead.ReplayCount(2, 1)
	dead.ReplayCount(5, 1)
	dead.Truncated(5)
	if got := dead.TakeDead(); !slices.Equal(got, []uint64{5}) {
		t.Fatalf("dead letters after Truncated(5): %v, want [5]", got)
	}
}

// TestDecodeCountsRefusesSeqsThatOverflowOrCountsBeyondUint32 pins
// DecodeCounts' range checks: a later skip of 2^64-1 (its step wraps to
// 0: a repeated seq), a step past the largest seq, and a count that does
// not fit a uint32 (it would wrap to 0).
func TestDecodeCountsRefusesSeqsThatOverflowOrCountsBeyondUint32(t *testing.T) {
	enc := func(vs ...uint64) []byte {
		b := []byte{countsVersion}
		for _, v := range vs {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	for name, b := range map[string][]byte{
		"skip 2^64-1 after the first": enc(2, 0, 1, math.MaxUint64, 1),
		"seq past 2^64-1":             enc(2, math.MaxUint64, 1, 0, 1),
		"count 2^32":                  enc(1, 5, 1<<32),
	} {
		if got, err := DecodeCounts(b); !errors.Is(err, ErrBadCounts) {
			t.Errorf("%s: %v %v, want ErrBadCounts", name, got, err)
		}
	}
	if got, err := DecodeCounts(enc(1, 5, math.MaxUint32)); err != nil || !slices.Equal(got, []SeqCount{{Seq: 5, Count: math.MaxUint32}}) {
		t.Fatalf("count 2^32-1: %v %v", got, err)
	}
}

// TestDoneStateEncodingIsStable pins doneStateVersion and the layout of
// AppendDoneState (the bytes are on disk), and doneRangeBytesMin: ranges
// of two one-byte varints each decode, a claim of more ranges than the
// bytes can hold is refused before it allocates.
func TestDoneStateEncodingIsStable(t *testing.T) {
	s := DoneState{Floor: 1, Ranges: []SeqRange{{3, 3}, {5, 5}, {7, 8}}}
	b := AppendDoneState(nil, s)
	if want := []byte{1, 1, 3, 1, 0, 0, 0, 0, 1}; !bytes.Equal(b, want) {
		t.Fatalf("encoded %v, want %v", b, want)
	}
	if got, err := DecodeDoneState(b); err != nil || got.Floor != 1 || !slices.Equal(got.Ranges, s.Ranges) {
		t.Fatalf("decoded %+v %v", got, err)
	}
	_, err := DecodeDoneState([]byte{doneStateVersion, 1, 3, 1, 0, 1, 0, 1})
	if !errors.Is(err, ErrBadDoneState) || !strings.Contains(err.Error(), "3 ranges in 5 bytes") {
		t.Fatalf("3 ranges in 5 bytes: %v, want refused by the size bound", err)
	}
}

// TestValidateRefusesAnInvertedRangeAndOneEndingAtTheLastSeq pins
// Validate's "r.Last < r.First" and "r.Last == math.MaxUint64".
func TestValidateRefusesAnInvertedRangeAndOneEndingAtTheLastSeq(t *testing.T) {
	for _, s := range []DoneState{
		{Floor: 1, Ranges: []SeqRange{{7, 6}}},
		{Floor: 1, Ranges: []SeqRange{{7, math.MaxUint64}}},
	} {
		if err := s.Validate(); !errors.Is(err, ErrBadDoneState) {
			t.Errorf("Validate(%+v): %v, want ErrBadDoneState", s, err)
		}
	}
	if err := (DoneState{Floor: 1, Ranges: []SeqRange{{7, 7}, {9, math.MaxUint64 - 1}}}).Validate(); err != nil {
		t.Fatalf("a valid state refused: %v", err)
	}
}

// TestAckedDeliveryLeavesTheFlight pins Ack's delete(c.inflight, seq): an
// acked delivery frees its slot under InflightMax and does not expire
// into a redelivery of a done seq.
func TestAckedDeliveryLeavesTheFlight(t *testing.T) {
	c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 1}, 1, 0)
	d, _ := c.Next(0, 2, 0)
	if _, err := c.Ack(d.Seq, d.DeliveryID); err != nil {
		t.Fatal(err)
	}
	if c.Inflight() != 0 || c.NextExpiryMs() != -1 {
		t.Fatalf("after the ack: %d in flight, next expiry %d", c.Inflight(), c.NextExpiryMs())
	}
	c.Expire(1000)
	if d, ok := c.Next(1000, 2, 0); !ok || d.Seq != 2 || d.Count != 1 {
		t.Fatalf("next delivery %+v %v, want seq 2 (1 is done)", d, ok)
	}
}

// TestNackedDeliveryLeavesTheFlight pins Nack's delete(c.inflight, seq):
// a nacked delivery frees its slot under InflightMax, so its retry goes
// out at once.
func TestNackedDeliveryLeavesTheFlight(t *testing.T) {
	c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 1}, 1, 0)
	d, _ := c.Next(0, 1, 0)
	if err := c.Nack(0, d.Seq, d.DeliveryID, 0); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Next(0, 1, 0); !ok || d.Seq != 1 || d.Count != 2 {
		t.Fatalf("redelivery %+v %v, want seq 1 as delivery 2", d, ok)
	}
}

// TestNegativeNackDelayIsNoDelay pins Nack's max(delayMs, 0): the retry is
// due now, not in the past.
func TestNegativeNackDelayIsNoDelay(t *testing.T) {
	c := newTestCursor(t, 5)
	d, _ := c.Next(0, 1, 0)
	if err := c.Nack(500, d.Seq, d.DeliveryID, -50); err != nil {
		t.Fatal(err)
	}
	if got := c.NextDeadlineMs(); got != 500 {
		t.Fatalf("next deadline %d, want 500 (now)", got)
	}
}

// TestReleasedDeliveriesComeBackInSeqOrder pins Release's sort: the map
// order of the deliveries in flight must not decide the order of their
// redeliveries (the kernel's output is deterministic).
func TestReleasedDeliveriesComeBackInSeqOrder(t *testing.T) {
	for range 20 {
		c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 8}, 1, 0)
		for range 8 {
			c.Next(0, 8, 1)
		}
		c.Release(10, 1)
		for want := uint64(1); want <= 8; want++ {
			if d, ok := c.Next(10, 8, 2); !ok || d.Seq != want || d.Count != 2 {
				t.Fatalf("redelivery %+v %v, want seq %d as delivery 2", d, ok, want)
			}
		}
	}
}

// TestDoneSeqsSumsTheRangesAndSaturates pins DoneSeqs: the sum of the
// ranges' lengths (Last-First+1), saturating at 2^64-1 when a range's
// length or the sum wraps.
func TestDoneSeqsSumsTheRangesAndSaturates(t *testing.T) {
	for _, c := range []struct {
		ranges []SeqRange
		want   uint64
	}{
		{nil, 0},
		{[]SeqRange{{3, 5}, {9, 9}}, 4},
		{[]SeqRange{{0, math.MaxUint64}}, math.MaxUint64},
		{[]SeqRange{{1, math.MaxUint64 - 1}, {1, 2}}, math.MaxUint64},
		{[]SeqRange{{1, math.MaxUint64 - 2}, {7, 7}}, math.MaxUint64 - 1},
	} {
		if got := (DoneState{Ranges: c.ranges}).DoneSeqs(); got != c.want {
			t.Errorf("DoneSeqs(%v) = %d, want %d", c.ranges, got, c.want)
		}
	}
}

// TestExpiredDeliveriesAndDeadLettersComeInSeqOrder pins the sorts of
// Expire and TakeDead: the map order of the deliveries in flight or of
// the dead letters must not decide the order of the redeliveries, the
// counts or the dead letters.
func TestExpiredDeliveriesAndDeadLettersComeInSeqOrder(t *testing.T) {
	for range 20 {
		c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 8}, 1, 0)
		for range 8 {
			c.Next(0, 8, 1)
		}
		c.Expire(100)
		for want := uint64(1); want <= 8; want++ {
			if d, ok := c.Next(100, 8, 1); !ok || d.Seq != want {
				t.Fatalf("redelivery %+v %v, want seq %d", d, ok, want)
			}
		}
		dead, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 1, InflightMax: 8}, 1, 0)
		for range 8 {
			dead.Next(0, 8, 1)
		}
		dead.Expire(100)
		if got := dead.TakeDead(); !slices.Equal(got, []uint64{1, 2, 3, 4, 5, 6, 7, 8}) {
			t.Fatalf("dead letters %v, want 1..8 in order", got)
		}
	}
}

// TestDeadLetteredSeqIsNoLongerDead pins DeadLettered's delete(c.dead,
// seq): once its copy is durable the seq is done, not a dead letter
// counted at MaxDeliver.
func TestDeadLetteredSeqIsNoLongerDead(t *testing.T) {
	c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 1, InflightMax: 8}, 1, 0)
	c.ReplayCount(2, 1)
	if got := c.TakeDead(); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("dead %v, want [2]", got)
	}
	c.DeadLettered(2)
	c.DeadLetterFailed(2) // late: it is done
	if got := c.Counts(); len(got) != 0 {
		t.Fatalf("counts %v after the dead letter, want none", got)
	}
	if got := c.TakeDead(); len(got) != 0 {
		t.Fatalf("dead %v offered again after the dead letter", got)
	}
}

// TestNextDeadlineIsTheEarliestExpiryOrRetry pins NextDeadlineMs' and
// NextExpiryMs' minimum over the retries and the deliveries in flight,
// whichever comes first, a retry due at 0 included.
func TestNextDeadlineIsTheEarliestExpiryOrRetry(t *testing.T) {
	for range 20 { // the deliveries in flight are a map: try its orders
		c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 8}, 1, 0)
		if c.NextDeadlineMs() != -1 || c.NextExpiryMs() != -1 {
			t.Fatalf("nothing pending: %d %d", c.NextDeadlineMs(), c.NextExpiryMs())
		}
		var ds []Delivery
		for _, now := range []int64{30, 10, 20, 40} {
			d, _ := c.Next(now, 8, 1)
			ds = append(ds, d)
		}
		if got := c.NextExpiryMs(); got != 110 || c.NextDeadlineMs() != 110 {
			t.Fatalf("deliveries expiring at 130, 110, 120, 140: next expiry %d, deadline %d; want 110", got, c.NextDeadlineMs())
		}
		c.Nack(50, ds[0].Seq, ds[0].DeliveryID, 70) // due 120
		c.Nack(50, ds[3].Seq, ds[3].DeliveryID, 40) // due 90
		c.Nack(50, ds[1].Seq, ds[1].DeliveryID, 60) // due 110; ds[2] expires at 120
		if got := c.NextDeadlineMs(); got != 90 {
			t.Fatalf("retries due at 120, 90, 110, expiry at 120: deadline %d, want 90", got)
		}
		c.Ack(ds[2].Seq, ds[2].DeliveryID)
		if c.NextExpiryMs() != -1 || c.NextDeadlineMs() != 90 {
			t.Fatalf("only retries: expiry %d, deadline %d; want -1 and 90", c.NextExpiryMs(), c.NextDeadlineMs())
		}
	}
	z := newTestCursor(t, 5)
	d1, _ := z.Next(0, 2, 0)
	d2, _ := z.Next(0, 2, 0)
	z.Nack(0, d1.Seq, d1.DeliveryID, 0)  // due 0
	z.Nack(0, d2.Seq, d2.DeliveryID, 50) // due 50
	if got := z.NextDeadlineMs(); got != 0 {
		t.Fatalf("retries due at 0 and 50: deadline %d, want 0", got)
	}
}

// TestRetryAboveTheCommitDoesNotHoldBackNewSeqs pins isPending's "r.seq
// == seq": a retry of another seq does not make a seq pending.
func TestRetryAboveTheCommitDoesNotHoldBackNewSeqs(t *testing.T) {
	c := newTestCursor(t, 5)
	c.ReplayCount(5, 1)
	if d, ok := c.Next(0, 3, 0); !ok || d.Seq != 1 {
		t.Fatalf("first delivery %+v %v, want seq 1 (the retry of 5 waits for its commit)", d, ok)
	}
}

// TestDecodeDoneStateRefusesAVarintThatEndsEarly pins DecodeDoneState's
// d.err checks after the floor and count and inside the ranges: a state
// whose bytes end before its varints do is refused, not read as zeros.
func TestDecodeDoneStateRefusesAVarintThatEndsEarly(t *testing.T) {
	for name, b := range map[string][]byte{
		"version alone":      {doneStateVersion},
		"no count":           {doneStateVersion, 5},
		"second range short": {doneStateVersion, 0, 2, 0x80, 0x01, 0x00, 0x00},
	} {
		if got, err := DecodeDoneState(b); !errors.Is(err, ErrBadDoneState) {
			t.Errorf("%s: %+v %v, want ErrBadDoneState", name, got, err)
		}
	}
}

// TestDecodeDoneStateAllocatesExactlyItsRanges pins DecodeDoneState's
// allocation of count ranges up front and its bound (count ≤ bytes/2,
// inclusive): n ranges of two one-byte varints each decode into n
// entries.
func TestDecodeDoneStateAllocatesExactlyItsRanges(t *testing.T) {
	for n := 1; n <= 20; n++ {
		s := DoneState{Floor: 1}
		for i := range n {
			s.Ranges = append(s.Ranges, SeqRange{First: uint64(3 + 2*i), Last: uint64(3 + 2*i)})
		}
		b := AppendDoneState(nil, s)
		got, err := DecodeDoneState(b)
		if err != nil || cap(got.Ranges) != n || !slices.Equal(got.Ranges, s.Ranges) {
			t.Fatalf("%d ranges in %d bytes: cap %d, %v", n, len(b), cap(got.Ranges), err)
		}
	}
}

// TestDecodeDoneStateTakesRangesUpToTheLastSeqButOne pins the overflow
// checks of DecodeDoneState at their bounds: a range may end at 2^64-2
// (after a floor of 2^64-3, or from a skip or an extra at their largest),
// and one step further is refused.
func TestDecodeDoneStateTakesRangesUpToTheLastSeqButOne(t *testing.T) {
	const top = math.MaxUint64 - 1
	for _, c := range []struct {
		floor, skip, extra uint64
		ok                 bool
	}{
		{math.MaxUint64 - 2, 0, 0, true},
		{5, top - 6, 0, true},
		{5, top - 5, 0, false},
		{1, 0, top - 2, true},
		{1, 0, top - 1, false},
	} {
		s, err := DecodeDoneState(appendRawRangeForTest(c.floor, c.skip, c.extra))
		if ok := err == nil; ok != c.ok {
			t.Errorf("floor %d, skip %d, extra %d: %+v %v, want accepted: %v", c.floor, c.skip, c.extra, s, err, c.ok)
		}
		if err == nil && (s.Validate() != nil || s.Ranges[0].Last != top) {
			t.Errorf("floor %d, skip %d, extra %d: decoded %+v", c.floor, c.skip, c.extra, s)
		}
	}
}

// TestFloorPastEveryRangeReleasesTheirArray pins advanceFloor's "c.done
// = nil": once the floor passed every done range, the cursor keeps no
// backing array (a consumer that held one old seq back while acking
// millions may have grown a large one).
func TestFloorPastEveryRangeReleasesTheirArray(t *testing.T) {
	c := newTestCursor(t, 5)
	for seq := uint64(3); seq <= 100; seq += 2 {
		c.markDone(seq)
	}
	for seq := uint64(2); seq <= 100; seq += 2 {
		c.markDone(seq)
	}
	c.markDone(1)
	if c.AckFloor() != 101 || c.done != nil {
		t.Fatalf("floor %d, done ranges %v (cap %d); want 101 and no array", c.AckFloor(), c.done, cap(c.done))
	}
}

// TestCursorCloneIsIndependent pins Clone's copies of the done ranges,
// the deliveries in flight, the retries, the dead letters and the counts
// not yet taken: the model checker explores from clones, and what one
// does must not show in the other. Twins built alike stand for what each
// must be.
func TestCursorCloneIsIndependent(t *testing.T) {
	build := func() *Cursor {
		c, _ := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 3, InflightMax: 10}, 1, 0)
		ds := map[uint64]uint64{}
		for range 6 {
			d, _ := c.Next(0, 10, 0)
			ds[d.Seq] = d.DeliveryID
		}
		c.Ack(3, ds[3])
		c.Expire(100) // retries and counts of 1, 2, 4, 5, 6
		c.ReplayCount(8, 3)
		return c
	}
	next := func(c *Cursor) Delivery {
		d, ok := c.Next(100, 10, 0)
		if !ok {
			t.Fatal("nothing to deliver")
		}
		return d
	}
	onClone := func(c *Cursor) {
		d := next(c) // 1
		c.Nack(100, d.Seq, d.DeliveryID, 0)
		for range 3 { // 2, 4, 5: the done range of 3 grows in place
			d := next(c)
			c.Ack(d.Seq, d.DeliveryID)
		}
		c.TakeDead()
		next(c) // 6
	}
	onOriginal := func(c *Cursor) {
		next(c) // 1
		d := next(c)
		c.Nack(100, d.Seq, d.DeliveryID, 0) // 2
	}
	a, b, twin := build(), build(), build()
	c := a.Clone()
	onClone(c)
	onClone(twin)
	onOriginal(a)
	onOriginal(b)
	if !bytes.Equal(a.AppendDigest(nil), b.AppendDigest(nil)) {
		t.Fatalf("the original moved with its clone:\n%+v\nwant\n%+v", a, b)
	}
	if !bytes.Equal(c.AppendDigest(nil), twin.AppendDigest(nil)) {
		t.Fatalf("the clone moved with its original:\n%+v\nwant\n%+v", c, twin)
	}
}
