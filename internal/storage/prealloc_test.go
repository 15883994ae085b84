package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// checkLayout asserts the on-disk invariants of preallocated segments:
// a sealed segment's file is exactly its batches; the active one's file is
// its batches followed by zeroes only, no longer than SegmentBytesMax
// unless one batch alone is.
func checkLayout(t testing.TB, m *vfs.MemFS, l *Log) {
	t.Helper()
	for i, s := range l.segments {
		name := segmentPath(l.dir, s.baseSeq)
		data, err := m.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		size := int64(len(data))
		if size < s.sizeBytes {
			t.Fatalf("segment %d: file of %d bytes, %d used", s.baseSeq, size, s.sizeBytes)
		}
		if i < len(l.segments)-1 {
			if size != s.sizeBytes {
				t.Fatalf("sealed segment %d: file of %d bytes, %d used", s.baseSeq, size, s.sizeBytes)
			}
			continue
		}
		if s.allocBytes != size {
			t.Fatalf("active segment %d: allocBytes %d, file of %d bytes", s.baseSeq, s.allocBytes, size)
		}
		if size > max(s.sizeBytes, l.opts.SegmentBytesMax) {
			t.Fatalf("active segment %d: file of %d bytes exceeds %d", s.baseSeq, size, l.opts.SegmentBytesMax)
		}
		if !allZero(data[s.sizeBytes:]) {
			t.Fatalf("active segment %d: non-zero bytes after its last batch at %d", s.baseSeq, s.sizeBytes)
		}
	}
}

// countOps counts the injected operations of each kind.
func countOps(m *vfs.MemFS) map[vfs.Op]int {
	counts := map[vfs.Op]int{}
	m.SetInjector(func(op vfs.Op, _ string) error {
		counts[op]++
		return nil
	})
	return counts
}

func TestPreallocatedLayout(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{SegmentBytesMax: 16 << 10, IndexIntervalBytes: 1024}
	l := openLog(t, m, opts)
	name := segmentPath(testDir, 1)
	if size, _ := m.Stat(name); size != 0 {
		t.Fatalf("new empty segment of %d bytes: preallocation must wait for an append", size)
	}
	var mod model
	prevSize := int64(0)
	for range 40 {
		appendMany(t, l, &mod, 1, 1)
		if len(l.segments) > 1 {
			break
		}
		s := l.active()
		size, _ := m.Stat(name)
		if size < s.sizeBytes || size > min(2*s.sizeBytes, opts.SegmentBytesMax) || size < prevSize {
			t.Fatalf("used %d: file of %d bytes (was %d)", s.sizeBytes, size, prevSize)
		}
		prevSize = size
	}
	if prevSize <= l.active().sizeBytes {
		t.Fatal("the active segment was never preallocated")
	}
	appendMany(t, l, &mod, 400, 1)
	if len(l.segments) < 3 {
		t.Fatalf("%d segments", len(l.segments))
	}
	checkLayout(t, m, l)
	checkAgainst(t, l, &mod)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	active := l.active()
	used, alloc := active.sizeBytes, active.allocBytes
	if alloc <= used {
		t.Fatalf("active: %d used, %d allocated", used, alloc)
	}

	// A crash keeps the synced zero tail, and recovery keeps it too: no
	// write, truncation or allocation on a clean reopen.
	m.CrashClean()
	counts := countOps(m)
	l = openLog(t, m, opts)
	if counts[vfs.OpTruncate] != 0 || counts[vfs.OpWrite] != 0 || counts[vfs.OpAllocate] != 0 {
		t.Fatalf("clean reopen did %v", counts)
	}
	m.SetInjector(nil)
	if a := l.active(); a.sizeBytes != used || a.allocBytes != alloc {
		t.Fatalf("after reopen: %d used, %d allocated; want %d, %d", a.sizeBytes, a.allocBytes, used, alloc)
	}
	checkLayout(t, m, l)
	checkAgainst(t, l, &mod)
	// The next append lands right after the last batch, inside the file.
	appendMany(t, l, &mod, 1, 2)
	if a := l.active(); a.allocBytes != alloc {
		t.Fatalf("append after reopen grew the file from %d to %d", alloc, a.allocBytes)
	}
	l.Close()
	l = openLog(t, m, opts)
	defer l.Close()
	checkLayout(t, m, l)
	checkAgainst(t, l, &mod)
}

