package storage

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// TestRetentionPointRespectsLimit: retention never deletes a segment that
// holds a seq above the limit (a replicated log's retain floor), and
// deleting through the point leaves the log starting right after it.
func TestRetentionPointRespectsLimit(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	opts.RetentionBytes = 3000
	l := openLog(t, m, opts)
	defer l.Close()
	var mod model
	appendMany(t, l, &mod, 400, 1)
	full := l.RetentionPoint(0, math.MaxUint64)
	if full == 0 {
		t.Fatal("nothing due for retention")
	}
	limit := full / 2
	point := l.RetentionPoint(0, limit)
	if point == 0 || point > limit {
		t.Fatalf("point %d with limit %d (unlimited %d)", point, limit, full)
	}
	if l.RetentionPoint(0, l.segments[0].nextSeq-2) != 0 {
		t.Fatal("a limit inside the first segment still lets it go")
	}
	n, err := l.DeleteThrough(point)
	if err != nil || n == 0 {
		t.Fatalf("DeleteThrough(%d) = %d, %v", point, n, err)
	}
	if l.StartSeq() != point+1 {
		t.Fatalf("StartSeq %d after deleting through %d", l.StartSeq(), point)
	}
	checkAgainst(t, l, &mod)
	// ApplyRetention is DeleteThrough of the unlimited point.
	want := l.RetentionPoint(0, math.MaxUint64)
	if _, err := l.ApplyRetention(0); err != nil {
		t.Fatal(err)
	}
	if want != 0 && l.StartSeq() != want+1 {
		t.Fatalf("StartSeq %d, want %d", l.StartSeq(), want+1)
	}
	checkAgainst(t, l, &mod)
}

// TestSpanPoint: the span point is the end of the newest segment with
// more than the given bytes in the segments after it — a read from any
// seq at or below it reads more than that — and 0 when no seq has.
func TestSpanPoint(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	defer l.Close()
	var mod model
	appendMany(t, l, &mod, 400, 1)
	if len(l.segments) < 4 {
		t.Fatalf("%d segments, want several", len(l.segments))
	}
	var total int64
	for _, s := range l.segments {
		total += s.sizeBytes
	}
	if got := l.SpanPoint(total); got != 0 {
		t.Fatalf("SpanPoint(all %d bytes) = %d, want 0", total, got)
	}
	for _, bytes := range []int64{0, 1, 500, 2000, total / 2, total - l.segments[0].sizeBytes - 1} {
		got := l.SpanPoint(bytes)
		var after int64 // the whole segments after the one holding got
		seen := false
		for _, s := range l.segments {
			if seen {
				after += s.sizeBytes
			}
			seen = seen || s.nextSeq-1 == got
		}
		if !seen || after <= bytes {
			t.Fatalf("SpanPoint(%d) = %d, not a segment's end with more than that after it (%d)", bytes, got, after)
		}
		// The next segment's end has no more than bytes after it.
		for i, s := range l.segments[:len(l.segments)-1] {
			if s.nextSeq-1 == got {
				var rest int64
				for _, r := range l.segments[i+2:] {
					rest += r.sizeBytes
				}
				if rest > bytes {
					t.Fatalf("SpanPoint(%d) = %d, but %d ends with %d bytes after it", bytes, got, l.segments[i+1].nextSeq-1, rest)
				}
			}
		}
	}
}

// TestResetStartsEmptyAtSeq: after Reset(s) the log is empty, its next
// record gets s, and that survives a crash.
func TestResetStartsEmptyAtSeq(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendMany(t, l, &mod, 200, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(0); err == nil {
		t.Fatal("Reset(0) accepted")
	}
	const start = 1000
	if err := l.Reset(start); err != nil {
		t.Fatal(err)
	}
	if l.StartSeq() != start || l.NextSeq() != start || l.SyncedSeq() != start-1 || l.LastEpoch() != 0 {
		t.Fatalf("after reset: start %d next %d synced %d epoch %d", l.StartSeq(), l.NextSeq(), l.SyncedSeq(), l.LastEpoch())
	}
	if _, err := l.Read(start-1, 1, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below the reset point: %v", err)
	}
	m.Crash(rand.New(rand.NewPCG(1, 2)))
	l = openLog(t, m, smallOpts())
	if l.StartSeq() != start || l.NextSeq() != start {
		t.Fatalf("after crash: start %d next %d", l.StartSeq(), l.NextSeq())
	}
	first, err := l.Append(7, []Record{testRecord(1), testRecord(2)})
	if err != nil || first != start {
		t.Fatalf("append after reset: first %d, %v", first, err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	es := readAll(t, l)
	if len(es) != 2 || es[0].Seq != start || es[1].Epoch != 7 || !sameRecord(es[1].Record, testRecord(2)) {
		t.Fatalf("read back %+v", es)
	}
	l.Close()
}

// TestResetCrashAtEveryDiskOp kills Reset at each of its disk operations:
// the recovered log is the old log's prefix or an empty log (from 1 or
// from the reset point), never a mix, and repeating the Reset completes it.
func TestResetCrashAtEveryDiskOp(t *testing.T) {
	const start = 500
	build := func(m *vfs.MemFS) (*Log, *model) {
		l := openLog(t, m, smallOpts())
		var mod model
		appendMany(t, l, &mod, 300, 2)
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		return l, &mod
	}
	var ops int
	{
		m := vfs.NewMem()
		l, _ := build(m)
		m.SetInjector(func(op vfs.Op, name string) error {
			if mutating(op) {
				ops++
			}
			return nil
		})
		if err := l.Reset(start); err != nil {
			t.Fatal(err)
		}
	}
	if ops < 3 {
		t.Fatalf("Reset did only %d disk operations", ops)
	}
	for at := range ops {
		for seed := range uint64(3) {
			name := fmt.Sprintf("at %d seed %d", at, seed)
			m := vfs.NewMem()
			l, mod := build(m)
			n, dead := 0, false
			m.SetInjector(func(op vfs.Op, name string) error {
				if dead {
					return errors.New("killed")
				}
				if mutating(op) {
					if n++; n-1 == at {
						dead = true
						return errors.New("injected")
					}
				}
				return nil
			})
			if err := l.Reset(start); err == nil {
				t.Fatalf("%s: Reset succeeded through a dead disk", name)
			}
			m.SetInjector(nil)
			m.Crash(rand.New(rand.NewPCG(uint64(at), seed)))
			l = openLog(t, m, smallOpts())
			switch l.StartSeq() {
			case 1:
				if l.NextSeq()-1 > uint64(len(mod.records)) {
					t.Fatalf("%s: recovered %d records of %d", name, l.NextSeq()-1, len(mod.records))
				}
				checkAgainst(t, l, mod)
			case start:
				if l.NextSeq() != start {
					t.Fatalf("%s: reset log holds records up to %d", name, l.NextSeq()-1)
				}
			default:
				t.Fatalf("%s: recovered a log starting at %d", name, l.StartSeq())
			}
			if err := l.Reset(start); err != nil {
				t.Fatalf("%s: repeated Reset: %v", name, err)
			}
			if l.StartSeq() != start || l.NextSeq() != start {
				t.Fatalf("%s: repeated Reset left start %d next %d", name, l.StartSeq(), l.NextSeq())
			}
			l.Close()
		}
	}
}
