package kv

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// watchAll drains a watch from cursor with the given credit per call,
// checking that every batch continues where the last one ended.
func watchAll(t tb, b *Bucket, c Cursor, credit int) ([]string, uint64) {
	t.Helper()
	var out []string
	for range 100 {
		batch := b.Watch(c, credit)
		out = append(out, describe(batch.Events)...)
		if batch.Expired || batch.Next == c.Next {
			return out, batch.Next
		}
		c.Next = batch.Next
	}
	t.Fatal("watch did not settle in 100 calls")
	return nil, 0
}

func TestWatchReportsSkipsDistinctly(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a/1", "v", 0)) // 1: overwritten by 3, 4, 6
	r.mustApply(t, put("b/1", "v", 0)) // 2: outside a/
	r.mustApply(t, put("a/1", "v", 0)) // 3
	r.mustApply(t, put("a/1", "v", 0)) // 4
	r.mustApply(t, cas("a/2", "v", 9)) // 5: refused, no revision
	r.mustApply(t, put("a/1", "v", 0)) // 6
	r.mustApply(t, del("a/2", 0))      // 7
	r.mustApply(t, put("b/2", "v", 0)) // 8
	r.mustApply(t, CompactRecord(1))   // 9: nothing to purge
	r.mustApply(t, Record{})           // 10: not a KV record
	got, next := watchAll(t, r.b, Cursor{Next: 1, Prefix: "a/"}, 10)
	want := []string{
		"SKIP 1-2 overwritten|outside-prefix", "PUT a/1@3", "PUT a/1@4",
		"SKIP 5-5 overwritten", "PUT a/1@6", "DEL a/2@7", "SKIP 8-10 overwritten|outside-prefix",
	}
	if !slices.Equal(got, want) || next != 11 {
		t.Fatalf("watch a/ from 1:\n got %v next %d\nwant %v next 11", got, next, want)
	}
	// With credit 1 the same events arrive, one delivery per call.
	if got, _ := watchAll(t, r.b, Cursor{Next: 1, Prefix: "a/"}, 1); !slices.Equal(got, want) {
		t.Fatalf("credit 1:\n got %v\nwant %v", got, want)
	}
	// Caught up: nothing, and the cursor stays.
	if batch := r.b.Watch(Cursor{Next: 11}, 5); len(batch.Events) != 0 || batch.Next != 11 {
		t.Fatalf("caught-up watch: %+v", batch)
	}
}

func TestWatchCreditBoundsDeliveries(t *testing.T) {
	r := newRun(Mutations{})
	for i := range 5 {
		r.mustApply(t, put(string(rune('a'+i)), "v", 0))
	}
	batch := r.b.Watch(Cursor{Next: 2}, 2)
	if got := describe(batch.Events); !slices.Equal(got, []string{"PUT b@2", "PUT c@3"}) || batch.Next != 4 {
		t.Fatalf("credit 2 from 2: %v next %d", got, batch.Next)
	}
	if batch := r.b.Watch(Cursor{Next: 2}, 0); len(batch.Events) != 0 || batch.Next != 2 {
		t.Fatalf("credit 0: %+v", batch)
	}
}

func TestWatchScanIsBounded(t *testing.T) {
	cfg := testConfig(Mutations{})
	cfg.WatchScanRevisionsMax = 2
	b, _ := NewBucket(cfg)
	for seq := uint64(1); seq <= 5; seq++ {
		b.Apply(seq, put("x"+strings.Repeat("x", int(seq)), "v", 0))
	}
	batch := b.Watch(Cursor{Next: 1, Prefix: "y"}, 10)
	if got := describe(batch.Events); !slices.Equal(got, []string{"SKIP 1-2 outside-prefix"}) || batch.Next != 3 {
		t.Fatalf("bounded scan: %v next %d", got, batch.Next)
	}
}

// TestWatchCursorExpired: a watcher below the floor — at resume, or live
// after a compaction overran it — gets CURSOR_EXPIRED and nothing else;
// at or above the floor it continues.
func TestWatchCursorExpired(t *testing.T) { watchCursorExpired(t, Mutations{}) }

