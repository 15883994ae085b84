package storage

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// tornTailLog is a log of 10 records in epoch 1 whose end went bad as
// shape says, closed: the name of its segment and the seqs the bad end's
// headers name (0, 0: none).
func tornTailLog(t *testing.T, m *vfs.MemFS, shape string) (name string, first, last uint64) {
	t.Helper()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 10, 1)
	name = testDir + "/00000000000000000001.log"
	end := l.active().sizeBytes
	switch shape {
	case "flipped last batch":
		// Flushed, acknowledged, then a bit flipped: looks torn.
		mod.append(t, l, 2, []Record{testRecord(11), testRecord(12)})
		l.Close()
		if err := m.FlipBit(name, end+batchOverheadBytes+5, 2); err != nil {
			t.Fatal(err)
		}
		return name, 11, 12
	case "flipped header of the last batch":
		// Its magic flipped: the header names nothing, and the batch, whole
		// because it was flushed, holds at most its bytes' worth of
		// records.
		mod.append(t, l, 2, []Record{testRecord(11), testRecord(12)})
		size := l.active().sizeBytes - end
		l.Close()
		if err := m.FlipBit(name, end, 3); err != nil {
			t.Fatal(err)
		}
		return name, 11, 10 + uint64((size-batchOverheadBytes)/recordBytesMin)
	case "flipped count of the last batch", "flipped length of the last batch":
		// Its count flipped from 3 to 1, or its length's bit 24 (a batch
		// longer than BatchBytesMax), and the header still decodes: its
		// records, read one by one, name all three.
		mod.append(t, l, 2, []Record{testRecord(11), testRecord(12), testRecord(13)})
		l.Close()
		at, bit := int64(26), uint(1)
		if shape == "flipped length of the last batch" {
			at, bit = 5, 0
		}
		if err := m.FlipBit(name, end+at, bit); err != nil {
			t.Fatal(err)
		}
		return name, 11, 13
	case "flip into the zeroes after the last batch":
		// Nothing was written there: nothing to keep.
		l.Close()
		if err := m.FlipBit(name, end+100, 3); err != nil {
			t.Fatal(err)
		}
		return name, 0, 0
	case "group commit", "group commit at the file's end":
		// A batch written while the one before it was not yet synced
		// proves nothing about it: both go with the flip.
		if _, err := l.Append(2, []Record{testRecord(11), testRecord(12)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(2, []Record{testRecord(13), testRecord(14), testRecord(15)}); err != nil {
			t.Fatal(err)
		}
		used := l.active().sizeBytes
		l.Close()
		if err := m.FlipBit(name, end+batchOverheadBytes+5, 2); err != nil {
			t.Fatal(err)
		}
		if shape == "group commit at the file's end" { // no preallocated zeroes after it
			f, err := m.OpenRW(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(used); err != nil {
				t.Fatal(err)
			}
			f.Sync()
			f.Close()
		}
		return name, 11, 15
	}
	l.Close()
	torn, err := appendBatch(nil, 11, 2, 10, []Record{testRecord(11), testRecord(12), testRecord(13)}, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cut := map[string]int{"torn write, its header whole": batchHeaderBytes + 3, "torn write inside its header": 20}[shape]
	f, err := m.OpenRW(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn[:cut], end); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	if cut < batchHeaderBytes {
		return name, 0, 0
	}
	return name, 11, 13
}

var tornTailShapes = []string{"flipped last batch", "flipped header of the last batch", "flipped count of the last batch", "flipped length of the last batch", "group commit", "group commit at the file's end",
	"torn write, its header whole", "torn write inside its header", "flip into the zeroes after the last batch"}

// TestKeptTornTailSeqsAreNotReused: with KeepTornSeqs, the seqs a torn
// tail's headers name are filled — gaps, or the filler — and a new record
// goes after them; seqs no header names are cut as before
// (TornSeqsNotReused). Without it, the tail is cut and its seqs are
// handed out again, the named ones still reported.
func TestKeptTornTailSeqsAreNotReused(t *testing.T) {
	filler := Record{Headers: []Header{{Key: "ctl", Value: []byte("lost")}}}
	for _, shape := range tornTailShapes {
		for _, opts := range []Options{{}, {KeepTornSeqs: true}, {KeepTornSeqs: true, Filler: &filler}} {
			m := vfs.NewMem()
			name, first, last := tornTailLog(t, m, shape)
			l := openLog(t, m, opts)
			tt, ok := l.TornTail()
			if !ok || tt.FirstSeq != 11 || tt.Named() != (last > 0) || (last > 0 && tt.LastSeq != last) {
				t.Fatalf("%s: torn tail %+v %v, want seqs %d-%d named", shape, tt, ok, first, last)
			}
			kept := opts.KeepTornSeqs && last > 0
			if tt.Kept != kept {
				t.Fatalf("%s %+v: Kept %v", shape, opts, tt.Kept)
			}
			want := uint64(11)
			if kept {
				want = last + 1
			}
			if l.NextSeq() != want {
				t.Fatalf("%s %+v: NextSeq %d, want %d", shape, opts, l.NextSeq(), want)
			}
			if kept {
				// A dedup snapshot taken now stands at the kept seqs' last,
				// in the log's last epoch: EpochAt agrees.
				if ep, err := l.EpochAt(last); err != nil || ep != 1 || l.LastEpoch() != 1 {
					t.Fatalf("%s %+v: EpochAt(%d) = %d, %v, last epoch %d; want 1", shape, opts, last, ep, err, l.LastEpoch())
				}
				es, err := l.Read(first, 100, 1<<20)
				switch gap := (*GapError)(nil); {
				case opts.Filler == nil && (!errors.As(err, &gap) || gap.Next != last+1):
					t.Fatalf("%s: read of a kept seq: %v %v, want a gap to %d", shape, es, err, last+1)
				case opts.Filler != nil && (err != nil || uint64(len(es)) != last-first+1):
					t.Fatalf("%s: read of kept seqs: %d entries, %v", shape, len(es), err)
				case opts.Filler != nil:
					for _, e := range es {
						if !sameRecord(e.Record, filler) || e.Epoch != 1 {
							t.Fatalf("%s: seq %d holds %+v in epoch %d, want the filler in epoch 1", shape, e.Seq, e.Record, e.Epoch)
						}
					}
				}
			}
			seq, err := l.Append(3, []Record{testRecord(99)})
			if err != nil || seq != want {
				t.Fatalf("%s %+v: append at %d (%v), want %d", shape, opts, seq, err, want)
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			l.Close()
			// The fill is durable and whole: a crash and reopen find
			// nothing torn, and the record after it.
			m.CrashClean()
			l = openLog(t, m, opts)
			if _, ok := l.TornTail(); ok || l.NextSeq() != want+1 {
				t.Fatalf("%s %+v: after a reopen NextSeq %d, want %d, torn %v", shape, opts, l.NextSeq(), want+1, ok)
			}
			if len(l.Damage()) != 0 {
				t.Fatalf("%s %+v: damage %+v", shape, opts, l.Damage())
			}
			l.Close()
			_ = name
		}
	}
}

// TestKeptTornTailSurvivesACrashDuringItsFill: an open that fails, or
// crashes, while it replaces the torn tail by its fill leaves the torn
// tail as it was; the next open fills it.
func TestKeptTornTailSurvivesACrashDuringItsFill(t *testing.T) {
	for seed := range uint64(20) {
		m := vfs.NewMem()
		_, _, last := tornTailLog(t, m, "group commit")
		m.SetInjector(func(op vfs.Op, name string) error {
			if op == vfs.OpRename {
				return errors.New("injected: rename")
			}
			return nil
		})
		if l, err := Open(m, testDir, Options{KeepTornSeqs: true}); err == nil {
			l.Close()
			t.Fatal("Open succeeded through a failed rename")
		}
		m.SetInjector(nil)
		m.Crash(rand.New(rand.NewPCG(seed, 1)))
		l := openLog(t, m, Options{KeepTornSeqs: true})
		if tt, ok := l.TornTail(); !ok || !tt.Kept || l.NextSeq() != last+1 {
			t.Fatalf("seed %d: NextSeq %d, torn %+v %v; want %d", seed, l.NextSeq(), tt, ok, last+1)
		}
		l.Close()
	}
}

// TestRepairKeepsTornSeqs: a repair with KeepTornSeqs fills a torn tail's
// named seqs as Open would, beside the damage it drops.
func TestRepairKeepsTornSeqs(t *testing.T) {
	filler := Record{Headers: []Header{{Key: "ctl", Value: []byte("lost")}}}
	for _, withFiller := range []bool{false, true} {
		m := vfs.NewMem()
		_, _, last := tornTailLog(t, m, "group commit")
		opts := Options{KeepTornSeqs: true}
		var rep RepairReport
		var err error
		if withFiller {
			rep, err = RepairFilled(m, testDir, opts, filler, false)
		} else {
			rep, err = Repair(m, testDir, opts, RepairSalvage, false)
		}
		if err != nil || rep.TornTail == nil || !rep.TornTail.Kept || rep.NextSeq != last+1 {
			t.Fatalf("filler %v: report %+v (torn %+v), %v", withFiller, rep, rep.TornTail, err)
		}
		l := openLog(t, m, Options{})
		if _, ok := l.TornTail(); ok || l.NextSeq() != last+1 {
			t.Fatalf("filler %v: after the repair NextSeq %d, torn %v", withFiller, l.NextSeq(), ok)
		}
		l.Close()
	}
}

// TestKeptTornTailFirstInItsSegmentTakesTheEpochBefore: a torn batch that
// is the first of the newest segment is filled, by an open or a repair,
// in the epoch of the last batch of the segment before it — the log's
// last epoch — not epoch 0.
func TestKeptTornTailFirstInItsSegmentTakesTheEpochBefore(t *testing.T) {
	for _, byRepair := range []bool{false, true} {
		m := vfs.NewMem()
		opts := smallOpts()
		opts.KeepTornSeqs = true
		l := openLog(t, m, opts)
		var mod model
		for l.active().sizeBytes+600 < opts.SegmentBytesMax {
			appendMany(t, l, &mod, 1, 3)
		}
		// A batch in epoch 4 too large for the segment: it rolls, and is
		// the first batch of the new one.
		big := testRecord(1000)
		big.Value = make([]byte, 800)
		mod.append(t, l, 4, []Record{big})
		base := l.active().baseSeq
		if l.active().nextSeq != base+1 {
			t.Fatalf("the epoch-4 batch did not start a segment (base %d, next %d)", base, l.active().nextSeq)
		}
		l.Close()
		if err := m.FlipBit(segmentPath(testDir, base), batchOverheadBytes+5, 1); err != nil {
			t.Fatal(err)
		}
		if byRepair {
			rep, err := Repair(m, testDir, opts, RepairSalvage, false)
			if err != nil || rep.TornTail == nil || !rep.TornTail.Kept || rep.TornTail.LastSeq != base {
				t.Fatalf("repair: %+v, %v; want seq %d kept", rep.TornTail, err, base)
			}
		}
		l = openLog(t, m, opts)
		if tt, ok := l.TornTail(); ok == byRepair || ok && (!tt.Kept || tt.FirstSeq != base || tt.LastSeq != base) {
			t.Fatalf("repair %v: torn tail %+v %v, want seq %d kept", byRepair, tt, ok, base)
		}
		if ep, err := l.EpochAt(base); err != nil || ep != 3 || l.LastEpoch() != 3 {
			t.Fatalf("repair %v: the fill's epoch %d (%v), last epoch %d; want 3", byRepair, ep, err, l.LastEpoch())
		}
		l.Close()
	}
}

// TestKeptTornTailTrustsOnlyAHeaderOfABatchItCouldHold: a torn header
// naming more seqs than one batch of BatchBytesMax could hold is made up
// of damage: it names nothing, and the tail is cut — its fill must not
// grow without bound.
func TestKeptTornTailTrustsOnlyAHeaderOfABatchItCouldHold(t *testing.T) {
	for _, total := range []int{4 << 10, 512 << 20} {
		m := vfs.NewMem()
		l := openLog(t, m, Options{})
		var mod model
		appendMany(t, l, &mod, 10, 1)
		end := l.active().sizeBytes
		l.Close()
		count := uint32((total - batchOverheadBytes) / recordBytesMin)
		header := appendBatchHeader(nil, batchVersionV2, total, 11, 1, count, 0)
		f, err := m.OpenRW(segmentPath(testDir, 1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(append(header, 1, 2, 3), end); err != nil {
			t.Fatal(err)
		}
		f.Sync()
		f.Close()
		l = openLog(t, m, Options{KeepTornSeqs: true})
		tt, _ := l.TornTail()
		if fits := total <= defaultBatchBytesMax; tt.Named() != fits || fits && l.NextSeq() != 11+uint64(count) || !fits && l.NextSeq() != 11 {
			t.Fatalf("a torn header of %d bytes for %d seqs: %+v, next seq %d", total, count, tt, l.NextSeq())
		}
		l.Close()
	}
}

// FuzzKeptTornTail opens any segment with KeepTornSeqs, with gaps and
// with a filler: the open never fails where a plain one does not, never
// ends the log below where the plain open does, serves only what a
// plain open serves below that end, and a reopen finds nothing torn and
// the same end.
// TestKeptTornTailReadsNoFurtherThanABatchItCouldHold: the records of a
// torn last batch whose header claims more bytes than BatchBytesMax are
// read only as far as a batch of BatchBytesMax reaches, so a length made
// up of damage does not name every record-like byte after it.
func TestKeptTornTailReadsNoFurtherThanABatchItCouldHold(t *testing.T) {
	const batchMax = 4 << 10
	m := vfs.NewMem()
	l := openLog(t, m, Options{BatchBytesMax: batchMax, RecordBytesMax: 1 << 10})
	var mod model
	appendMany(t, l, &mod, 10, 1)
	end := l.active().sizeBytes
	l.Close()
	var recs []Record
	for i := range 400 { // about 20 KiB of records
		recs = append(recs, testRecord(11+i))
	}
	batch, err := appendBatch(nil, 11, 1, 10, recs, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	batch[batchCRCOffset] ^= 1 // torn: its CRC fails
	f, err := m.OpenRW(segmentPath(testDir, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(batch, end); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	l = openLog(t, m, Options{BatchBytesMax: batchMax, RecordBytesMax: 1 << 10, KeepTornSeqs: true})
	defer l.Close()
	tt, _ := l.TornTail()
	if n := tt.LastSeq - tt.FirstSeq + 1; !tt.Named() || n*uint64(RecordBytes(&recs[0])) > batchMax {
		t.Fatalf("a torn batch of %d bytes for %d records, BatchBytesMax %d: %+v names %d", len(batch), len(recs), batchMax, tt, n)
	}
}

func FuzzKeptTornTail(f *testing.F) {
	seg, used := validSegmentUsed(f)
	f.Add(seg, false)
	f.Add(seg[:used-7], true)
	torn := append(append([]byte(nil), seg[:used]...), seg[:batchHeaderBytes+9]...)
	f.Add(torn, false)
	f.Add(torn, true)
	filler := Record{Headers: []Header{{Key: "ctl", Value: []byte("lost")}}}
	f.Fuzz(func(t *testing.T, data []byte, withFiller bool) {
		open := func(opts Options) (*vfs.MemFS, *Log) {
			m := vfs.NewMem()
			if err := m.MkdirAll(testDir); err != nil {
				t.Fatal(err)
			}
			if err := m.WriteFile(segmentPath(testDir, 1), data); err != nil {
				t.Fatal(err)
			}
			l, err := Open(m, testDir, opts)
			if err != nil {
				t.Fatalf("Open %+v: %v", opts, err)
			}
			return m, l
		}
		_, plain := open(Options{})
		defer plain.Close()
		opts := Options{KeepTornSeqs: true}
		if withFiller {
			opts.Filler = &filler
		}
		m, l := open(opts)
		next := l.NextSeq()
		if next < plain.NextSeq() {
			t.Fatalf("kept end %d below the plain end %d", next, plain.NextSeq())
		}
		for seq := l.StartSeq(); seq < plain.NextSeq(); seq++ {
			a, errA := plain.Read(seq, 1, 1<<20)
			b, errB := l.Read(seq, 1, 1<<20)
			if (errA == nil) != (errB == nil) || errA == nil && !sameRecord(a[0].Record, b[0].Record) {
				t.Fatalf("seq %d: plain %v %v, kept %v %v", seq, a, errA, b, errB)
			}
			gap, damaged := (*GapError)(nil), (*CorruptError)(nil)
			switch { // a gap batch or a damaged range may span billions of seqs
			case errors.As(errA, &gap):
				seq = gap.Next - 1
			case errors.As(errA, &damaged) && damaged.Damage.LastSeq > seq:
				seq = damaged.Damage.LastSeq
			}
		}
		l.Close()
		l, err := Open(m, testDir, opts)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer l.Close()
		if _, torn := l.TornTail(); torn || l.NextSeq() != next {
			t.Fatalf("reopen: torn %v, end %d; want none and %d", torn, l.NextSeq(), next)
		}
	})
}