// TestLargeBatchIsNotPreallocatedAhead: a batch of largeBatchBytes or
// more grows the active segment up to its own end and no further (zeroes
// ahead of it would reach the disk only to be written over); the next
// small append preallocates ahead again; a log ending at its last batch,
// with no zero tail, recovers as one with a tail does.
func TestLargeBatchIsNotPreallocatedAhead(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	big := func(n int) []Record {
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = Record{TimestampMs: int64(i), Key: []byte("k"), Value: bytes.Repeat([]byte{byte(i + 1)}, 64<<10)}
		}
		return recs
	}
	name := segmentPath(testDir, 1)
	tail := func() int64 {
		t.Helper()
		size, err := m.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if a := l.active(); a.allocBytes != size {
			t.Fatalf("allocBytes %d, file of %d bytes", a.allocBytes, size)
		}
		return size - l.active().sizeBytes
	}
	appendMany(t, l, &mod, 3, 1)
	if tail() == 0 {
		t.Fatal("a small append was not preallocated ahead")
	}
	mod.append(t, l, 1, big(4)) // 256 KiB of values: past the small append's step
	if n := tail(); n != 0 {
		t.Fatalf("a batch of %d bytes left a zero tail of %d bytes", 4*64<<10, n)
	}
	appendMany(t, l, &mod, 2, 1)
	if tail() == 0 {
		t.Fatal("a small append after a large batch was not preallocated ahead")
	}
	mod.append(t, l, 2, big(8))
	if n := tail(); n != 0 {
		t.Fatalf("a batch of %d bytes left a zero tail of %d bytes", 8*64<<10, n)
	}
	checkLayout(t, m, l)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	l = openLog(t, m, Options{})
	defer l.Close()
	checkLayout(t, m, l)
	checkAgainst(t, l, &mod)
	appendMany(t, l, &mod, 2, 3)
	checkAgainst(t, l, &mod)
}

