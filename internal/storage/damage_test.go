package storage

import (
	"errors"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// appendSynced appends n records in batches of 3, syncing after each
// batch (as a partition does before it acknowledges), and returns the
// offset and seq range of batch number mid.
func appendSynced(t *testing.T, l *Log, mod *model, batches, mid int) (off int64, first, last uint64) {
	t.Helper()
	for i := 0; i < batches; i++ {
		if i == mid {
			off, first = l.active().sizeBytes, l.NextSeq()
		}
		recs := []Record{testRecord(len(mod.records) + 1), testRecord(len(mod.records) + 2), testRecord(len(mod.records) + 3)}
		mod.append(t, l, 1, recs)
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		if i == mid {
			last = l.NextSeq() - 1
		}
	}
	return off, first, last
}

// readAround reads the whole log, stepping over damaged ranges, and
// checks every record served against mod; it returns the seqs refused as
// corrupt.
func readAround(t *testing.T, l *Log, mod *model) (refused []uint64) {
	refused, _ = readAroundCounting(t, l, mod)
	return refused
}

// readAroundCounting is readAround that also counts the records served.
func readAroundCounting(t *testing.T, l *Log, mod *model) (refused []uint64, served int) {
	t.Helper()
	for seq := l.StartSeq(); seq < l.NextSeq(); {
		es, err := l.Read(seq, 4, 1<<20)
		var ce *CorruptError
		if errors.As(err, &ce) {
			refused = append(refused, seq)
			seq = ce.Damage.LastSeq + 1
			continue
		}
		var gap *GapError
		if errors.As(err, &gap) {
			if gap.Next <= seq {
				t.Fatalf("gap at %d ends at %d", seq, gap.Next)
			}
			seq = gap.Next
			continue
		}
		if err != nil {
			t.Fatalf("Read(%d): %v", seq, err)
		}
		for i, e := range es {
			if e.Seq != seq+uint64(i) {
				t.Fatalf("Read(%d) entry %d has seq %d", seq, i, e.Seq)
			}
			if !sameRecord(e.Record, mod.records[e.Seq-1]) {
				t.Fatalf("seq %d served a wrong record", e.Seq)
			}
		}
		served += len(es)
		seq = es[len(es)-1].Seq + 1
	}
	return refused, served
}

// TestFlipInTheMiddleOfTheActiveSegmentIsDamage: a flipped byte in a
// synced batch followed by batches written after that sync is corruption,
// not a torn tail: nothing is cut, no seq is reused, the damaged seqs are
// refused and every later record is still served.
func TestFlipInTheMiddleOfTheActiveSegmentIsDamage(t *testing.T) {
	for _, at := range []string{"header", "crc", "record"} {
		t.Run(at, func(t *testing.T) {
			m := vfs.NewMem()
			l := openLog(t, m, Options{IndexIntervalBytes: 256})
			var mod model
			off, first, last := appendSynced(t, l, &mod, 40, 20)
			next := l.NextSeq()
			l.Close()
			flip := map[string]int64{"header": off + 12, "crc": off + 7, "record": off + batchOverheadBytes + 20}[at]
			if err := m.FlipBit(segmentPath(testDir, 1), flip, 3); err != nil {
				t.Fatal(err)
			}
			l = openLog(t, m, Options{IndexIntervalBytes: 256})
			defer l.Close()
			if l.NextSeq() != next {
				t.Fatalf("NextSeq %d after recovery, want %d: the log was cut", l.NextSeq(), next)
			}
			if tt, ok := l.TornTail(); ok {
				t.Fatalf("damage taken for a torn tail: %+v", tt)
			}
			ds := l.Damage()
			if len(ds) != 1 || ds[0].FirstSeq != first || ds[0].LastSeq != last || ds[0].Offset != off {
				t.Fatalf("damage %+v, want seqs %d-%d at offset %d", ds, first, last, off)
			}
			if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != first {
				t.Fatalf("refused %v, want only %d", refused, first)
			}
			for seq := first; seq <= last; seq++ {
				if _, err := l.Read(seq, 1, 1<<20); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Read(%d) in the damage: %v", seq, err)
				}
			}
			if es, err := l.Read(last+1, 1, 1<<20); err != nil || es[0].Seq != last+1 {
				t.Fatalf("Read(%d) after the damage: %v %v", last+1, es, err)
			}
		})
	}
}

