package delivery

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func testConfig() Config { return Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 1 << 30} }

// ackAll delivers everything up to commitSeq and acks every seq except
// those in skip; it returns the cursor.
func ackAllBut(t testing.TB, commitSeq uint64, skip map[uint64]bool) *Cursor {
	t.Helper()
	c, err := NewCursor(testConfig(), 1, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	for {
		d, ok := c.Next(0, commitSeq, 1)
		if !ok {
			break
		}
		if skip[d.Seq] {
			continue
		}
		if _, err := c.Ack(d.Seq, d.DeliveryID); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestSnapshotOfOneMillionAcksWithGapsIsSmall(t *testing.T) {
	gaps := map[uint64]bool{3: true, 500_000: true, 500_001: true, 777_777: true, 999_999: true}
	c := ackAllBut(t, 1_000_000, gaps)
	s := c.Snapshot()
	want := DoneState{Floor: 3, Ranges: []SeqRange{{4, 499_999}, {500_002, 777_776}, {777_778, 999_998}, {1_000_000, 1_000_000}}}
	if s.Floor != want.Floor || !slices.Equal(s.Ranges, want.Ranges) {
		t.Fatalf("snapshot %+v, want %+v", s, want)
	}
	b := AppendDoneState(nil, s)
	// 1M acked seqs (12 MB of ledger records) take a few bytes per gap.
	if len(b) > 32 {
		t.Fatalf("encoded snapshot of 1M acks with %d gaps is %d bytes, want ≤ 32", len(gaps), len(b))
	}
	t.Logf("1M acked seqs, %d gaps: %d bytes", len(gaps), len(b))
	got, err := DecodeDoneState(b)
	if err != nil || got.Floor != s.Floor || !slices.Equal(got.Ranges, s.Ranges) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// A fresh cursor restored from it redelivers exactly the gaps.
	r, _ := NewCursor(testConfig(), 1, 2<<40)
	if err := r.Restore(got); err != nil {
		t.Fatal(err)
	}
	var redelivered []uint64
	for {
		d, ok := r.Next(0, 1_000_000, 1)
		if !ok {
			break
		}
		redelivered = append(redelivered, d.Seq)
	}
	if !slices.Equal(redelivered, []uint64{3, 500_000, 500_001, 777_777, 999_999}) {
		t.Fatalf("after restore redelivered %v", redelivered)
	}
}

func TestRestoreThenReplayMatchesLedgerReplay(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		commit := uint64(1 + rng.IntN(300))
		skip := map[uint64]bool{}
		for i := rng.IntN(20); i > 0; i-- {
			skip[uint64(1+rng.IntN(int(commit)))] = true
		}
		c := ackAllBut(t, commit, skip)
		start := uint64(1 + rng.IntN(10)) // retention may have moved the start
		restored, _ := NewCursor(testConfig(), start, 0)
		if err := restored.Restore(c.Snapshot()); err != nil {
			t.Fatal(err)
		}
		replayed, _ := NewCursor(testConfig(), start, 0)
		for seq := uint64(1); seq <= commit; seq++ {
			if !skip[seq] {
				replayed.ReplayAck(seq)
			}
		}
		if restored.AckFloor() != replayed.AckFloor() {
			t.Fatalf("round %d: floor %d restored, %d replayed", round, restored.AckFloor(), replayed.AckFloor())
		}
		for seq := uint64(0); seq <= commit+1; seq++ {
			if restored.isDone(seq) != replayed.isDone(seq) {
				t.Fatalf("round %d: seq %d done=%v restored, %v replayed", round, seq, restored.isDone(seq), replayed.isDone(seq))
			}
		}
	}
}

func TestDecodeDoneStateRejects(t *testing.T) {
	valid := AppendDoneState(nil, DoneState{Floor: 5, Ranges: []SeqRange{{7, 9}, {11, 11}}})
	cases := map[string][]byte{
		"empty":            nil,
		"version":          append([]byte{2}, valid[1:]...),
		"truncated":        valid[:len(valid)-1],
		"trailing":         append(slices.Clone(valid), 0),
		"count too large":  {doneStateVersion, 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"non-minimal":      {doneStateVersion, 0x80, 0x00, 0},
		"first overflows":  appendRawRangeForTest(math.MaxUint64-1, 0, 0),
		"last overflows":   appendRawRangeForTest(5, 0, math.MaxUint64-6),
		"varint too long":  {doneStateVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0},
		"count no payload": {doneStateVersion, 0, 1},
	}
	for name, b := range cases {
		if _, err := DecodeDoneState(b); !errors.Is(err, ErrBadDoneState) {
			t.Errorf("%s: %v, want ErrBadDoneState", name, err)
		}
	}
	if err := (DoneState{Floor: 5, Ranges: []SeqRange{{5, 6}}}).Validate(); err == nil {
		t.Error("range at the floor accepted")
	}
	if err := (DoneState{Floor: 5, Ranges: []SeqRange{{7, 8}, {9, 9}}}).Validate(); err == nil {
		t.Error("adjacent ranges accepted")
	}
}

// appendRawRangeForTest encodes one raw (skip, extra) range after floor,
// for building invalid inputs.
func appendRawRangeForTest(floor, skip, extra uint64) []byte {
	b := []byte{doneStateVersion}
	for _, v := range []uint64{floor, 1, skip, extra} {
		b = appendUvarintForTest(b, v)
	}
	return b
}

func appendUvarintForTest(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// FuzzDecodeDoneState: the decoder never panics, allocates in proportion to
// its input, accepts only valid states and only their one encoding; a small
// decoded state restores into a cursor that agrees with it.
func FuzzDecodeDoneState(f *testing.F) {
	f.Add(AppendDoneState(nil, DoneState{Floor: 1}))
	f.Add(AppendDoneState(nil, DoneState{Floor: 3, Ranges: []SeqRange{{4, 499_999}, {500_002, 1_000_000}}}))
	f.Add(AppendDoneState(nil, DoneState{Floor: math.MaxUint64 - 3, Ranges: []SeqRange{{math.MaxUint64 - 2, math.MaxUint64 - 1}}}))
	f.Add([]byte{doneStateVersion, 0, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeDoneState(b)
		if err != nil {
			if !errors.Is(err, ErrBadDoneState) {
				t.Fatalf("error %v does not match ErrBadDoneState", err)
			}
			return
		}
		if cap(s.Ranges) > len(b)/doneRangeBytesMin {
			t.Fatalf("%d ranges allocated for %d bytes", cap(s.Ranges), len(b))
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded an invalid state: %v", err)
		}
		if again := AppendDoneState(nil, s); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x, input %x", again, b)
		}
		if s.Floor == 0 || s.Floor > 1<<20 || s.DoneSeqs() > 1<<12 {
			return // restoring is linear in the done seqs
		}
		c, _ := NewCursor(testConfig(), 1, 0)
		if err := c.Restore(s); err != nil {
			t.Fatal(err)
		}
		if got := c.Snapshot(); got.Floor != s.Floor || !slices.Equal(got.Ranges, s.Ranges) {
			t.Fatalf("restore then snapshot %+v, want %+v", got, s)
		}
	})
}