// TestRecoveryOfTheActiveTail damages what follows the last batch of a
// preallocated active segment. Only an all-zero tail is a clean end; every
// other tail is cut off, and no record is served from it.
func TestRecoveryOfTheActiveTail(t *testing.T) {
	next, err := appendBatch(nil, 31, 1, 0, []Record{testRecord(31)}, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		// damage writes into the file of the active segment whose
		// batches end at used.
		damage func(f vfs.File, used int64) error
		// cut: recovery must truncate the file to its used length.
		cut bool
	}{
		{"clean zero tail", func(vfs.File, int64) error { return nil }, false},
		{"torn batch then zeroes", func(f vfs.File, used int64) error {
			_, err := f.WriteAt(next[:batchHeaderBytes+7], used)
			return err
		}, true},
		{"whole valid batch after a zeroed gap", func(f vfs.File, used int64) error {
			_, err := f.WriteAt(next, used+100)
			return err
		}, true},
		{"one stray byte at the end", func(f vfs.File, _ int64) error {
			size, _ := f.Size()
			_, err := f.WriteAt([]byte{1}, size-1)
			return err
		}, true},
		{"zero header then the rest of a batch", func(f vfs.File, used int64) error {
			_, err := f.WriteAt(next[batchHeaderBytes:], used+batchHeaderBytes)
			return err
		}, true},
		{"garbage past the preallocation", func(f vfs.File, _ int64) error {
			size, _ := f.Size()
			_, err := f.WriteAt([]byte("garbage"), size+10)
			return err
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := vfs.NewMem()
			l := openLog(t, m, Options{})
			var mod model
			appendMany(t, l, &mod, 30, 1)
			used, alloc := l.active().sizeBytes, l.active().allocBytes
			if alloc <= used {
				t.Fatalf("not preallocated: %d used, %d allocated", used, alloc)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			f, err := m.OpenRW(segmentPath(testDir, 1))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.damage(f, used); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			l = openLog(t, m, Options{})
			defer l.Close()
			if l.NextSeq() != 31 {
				t.Fatalf("NextSeq %d, want 31", l.NextSeq())
			}
			checkAgainst(t, l, &mod)
			checkLayout(t, m, l)
			size, _ := m.Stat(segmentPath(testDir, 1))
			if c.cut && size != used || !c.cut && size != alloc {
				t.Fatalf("file of %d bytes after recovery (used %d, allocated %d, cut %v)", size, used, alloc, c.cut)
			}
			// Appending again works, and survives a reopen.
			mod.append(t, l, 2, []Record{testRecord(31)})
			l.Close()
			l = openLog(t, m, Options{})
			checkAgainst(t, l, &mod)
			if l.NextSeq() != 32 {
				t.Fatalf("NextSeq %d after append and reopen", l.NextSeq())
			}
		})
	}
}

// zeroRange durably zeroes name[off:off+n] (media damage, or a lost write).
func zeroRange(t *testing.T, m *vfs.MemFS, name string, off, n int) {
	t.Helper()
	data, err := m.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	clear(data[off:min(off+n, len(data))])
	if err := m.WriteFile(name, data); err != nil {
		t.Fatal(err)
	}
}

// TestZeroedBatchInsideTheLogIsNotAnEnd: zeroes in the middle of the log
// are damage, handled exactly as any invalid batch was before
// preallocation: the active segment is cut at the first one, and a sealed
// segment with a valid index never serves it (Read returns ErrCorrupt).
func TestZeroedBatchInsideTheLogIsNotAnEnd(t *testing.T) {
	t.Run("active", func(t *testing.T) {
		m := vfs.NewMem()
		l := openLog(t, m, Options{IndexIntervalBytes: 64})
		var mod model
		appendMany(t, l, &mod, 30, 1)
		s := l.active()
		off, seq := s.index[len(s.index)/2].offset, s.index[len(s.index)/2].seq
		l.Close()
		zeroRange(t, m, segmentPath(testDir, 1), int(off), batchHeaderBytes)
		l = openLog(t, m, Options{IndexIntervalBytes: 64})
		defer l.Close()
		if l.NextSeq() != seq {
			t.Fatalf("NextSeq %d, want %d (cut at the zeroed batch)", l.NextSeq(), seq)
		}
		mod.truncate(seq - 1)
		checkAgainst(t, l, &mod)
		checkLayout(t, m, l)
	})
	t.Run("sealed", func(t *testing.T) {
		m := vfs.NewMem()
		l := openLog(t, m, smallOpts())
		var mod model
		appendMany(t, l, &mod, 200, 1)
		first := l.segments[0]
		off, seq := first.index[1].offset, first.index[1].seq
		l.Close()
		zeroRange(t, m, segmentPath(testDir, 1), int(off), 60)
		l = openLog(t, m, smallOpts())
		defer l.Close()
		if l.NextSeq() != 201 {
			t.Fatalf("NextSeq %d", l.NextSeq())
		}
		if _, err := l.Read(seq, 1, 1<<20); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Read(%d) of a zeroed batch: %v", seq, err)
		}
		es, err := l.Read(1, 1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if last := es[len(es)-1].Seq; last >= seq {
			t.Fatalf("read past the zeroed batch at seq %d up to %d", seq, last)
		}
	})
}

// TestSealedSegmentZeroTailTrimmed: a sealed segment still holding a zero
// tail (its trim at roll was not durable) is trimmed on recovery, and the
// segments after it are kept.
func TestSealedSegmentZeroTailTrimmed(t *testing.T) {
	for _, keepIndex := range []bool{true, false} {
		m := vfs.NewMem()
		l := openLog(t, m, smallOpts())
		var mod model
		appendMany(t, l, &mod, 200, 1)
		segs := len(l.segments)
		l.Close()
		name := segmentPath(testDir, 1)
		data, _ := m.ReadFile(name)
		used := len(data)
		if err := m.WriteFile(name, append(data, make([]byte, 700)...)); err != nil {
			t.Fatal(err)
		}
		if !keepIndex {
			if err := m.Remove(indexPath(testDir, 1)); err != nil {
				t.Fatal(err)
			}
		}
		l = openLog(t, m, smallOpts())
		if len(l.segments) != segs || l.NextSeq() != 201 {
			t.Fatalf("index %v: %d segments (want %d), NextSeq %d", keepIndex, len(l.segments), segs, l.NextSeq())
		}
		if size, _ := m.Stat(name); size != int64(used) {
			t.Fatalf("index %v: sealed segment of %d bytes, want %d", keepIndex, size, used)
		}
		checkAgainst(t, l, &mod)
		checkLayout(t, m, l)
		if _, err := ReadFileAtomic(m, indexPath(testDir, 1)); err != nil {
			t.Fatalf("index %v: index not rewritten: %v", keepIndex, err)
		}
		l.Close()
	}
}

func TestTruncateAfterDropsThePreallocatedTail(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 40, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncateAfter(25); err != nil {
		t.Fatal(err)
	}
	mod.truncate(25)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// Nothing of the dropped batches is left after the new end.
	checkLayout(t, m, l)
	m.CrashClean()
	l = openLog(t, m, Options{})
	if l.NextSeq() != 26 {
		t.Fatalf("NextSeq %d", l.NextSeq())
	}
	checkAgainst(t, l, &mod)
	// New, different records at the same seqs, appended over the old
	// offsets, then a crash that keeps only part of them.
	for i := range 20 {
		r := testRecord(5000 + i)
		mod.append(t, l, 2, []Record{r})
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	checkLayout(t, m, l)
	m.CrashClean()
	l = openLog(t, m, Options{})
	defer l.Close()
	checkAgainst(t, l, &mod)
	checkLayout(t, m, l)
}

func TestPreallocateErrorFailsLog(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 3, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected ENOSPC")
	m.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpAllocate {
			return injected
		}
		return nil
	})
	var err error
	for i := 0; err == nil && i < 100; i++ {
		_, err = l.Append(1, []Record{testRecord(100 + i)})
	}
	if !errors.Is(err, injected) {
		t.Fatalf("Append: %v", err)
	}
	if _, err := l.Append(1, []Record{{}}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after a failed preallocation: %v", err)
	}
	m.SetInjector(nil)
	l.Close()
	m.Crash(rand.New(rand.NewPCG(1, 1)))
	l = openLog(t, m, Options{})
	defer l.Close()
	if l.NextSeq() < 4 {
		t.Fatalf("NextSeq %d: synced records lost", l.NextSeq())
	}
	checkLayout(t, m, l)
}