// TestUnprovenInvalidBatchIsATornTail: batches appended while the damaged
// one was not yet synced (group commit's next batch) prove nothing, so
// the damage is the torn end of the log and is cut with them.
func TestUnprovenInvalidBatchIsATornTail(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 5, -1)
	off, first := l.active().sizeBytes, l.NextSeq()
	appendMany(t, l, &mod, 12, 1) // several batches, no sync in between
	l.Close()
	if err := m.FlipBit(segmentPath(testDir, 1), off+batchOverheadBytes+3, 1); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	tt, ok := l.TornTail()
	if !ok || tt.Offset != off || l.NextSeq() != first || len(l.Damage()) != 0 {
		t.Fatalf("torn tail %+v %v, NextSeq %d, damage %v; want a torn tail at %d, NextSeq %d", tt, ok, l.NextSeq(), l.Damage(), off, first)
	}
	mod.truncate(first - 1)
	checkAgainst(t, l, &mod)
}

// TestDamagedSealedSegmentKeepsTheSegmentsAfterIt: a sealed segment
// scanned at open (its index is gone) whose end is unreadable keeps its
// seqs reserved and every later segment.
func TestDamagedSealedSegmentKeepsTheSegmentsAfterIt(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	if len(l.segments) < 3 {
		t.Fatalf("%d segments", len(l.segments))
	}
	first := l.segments[0]
	lastOff := first.index[len(first.index)-1].offset
	next, second := l.NextSeq(), l.segments[1].baseSeq
	l.Close()
	if err := m.Remove(indexPath(testDir, 1)); err != nil {
		t.Fatal(err)
	}
	// Damage the last part of the first segment, through its end.
	zeroRange(t, m, segmentPath(testDir, 1), int(lastOff)+1, 1<<20)
	l = openLog(t, m, smallOpts())
	defer l.Close()
	if l.NextSeq() != next {
		t.Fatalf("NextSeq %d, want %d", l.NextSeq(), next)
	}
	ds := l.Damage()
	if len(ds) != 1 || ds[0].LastSeq != second-1 {
		t.Fatalf("damage %+v, want one range ending at %d", ds, second-1)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 {
		t.Fatalf("refused %v", refused)
	}
}

// TestVerifyFindsDamageInAnIndexedSealedSegment: the scrubber's step
// finds a flip that recovery could not see (the segment was trusted
// through its index), records it once, and reads step over it.
func TestVerifyFindsDamageInAnIndexedSealedSegment(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	s1 := l.segments[1]
	off, seq := s1.index[1].offset, s1.index[1].seq
	l.Close()
	if err := m.FlipBit(segmentPath(testDir, s1.baseSeq), off+batchOverheadBytes+5, 0); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	if len(l.Damage()) != 0 {
		t.Fatalf("recovery scanned an indexed sealed segment: %v", l.Damage())
	}
	var found []Damage
	for from := l.StartSeq(); ; {
		next, _, ds, err := l.Verify(from, 1)
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, ds...)
		if next == 0 {
			break
		}
		from = next
	}
	if len(found) != 1 || found[0].FirstSeq != seq {
		t.Fatalf("Verify found %+v, want damage from seq %d", found, seq)
	}
	if _, _, again, _ := l.Verify(s1.baseSeq, 1); len(again) != 0 {
		t.Fatalf("the same damage reported twice: %v", again)
	}
	if refused := readAround(t, l, &mod); len(refused) != 1 || refused[0] != seq {
		t.Fatalf("refused %v, want %d", refused, seq)
	}
}

