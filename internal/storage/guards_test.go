package storage

// Tests that pin the package's integrity guards one by one: a mutation
// sweep (each guard deleted or weakened in turn) found these guards could
// go with every earlier test green; each test here names the guard it
// fails without.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"path/filepath"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// batchOffsets walks the batches of a segment file by their headers and
// returns each one's offset and header; it stops at the first header that
// does not decode (a zero tail, or damage).
func batchOffsets(t *testing.T, m *vfs.MemFS, name string) ([]int64, []batchHeader) {
	t.Helper()
	data, err := m.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	var hs []batchHeader
	for off := int64(0); int64(len(data))-off >= batchHeaderBytes; {
		h, err := decodeBatchHeader(data[off:])
		if err != nil || h.totalBytes > int64(len(data))-off {
			break
		}
		offs, hs = append(offs, off), append(hs, h)
		off += h.totalBytes
	}
	return offs, hs
}

// oneRecordBatches appends n batches of one record each, syncing after
// each, and returns each batch's offset in the active segment.
func oneRecordBatches(t *testing.T, l *Log, mod *model, n int) []int64 {
	t.Helper()
	var offs []int64
	for range n {
		offs = append(offs, l.active().sizeBytes)
		mod.append(t, l, 1, []Record{testRecord(len(mod.records) + 1)})
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	return offs
}

// singleSeqDamaged: five synced one-record batches; seq 4's record is
// flipped. Batch 5 was written when seq 4 was synced (its synced-through
// is exactly 4), so it alone proves seq 4 durable.
func singleSeqDamaged(t *testing.T) (*vfs.MemFS, *model) {
	t.Helper()
	m, mod := vfs.NewMem(), &model{}
	l := openLog(t, m, Options{})
	offs := oneRecordBatches(t, l, mod, 5)
	l.Close()
	if err := m.FlipBit(segmentPath(testDir, 1), offs[3]+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
	return m, mod
}

// TestSingleSeqDamageProvenByTheNextBatch guards segment.go scan's
// `st >= pending[0].damage.FirstSeq` (not >) and Damage.Seqs's
// `LastSeq < FirstSeq` (not <=): a one-seq damaged range proven by a batch
// whose synced-through equals its seq is damage, refused with a
// *CorruptError; the batch after it is served.
func TestSingleSeqDamageProvenByTheNextBatch(t *testing.T) {
	m, mod := singleSeqDamaged(t)
	l := openLog(t, m, Options{})
	defer l.Close()
	if tt, ok := l.TornTail(); ok || l.NextSeq() != 6 {
		t.Fatalf("torn tail %+v %v, NextSeq %d; want no cut, NextSeq 6", tt, ok, l.NextSeq())
	}
	if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != 4 || ds[0].LastSeq != 4 || ds[0].Seqs() != 1 {
		t.Fatalf("damage %+v, want seq 4", ds)
	}
	var ce *CorruptError
	if _, err := l.Read(4, 1, 1<<20); !errors.As(err, &ce) {
		t.Fatalf("Read(4): %v, want a *CorruptError", err)
	}
	if es, err := l.Read(5, 1, 1<<20); err != nil || len(es) != 1 || !sameRecord(es[0].Record, mod.records[4]) {
		t.Fatalf("Read(5): %v %v", es, err)
	}
}

// TestRepairOfASingleSeq guards repair.go appendGaps/appendFillers'
// `first <= last` (not <) and epochs.go EpochStarts' gap check: a repair
// of a one-seq damaged range writes one gap (or filler) for it and keeps
// the record after it at its seq; EpochStarts refuses to cross the gap.
func TestRepairOfASingleSeq(t *testing.T) {
	for _, filled := range []bool{false, true} {
		m, mod := singleSeqDamaged(t)
		filler := Record{Key: []byte("filler")}
		var rep RepairReport
		var err error
		if filled {
			rep, err = RepairFilled(m, testDir, Options{}, filler, false)
		} else {
			rep, err = Repair(m, testDir, Options{}, RepairSalvage, false)
		}
		if err != nil || rep.DroppedSeqs != 1 {
			t.Fatalf("filled %v: report %+v, %v", filled, rep, err)
		}
		l := openLog(t, m, Options{})
		if len(l.Damage()) != 0 || l.NextSeq() != 6 {
			t.Fatalf("filled %v: damage %v, NextSeq %d after repair", filled, l.Damage(), l.NextSeq())
		}
		es, err := l.Read(4, 1, 1<<20)
		if filled {
			if err != nil || len(es) != 1 || !sameRecord(es[0].Record, filler) {
				t.Fatalf("Read(4) after a filled repair: %v %v", es, err)
			}
		} else {
			var gap *GapError
			if !errors.As(err, &gap) || gap.Next != 5 {
				t.Fatalf("Read(4) after repair: %v %v, want a gap to 5", es, err)
			}
			if _, err := l.EpochStarts(1); !errors.As(err, &gap) {
				t.Fatalf("EpochStarts(1) across the gap: %v", err)
			}
		}
		if es, err := l.Read(5, 1, 1<<20); err != nil || !sameRecord(es[0].Record, mod.records[4]) {
			t.Fatalf("filled %v: Read(5) after repair: %v %v", filled, es, err)
		}
		l.Close()
	}
}

// TestOneBatchProvesEveryPendingRange guards scan's loop that promotes
// every pending range a batch proves (not only the first): A is written
// with C before any sync (C proves nothing), B after C's sync, D after
// B's; with A and B flipped, D proves both, and nothing is cut.
func TestOneBatchProvesEveryPendingRange(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 3, -1)
	offA, firstA := l.active().sizeBytes, l.NextSeq()
	mod.append(t, l, 1, []Record{testRecord(len(mod.records) + 1)})
	mod.append(t, l, 1, []Record{testRecord(len(mod.records) + 1)})
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	offB, firstB := l.active().sizeBytes, l.NextSeq()
	appendSynced(t, l, &mod, 2, -1) // B, then D
	next := l.NextSeq()
	l.Close()
	for _, off := range []int64{offA, offB} {
		if err := m.FlipBit(segmentPath(testDir, 1), off+batchOverheadBytes+3, 0); err != nil {
			t.Fatal(err)
		}
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	if tt, ok := l.TornTail(); ok || l.NextSeq() != next {
		t.Fatalf("torn tail %+v %v, NextSeq %d; want no cut, NextSeq %d", tt, ok, l.NextSeq(), next)
	}
	if refused := readAround(t, l, &mod); len(refused) != 2 || refused[0] != firstA || refused[1] != firstB {
		t.Fatalf("refused %v, want %d and %d", refused, firstA, firstB)
	}
}

// TestUnprovenRangeUpToTheFileEndIsATornTail guards scan's final
// `if len(pending) > 0 { return stop(nil) }`: an invalid batch followed
// by a valid one that proves nothing, ending exactly at the end of the
// file (no zero tail), is a torn tail.
func TestUnprovenRangeUpToTheFileEndIsATornTail(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 3, -1)
	off, next := l.active().sizeBytes, l.NextSeq()
	mod.append(t, l, 1, []Record{testRecord(100)}) // X
	mod.append(t, l, 1, []Record{testRecord(101)}) // Y: written before X was synced
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	used := l.active().sizeBytes
	l.Close()
	name := segmentPath(testDir, 1)
	data, _ := m.ReadFile(name)
	data = data[:used]
	data[off+batchOverheadBytes+3] ^= 1
	if err := m.WriteFile(name, data); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	if tt, ok := l.TornTail(); !ok || tt.Offset != off || l.NextSeq() != next {
		t.Fatalf("torn tail %+v %v, NextSeq %d; want a cut at %d, NextSeq %d", tt, ok, l.NextSeq(), off, next)
	}
}

// TestBatchThatDoesNotContinueTheLogIsATornTail guards checkBatchHeader's
// `h.baseSeq != s.nextSeq` and `h.epoch < s.lastEpoch`: a valid batch
// (good CRC) after the end of the log whose seq or epoch does not continue
// it is not taken as its continuation.
func TestBatchThatDoesNotContinueTheLogIsATornTail(t *testing.T) {
	cases := map[string]func(next uint64) []byte{
		"seq below":   func(next uint64) []byte { return mustBatch(t, next-2, 5, next-3) },
		"seq above":   func(next uint64) []byte { return mustBatch(t, next+3, 5, next-1) },
		"epoch below": func(next uint64) []byte { return mustBatch(t, next, 4, next-1) },
	}
	for name, mk := range cases {
		m := vfs.NewMem()
		l := openLog(t, m, Options{})
		var mod model
		for range 4 {
			mod.append(t, l, 5, []Record{testRecord(len(mod.records) + 1)})
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		used, next := l.active().sizeBytes, l.NextSeq()
		l.Close()
		seg := segmentPath(testDir, 1)
		data, _ := m.ReadFile(seg)
		b := mk(next)
		if int64(len(data)) < used+int64(len(b)) {
			t.Fatalf("%s: no room after the log", name)
		}
		copy(data[used:], b)
		if err := m.WriteFile(seg, data); err != nil {
			t.Fatal(err)
		}
		l = openLog(t, m, Options{})
		if tt, ok := l.TornTail(); !ok || tt.Offset != used || l.NextSeq() != next || l.LastEpoch() != 5 {
			t.Fatalf("%s: torn tail %+v %v, NextSeq %d, LastEpoch %d; want a cut at %d, NextSeq %d, epoch 5",
				name, tt, ok, l.NextSeq(), l.LastEpoch(), used, next)
		}
		checkAgainst(t, l, &mod)
		l.Close()
	}
}

func mustBatch(t *testing.T, base, epoch, synced uint64) []byte {
	t.Helper()
	b, err := appendBatch(nil, base, epoch, synced, []Record{testRecord(500)}, math.MaxInt, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResyncIgnoresABatchInsideTheDamagedOne guards nextValidBatch's hint
// (scan's `hint = off + h.totalBytes`, nextValidBatch's `if hint > off`)
// and its `h.baseSeq < nextSeq` check: a damaged batch whose record holds
// the encoding of a batch (a producer's payload) must not resync on it.
// With the header intact the embedded batch claims the damaged batch's own
// seq; with the header's magic destroyed it is a copy of batch 1.
func TestResyncIgnoresABatchInsideTheDamagedOne(t *testing.T) {
	for _, headerIntact := range []bool{true, false} {
		m := vfs.NewMem()
		l := openLog(t, m, Options{})
		var mod model
		oneRecordBatches(t, l, &mod, 1)
		name := segmentPath(testDir, 1)
		data, _ := m.ReadFile(name)
		batch1 := append([]byte(nil), data[:l.active().sizeBytes]...)
		oneRecordBatches(t, l, &mod, 2)
		off, first := l.active().sizeBytes, l.NextSeq()
		embedded := batch1
		if headerIntact {
			embedded = mustBatch(t, first, 1, first-1)
		}
		rec := testRecord(len(mod.records) + 1)
		rec.Value = embedded
		mod.append(t, l, 1, []Record{rec})
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		oneRecordBatches(t, l, &mod, 3)
		next := l.NextSeq()
		l.Close()
		at := off // the magic byte
		if headerIntact {
			at = off + batchOverheadBytes + 3 // the record's timestamp
		}
		if err := m.FlipBit(name, at, 0); err != nil {
			t.Fatal(err)
		}
		l = openLog(t, m, Options{})
		if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != first || ds[0].LastSeq != first || l.NextSeq() != next {
			t.Fatalf("header intact %v: damage %+v, NextSeq %d; want seq %d only, NextSeq %d", headerIntact, ds, l.NextSeq(), first, next)
		}
		if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != first {
			t.Fatalf("header intact %v: refused %v, want %d", headerIntact, refused, first)
		}
		l.Close()
	}
}

// TestSeqsMissingBetweenSegmentsAreDamage guards recover's and repair's
// `base > prev.nextSeq`: a sealed segment that ends cleanly but early
// (its last batch gone, its index gone) leaves seqs missing before the
// next segment; they are damage, refused, and a repair turns them into a
// gap.
func TestSeqsMissingBetweenSegmentsAreDamage(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	base1, next := l.segments[1].baseSeq, l.NextSeq()
	l.Close()
	name := segmentPath(testDir, 1)
	offs, hs := batchOffsets(t, m, name)
	first := hs[len(hs)-1].baseSeq
	data, _ := m.ReadFile(name)
	if err := m.WriteFile(name, data[:offs[len(offs)-1]]); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, smallOpts())
	if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != first || ds[0].LastSeq != base1-1 || l.NextSeq() != next {
		t.Fatalf("damage %+v, NextSeq %d; want seqs %d-%d, NextSeq %d", ds, l.NextSeq(), first, base1-1, next)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != first {
		t.Fatalf("refused %v, want %d", refused, first)
	}
	l.Close()
	rep, err := Repair(m, testDir, smallOpts(), RepairSalvage, false)
	if err != nil || len(rep.Damage) != 1 || rep.DroppedSeqs != base1-first {
		t.Fatalf("repair: %+v, %v", rep, err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	var gap *GapError
	if _, err := l.Read(first, 1, 1<<20); len(l.Damage()) != 0 || !errors.As(err, &gap) || gap.Next != base1 {
		t.Fatalf("after repair: damage %v, Read(%d): %v", l.Damage(), first, err)
	}
}

// TestStaleSegmentInsideTheLogIsDropped guards recover's overlap check
// `base < prev.nextSeq`, its removal of what does not continue the log,
// and repair's overlap refusal: an (empty) segment file whose base lies
// inside the last segment's seqs is removed by Open, which keeps every
// record and NextSeq; Repair refuses such a directory.
func TestStaleSegmentInsideTheLogIsDropped(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	next, last := l.NextSeq(), l.active().baseSeq
	l.Close()
	stray := segmentPath(testDir, next-2)
	if next-2 <= last {
		t.Fatalf("the active segment holds too few seqs")
	}
	if err := m.WriteFile(stray, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Repair(m, testDir, smallOpts(), RepairSalvage, true); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Repair of overlapping segments: %v, want ErrCorrupt", err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	if l.NextSeq() != next || len(l.Damage()) != 0 {
		t.Fatalf("NextSeq %d, damage %v; want %d, none", l.NextSeq(), l.Damage(), next)
	}
	if _, err := m.Stat(stray); err == nil {
		t.Fatal("the stale segment file is still there")
	}
	checkAgainst(t, l, &mod)
}

// TestRepairTruncateRemovesLaterSegmentsAndRunsAgain guards RepairTruncate's
// removal of the segments after the cut: none is left, and a second
// Repair finds a clean log.
func TestRepairTruncateRemovesLaterSegmentsAndRunsAgain(t *testing.T) {
	m, _, name, first, _ := damagedSealedLog(t)
	if _, err := Repair(m, testDir, smallOpts(), RepairTruncate, false); err != nil {
		t.Fatal(err)
	}
	for _, f := range segmentFiles(t, m, segmentSuffix) {
		if f > filepath.Base(name) {
			t.Fatalf("segment %s after the cut survived the repair", f)
		}
	}
	rep, err := Repair(m, testDir, smallOpts(), RepairTruncate, false)
	if err != nil || len(rep.Damage) != 0 || rep.NextSeq <= first {
		t.Fatalf("second repair: %+v, %v", rep, err)
	}
}

// TestRepairIsDurableWhenItReturns guards replaceSegment's fsync of the
// temporary file and its SyncDir after the rename: a crash right after
// Repair returns leaves the repaired log.
func TestRepairIsDurableWhenItReturns(t *testing.T) {
	for _, mode := range []RepairMode{RepairSalvage, RepairTruncate} {
		m, mod, _, _, next := damagedSealedLog(t)
		rep, err := Repair(m, testDir, smallOpts(), mode, false)
		if err != nil {
			t.Fatal(err)
		}
		m.CrashClean()
		l := openLog(t, m, smallOpts())
		if len(l.Damage()) != 0 || l.NextSeq() != next {
			t.Fatalf("%v: after repair and a crash: damage %v, NextSeq %d, want none and %d", mode, l.Damage(), l.NextSeq(), next)
		}
		refused, served := readAroundCounting(t, l, mod)
		if len(refused) != 0 || uint64(served) != next-1-rep.DroppedSeqs {
			t.Fatalf("%v: refused %v, served %d", mode, refused, served)
		}
		l.Close()
	}
}

// TestRepairLeftoverTempFileIsReplaced guards replaceSegment's
// Truncate(0) of the temporary file: a longer leftover from an interrupted
// repair leaves no stale bytes after the rewritten segment.
func TestRepairLeftoverTempFileIsReplaced(t *testing.T) {
	m, mod, name, _, next := damagedSealedLog(t)
	if err := m.WriteFile(name+tmpSuffix, bytes.Repeat([]byte{0xAB}, 1<<15)); err != nil {
		t.Fatal(err)
	}
	if _, err := Repair(m, testDir, smallOpts(), RepairSalvage, false); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, m, smallOpts())
	defer l.Close()
	if len(l.Damage()) != 0 || l.NextSeq() != next {
		t.Fatalf("damage %v, NextSeq %d after repair", l.Damage(), l.NextSeq())
	}
	if refused := readAround(t, l, mod); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
}

// TestRepairCutsATornTail guards Repair's torn-tail handling: a clean
// log reports none (`!res.zeroTail`), a dry run reports it and writes
// nothing, a repair cuts it (with and without damage elsewhere).
func TestRepairCutsATornTail(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 5, -1)
	off, next := l.active().sizeBytes, l.NextSeq()
	appendSynced(t, l, &mod, 1, -1)
	l.Close()
	if rep, err := Repair(m, testDir, Options{}, RepairSalvage, true); err != nil || rep.TornTail != nil {
		t.Fatalf("clean log: %+v, %v", rep, err)
	}
	name := segmentPath(testDir, 1)
	if err := m.FlipBit(name, off+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
	before, _ := m.ReadFile(name)
	dry, err := Repair(m, testDir, Options{}, RepairSalvage, true)
	if err != nil || dry.TornTail == nil || dry.TornTail.Offset != off {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if after, _ := m.ReadFile(name); !bytes.Equal(after, before) {
		t.Fatal("a dry run changed the segment")
	}
	if _, err := Repair(m, testDir, Options{}, RepairSalvage, false); err != nil {
		t.Fatal(err)
	}
	if size, _ := m.Stat(name); size != off {
		t.Fatalf("segment of %d bytes after the repair, want %d", size, off)
	}
	l = openLog(t, m, Options{})
	if _, ok := l.TornTail(); ok || l.NextSeq() != next {
		t.Fatalf("a torn tail left for Open; NextSeq %d", l.NextSeq())
	}
	l.Close()

	// With damage in a sealed segment too: the salvage cuts the tail of the
	// last segment.
	m, _, _, _, _ = damagedSealedLog(t)
	names := segmentFiles(t, m, segmentSuffix)
	lastName := filepath.Join(testDir, names[len(names)-1])
	offs, _ := batchOffsets(t, m, lastName)
	if err := m.FlipBit(lastName, offs[len(offs)-1]+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := Repair(m, testDir, smallOpts(), RepairSalvage, false); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	if tt, ok := l.TornTail(); ok || len(l.Damage()) != 0 {
		t.Fatalf("after a salvage: torn tail %+v %v, damage %v", tt, ok, l.Damage())
	}
}

// TestDecodeIndexRejectsAnInconsistentIndex guards decodeIndex's checks
// one by one, each with an index payload that passes every other check.
func TestDecodeIndexRejectsAnInconsistentIndex(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	s := l.segments[1]
	good, size, base, next, n := s.encodeIndex(), s.sizeBytes, s.baseSeq, s.nextSeq, len(s.index)
	l.Close()
	if n < 3 {
		t.Fatalf("%d index entries", n)
	}
	if err := newSegment(testDir, base, nil).decodeIndex(good, size); err != nil {
		t.Fatalf("a good index: %v", err)
	}
	entry := func(i int) int { return indexFixedBytes + i*indexEntryBytes }
	edit := func(b []byte, fn func(b []byte)) []byte { b = bytes.Clone(b); fn(b); return b }
	put := func(off int, v uint64) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint64(b[off:], v) }
	}
	cases := map[string][]byte{
		"short": good[:indexFixedBytes-1],
		"other segment's base": edit(good, func(b []byte) {
			put(8, base+1)(b)
			put(entry(0), base+1)(b)
		}),
		"no entries":                  edit(good[:indexFixedBytes], func(b []byte) { binary.LittleEndian.PutUint32(b[40:], 0) }),
		"trailing bytes":              append(bytes.Clone(good), 0),
		"first entry not at offset 0": edit(good, put(entry(0)+8, 1)),
		"entries out of order": edit(good, func(b []byte) {
			e1, e2 := bytes.Clone(b[entry(1):entry(2)]), bytes.Clone(b[entry(2):entry(3)])
			copy(b[entry(1):], e2)
			copy(b[entry(2):], e1)
		}),
		"entry seq past next":   edit(good, put(entry(n-1), next)),
		"entry offset past end": edit(good, put(entry(n-1)+8, uint64(size))),
	}
	for name, b := range cases {
		if err := newSegment(testDir, base, nil).decodeIndex(b, size); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestEmptyActiveSegmentAfterACrash guards computeLastEpoch's
// `nextSeq > baseSeq` and RepairTruncate's `last >= first.FirstSeq` (report
// and gaps): a crash right after a roll leaves an empty active segment;
// LastEpoch is still the sealed segment's, and a one-seq damage at the very
// end of the log is truncated into one gap so that no seq is reused.
func TestEmptyActiveSegmentAfterACrash(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{SegmentBytesMax: 1024}
	l := openLog(t, m, opts)
	for i := 0; len(l.segments) == 1; i++ {
		if _, err := l.Append(7, []Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
		if len(l.segments) == 1 {
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := l.active().baseSeq
	m.CrashClean() // the batch in the new segment was never synced
	l = openLog(t, m, opts)
	if l.NextSeq() != base || l.active().sizeBytes != 0 || l.LastEpoch() != 7 {
		t.Fatalf("NextSeq %d (want %d), active holds %d bytes, LastEpoch %d (want 7)", l.NextSeq(), base, l.active().sizeBytes, l.LastEpoch())
	}
	if _, err := l.Append(3, []Record{testRecord(1)}); !errors.Is(err, ErrEpochRegression) {
		t.Fatalf("Append in epoch 3 after epoch 7: %v", err)
	}
	l.Close()
	name := segmentPath(testDir, 1)
	offs, _ := batchOffsets(t, m, name)
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit(name, offs[len(offs)-1]+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := Repair(m, testDir, opts, RepairTruncate, false)
	if err != nil || rep.DroppedSeqs != 1 || len(rep.Dropped) != 1 || rep.Dropped[0] != (SeqRange{base - 1, base - 1}) {
		t.Fatalf("repair: %+v, %v", rep, err)
	}
	l = openLog(t, m, opts)
	defer l.Close()
	var gap *GapError
	if _, err := l.Read(base-1, 1, 1<<20); len(l.Damage()) != 0 || l.NextSeq() != base || !errors.As(err, &gap) {
		t.Fatalf("after repair: damage %v, NextSeq %d, Read(%d): %v", l.Damage(), l.NextSeq(), base-1, err)
	}
}

// TestOversizedBatchGetsASegmentOfItsOwn guards Append's
// `active.sizeBytes > 0` before a roll and the roll bound `>`: a batch
// larger than SegmentBytesMax goes into the empty first segment without a
// roll, and a segment may fill up to exactly SegmentBytesMax.
func TestOversizedBatchGetsASegmentOfItsOwn(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{SegmentBytesMax: 1024}
	l := openLog(t, m, opts)
	var mod model
	big := testRecord(1)
	big.Value = make([]byte, 3000)
	mod.append(t, l, 1, []Record{big})
	mod.append(t, l, 1, []Record{testRecord(2)})
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(l.segments) != 2 || l.segments[0].nextSeq != 2 {
		t.Fatalf("%d segments, the first ends at %d", len(l.segments), l.segments[0].nextSeq)
	}
	l.Close()
	l = openLog(t, m, opts)
	checkAgainst(t, l, &mod)
	if l.NextSeq() != 3 {
		t.Fatalf("NextSeq %d", l.NextSeq())
	}
	l.Close()

	// Two batches that fill a segment exactly stay in it.
	one, err := appendBatch(nil, 1, 1, 0, []Record{testRecord(1)}, math.MaxInt, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	l = openLog(t, vfs.NewMem(), Options{SegmentBytesMax: 2 * int64(len(one))})
	defer l.Close()
	for range 2 {
		if _, err := l.Append(1, []Record{testRecord(1)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.segments) != 1 {
		t.Fatalf("%d segments for two batches that fill one exactly", len(l.segments))
	}
}

// TestReadRefusesAHeaderChangedAfterOpen guards readBatchHeader's
// `h.baseSeq != expectSeq`: Read steps over the batches before fromSeq by
// their headers alone (no CRC); a header whose base seq changed on disk
// since recovery must fail the read, not make it skip the batch holding
// fromSeq and serve later seqs.
func TestReadRefusesAHeaderChangedAfterOpen(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 10, -1) // seqs 1-30, one index entry
	offs, hs := batchOffsets(t, m, segmentPath(testDir, 1))
	if hs[4].baseSeq != 13 || len(l.active().index) != 1 {
		t.Fatalf("unexpected layout: batch 5 at seq %d, %d index entries", hs[4].baseSeq, len(l.active().index))
	}
	if err := m.FlipBit(segmentPath(testDir, 1), offs[4]+10, 3); err != nil { // base seq 13 -> 5
		t.Fatal(err)
	}
	if es, err := l.Read(14, 10, 1<<20); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read(14) over a changed header: %d entries from seq %v, %v", len(es), firstSeq(es), err)
	}
	if _, err := l.EpochStarts(14); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("EpochStarts(14) over a changed header: %v", err)
	}
}

func firstSeq(es []Entry) any {
	if len(es) == 0 {
		return nil
	}
	return es[0].Seq
}

// TestVersionFlippedToGapIsDamage guards decodeBatchHeader's
// `h.totalBytes != batchHeaderBytes` for a gap batch: the version byte is
// outside the CRC, and a record batch whose version bit flips to the gap
// version would otherwise verify as a repair's gap (records silently
// dropped, reported as a deliberate gap).
func TestVersionFlippedToGapIsDamage(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 6, -1)
	l.Close()
	offs, hs := batchOffsets(t, m, segmentPath(testDir, 1))
	if err := m.FlipBit(segmentPath(testDir, 1), offs[2]+1, 0); err != nil { // version 2 -> 3
		t.Fatal(err)
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	first := hs[2].baseSeq
	var ce *CorruptError
	if _, err := l.Read(first, 1, 1<<20); !errors.As(err, &ce) {
		t.Fatalf("Read(%d) of a batch whose version became the gap version: %v, want a *CorruptError", first, err)
	}
}

// TestReadStepsOverADamagedHeader guards scan's forced index entry after
// damage: with a destroyed header (nothing to step over it by) and one
// index entry for the whole segment, the records after the damage are
// still served.
func TestReadStepsOverADamagedHeader(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 10, -1)
	l.Close()
	offs, _ := batchOffsets(t, m, segmentPath(testDir, 1))
	if err := m.FlipBit(segmentPath(testDir, 1), offs[3], 0); err != nil { // the magic byte
		t.Fatal(err)
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != 10 {
		t.Fatalf("refused %v, want 10", refused)
	}
}

// TestVerifyAllChecksTheActiveSegment guards VerifyAll's recording of the
// active segment's damage.
func TestVerifyAllChecksTheActiveSegment(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 6, -1)
	offs, hs := batchOffsets(t, m, segmentPath(testDir, 1))
	if err := m.FlipBit(segmentPath(testDir, 1), offs[2]+batchOverheadBytes+3, 0); err != nil {
		t.Fatal(err)
	}
	found, err := l.VerifyAll()
	if err != nil || len(found) != 1 || found[0].FirstSeq != hs[2].baseSeq || len(l.Damage()) != 1 {
		t.Fatalf("VerifyAll: %+v, %v; damage %v", found, err, l.Damage())
	}
}

// TestVerifyStopsAtItsByteBudget guards Verify's `readBytes >= bytesMax`:
// a budget of exactly the first segment's size verifies that segment only.
func TestVerifyStopsAtItsByteBudget(t *testing.T) {
	l := openLog(t, vfs.NewMem(), smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	size0, base1 := l.segments[0].sizeBytes, l.segments[1].baseSeq
	next, read, _, err := l.Verify(l.StartSeq(), size0)
	if err != nil || next != base1 || read != size0 {
		t.Fatalf("Verify: next %d, read %d, %v; want %d, %d", next, read, err, base1, size0)
	}
}

// TestRetentionByAgeBoundaries guards olderThan's `tsMs >= nowMs` (records
// from the future are not old: unsigned wrap-around would make them
// ancient) and its strict `>` (exactly RetentionAgeMs old is not older).
func TestRetentionByAgeBoundaries(t *testing.T) {
	opts := smallOpts()
	opts.RetentionAgeMs = 1000
	l := openLog(t, vfs.NewMem(), opts)
	defer l.Close()
	for i := range 80 {
		r := testRecord(i)
		r.TimestampMs = 50000 + int64(i)
		if _, err := l.Append(1, []Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.segments) < 2 {
		t.Fatal("one segment")
	}
	if n, err := l.ApplyRetention(10000); err != nil || n != 0 {
		t.Fatalf("records from the future: deleted %d, %v", n, err)
	}
	newest := l.segments[0].maxTimestampMs
	if n, err := l.ApplyRetention(newest + 1000); err != nil || n != 0 {
		t.Fatalf("exactly RetentionAgeMs old: deleted %d, %v", n, err)
	}
	if n, err := l.ApplyRetention(newest + 1001); err != nil || n != 1 {
		t.Fatalf("older than RetentionAgeMs: deleted %d, %v", n, err)
	}
}

// TestRetentionByBytesBoundary guards RetentionPoint's strict
// `totalBytes > RetentionBytes`: a log of exactly RetentionBytes keeps all.
func TestRetentionByBytesBoundary(t *testing.T) {
	l := openLog(t, vfs.NewMem(), smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	var total int64
	for _, s := range l.segments {
		total += s.sizeBytes
	}
	l.opts.RetentionBytes = total
	if p := l.RetentionPoint(0, math.MaxUint64); p != 0 {
		t.Fatalf("a log of exactly RetentionBytes: retention point %d", p)
	}
	l.opts.RetentionBytes = total - 1
	if p := l.RetentionPoint(0, math.MaxUint64); p != l.segments[0].nextSeq-1 {
		t.Fatalf("one byte over: retention point %d, want %d", p, l.segments[0].nextSeq-1)
	}
}

// TestDeleteThroughForgetsTheDamageItDeletes guards DeleteThrough's
// keepDamage: damage in deleted segments is no longer reported.
func TestDeleteThroughForgetsTheDamageItDeletes(t *testing.T) {
	m, _, _, _, _ := damagedSealedLog(t)
	l := openLog(t, m, smallOpts())
	defer l.Close()
	if len(l.Damage()) != 1 {
		t.Fatalf("damage %v", l.Damage())
	}
	if n, err := l.DeleteThrough(l.segments[1].nextSeq - 1); err != nil || n != 2 {
		t.Fatalf("DeleteThrough: %d, %v", n, err)
	}
	if ds := l.Damage(); len(ds) != 0 {
		t.Fatalf("damage of deleted segments still reported: %v", ds)
	}
}

// TestTrimmedSealedZeroTailIsNotATornTail guards scanSegment's
// `!res.zeroTail`: trimming a sealed segment's zero tail is not a torn
// tail, and BeforeTornTailCut (a replicated log's "entries may be lost")
// is not called for it.
func TestTrimmedSealedZeroTailIsNotATornTail(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendMany(t, l, &mod, 200, 1)
	l.Close()
	name := segmentPath(testDir, 1)
	data, _ := m.ReadFile(name)
	if err := m.WriteFile(name, append(data, make([]byte, 700)...)); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	opts := smallOpts()
	called := false
	opts.BeforeTornTailCut = func(TornTail) error { called = true; return nil }
	l = openLog(t, m, opts)
	defer l.Close()
	if tt, ok := l.TornTail(); ok || called {
		t.Fatalf("torn tail %+v %v, hook called %v; want none", tt, ok, called)
	}
}

// TestResyncBudgetIsAFewPasses pins verifyBudget to "several times the
// bytes searched" (TestResyncSearchIsBounded computes its limit from
// verifyBudget itself, so it cannot catch a budget made unbounded).
func TestResyncBudgetIsAFewPasses(t *testing.T) {
	for _, n := range []int64{0, 1 << 10, 1 << 20, 1 << 30} {
		if b := verifyBudget(n); b < n || b > 16*n+2<<20 {
			t.Fatalf("verifyBudget(%d) = %d", n, b)
		}
	}
}

// TestLimitsAndOptions guards withDefaults' BatchBytesMax bounds and
// appendBatch's batch limit: Options that cannot hold a record or exceed
// the format's batch limit are refused, and a batch over BatchBytesMax is
// refused with ErrBatchTooLarge.
func TestLimitsAndOptions(t *testing.T) {
	for _, o := range []Options{{BatchBytesMax: batchBytesLimit + 1}, {RecordBytesMax: 1000, BatchBytesMax: 500}} {
		if _, err := Open(vfs.NewMem(), testDir, o); !errors.Is(err, ErrInvalidOptions) {
			t.Fatalf("Open with %+v: %v", o, err)
		}
	}
	l := openLog(t, vfs.NewMem(), Options{RecordBytesMax: 100, BatchBytesMax: 300})
	defer l.Close()
	recs := []Record{{Value: make([]byte, 50)}, {Value: make([]byte, 50)}, {Value: make([]byte, 50)}, {Value: make([]byte, 50)}}
	if _, err := l.Append(1, recs); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("Append of %d bytes into BatchBytesMax 300: %v", 4*(recordBytesMin+50), err)
	}
}

// TestDecodeRecordRejectsTrailingBytes guards DecodeRecord's trailing-bytes
// check (replication decodes records from the network with it).
func TestDecodeRecordRejectsTrailingBytes(t *testing.T) {
	r := testRecord(4)
	if _, err := DecodeRecord(append(EncodeRecord(&r), 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("DecodeRecord with a trailing byte: %v", err)
	}
}

// TestReadFileAtomicRejectsABadHeader guards ReadFileAtomic's size, magic
// and length checks, each with a file whose data checksum is right.
func TestReadFileAtomicRejectsABadHeader(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll(testDir); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(testDir, "f")
	if err := WriteFileAtomic(m, name, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	good, _ := m.ReadFile(name)
	// A header claiming 4 bytes of data in front of 6 bytes whose checksum is right.
	data := []byte("hello!")
	length := append([]byte(atomicFileMagic), 4, 0, 0, 0)
	length = binary.LittleEndian.AppendUint32(length, crc32.Checksum(data, castagnoli))
	bad := map[string][]byte{
		"short":  good[:3],
		"magic":  append([]byte("XAF1"), good[4:]...),
		"length": append(length, data...),
	}
	for what, b := range bad {
		if err := m.WriteFile(name, b); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFileAtomic(m, name); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", what, err)
		}
	}
}

// TestWriterMethodsAfterCloseReturnErrClosed guards writerCheck's closed
// check.
func TestWriterMethodsAfterCloseReturnErrClosed(t *testing.T) {
	l := openLog(t, vfs.NewMem(), Options{})
	var mod model
	appendSynced(t, l, &mod, 2, -1)
	l.Close()
	if _, err := l.Append(1, []Record{testRecord(1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
	if err := l.TruncateAfter(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("TruncateAfter after Close: %v", err)
	}
}

// TestOpenRemovesLeftoverTempFiles guards recover's removal of *.tmp.
func TestOpenRemovesLeftoverTempFiles(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll(testDir); err != nil {
		t.Fatal(err)
	}
	tmp := indexPath(testDir, 1) + tmpSuffix
	if err := m.WriteFile(tmp, []byte("partial")); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, m, Options{})
	defer l.Close()
	if _, err := m.Stat(tmp); err == nil {
		t.Fatal("a leftover temporary file survived Open")
	}
}

// TestResyncStaysInsideItsSegment guards nextValidBatch's limitSeq: in a
// sealed segment, a damaged batch (its header destroyed, so no hint)
// whose record holds a valid batch claiming seqs past the next segment's
// base must not be taken for the next batch — recovery would then see
// the segment overlap the next and drop every later segment.
func TestResyncStaysInsideItsSegment(t *testing.T) {
	m, mod, first, next := sealedBatchHoldingABatch(t, func(uint64) []byte { return mustBatch(t, 10_000, 1, 9_999) })
	l := openLog(t, m, smallOpts())
	defer l.Close()
	if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != first || ds[0].LastSeq != first || l.NextSeq() != next {
		t.Fatalf("damage %+v, NextSeq %d; want seq %d only, NextSeq %d", ds, l.NextSeq(), first, next)
	}
	if refused := readAround(t, l, mod); len(refused) != 1 || refused[0] != first {
		t.Fatalf("refused %v, want %d", refused, first)
	}
}

// sealedBatchHoldingABatch writes a log of one-record batches over two
// segments or more in which the first segment's fourth batch (seq first)
// holds payload(first) as its record's value — the encoding of a batch,
// or a part of one — then removes that segment's index (so Open scans it)
// and destroys the batch's magic byte (so a resync has no hint). next is
// the log's next seq.
func sealedBatchHoldingABatch(t *testing.T, payload func(first uint64) []byte) (m *vfs.MemFS, mod *model, first, next uint64) {
	t.Helper()
	m, mod = vfs.NewMem(), &model{}
	l := openLog(t, m, smallOpts())
	oneRecordBatches(t, l, mod, 3)
	off := l.active().sizeBytes
	first = l.NextSeq()
	rec := testRecord(len(mod.records) + 1)
	rec.Value = payload(first)
	mod.append(t, l, 1, []Record{rec})
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	for len(l.segments) < 2 || l.NextSeq() < l.active().baseSeq+3 {
		oneRecordBatches(t, l, mod, 1)
	}
	next = l.NextSeq()
	l.Close()
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit(segmentPath(testDir, 1), off, 0); err != nil {
		t.Fatal(err)
	}
	return m, mod, first, next
}

// TestAppendNearTheLastSeqIsRefused guards Append's seq overflow check: a
// log reset near the end of the seq space refuses a batch whose seqs
// would wrap (ErrBatchTooLarge), appends one that fits, and reopens.
func TestAppendNearTheLastSeqIsRefused(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	if err := l.Reset(math.MaxUint64 - 2); err != nil {
		t.Fatal(err)
	}
	three := []Record{testRecord(1), testRecord(2), testRecord(3)}
	if _, err := l.Append(1, three); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("Append of 3 records at seq %d: %v, want ErrBatchTooLarge", uint64(math.MaxUint64-2), err)
	}
	if _, err := l.Append(1, three[:2]); err != nil {
		t.Fatalf("Append of 2 records at seq %d: %v", uint64(math.MaxUint64-2), err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openLog(t, m, Options{})
	defer l.Close()
	if l.NextSeq() != math.MaxUint64 {
		t.Fatalf("NextSeq %d after a reopen, want %d", l.NextSeq(), uint64(math.MaxUint64))
	}
}

// TestResyncSkipsACandidateThatOverrunsTheFile guards nextValidBatch's
// `h.totalBytes > end-at`: a damaged batch (header destroyed) whose record
// holds a batch header claiming more bytes than the segment has left is
// not read as a candidate — reading it failed Open ("scan segment").
func TestResyncSkipsACandidateThatOverrunsTheFile(t *testing.T) {
	m, _, first, next := sealedBatchHoldingABatch(t, func(first uint64) []byte {
		header := mustBatch(t, first+1, 1, first)[:batchHeaderBytes]
		binary.LittleEndian.PutUint32(header[2:], 1<<20) // a 1 MiB batch
		return header
	})
	l, err := Open(m, testDir, smallOpts())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer l.Close()
	if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != first || ds[0].LastSeq != first || l.NextSeq() != next {
		t.Fatalf("damage %+v, NextSeq %d; want seq %d only, NextSeq %d", ds, l.NextSeq(), first, next)
	}
}