// crashHistory is what a crash workload did before it stopped.
type crashHistory struct {
	mod model
	// olds are the histories before each TruncateAfter since the last
	// Sync: while a truncation is not durable, a crash may bring back
	// the records it dropped.
	olds []model
	// synced is the log's SyncedSeq after its last successful call.
	synced uint64
}

func (h *crashHistory) append(l *Log, epoch uint64, recs []Record) error {
	if _, err := l.Append(epoch, recs); err != nil {
		return err
	}
	for _, r := range recs {
		h.mod.records = append(h.mod.records, r)
		h.mod.epochs = append(h.mod.epochs, epoch)
	}
	return nil
}

func (h *crashHistory) sync(l *Log) error {
	if err := l.Sync(); err != nil {
		return err
	}
	h.synced, h.olds = l.SyncedSeq(), nil
	return nil
}

func (h *crashHistory) truncateAfter(l *Log, seq uint64) error {
	h.olds = append(h.olds, model{records: slices.Clone(h.mod.records), epochs: slices.Clone(h.mod.epochs)})
	// Asking for the truncation gives up the records after seq, even if
	// it fails midway.
	h.synced = min(h.synced, seq)
	if err := l.TruncateAfter(seq); err != nil {
		return err
	}
	h.mod.truncate(min(seq, uint64(len(h.mod.records))))
	h.synced = l.SyncedSeq()
	return nil
}

// histories returns every history the log may hold a prefix of.
func (h *crashHistory) histories() []*model {
	out := []*model{&h.mod}
	for i := range h.olds {
		out = append(out, &h.olds[i])
	}
	return out
}