// damagedSealedLog writes 60 synced batches into a log of small
// segments and flips a bit in a batch of the second segment, whose index
// it removes (recovery would otherwise trust it). It returns the file
// system, what was written, the damaged segment's path, the damaged
// batch's first seq and the log's next seq.
func damagedSealedLog(t *testing.T) (m *vfs.MemFS, mod *model, name string, first, next uint64) {
	t.Helper()
	m, mod = vfs.NewMem(), &model{}
	l := openLog(t, m, smallOpts())
	appendSynced(t, l, mod, 60, -1)
	s1 := l.segments[1]
	off := s1.index[1].offset
	first, next = s1.index[1].seq, l.NextSeq()
	l.Close()
	if err := m.Remove(indexPath(testDir, s1.baseSeq)); err != nil {
		t.Fatal(err)
	}
	name = segmentPath(testDir, s1.baseSeq)
	if err := m.FlipBit(name, off+batchOverheadBytes+5, 0); err != nil {
		t.Fatal(err)
	}
	return m, mod, name, first, next
}

// appendAfterRepair appends one record to a repaired log, which must get
// seq next (above everything the log held), and returns the next seq.
func appendAfterRepair(t *testing.T, l *Log, mod *model, next uint64) uint64 {
	t.Helper()
	rec := testRecord(9999)
	if seq, err := l.Append(2, []Record{rec}); err != nil || seq != next {
		t.Fatalf("Append after repair: seq %d, %v; want %d", seq, err, next)
	}
	mod.records = append(mod.records, rec)
	mod.epochs = append(mod.epochs, 2)
	return next + 1
}

// TestRepair: both modes make a damaged log whole again; new records get
// seqs above the old end; salvage keeps every valid record at its seq,
// truncate drops everything from the damage on; a dry run changes
// nothing; the result survives a reopen.
func TestRepair(t *testing.T) {
	for _, mode := range []RepairMode{RepairSalvage, RepairTruncate} {
		t.Run(mode.String(), func(t *testing.T) {
			m, mod, name, first, next := damagedSealedLog(t)
			before, _ := m.ReadFile(name)
			dry, err := Repair(m, testDir, smallOpts(), mode, true)
			if err != nil {
				t.Fatal(err)
			}
			if after, _ := m.ReadFile(name); string(after) != string(before) {
				t.Fatal("a dry run changed the segment")
			}
			rep, err := Repair(m, testDir, smallOpts(), mode, false)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Damage) != 1 || rep.Damage[0].FirstSeq != first || rep.NextSeq != next ||
				rep.DroppedSeqs != dry.DroppedSeqs || rep.DroppedSeqs == 0 {
				t.Fatalf("report %+v (dry run %+v)", rep, dry)
			}
			wantDropped := rep.Damage[0].Seqs()
			if mode == RepairTruncate {
				wantDropped = next - first
			}
			if rep.DroppedSeqs != wantDropped || rep.ValidRecordsDropped != wantDropped-rep.Damage[0].Seqs() {
				t.Fatalf("dropped %d seqs (%d valid), want %d", rep.DroppedSeqs, rep.ValidRecordsDropped, wantDropped)
			}
			for reopen := 0; reopen < 2; reopen++ {
				l := openLog(t, m, smallOpts())
				if len(l.Damage()) != 0 || l.NextSeq() != next {
					t.Fatalf("after repair: damage %v, NextSeq %d, want none and %d", l.Damage(), l.NextSeq(), next)
				}
				refused, served := readAroundCounting(t, l, mod)
				if len(refused) != 0 {
					t.Fatalf("refused %v after repair", refused)
				}
				if want := int(next-1) - int(rep.DroppedSeqs); served != want {
					t.Fatalf("served %d records, want %d", served, want)
				}
				if reopen == 0 {
					next = appendAfterRepair(t, l, mod, next)
				}
				l.Close()
			}
		})
	}
}

