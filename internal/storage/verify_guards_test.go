package storage

// Tests that pin the guards of the scrubber's re-verification (verify.go),
// of the decoders' size bounds and of segment file names, in the style of
// guards_test.go: a mutation sweep (each guard deleted or weakened in
// turn) found these guards could go with every earlier test green; each
// test names the guard it fails without.

import (
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// readHookFS is a MemFS whose OpenRW files call afterRead (when set) after
// each ReadAt and beforeWrite (when set) before each WriteAt, with no lock
// of the MemFS held: a test runs the writer there, in the middle of a
// reader's pass.
type readHookFS struct {
	*vfs.MemFS
	afterRead   func(name string, off int64, n int)
	beforeWrite func(name string)
}

func (h *readHookFS) OpenRW(name string) (vfs.File, error) {
	f, err := h.MemFS.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return readHookFile{f, h, name}, nil
}

type readHookFile struct {
	vfs.File
	h    *readHookFS
	name string
}

func (f readHookFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if f.h.afterRead != nil {
		f.h.afterRead(f.name, off, len(p))
	}
	return n, err
}

func (f readHookFile) WriteAt(p []byte, off int64) (int, error) {
	if f.h.beforeWrite != nil {
		f.h.beforeWrite(f.name)
	}
	return f.File.WriteAt(p, off)
}

// verifyFirst runs Verify on the first segment only and fails on an error.
func verifyFirst(t *testing.T, l *Log) []Damage {
	t.Helper()
	_, _, found, err := l.Verify(l.StartSeq(), 1)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return found
}

// verifyEverySealed runs Verify over every sealed segment, one per call.
func verifyEverySealed(t *testing.T, l *Log) []Damage {
	t.Helper()
	var found []Damage
	for from := l.StartSeq(); ; {
		next, _, ds, err := l.Verify(from, 1)
		if err != nil {
			t.Fatalf("Verify(%d): %v", from, err)
		}
		found = append(found, ds...)
		if next == 0 {
			return found
		}
		from = next
	}
}

// flipRecord flips a bit in the first record of the batch at off.
func flipRecord(t *testing.T, m *vfs.MemFS, name string, off int64) {
	t.Helper()
	if err := m.FlipBit(name, off+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyAfterCloseReturnsErrClosed guards Verify's `l.closed` check:
// a scrubber step that races a Close gets ErrClosed, not a read error of
// a closed file reported as a failed verification.
func TestVerifyAfterCloseReturnsErrClosed(t *testing.T) {
	l := openLog(t, vfs.NewMem(), smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	start := l.StartSeq()
	l.Close()
	if _, _, _, err := l.Verify(start, math.MaxInt64); !errors.Is(err, ErrClosed) {
		t.Fatalf("Verify after Close: %v, want ErrClosed", err)
	}
	if _, err := l.VerifyAll(); !errors.Is(err, ErrClosed) {
		t.Fatalf("VerifyAll after Close: %v, want ErrClosed", err)
	}
}

// TestVerifyReportsTheUnreadableEndOfASealedSegment guards Verify's scan
// of a sealed segment up to limitSeq (not as the last segment, 0): the
// last batch of a sealed segment was synced when it rolled, so its
// damage is damage through the next segment's base even though no later
// batch in the segment proves it.
func TestVerifyReportsTheUnreadableEndOfASealedSegment(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	base1 := l.segments[1].baseSeq
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, m, name)
	flipRecord(t, m, name, offs[len(offs)-1])
	l = openLog(t, m, smallOpts())
	defer l.Close()
	first := hs[len(hs)-1].baseSeq
	found := verifyFirst(t, l)
	if len(found) != 1 || found[0].FirstSeq != first || found[0].LastSeq != base1-1 {
		t.Fatalf("Verify found %+v, want seqs %d-%d", found, first, base1-1)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != first {
		t.Fatalf("refused %v, want %d", refused, first)
	}
}

// TestVerifyReturnsAReadError guards Verify's `err != nil` after its scan
// and `l.stillHolds(s)` (a segment still in the log), VerifyAll's
// `err != nil` after Verify and its own after scanning the active
// segment: a read that fails is an error of the verification, not a
// segment passed as healthy.
func TestVerifyReturnsAReadError(t *testing.T) {
	errRead := errors.New("injected read error")
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	for _, base := range []uint64{l.segments[0].baseSeq, l.active().baseSeq} {
		name := segmentPath(testDir, base)
		m.SetInjector(func(op vfs.Op, n string) error {
			if op == vfs.OpRead && n == name {
				return errRead
			}
			return nil
		})
		if base != l.active().baseSeq {
			if _, _, _, err := l.Verify(l.StartSeq(), math.MaxInt64); !errors.Is(err, errRead) {
				t.Errorf("Verify with segment %d unreadable: %v", base, err)
			}
		}
		if _, err := l.VerifyAll(); !errors.Is(err, errRead) {
			t.Errorf("VerifyAll with segment %d unreadable: %v", base, err)
		}
		m.SetInjector(nil)
	}
}

// TestVerifySkipsASegmentDeletedMeanwhile guards Verify's
// `l.stillHolds(s)`: a segment that retention deletes while Verify reads
// it (its reads then fail) is skipped, not reported as a failure, and
// Verify goes on with the next segment.
func TestVerifySkipsASegmentDeletedMeanwhile(t *testing.T) {
	h := &readHookFS{MemFS: vfs.NewMem()}
	l := openLog(t, h, smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	s0, s1 := l.segments[0], l.segments[1]
	fired := false
	h.afterRead = func(name string, _ int64, _ int) {
		if name == s0.path && !fired {
			fired = true
			if n, err := l.DeleteThrough(s0.nextSeq - 1); err != nil || n != 1 {
				t.Errorf("DeleteThrough: %d, %v", n, err)
			}
		}
	}
	next, read, found, err := l.Verify(s0.baseSeq, s0.sizeBytes+1)
	h.afterRead = nil
	if !fired || err != nil || len(found) != 0 || next != l.segments[1].baseSeq || read != s0.sizeBytes+s1.sizeBytes {
		t.Fatalf("Verify over a segment deleted meanwhile: next %d, read %d, found %v, %v; want next %d after both segments",
			next, read, found, err, l.segments[1].baseSeq)
	}
}

// TestVerifyRecordsNoDamageForASegmentDeletedMeanwhile guards
// recordDamage's `i < 0`: damage Verify read in a segment that retention
// deleted after Verify's last read of it is not recorded (the segment is
// no longer the log's; the scrubber would report a range below StartSeq).
func TestVerifyRecordsNoDamageForASegmentDeletedMeanwhile(t *testing.T) {
	h := &readHookFS{MemFS: vfs.NewMem()}
	l := openLog(t, h, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, h.MemFS, name)
	flipRecord(t, h.MemFS, name, offs[1])
	l = openLog(t, h, smallOpts())
	defer l.Close()
	s0 := l.segments[0]
	lastOff, lastBytes := offs[len(offs)-1], int(hs[len(hs)-1].totalBytes)
	fired := false
	h.afterRead = func(name string, off int64, n int) {
		// The scan's read of the segment's last batch: nothing is read
		// after it.
		if name == s0.path && off == lastOff && n == lastBytes && !fired {
			fired = true
			if n, err := l.DeleteThrough(s0.nextSeq - 1); err != nil || n != 1 {
				t.Errorf("DeleteThrough: %d, %v", n, err)
			}
		}
	}
	found := verifyFirst(t, l)
	h.afterRead = nil
	if !fired || len(found) != 0 || len(l.Damage()) != 0 {
		t.Fatalf("deleted during Verify (hook ran: %v): found %v, damage %v; want none", fired, found, l.Damage())
	}
}

// TestVerifyRecordsNoDamageForASegmentRewrittenMeanwhile guards
// recordDamage's checks that the segment did not change since Verify read
// it — `s.sizeBytes != sizeBytes`, `s.nextSeq != nextSeq` and
// `sealedOnly && i == len(l.segments)-1` — and the truncation count that
// covers what they miss. While Verify reads a sealed segment (and has just
// read a damaged batch in it), a replica's truncation cuts the segment
// before that batch and appends again from the new leader (epoch 2): the
// bytes Verify read are gone, and the damage it found must not be
// recorded against the healthy records now there.
func TestVerifyRecordsNoDamageForASegmentRewrittenMeanwhile(t *testing.T) {
	same := func(_ *testing.T, orig [][]Record, _, _ int64) [][]Record { return orig }
	for _, rw := range []segmentRewrite{
		// The segment is the active one again, of the same size and seqs.
		{what: "same batches, still active", batches: same, stayActive: true},
		// Sealed again, of the same size and seqs: only the truncation
		// count tells.
		{what: "same batches, rolled", batches: same},
		// Sealed again with the same seqs, one byte longer.
		{what: "one byte more, rolled", sizeChanges: true, batches: func(_ *testing.T, orig [][]Record, _, _ int64) [][]Record {
			out := make([][]Record, len(orig))
			for i, b := range orig {
				out[i] = append([]Record(nil), b...)
			}
			last := out[len(out)-1]
			last[0].Value = append(append([]byte(nil), last[0].Value...), 0xEE)
			return out
		}},
		// Sealed again, of the same size, with fewer seqs: one batch of
		// one record filling the bytes cut.
		{what: "fewer seqs, same size, rolled", seqsChange: true, batches: func(t *testing.T, _ [][]Record, cutOff, sizeBytes int64) [][]Record {
			n := sizeBytes - cutOff - batchOverheadBytes - recordBytesMin
			if n < 0 {
				t.Fatalf("no room for a record in %d bytes", sizeBytes-cutOff)
			}
			return [][]Record{{{TimestampMs: 7, Value: make([]byte, n)}}}
		}},
	} {
		t.Run(rw.what, func(t *testing.T) { verifyDuringRewrite(t, rw) })
	}
}

// segmentRewrite is a case of
// TestVerifyRecordsNoDamageForASegmentRewrittenMeanwhile.
type segmentRewrite struct {
	what string
	// batches returns the records to append from the cut on, one slice
	// per batch, given the original batches' records from the cut to the
	// segment's end; the segment is then rolled unless stayActive.
	batches    func(t *testing.T, orig [][]Record, cutOff, sizeBytes int64) [][]Record
	stayActive bool
	// What the rewrite changes (which guard must see it).
	sizeChanges, seqsChange bool
}

func verifyDuringRewrite(t *testing.T, rw segmentRewrite) {
	const j = 2 // the damaged batch of the first segment
	h := &readHookFS{MemFS: vfs.NewMem()}
	l := openLog(t, h, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	sizeBytes, nextSeq := l.segments[0].sizeBytes, l.segments[0].nextSeq
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, h.MemFS, name)
	if len(offs) <= j+2 || sizeBytes+1 > smallOpts().SegmentBytesMax {
		t.Fatalf("unexpected layout: %d batches, %d bytes", len(offs), sizeBytes)
	}
	var orig [][]Record
	for _, hd := range hs[j:] {
		orig = append(orig, mod.records[hd.baseSeq-1:hd.nextSeq()-1])
	}
	flipRecord(t, h.MemFS, name, offs[j])
	l = openLog(t, h, smallOpts())
	defer l.Close()
	s0, cut := l.segments[0], hs[j].baseSeq
	fired := false
	h.afterRead = func(name string, off int64, n int) {
		// The scan has just read the damaged batch.
		if name != s0.path || off != offs[j] || n != int(hs[j].totalBytes) || fired {
			return
		}
		fired = true
		if err := l.TruncateAfter(cut - 1); err != nil {
			t.Errorf("TruncateAfter: %v", err)
			return
		}
		mod.truncate(cut - 1)
		for _, recs := range rw.batches(t, orig, offs[j], sizeBytes) {
			mod.append(t, l, 2, recs)
		}
		if !rw.stayActive {
			big := testRecord(9000)
			big.Value = make([]byte, 1500)
			mod.append(t, l, 2, []Record{big}) // does not fit: rolls
		}
	}
	_, _, found, err := l.Verify(l.StartSeq(), 1)
	h.afterRead = nil
	if !fired || err != nil {
		t.Fatalf("hook ran %v; Verify: %v", fired, err)
	}
	if sealed := len(l.segments) > 1; sealed == rw.stayActive ||
		(s0.sizeBytes != sizeBytes) != rw.sizeChanges || (s0.nextSeq != nextSeq) != rw.seqsChange {
		t.Fatalf("after the rewrite: sealed %v, size %d (was %d), next seq %d (was %d)",
			sealed, s0.sizeBytes, sizeBytes, s0.nextSeq, nextSeq)
	}
	if len(found) != 0 || len(l.Damage()) != 0 {
		t.Fatalf("Verify recorded %v (damage %v), read before the segment was rewritten", found, l.Damage())
	}
	checkAgainst(t, l, &mod)
}

// TestVerifyOfHealthySegmentsDoesNotWaitForTheWriter guards Verify's
// `len(res.damage) > 0` before recordDamage (which takes the writer's
// lock): the scrubber verifying healthy segments never waits for a writer
// stuck in a slow write.
func TestVerifyOfHealthySegmentsDoesNotWaitForTheWriter(t *testing.T) {
	h := &readHookFS{MemFS: vfs.NewMem()}
	l := openLog(t, h, smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	stuck, release := make(chan struct{}), make(chan struct{})
	fired := false
	h.beforeWrite = func(string) {
		if !fired {
			fired = true
			close(stuck)
			<-release
		}
	}
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(1, []Record{testRecord(len(mod.records) + 1)})
		appended <- err
	}()
	<-stuck // the writer holds its lock, in WriteAt
	verified := make(chan error, 1)
	go func() {
		_, _, found, err := l.Verify(l.StartSeq(), math.MaxInt64)
		if err == nil && len(found) != 0 {
			err = errors.New("damage found in a healthy log")
		}
		verified <- err
	}()
	waited := false
	select {
	case err := <-verified:
		if err != nil {
			t.Errorf("Verify: %v", err)
		}
	case <-time.After(5 * time.Second):
		waited = true
		t.Errorf("Verify of healthy segments waited for the writer")
	}
	close(release)
	if err := <-appended; err != nil {
		t.Fatalf("Append: %v", err)
	}
	if waited {
		<-verified
	}
}

// TestVerifyDropsFromTheCacheExactlyBehindTheCachedTail guards Verify's
// `keep >= 0` (a negative CachedTailBytes drops nothing) and `after >=
// keep` (a segment with exactly CachedTailBytes after it lies behind the
// cached tail and is dropped).
func TestVerifyDropsFromTheCacheExactlyBehindTheCachedTail(t *testing.T) {
	for _, keep := range []int64{-1, 0} {
		m := vfs.NewMem()
		l := openLog(t, m, smallOpts()) // default CachedTailBytes: nothing dropped while appending
		var mod model
		appendSynced(t, l, &mod, 60, -1)
		n := len(l.segments)
		if n < 3 || l.active().sizeBytes == 0 {
			t.Fatalf("%d segments, the active one of %d bytes", n, l.active().sizeBytes)
		}
		last := l.segments[n-2] // the last sealed segment
		l.opts.CachedTailBytes = keep
		if keep == 0 {
			l.opts.CachedTailBytes = l.active().sizeBytes // exactly what lies after last
		}
		var before []int64
		for _, s := range l.segments {
			d, _ := m.CacheDrops(s.path)
			before = append(before, d)
		}
		if _, err := l.VerifyAll(); err != nil {
			t.Fatal(err)
		}
		for i, s := range l.segments[:n-1] {
			d, _ := m.CacheDrops(s.path)
			want := before[i]
			if keep == 0 {
				want += s.sizeBytes
			}
			if d != want {
				t.Errorf("CachedTailBytes %d: segment %d (last sealed: %v) dropped %d bytes, want %d",
					l.opts.CachedTailBytes, s.baseSeq, s == last, d-before[i], want-before[i])
			}
		}
		l.Close()
	}
}

// TestVerifyIndexStepsOverTheDamageItFinds guards recordDamage's
// `s.index = rescanned.index`: after Verify finds a batch whose header is
// destroyed in a segment indexed once (recovery trusted its index), reads
// of the records after it are served, stepping from the entry the rescan
// indexed after the damage.
func TestVerifyIndexStepsOverTheDamageItFinds(t *testing.T) {
	opts := Options{SegmentBytesMax: 4096, IndexIntervalBytes: 1 << 20}
	m := vfs.NewMem()
	l := openLog(t, m, opts)
	var mod model
	appendSynced(t, l, &mod, 40, -1)
	if len(l.segments) < 2 || len(l.segments[0].index) != 1 {
		t.Fatalf("%d segments, the first with %d index entries", len(l.segments), len(l.segments[0].index))
	}
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, m, name)
	if err := m.FlipBit(name, offs[3], 0); err != nil { // the magic byte
		t.Fatal(err)
	}
	l = openLog(t, m, opts)
	defer l.Close()
	if found := verifyFirst(t, l); len(found) != 1 || found[0].FirstSeq != hs[3].baseSeq {
		t.Fatalf("Verify found %+v, want damage from seq %d", found, hs[3].baseSeq)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != hs[3].baseSeq {
		t.Fatalf("refused %v, want %d", refused, hs[3].baseSeq)
	}
}

// TestVerifyRecordsEveryDamagedRange guards recordDamage's test for damage
// already known, which compares both the segment and the offset: two
// damaged batches of one segment, and damaged batches at the same offset
// of two segments, are each recorded and refused.
func TestVerifyRecordsEveryDamagedRange(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	base1 := l.segments[1].baseSeq
	l.Close()
	name0, name1 := segmentPath(testDir, 1), segmentPath(testDir, base1)
	offs0, hs0 := batchOffsets(t, m, name0)
	_, hs1 := batchOffsets(t, m, name1)
	flipRecord(t, m, name0, offs0[0])
	flipRecord(t, m, name0, offs0[2])
	flipRecord(t, m, name1, 0)
	want := []uint64{hs0[0].baseSeq, hs0[2].baseSeq, hs1[0].baseSeq}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	found := verifyEverySealed(t, l)
	ds := l.Damage()
	if len(found) != 3 || len(ds) != 3 {
		t.Fatalf("Verify found %+v, damage %+v; want seqs %v", found, ds, want)
	}
	for i, d := range ds {
		if d.FirstSeq != want[i] {
			t.Fatalf("damage %+v; want seqs %v", ds, want)
		}
	}
	if refused := readAround(t, l, &mod); len(refused) != 3 {
		t.Fatalf("refused %v, want %v", refused, want)
	}
}

// TestVerifyKeepsTheDamageSorted guards recordDamage's sort: damage Verify
// finds below the damage recovery found goes before it (Read looks for the
// first range at or after a seq in order), and reads refuse both.
func TestVerifyKeepsTheDamageSorted(t *testing.T) {
	m, mod, name, later, _ := damagedSealedLog(t) // in the second segment, found by recovery
	offs, hs := batchOffsets(t, m, segmentPath(testDir, 1))
	flipRecord(t, m, segmentPath(testDir, 1), offs[1]) // in the first, indexed: found by Verify
	l := openLog(t, m, smallOpts())
	defer l.Close()
	if ds := l.Damage(); len(ds) != 1 || ds[0].Segment != name {
		t.Fatalf("damage after recovery %+v, want one range in %s", ds, name)
	}
	earlier := hs[1].baseSeq
	if found := verifyFirst(t, l); len(found) != 1 || found[0].FirstSeq != earlier {
		t.Fatalf("Verify found %+v, want damage from seq %d", found, earlier)
	}
	if ds := l.Damage(); len(ds) != 2 || ds[0].FirstSeq != earlier || ds[1].FirstSeq != later {
		t.Fatalf("damage %+v, want seqs %d then %d", ds, earlier, later)
	}
	if refused := readAround(t, l, mod); len(refused) != 2 || refused[0] != earlier || refused[1] != later {
		t.Fatalf("refused %v, want %d and %d", refused, earlier, later)
	}
}

// TestVerifyAllReportsTheLastBatchOfTheActiveSegment guards VerifyAll's
// scan of the active segment up to its next seq (not as a last segment
// after a crash, 0): a damaged last batch was read back wrong, not torn by
// a crash, and is damage though no batch after it proves it durable.
func TestVerifyAllReportsTheLastBatchOfTheActiveSegment(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 6, -1)
	offs, hs := batchOffsets(t, m, segmentPath(testDir, 1))
	flipRecord(t, m, segmentPath(testDir, 1), offs[len(offs)-1])
	first := hs[len(hs)-1].baseSeq
	found, err := l.VerifyAll()
	if err != nil || len(found) != 1 || found[0].FirstSeq != first || found[0].LastSeq != l.NextSeq()-1 {
		t.Fatalf("VerifyAll: %+v, %v; want seqs %d-%d", found, err, first, l.NextSeq()-1)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != first {
		t.Fatalf("refused %v, want %d", refused, first)
	}
}

// TestVerifyAllChecksAFirstSegmentOfOneSeq guards VerifyAll's start at
// StartSeq: a first segment holding one seq (one oversized record) is
// verified too.
func TestVerifyAllChecksAFirstSegmentOfOneSeq(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{SegmentBytesMax: 1024}
	l := openLog(t, m, opts)
	var mod model
	big := testRecord(1)
	big.Value = make([]byte, 3000)
	mod.append(t, l, 1, []Record{big})
	appendSynced(t, l, &mod, 3, -1)
	if len(l.segments) != 2 || l.segments[0].nextSeq != 2 {
		t.Fatalf("%d segments, the first ends at %d", len(l.segments), l.segments[0].nextSeq)
	}
	l.Close()
	flipRecord(t, m, segmentPath(testDir, 1), 0)
	l = openLog(t, m, opts)
	defer l.Close()
	if found, err := l.VerifyAll(); err != nil || len(found) != 1 || found[0].FirstSeq != 1 || found[0].LastSeq != 1 {
		t.Fatalf("VerifyAll: %+v, %v; want seq 1", found, err)
	}
}

// TestOpenIgnoresFilesNotNamedLikeSegments guards parseBaseName: the
// suffix check, the exact count of 20 digits (not fewer, not more), the
// parse error (a value past the seq space) and the zero base. A file that
// is not a segment is left alone by Open and Repair; taken for one, it
// became an empty segment with seqs missing up to the log (or from it to
// the end of the seq space).
func TestOpenIgnoresFilesNotNamedLikeSegments(t *testing.T) {
	for _, stray := range []string{
		"00000000000000000007",      // no suffix
		"7.log",                     // too few digits
		"000000000000000000007.log", // too many digits
		"99999999999999999999.log",  // past the seq space
		"00000000000000000000.log",  // seq 0
	} {
		m := vfs.NewMem()
		l := openLog(t, m, smallOpts())
		var mod model
		appendSynced(t, l, &mod, 60, -1)
		if _, err := l.DeleteThrough(l.segments[1].nextSeq - 1); err != nil {
			t.Fatal(err)
		}
		start, next := l.StartSeq(), l.NextSeq()
		if start <= 7 {
			t.Fatalf("start seq %d", start)
		}
		l.Close()
		if err := m.WriteFile(filepath.Join(testDir, stray), nil); err != nil {
			t.Fatal(err)
		}
		if rep, err := Repair(m, testDir, smallOpts(), RepairSalvage, true); err != nil || len(rep.Damage) != 0 || rep.TornTail != nil {
			t.Errorf("%s: a dry-run repair: %+v, %v", stray, rep, err)
		}
		l, err := Open(m, testDir, smallOpts())
		if err != nil {
			t.Errorf("%s: Open: %v", stray, err)
			continue
		}
		if l.StartSeq() != start || l.NextSeq() != next || len(l.Damage()) != 0 {
			t.Errorf("%s: seqs [%d, %d), damage %v; want [%d, %d), none", stray, l.StartSeq(), l.NextSeq(), l.Damage(), start, next)
		} else {
			checkAgainst(t, l, &mod)
		}
		l.Close()
		if _, err := m.Stat(filepath.Join(testDir, stray)); err != nil {
			t.Errorf("%s: %v", stray, err)
		}
	}
}

// TestDecodeIndexRejectsACountBeyondItsEntries guards decodeIndex's entry
// count check in the direction the sweep found open: an index counting
// more entries than it holds is corrupt (ignored, the segment scanned),
// not read past its end.
func TestDecodeIndexRejectsACountBeyondItsEntries(t *testing.T) {
	l := openLog(t, vfs.NewMem(), smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	s := l.segments[0]
	good, size, base, n := s.encodeIndex(), s.sizeBytes, s.baseSeq, len(s.index)
	l.Close()
	for _, count := range []uint32{uint32(n) + 1, 1 << 20} {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint32(b[40:], count)
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("count %d for %d entries: panic %v", count, n, r)
				}
			}()
			if err := newSegment(testDir, base, nil).decodeIndex(b, size); !errors.Is(err, ErrCorrupt) {
				t.Errorf("count %d for %d entries: %v, want ErrCorrupt", count, n, err)
			}
		}()
	}
}

// batchHeaderOf returns the header of a one-record batch at seq 1 claiming
// totalBytes and count.
func batchHeaderOf(t *testing.T, totalBytes int64, count uint32) []byte {
	t.Helper()
	h := mustBatch(t, 1, 1, 0)[:batchHeaderBytes]
	binary.LittleEndian.PutUint32(h[2:], uint32(totalBytes-batchCRCOffset))
	binary.LittleEndian.PutUint32(h[26:], count)
	return h
}

// TestBatchLengthIsBoundedByTheFormat guards decodeBatchHeader's
// `h.totalBytes > batchBytesLimit` (not >=) and its record count bound:
// a header claiming up to 1 GiB decodes; one claiming more, or more
// records than its length holds, is corrupt before anything is allocated
// for it — also in a segment with room for it (checkBatchHeader, the
// scan's check before it reads the batch into a buffer of that size).
func TestBatchLengthIsBoundedByTheFormat(t *testing.T) {
	seg := newSegment(testDir, 1, nil)
	const room = 4 << 30 // a segment file of 4 GiB
	if h, err := seg.checkBatchHeader(batchHeaderOf(t, batchBytesLimit, 1), room); err != nil || h.totalBytes != batchBytesLimit {
		t.Fatalf("a batch of exactly %d bytes: %+v, %v", batchBytesLimit, h, err)
	}
	maxCount := uint32((batchBytesLimit - batchOverheadBytes) / recordBytesMin)
	if _, err := seg.checkBatchHeader(batchHeaderOf(t, batchBytesLimit, maxCount), room); err != nil {
		t.Fatalf("%d records in %d bytes: %v", maxCount, batchBytesLimit, err)
	}
	for what, hb := range map[string][]byte{
		"one byte over 1 GiB":       batchHeaderOf(t, batchBytesLimit+1, 1),
		"4 GiB":                     batchHeaderOf(t, math.MaxUint32+batchCRCOffset, 1),
		"one record more than fits": batchHeaderOf(t, batchBytesLimit, maxCount+1),
	} {
		if h, err := decodeBatchHeader(hb); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decoded %+v, %v", what, h, err)
		}
		if h, err := seg.checkBatchHeader(hb, room); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: checked %+v, %v", what, h, err)
		}
	}
}

// TestDecodeRecordWithAHostileHeaderCountAllocatesLittle guards the
// record decoder's header count bound (`nh > remaining/headerBytesMin`):
// a record (from the network, or a damaged batch) claiming a million
// headers over a megabyte of bytes is corrupt before the headers are
// allocated (40 MiB for it without the bound).
func TestDecodeRecordWithAHostileHeaderCountAllocatesLittle(t *testing.T) {
	b := EncodeRecord(&Record{})
	binary.LittleEndian.PutUint32(b[len(b)-4:], 1<<20)
	b = append(b, make([]byte, 1<<20)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := DecodeRecord(b)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("DecodeRecord: %v, want ErrCorrupt", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("DecodeRecord of a hostile header count allocated %d bytes", n)
	}
}

// TestAllZeroSegmentIsAnEmptyLog guards zeroFrom's sizing of its buffer
// (`cap(buf) < want`): a segment that is all preallocated zeroes, read
// before any batch grew the scan's buffer, is an empty log — the scan
// read it through an empty buffer forever.
func TestAllZeroSegmentIsAnEmptyLog(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll(testDir); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile(segmentPath(testDir, 1), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *Log
		err error
	}
	opened := make(chan result, 1)
	go func() {
		l, err := Open(m, testDir, Options{})
		opened <- result{l, err}
	}()
	select {
	case r := <-opened:
		if r.err != nil {
			t.Fatalf("Open: %v", r.err)
		}
		defer r.l.Close()
		if _, ok := r.l.TornTail(); ok || r.l.NextSeq() != 1 || len(r.l.Damage()) != 0 {
			t.Fatalf("NextSeq %d, torn tail %v, damage %v; want an empty log", r.l.NextSeq(), ok, r.l.Damage())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open of an all-zero segment did not return")
	}
}

// TestBatchPastTheEndOfTheSeqSpaceIsNotTheLog guards decodeBatchHeader's
// `h.baseSeq > math.MaxUint64-uint64(h.count)` (not >=): a batch whose
// seqs would run past the last seq (a valid CRC, as a writer that did not
// check would leave it) is not taken as the log's continuation — its
// next seq would wrap to the start of the seq space — while one ending
// exactly at the last seq is.
func TestBatchPastTheEndOfTheSeqSpaceIsNotTheLog(t *testing.T) {
	const base = math.MaxUint64 - 2
	for _, count := range []int{2, 3} {
		m := vfs.NewMem()
		l := openLog(t, m, Options{})
		if err := l.Reset(base); err != nil {
			t.Fatal(err)
		}
		l.Close()
		var recs []Record
		for i := range count {
			recs = append(recs, testRecord(i))
		}
		b, err := appendBatch(nil, base, 1, 0, recs, math.MaxInt, math.MaxInt)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.WriteFile(segmentPath(testDir, base), b); err != nil {
			t.Fatal(err)
		}
		l = openLog(t, m, Options{})
		tt, torn := l.TornTail()
		if count == 2 && (torn || l.NextSeq() != math.MaxUint64) {
			t.Errorf("a batch ending at the last seq: torn tail %+v %v, NextSeq %d", tt, torn, l.NextSeq())
		}
		if count == 3 && (!torn || tt.Offset != 0 || l.NextSeq() != base) {
			t.Errorf("a batch past the last seq: torn tail %+v %v, NextSeq %d; want it cut, NextSeq %d", tt, torn, l.NextSeq(), uint64(base))
		}
		l.Close()
	}
}

// TestDecodeBatchHeaderRejectsAnEmptyGap guards decodeBatchHeader's
// `h.count == 0` for a gap batch: a repair writes a gap for one seq or
// more; a gap header naming none is corrupt.
func TestDecodeBatchHeaderRejectsAnEmptyGap(t *testing.T) {
	one := appendGapBatch(nil, 5, 1, 1)
	if h, err := decodeBatchHeader(one); err != nil || !h.gap() || h.count != 1 {
		t.Fatalf("a gap of one seq: %+v, %v", h, err)
	}
	empty := appendGapBatch(nil, 5, 1, 0)
	if h, err := decodeBatchHeader(empty); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a gap of no seq: decoded %+v, %v", h, err)
	}
}

// TestVerifyKeepsTheEndOfASealedSegmentThatEndsEarly guards recordDamage's
// leaving a sealed segment's next seq alone: a sealed segment that ends
// early (its last batch and its index gone: seqs missing before the next
// segment) and holds damage too still ends where the next segment starts
// once Verify has stepped over its damage. Lowered to where its records
// end, the points of retention and of the span (which read a sealed
// segment's end) moved, and TruncateAfter took a cut inside the missing
// seqs for one past the segment's end.
func TestVerifyKeepsTheEndOfASealedSegmentThatEndsEarly(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	l := openLog(t, m, opts)
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	base1 := l.segments[1].baseSeq
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, m, name)
	if len(offs) < 3 {
		t.Fatalf("the first segment has %d batches", len(offs))
	}
	data, _ := m.ReadFile(name)
	if err := m.WriteFile(name, data[:offs[len(offs)-1]]); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, opts)
	defer l.Close()
	flipRecord(t, m, name, offs[1]) // after Open: Verify is the first to read it
	// SpanPoint(after-1) reads the first segment's end.
	var after int64
	for _, s := range l.segments[1:] {
		after += s.sizeBytes
	}
	spanBefore := l.SpanPoint(after - 1)
	if found := verifyFirst(t, l); len(found) != 1 || found[0].FirstSeq != hs[1].baseSeq {
		t.Fatalf("Verify found %+v, want damage from seq %d", found, hs[1].baseSeq)
	}
	if got := l.SpanPoint(after - 1); got != spanBefore || got != base1-1 {
		t.Fatalf("SpanPoint after Verify %d, before %d; want %d (the first segment ends where the second starts)", got, spanBefore, base1-1)
	}
}