// checkRecovered asserts that l, just recovered, holds every synced record
// and a prefix of one of the histories, and makes that prefix the history.
func checkRecovered(t testing.TB, l *Log, h *crashHistory) {
	t.Helper()
	last := l.NextSeq() - 1
	if last < h.synced {
		t.Fatalf("recovered up to seq %d, synced %d", last, h.synced)
	}
	got := readAll(t, l)
	for _, mod := range h.histories() {
		if last > uint64(len(mod.records)) {
			continue
		}
		prefix := true
		for _, e := range got {
			if !sameRecord(e.Record, mod.records[e.Seq-1]) || e.Epoch != mod.epochs[e.Seq-1] {
				prefix = false
				break
			}
		}
		if prefix {
			h.mod = *mod
			h.mod.truncate(last)
			h.olds, h.synced = nil, last
			return
		}
	}
	t.Fatalf("recovered %d records that are not a prefix of what was appended (%d, and %d earlier histories)",
		last, len(h.mod.records), len(h.olds))
}

// crashWorkload opens a log with smallOpts and appends, syncs, rolls
// (several segments, each preallocated as it grows) and truncates, until
// done or until a call fails. It leaves the log open, as a killed process
// would.
func crashWorkload(m *vfs.MemFS, h *crashHistory) {
	l, err := Open(m, testDir, smallOpts())
	if err != nil {
		return
	}
	for i := range 70 {
		var recs []Record
		for j := range 1 + i%3 {
			recs = append(recs, testRecord(len(h.mod.records)+j+1))
		}
		epoch := uint64(1)
		if i >= 45 {
			epoch = 2
			for j := range recs {
				recs[j].Value = append([]byte("after truncation "), recs[j].Value...)
			}
		}
		if i == 20 || i == 60 {
			// A large record: a batch longer than a segment, with a
			// segment of its own.
			recs[0].Value = append(recs[0].Value, make([]byte, 256<<10)...)
		}
		if err := h.append(l, epoch, recs); err != nil {
			return
		}
		if i%4 == 3 {
			if err := h.sync(l); err != nil {
				return
			}
		}
		if i == 44 {
			// Back into an earlier segment, then new records.
			if err := h.truncateAfter(l, uint64(len(h.mod.records))*2/3); err != nil {
				return
			}
		}
	}
	if err := h.sync(l); err != nil {
		return
	}
	if err := l.Close(); err == nil {
		h.synced = uint64(len(h.mod.records))
	}
}

// mutating reports whether op changes the disk.
func mutating(op vfs.Op) bool {
	switch op {
	case vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpSyncDir, vfs.OpRename, vfs.OpRemove,
		vfs.OpMkdirAll, vfs.OpTruncate, vfs.OpAllocate:
		return true
	}
	return false
}