// TestRepairFilled: a filled repair puts the filler at every seq of the
// damaged range, in the epoch of the batch before it, so the log reads
// end to end with no gap (its epoch starts too), every other record at
// its seq; a dry run changes nothing; the result survives a reopen and
// takes appends above the old end.
func TestRepairFilled(t *testing.T) {
	m, mod, name, _, next := damagedSealedLog(t)
	filler := Record{Headers: []Header{{Key: "control", Value: []byte("lost")}}}
	before, _ := m.ReadFile(name)
	if _, err := RepairFilled(m, testDir, smallOpts(), filler, true); err != nil {
		t.Fatal(err)
	}
	if after, _ := m.ReadFile(name); string(after) != string(before) {
		t.Fatal("a dry run changed the segment")
	}
	rep, err := RepairFilled(m, testDir, smallOpts(), filler, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Damage) != 1 || rep.DroppedSeqs != rep.Damage[0].Seqs() || rep.NextSeq != next {
		t.Fatalf("report %+v", rep)
	}
	d := rep.Damage[0]
	for reopen := range 2 {
		l := openLog(t, m, smallOpts())
		if len(l.Damage()) != 0 || l.NextSeq() != next {
			t.Fatalf("after repair: damage %v, NextSeq %d, want none and %d", l.Damage(), l.NextSeq(), next)
		}
		if _, err := l.EpochStarts(l.StartSeq()); err != nil {
			t.Fatalf("epoch starts after a filled repair: %v", err)
		}
		all := readAll(t, l)
		if uint64(len(all)) != l.NextSeq()-l.StartSeq() {
			t.Fatalf("read %d entries of seqs %d-%d: a gap", len(all), l.StartSeq(), l.NextSeq()-1)
		}
		for _, e := range all {
			switch {
			case e.Seq >= d.FirstSeq && e.Seq <= d.LastSeq:
				if !sameRecord(e.Record, filler) || e.Epoch != mod.epochs[d.FirstSeq-2] {
					t.Fatalf("seq %d of the damaged range holds %+v in epoch %d, want the filler in %d", e.Seq, e.Record, e.Epoch, mod.epochs[d.FirstSeq-2])
				}
			case !sameRecord(e.Record, mod.records[e.Seq-1]) || e.Epoch != mod.epochs[e.Seq-1]:
				t.Fatalf("seq %d changed by the repair", e.Seq)
			}
		}
		if reopen == 0 {
			next = appendAfterRepair(t, l, mod, next)
		}
		l.Close()
	}
}

// TestTruncateAtTheDamage: a replica that quarantines damage truncates its
// log just before it; the damaged batch is never read for that, and the
// damage is gone from the log afterwards.
func TestTruncateAtTheDamage(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		m := vfs.NewMem()
		opts := Options{IndexIntervalBytes: 256}
		if sealed {
			opts.SegmentBytesMax = 2048
		}
		l := openLog(t, m, opts)
		var mod model
		off, first, _ := appendSynced(t, l, &mod, 60, 20)
		name := l.segments[0].path
		for _, s := range l.segments {
			if s.baseSeq <= first {
				name = s.path
				if sealed {
					off = -1
					for _, e := range s.index {
						if e.seq == first {
							off = e.offset
						}
					}
				}
			}
		}
		l.Close()
		if sealed {
			if off < 0 {
				t.Fatalf("seq %d not indexed", first)
			}
			if err := m.Remove(name[:len(name)-len(segmentSuffix)] + indexSuffix); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.FlipBit(name, off+12, 2); err != nil { // the header's base seq
			t.Fatal(err)
		}
		l = openLog(t, m, opts)
		if ds := l.Damage(); len(ds) != 1 || ds[0].FirstSeq != first {
			t.Fatalf("sealed %v: damage %v, want from %d", sealed, ds, first)
		}
		if err := l.TruncateAfter(first - 1); err != nil {
			t.Fatalf("sealed %v: TruncateAfter(%d): %v", sealed, first-1, err)
		}
		if len(l.Damage()) != 0 || l.NextSeq() != first {
			t.Fatalf("sealed %v: damage %v, NextSeq %d after truncation", sealed, l.Damage(), l.NextSeq())
		}
		mod.truncate(first - 1)
		checkAgainst(t, l, &mod)
		l.Close()
		l = openLog(t, m, opts)
		if len(l.Damage()) != 0 || l.NextSeq() != first {
			t.Fatalf("sealed %v: after reopen damage %v, NextSeq %d", sealed, l.Damage(), l.NextSeq())
		}
		l.Close()
	}
}