func watchCursorExpired(t tb, m Mutations) {
	r := newRun(m)
	r.mustApply(t, put("k", "v", 0))         // 1
	r.mustApply(t, del("k", 0))              // 2
	r.mustApply(t, put("j", "v", 0))         // 3
	live := Cursor{Next: 2}                  // a watcher that has seen 1 only
	r.mustApply(t, CompactRecord(testTTLms)) // 4: purges k@1, k@2
	if r.b.Floor() != 3 {
		t.Fatalf("floor %d, want 3", r.b.Floor())
	}
	for _, c := range []Cursor{live, {Next: 1}, {Next: 1, Prefix: "j"}} {
		batch := r.b.Watch(c, 10)
		if got := describe(batch.Events); !slices.Equal(got, []string{"CURSOR_EXPIRED floor=3"}) || !batch.Expired || batch.Next != c.Next {
			t.Fatalf("watch from %+v: %v next %d expired %v", c, got, batch.Next, batch.Expired)
		}
	}
	if got, _ := watchAll(t, r.b, Cursor{Next: 3}, 10); !slices.Equal(got, []string{"PUT j@3", "SKIP 4-4 overwritten"}) {
		t.Fatalf("watch from the floor: %v", got)
	}
}

// Seqs a repair dropped (DroppedNeverSkippedSilently): the cursor moves
// over them, the state keeps what it had, and the floor rises above them
// — a watcher that had not seen them all gets CURSOR_EXPIRED and lists
// again, one past them goes on. Out of order is refused.
func TestDropRaisesTheFloorOverTheLostSeqs(t *testing.T) { droppedSeqsExpireWatchers(t, Mutations{}) }

func TestFenceExpiresEveryCursor(t *testing.T) { fenceExpiresEveryCursor(t, Mutations{}) }

func droppedSeqsExpireWatchers(t tb, m Mutations) {
	r := newRun(m)
	r.mustApply(t, put("a", "1", 0))       // 1
	r.mustApply(t, put("b", "1", 0))       // 2
	seen := Cursor{Next: 3}                // a watcher that has seen 1-2
	if err := r.b.Drop(3, 4); err != nil { // a put of a at 3, say: lost
		t.Fatal(err)
	}
	if r.b.Applied() != 4 || r.b.Floor() != 5 {
		t.Fatalf("after the drop: applied %d floor %d, want 4 and 5", r.b.Applied(), r.b.Floor())
	}
	if rev, ok := r.b.Get("a"); !ok || string(rev.Value) != "1" || rev.Seq != 1 {
		t.Fatalf("a = %+v, %v: the state keeps what it had", rev, ok)
	}
	r.mustApply(t, put("c", "1", 0)) // 5
	if got := describe(r.b.Watch(seen, 10).Events); !slices.Equal(got, []string{"CURSOR_EXPIRED floor=5"}) {
		t.Fatalf("watch from 3 across the dropped seqs: %v", got)
	}
	if got, _ := watchAll(t, r.b, Cursor{Next: 5}, 10); !slices.Equal(got, []string{"PUT c@5"}) {
		t.Fatalf("watch from past them: %v", got)
	}
	for _, d := range [][2]uint64{{5, 5}, {7, 8}, {7, 6}} {
		if err := r.b.Drop(d[0], d[1]); !errors.Is(err, ErrOutOfOrder) || r.b.Applied() != 5 {
			t.Fatalf("Drop(%d, %d) after 5: %v, applied %d", d[0], d[1], err, r.b.Applied())
		}
	}
}

// fenceExpiresEveryCursor: a watcher that saw the write at 2 before a
// repair dropped it — its cursor past the drop — is not expired by the
// drop itself; the fence the leader proposes after it expires every
// cursor up to the fence, that one included, and a watch from past the
// fence runs on (LossExpiresEveryCursor).
func fenceExpiresEveryCursor(t tb, m Mutations) {
	// The log after the repair, replayed: a=1 at 1, seq 2 (a=2, which
	// the watcher saw) dropped, b=1 at 3.
	r := newRun(m)
	r.mustApply(t, put("a", "1", 0)) // 1
	if err := r.b.Drop(2, 2); err != nil {
		t.Fatal(err)
	}
	r.mustApply(t, put("b", "1", 0)) // 3
	sawLost := Cursor{Next: 4}
	if got, _ := watchAll(t, r.b, sawLost, 10); len(got) != 0 {
		t.Fatalf("before the fence, the watch past the drop: %v", got)
	}
	if _, res, err := r.apply(FenceRecord([]Span{{2, 2}})); err != nil || res.Outcome != Fenced {
		t.Fatalf("the fence applied: %+v, %v", res, err)
	}
	for _, c := range []Cursor{{Next: 3}, sawLost} {
		if got := describe(r.b.Watch(c, 10).Events); !slices.Equal(got, []string{"CURSOR_EXPIRED floor=5"}) {
			t.Fatalf("watch from %d after the fence at 4: %v", c.Next, got)
		}
	}
	r.mustApply(t, put("c", "1", 0)) // 5
	if got, _ := watchAll(t, r.b, Cursor{Next: 5}, 10); !slices.Equal(got, []string{"PUT c@5"}) {
		t.Fatalf("watch from past the fence: %v", got)
	}
}