// TestCrashAtEveryDiskOp runs crashWorkload and stops it at each of its
// disk-changing operations in turn: either the process dies there (the
// operation and everything after it never happen) or the operation fails
// (the log fails, nothing more is written). Then the disk crashes with
// torn writes and the log is recovered: it must hold a prefix of what was
// appended with everything synced, and only zeroes after its last batch;
// it must then take appends and recover them again.
func TestCrashAtEveryDiskOp(t *testing.T) {
	var ops []string
	{
		m := vfs.NewMem()
		m.SetInjector(func(op vfs.Op, name string) error {
			if mutating(op) {
				ops = append(ops, op.String()+" "+name)
			}
			return nil
		})
		var h crashHistory
		crashWorkload(m, &h)
		if h.synced != uint64(len(h.mod.records)) {
			t.Fatalf("the workload did not finish: synced %d of %d", h.synced, len(h.mod.records))
		}
	}
	all := strings.Join(ops, "\n")
	for _, want := range []string{"Allocate", "Truncate", "Create", "Remove"} {
		if !strings.Contains(all, want+" ") {
			t.Fatalf("the workload never does %s:\n%s", want, all)
		}
	}
	t.Logf("crashing at each of %d disk operations", len(ops))
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for at := range ops {
		for _, kill := range []bool{true, false} {
			for seed := range seeds {
				m := vfs.NewMem()
				n, dead := 0, false
				m.SetInjector(func(op vfs.Op, name string) error {
					if dead {
						return errors.New("killed")
					}
					if !mutating(op) {
						return nil
					}
					n++
					if n-1 == at {
						dead = kill
						return errors.New("injected")
					}
					return nil
				})
				var h crashHistory
				crashWorkload(m, &h)
				m.SetInjector(nil)
				m.Crash(rand.New(rand.NewPCG(uint64(at), seed)))
				name := fmt.Sprintf("at %d (%s) kill %v seed %d", at, ops[at], kill, seed)
				l, err := Open(m, testDir, smallOpts())
				if err != nil {
					t.Fatalf("%s: Open: %v", name, err)
				}
				if !t.Run(name, func(t *testing.T) {
					checkRecovered(t, l, &h)
					checkLayout(t, m, l)
				}) {
					return
				}
				// Appends on the recovered log survive the next crash.
				for i := range 25 {
					if err := h.append(l, 3, []Record{testRecord(9000 + i)}); err != nil {
						t.Fatalf("%s: append after recovery: %v", name, err)
					}
				}
				if err := h.sync(l); err != nil {
					t.Fatal(err)
				}
				m.Crash(rand.New(rand.NewPCG(seed, uint64(at))))
				l, err = Open(m, testDir, smallOpts())
				if err != nil {
					t.Fatalf("%s: second Open: %v", name, err)
				}
				if !t.Run(name+" then appends", func(t *testing.T) {
					checkRecovered(t, l, &h)
					checkLayout(t, m, l)
				}) {
					return
				}
				l.Close()
			}
		}
	}
}

// FuzzLogCrash runs a program of appends, syncs, truncations, crashes with
// torn writes and reopens on a MemFS, and checks after each recovery that
// the log holds a prefix of what was appended with everything synced, and
// only zeroes after its last batch.
func FuzzLogCrash(f *testing.F) {
	f.Add([]byte{0, 1, 2, 4, 0, 0, 6, 1, 3, 5, 9, 4, 6}, uint64(1))
	f.Add(bytes.Repeat([]byte{3, 3, 3, 4}, 30), uint64(2))
	f.Add(append(bytes.Repeat([]byte{2, 4}, 40), 5, 200, 6, 1, 1, 7, 6), uint64(3))
	f.Fuzz(func(t *testing.T, prog []byte, seed uint64) {
		if len(prog) > 400 {
			return
		}
		opts := Options{SegmentBytesMax: 1500, IndexIntervalBytes: 128}
		rng := rand.New(rand.NewPCG(seed, 7))
		m := vfs.NewMem()
		l, err := Open(m, testDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		var h crashHistory
		epoch := uint64(1)
		for pc := 0; pc < len(prog); pc++ {
			switch op := prog[pc] % 8; op {
			case 0, 1, 2, 3: // append 1-4 records of a size set by op
				var recs []Record
				for j := range 1 + int(prog[pc]/8)%4 {
					r := testRecord(len(h.mod.records) + j + 1)
					r.Value = bytes.Repeat([]byte{byte(epoch)}, int(op)*40+int(prog[pc]/32))
					recs = append(recs, r)
				}
				if err := h.append(l, epoch, recs); err != nil {
					t.Fatal(err)
				}
			case 4:
				if err := h.sync(l); err != nil {
					t.Fatal(err)
				}
			case 5: // truncate after the seq given by the next byte
				if pc+1 >= len(prog) {
					continue
				}
				pc++
				if err := h.truncateAfter(l, uint64(prog[pc])%(uint64(len(h.mod.records))+1)); err != nil {
					t.Fatal(err)
				}
				epoch++
			case 6, 7: // crash (torn writes) or close, and recover
				if op == 7 {
					if err := l.Close(); err != nil {
						t.Fatal(err)
					}
					h.synced, h.olds = uint64(len(h.mod.records)), nil
				}
				m.Crash(rng)
				if l, err = Open(m, testDir, opts); err != nil {
					t.Fatal(err)
				}
				checkRecovered(t, l, &h)
				checkLayout(t, m, l)
			}
		}
		l.Close()
	})
}