// countingFile counts the bytes read through it.
type countingFile struct {
	vfs.File
	read *int64
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	*f.read += int64(n)
	return n, err
}

// TestResyncSearchIsBounded: bytes built so that every offset holds a
// plausible batch header claiming the rest of the file (each failing its
// CRC) would make the search for the next valid batch read the file once
// per offset; its verification budget stops it after a few passes.
func TestResyncSearchIsBounded(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll(testDir); err != nil {
		t.Fatal(err)
	}
	const size = 256 << 10
	var data []byte
	for len(data) < size {
		h := appendBatchHeader(nil, batchVersionV2, size-len(data), 5, 1, 1, 0)
		data = append(data, h...)
	}
	name := testDir + "/junk"
	if err := m.WriteFile(name, data[:size]); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenRW(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var read int64
	if _, _, found, err := nextValidBatch(countingFile{f, &read}, 0, 0, size, 5, 1, 0); err != nil || found {
		t.Fatalf("found %v, %v", found, err)
	}
	if limit := verifyBudget(size) + 2*size; read > limit {
		t.Fatalf("the search read %d bytes of a %d-byte file (budget %d)", read, size, limit)
	}
}

// TestVerifyRecordsNothingForASegmentThatChanged: Verify reads a sealed
// segment without the writer's lock; if a replica's truncation cut that
// segment meanwhile (making it the active one), what Verify read is not
// what the segment holds, and no damage may be recorded from it.
func TestVerifyRecordsNothingForASegmentThatChanged(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 60, -1)
	s := l.segments[0]
	sizeBytes, nextSeq, truncations := s.sizeBytes, s.nextSeq, l.truncations
	fake := []Damage{{Segment: s.path, Offset: 10, FirstSeq: s.baseSeq + 1, LastSeq: s.baseSeq + 1, Cause: "read while it changed"}}
	if err := l.TruncateAfter(s.baseSeq + 2); err != nil {
		t.Fatal(err)
	}
	if got := l.recordDamage(s, sizeBytes, nextSeq, truncations, true, newSegment(l.dir, s.baseSeq, s.file), fake); len(got) != 0 || len(l.Damage()) != 0 {
		t.Fatalf("recorded %v from a segment truncated since it was read", got)
	}
}

// TestBeforeTornTailCutRunsFirst: the hook sees the torn tail while its
// bytes are still in the file; its error fails Open and cuts nothing (so
// a replicated log that cannot record its uncertainty keeps the evidence),
// and an Open that succeeds afterwards cuts as usual.
func TestBeforeTornTailCutRunsFirst(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendSynced(t, l, &mod, 5, -1)
	off, next := l.active().sizeBytes, l.NextSeq()
	appendSynced(t, l, &mod, 1, -1) // the last batch: nothing after it proves it durable
	size := l.active().sizeBytes
	l.Close()
	if err := m.FlipBit(segmentPath(testDir, 1), off+batchOverheadBytes+3, 1); err != nil {
		t.Fatal(err)
	}
	errRefused := errors.New("refused")
	var seen []TornTail
	_, err := Open(m, testDir, Options{BeforeTornTailCut: func(tt TornTail) error {
		f, err := m.Open(tt.Segment)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if n, _ := f.Size(); n < tt.Offset+tt.Bytes {
			t.Errorf("the hook ran after the cut: file of %d bytes, torn tail %+v", n, tt)
		}
		seen = append(seen, tt)
		return errRefused
	}})
	if !errors.Is(err, errRefused) || len(seen) != 1 || seen[0].Offset != off {
		t.Fatalf("Open: %v, hook saw %+v; want the hook's error and a torn tail at %d", err, seen, off)
	}
	f, err := m.Open(segmentPath(testDir, 1))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := f.Size(); n < size {
		t.Fatalf("a refused cut left %d bytes of %d", n, size)
	}
	f.Close()
	l = openLog(t, m, Options{BeforeTornTailCut: func(TornTail) error { return nil }})
	defer l.Close()
	if tt, ok := l.TornTail(); !ok || tt.Offset != off || l.NextSeq() != next {
		t.Fatalf("torn tail %+v %v, NextSeq %d; want a cut at %d, NextSeq %d", tt, ok, l.NextSeq(), off, next)
	}
}

