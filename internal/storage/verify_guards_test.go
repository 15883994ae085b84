package storage

// Tests that pin the guards of the scrubber's re-verification (verify.go),
// of the decoders' size bounds and of segment file names, in the style of
// guards_test.go: a mutation sweep (each guard deleted or weakened in
// turn) found these guards could go with every earlier test green; each
// test names the guard it fails without.

import (
	"testing"

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

// flipRecord flips a bit in the first record of the batch at off.
func flipRecord(t *testing.T, m *vfs.MemFS, name string, off int64) {
	t.Helper()
	if err := m.FlipBit(name, off+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
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