// DurableTailNotTorn: a last batch that fails its checksum after every
// batch was synced looks like a torn write. With Options.DurableThrough
// at or past its seqs (a single node's dedup snapshot point), Open
// refuses the log with a *CorruptError naming them and cuts nothing; a
// repair (either mode) drops them as a gap, and the log's next seq is
// above DurableThrough — never handed out again. Past the durable point
// the same tail is still cut as torn, and a log missing every segment
// is refused too, then repaired to start after the durable point.
func TestDurableTailIsNotTorn(t *testing.T) {
	for _, mode := range []RepairMode{RepairSalvage, RepairTruncate} {
		t.Run(mode.String(), func(t *testing.T) {
			m := vfs.NewMem()
			l := openLog(t, m, Options{})
			var mod model
			appendSynced(t, l, &mod, 4, -1)
			off, first := l.active().sizeBytes, l.NextSeq()
			appendSynced(t, l, &mod, 1, -1) // the last batch, synced: durable
			durable := l.NextSeq() - 1
			l.Close()
			name := segmentPath(testDir, 1)
			if err := m.FlipBit(name, off+batchOverheadBytes+3, 1); err != nil {
				t.Fatal(err)
			}
			before, _ := m.ReadFile(name)

			// Without the durable point: a torn tail (as before).
			if l, err := Open(m, testDir, Options{DurableThrough: first - 1}); err != nil {
				t.Fatal(err)
			} else if tt, ok := l.TornTail(); !ok || tt.FirstSeq != first {
				t.Fatalf("torn tail %+v %v below the durable point, want one from %d", tt, ok, first)
			} else {
				l.Close()
			}
			if err := m.WriteFile(name, before); err != nil { // as it was
				t.Fatal(err)
			}

			opts := Options{DurableThrough: durable}
			_, err := Open(m, testDir, opts)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Damage.FirstSeq != first || ce.Damage.LastSeq != durable {
				t.Fatalf("open with the tail's seqs known durable: %v, want a *CorruptError naming %d-%d", err, first, durable)
			}
			if after, _ := m.ReadFile(name); string(after) != string(before) {
				t.Fatal("the refused open cut the segment")
			}
			rep, err := Repair(m, testDir, opts, mode, false)
			if err != nil {
				t.Fatal(err)
			}
			if rep.TornTail != nil || len(rep.Dropped) != 1 || rep.Dropped[0] != (SeqRange{first, durable}) || rep.NextSeq != durable+1 {
				t.Fatalf("repair %+v, want %d-%d dropped and next seq %d", rep, first, durable, durable+1)
			}
			l = openLog(t, m, opts)
			if l.NextSeq() != durable+1 || len(l.Damage()) != 0 {
				t.Fatalf("after the repair: next seq %d, damage %v; want %d and none", l.NextSeq(), l.Damage(), durable+1)
			}
			mod.truncate(first - 1)
			for range durable - first + 1 { // the dropped seqs: gaps, never served
				mod.records = append(mod.records, Record{})
				mod.epochs = append(mod.epochs, 1)
			}
			appendAfterRepair(t, l, &mod, durable+1)
			l.Close()
		})
	}
	t.Run("no segment left", func(t *testing.T) {
		m := vfs.NewMem()
		if err := m.MkdirAll(testDir); err != nil {
			t.Fatal(err)
		}
		opts := Options{DurableThrough: 40}
		if _, err := Open(m, testDir, opts); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("open of a log without segments that held seq 40: %v", err)
		}
		rep, err := Repair(m, testDir, opts, RepairSalvage, false)
		if err != nil || rep.NextSeq != 41 || len(rep.Dropped) != 1 {
			t.Fatalf("repair %+v, %v", rep, err)
		}
		l := openLog(t, m, opts)
		defer l.Close()
		if l.StartSeq() != 41 || l.NextSeq() != 41 {
			t.Fatalf("after the repair the log holds %d-%d, want it to start at 41", l.StartSeq(), l.NextSeq())
		}
	})
}
