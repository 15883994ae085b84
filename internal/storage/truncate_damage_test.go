package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// damagedLog is a log holding one known damaged range of several seqs,
// open on m, and what was appended to it.
type damagedLog struct {
	m    *vfs.MemFS
	opts Options
	l    *Log
	mod  model
}

// damageKinds builds each kind of damaged range a log knows of: found by
// recovery in the active segment, found by the scrubber in a sealed one,
// and seqs missing between segments (a sealed segment that ends early).
var damageKinds = []struct {
	name  string
	build func(t *testing.T) *damagedLog
}{
	{"flipped batch found by recovery", func(t *testing.T) *damagedLog {
		d := &damagedLog{m: vfs.NewMem(), opts: Options{IndexIntervalBytes: 256}}
		l := openLog(t, d.m, d.opts)
		off, _, _ := appendSynced(t, l, &d.mod, 40, 20)
		l.Close()
		if err := d.m.FlipBit(segmentPath(testDir, 1), off+batchOverheadBytes+20, 3); err != nil {
			t.Fatal(err)
		}
		d.l = openLog(t, d.m, d.opts)
		return d
	}},
	{"flipped batch found by Verify", func(t *testing.T) *damagedLog {
		d := &damagedLog{m: vfs.NewMem(), opts: smallOpts()}
		d.l = openLog(t, d.m, d.opts)
		appendSynced(t, d.l, &d.mod, 60, -1)
		offs, _ := batchOffsets(t, d.m, segmentPath(testDir, 1))
		flipRecord(t, d.m, segmentPath(testDir, 1), offs[1])
		verifyFirst(t, d.l)
		return d
	}},
	{"seqs missing between segments", func(t *testing.T) *damagedLog {
		d := &damagedLog{m: vfs.NewMem(), opts: smallOpts()}
		l := openLog(t, d.m, d.opts)
		appendSynced(t, l, &d.mod, 60, -1)
		l.Close()
		name := segmentPath(testDir, 1)
		offs, _ := batchOffsets(t, d.m, name)
		data, _ := d.m.ReadFile(name)
		if err := d.m.WriteFile(name, data[:offs[len(offs)-1]]); err != nil { // its last batch gone
			t.Fatal(err)
		}
		if err := d.m.Remove(indexPath(testDir, 1)); err != nil {
			t.Fatal(err)
		}
		d.l = openLog(t, d.m, d.opts)
		return d
	}},
}

// TestTruncateInsideDamageIsRefused guards TruncateAfter's
// cutOutsideDamage: a cut after any seq of a known damaged range (its last
// one included) is refused with a *CorruptError naming the range, and
// changes nothing; the log stays usable — it appends, serves every record
// outside the range, survives a reopen — and a cut just before the range
// drops it whole. Without the guard a cut inside the range failed the
// whole log (the split of the damaged batch, or the walk to a batch
// missing from a segment that ends early, could not read it), and a cut
// at the end of missing seqs left the log ending there: the next append
// landed where they start and recovery cut it as a torn tail.
func TestTruncateInsideDamageIsRefused(t *testing.T) {
	for _, kind := range damageKinds {
		t.Run(kind.name, func(t *testing.T) {
			d := kind.build(t)
			l := d.l
			defer func() { l.Close() }()
			ds := l.Damage()
			if len(ds) != 1 || ds[0].Seqs() < 2 {
				t.Fatalf("setup: damage %v, want one range of several seqs", ds)
			}
			dmg, next, segments := ds[0], l.NextSeq(), len(l.segments)
			for seq := dmg.FirstSeq; seq <= dmg.LastSeq; seq++ {
				err := l.TruncateAfter(seq)
				var ce *CorruptError
				if !errors.As(err, &ce) || ce.Damage.FirstSeq != dmg.FirstSeq || ce.Damage.LastSeq != dmg.LastSeq {
					t.Fatalf("TruncateAfter(%d) inside damaged seqs %d-%d: %v, want a *CorruptError naming them", seq, dmg.FirstSeq, dmg.LastSeq, err)
				}
				if l.NextSeq() != next || len(l.segments) != segments || !reflect.DeepEqual(l.Damage(), ds) {
					t.Fatalf("a refused TruncateAfter(%d) changed the log: NextSeq %d (was %d), %d segments (were %d), damage %v",
						seq, l.NextSeq(), next, len(l.segments), segments, l.Damage())
				}
			}
			d.mod.append(t, l, 1, []Record{testRecord(int(next))})
			if err := l.Sync(); err != nil {
				t.Fatalf("Sync after the refusals: %v", err)
			}
			if refused := readAround(t, l, &d.mod); !reflect.DeepEqual(refused, []uint64{dmg.FirstSeq}) {
				t.Fatalf("after the refusals: refused %v, want only %d", refused, dmg.FirstSeq)
			}
			l.Close()
			l = openLog(t, d.m, d.opts)
			if es, err := l.Read(next, 1, 1<<20); err != nil || len(es) != 1 || !sameRecord(es[0].Record, d.mod.records[next-1]) {
				t.Fatalf("after a reopen, Read(%d) of the record appended after the refusals: %v %v", next, es, err)
			}
			if err := l.TruncateAfter(dmg.FirstSeq - 1); err != nil {
				t.Fatalf("TruncateAfter(%d), just before the damage: %v", dmg.FirstSeq-1, err)
			}
			if len(l.Damage()) != 0 || l.NextSeq() != dmg.FirstSeq {
				t.Fatalf("after dropping the damage whole: damage %v, NextSeq %d; want none, %d", l.Damage(), l.NextSeq(), dmg.FirstSeq)
			}
			d.mod.truncate(dmg.FirstSeq - 1)
			checkAgainst(t, l, &d.mod)
		})
	}
}

// TestTruncateInsideAGapKeepsAGap guards truncateSegment's
// gapSplitStaysAGap: a cut inside a repair's gap keeps the seqs below the
// cut a gap. A gap batch has no records; the split used to take its first
// seqs for records (the slice of none reached into spare capacity) and
// wrote empty records there, which readers were then served as data.
func TestTruncateInsideAGapKeepsAGap(t *testing.T) {
	m, _, _, first, _ := damagedSealedLog(t)
	if _, err := Repair(m, testDir, smallOpts(), RepairTruncate, false); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, m, smallOpts())
	defer func() { l.Close() }()
	var gap *GapError
	if _, err := l.Read(first, 1, 1<<20); !errors.As(err, &gap) || gap.Next != l.NextSeq() {
		t.Fatalf("setup: Read(%d): %v, want a gap to the log's end %d", first, err, l.NextSeq())
	}
	if err := l.TruncateAfter(first + 1); err != nil {
		t.Fatalf("TruncateAfter(%d) inside the gap: %v", first+1, err)
	}
	for reopened := range 2 {
		if l.NextSeq() != first+2 {
			t.Fatalf("reopened %d: NextSeq %d, want %d", reopened, l.NextSeq(), first+2)
		}
		for _, seq := range []uint64{first, first + 1} {
			es, err := l.Read(seq, 1, 1<<20)
			if !errors.As(err, &gap) || gap.Next != first+2 {
				t.Fatalf("reopened %d: Read(%d) in the kept part of the gap: %d entries %+v, %v; want a gap to %d", reopened, seq, len(es), es, err, first+2)
			}
		}
		l.Close()
		l = openLog(t, m, smallOpts())
	}
}

// dirContents returns every file of the log's directory and its bytes.
func dirContents(t *testing.T, m *vfs.MemFS) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range segmentFiles(t, m, "") {
		data, err := m.ReadFile(testDir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = string(data)
	}
	return out
}

// flippedAfterOpen is an open log of 64 synced batches of 3 records in
// small segments indexed at their start only, in which a bit of batch
// number nth of segment number seg (-1: the last batch of the segment;
// seg -1: the active segment) flipped after open: in a record, or in
// the header's base seq (a header the walk to a later batch cannot pass).
// Nobody has read it since. It returns the log's file system and options,
// what was appended, and the flipped batch's segment, offset and seqs.
func flippedAfterOpen(t *testing.T, seg, nth int, header bool) (d *damagedLog, name string, off int64, first, last uint64) {
	t.Helper()
	d = &damagedLog{m: vfs.NewMem(), opts: Options{SegmentBytesMax: 2048, IndexIntervalBytes: 1 << 20}}
	d.l = openLog(t, d.m, d.opts)
	appendSynced(t, d.l, &d.mod, 64, -1) // the active segment holds 5
	if seg < 0 {
		seg = len(d.l.segments) - 1
	}
	s := d.l.segments[seg]
	offs, hs := batchOffsets(t, d.m, s.path)
	if nth < 0 {
		nth = len(offs) - 1
	}
	if seg == len(d.l.segments)-1 && nth == len(offs)-1 {
		t.Fatalf("setup: the log's last batch would be a torn tail, not damage")
	}
	at := offs[nth] + batchOverheadBytes + 3
	if header {
		at = offs[nth] + batchCRCEnd // the base seq's low byte
	}
	if err := d.m.FlipBit(s.path, at, 1); err != nil {
		t.Fatal(err)
	}
	return d, s.path, offs[nth], hs[nth].baseSeq, hs[nth].nextSeq() - 1
}

// TestTruncateMeetingUnrecordedDamageIsRefused guards TruncateAfter's
// cutVerifiedFirst: a cut inside a batch that went bad after open, or at
// its end — in a sealed segment trusted through its index, at the end of
// one, or in the active segment — is refused with a *CorruptError naming
// the batch's seqs, changes no byte on disk, records the damage as Verify
// would (Verify finds nothing new after it), and leaves the log usable:
// it appends and syncs, serves every record but the batch's, refuses the
// cut again after a reopen, and a cut just before the batch drops it.
// Without the guard the split batch's CRC failed the whole log after the
// later segments were removed, and a cut at the batch's end was made,
// leaving the log ending in damage recorded nowhere.
func TestTruncateMeetingUnrecordedDamageIsRefused(t *testing.T) {
	for _, c := range []struct {
		name     string
		seg, nth int
		cutAt    func(first, last uint64) uint64
	}{
		{"inside a batch of a sealed segment", 1, 2, func(first, _ uint64) uint64 { return first + 1 }},
		{"at the end of a batch of a sealed segment", 1, 2, func(_, last uint64) uint64 { return last }},
		{"at the end of a sealed segment", 1, -1, func(_, last uint64) uint64 { return last }},
		{"inside a batch of the active segment", -1, 0, func(first, _ uint64) uint64 { return first }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, name, off, first, last := flippedAfterOpen(t, c.seg, c.nth, false)
			l := d.l
			defer func() { l.Close() }()
			seq := c.cutAt(first, last)
			before, next := dirContents(t, d.m), l.NextSeq()
			err := l.TruncateAfter(seq)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Damage.FirstSeq != first || ce.Damage.LastSeq != last {
				t.Fatalf("TruncateAfter(%d) in flipped batch %d-%d: %v, want a *CorruptError naming it", seq, first, last, err)
			}
			if !reflect.DeepEqual(dirContents(t, d.m), before) || l.NextSeq() != next {
				t.Fatalf("the refused TruncateAfter(%d) changed the log (NextSeq %d, was %d)", seq, l.NextSeq(), next)
			}
			if ds := l.Damage(); len(ds) != 1 || ds[0].Segment != name || ds[0].Offset != off || ds[0].FirstSeq != first || ds[0].LastSeq != last {
				t.Fatalf("damage after the refusal: %v; want the flipped batch at %s offset %d, seqs %d-%d", ds, name, off, first, last)
			}
			if found, err := l.VerifyAll(); err != nil || len(found) != 0 {
				t.Fatalf("VerifyAll after the refusal found %v, %v; want nothing new", found, err)
			}
			d.mod.append(t, l, 1, []Record{testRecord(int(next))})
			if err := l.Sync(); err != nil {
				t.Fatalf("Sync after the refusal: %v", err)
			}
			if refused := readAround(t, l, &d.mod); !reflect.DeepEqual(refused, []uint64{first}) {
				t.Fatalf("after the refusal: refused %v, want only %d", refused, first)
			}
			l.Close()
			l = openLog(t, d.m, d.opts)
			if err := l.TruncateAfter(seq); !errors.As(err, &ce) || ce.Damage.FirstSeq != first {
				t.Fatalf("TruncateAfter(%d) after a reopen: %v, want the refusal again", seq, err)
			}
			if err := l.TruncateAfter(first - 1); err != nil {
				t.Fatalf("TruncateAfter(%d), just before the flipped batch: %v", first-1, err)
			}
			d.mod.truncate(first - 1)
			checkAgainst(t, l, &d.mod)
			if len(l.Damage()) != 0 || l.NextSeq() != first {
				t.Fatalf("after dropping the flipped batch: damage %v, NextSeq %d; want none, %d", l.Damage(), l.NextSeq(), first)
			}
		})
	}
}

// TestTruncateStepsOverUnrecordedDamageBelowTheCut guards
// cutVerifiedFirst where the cut lies past the damage: a batch header
// flipped after open lies between the segment's index entry and the cut.
// The truncation records the damage and steps over it (the index it
// verified past the damage); it keeps every record below the cut but the
// batch's, and they survive a reopen. Without the guard the walk to the
// cut could not read the flipped header and failed the whole log.
func TestTruncateStepsOverUnrecordedDamageBelowTheCut(t *testing.T) {
	d, name, off, first, last := flippedAfterOpen(t, 1, 1, true)
	l := d.l
	defer func() { l.Close() }()
	seq := last + 2 // inside the batch after the flipped one
	if err := l.TruncateAfter(seq); err != nil {
		t.Fatalf("TruncateAfter(%d), past a header flipped at seqs %d-%d: %v", seq, first, last, err)
	}
	d.mod.truncate(seq)
	for reopened := range 2 {
		if ds := l.Damage(); len(ds) != 1 || ds[0].Segment != name || ds[0].Offset != off || ds[0].FirstSeq != first || ds[0].LastSeq != last {
			t.Fatalf("reopened %d: damage %v; want the flipped batch at %s offset %d, seqs %d-%d", reopened, ds, name, off, first, last)
		}
		if refused, served := readAroundCounting(t, l, &d.mod); l.NextSeq() != seq+1 || !reflect.DeepEqual(refused, []uint64{first}) || uint64(served) != seq-(last-first+1) {
			t.Fatalf("reopened %d: NextSeq %d, refused %v, served %d; want %d, [%d], %d", reopened, l.NextSeq(), refused, served, seq+1, first, seq-(last-first+1))
		}
		l.Close()
		l = openLog(t, d.m, d.opts)
	}
}

// TestTruncateInsideDamageThatGrewIsRefused guards addDamage's
// damageGrows: the scrubber recorded a flipped batch of a sealed segment;
// then the batch after it went bad too. Verify, and a truncation's own
// verification, find one longer range from the same offset; it replaces
// the known one, and a cut inside the batch that went bad later is
// refused naming the whole range, the log unchanged. Without the guard
// the longer range was taken for the known one and dropped: Verify
// reported nothing, and the cut went ahead and failed the whole log on
// the split batch's CRC.
func TestTruncateInsideDamageThatGrewIsRefused(t *testing.T) {
	for _, scrubbed := range []bool{true, false} {
		t.Run(fmt.Sprintf("scrubbed again %v", scrubbed), func(t *testing.T) {
			d, name, off, first, _ := flippedAfterOpen(t, 1, 2, false)
			l := d.l
			defer l.Close()
			verifyEverySealed(t, l)
			offs, hs := batchOffsets(t, d.m, name)
			flipRecord(t, d.m, name, offs[3])
			last := hs[3].nextSeq() - 1
			if scrubbed {
				if found := verifyEverySealed(t, l); len(found) != 1 || found[0].FirstSeq != first || found[0].LastSeq != last {
					t.Fatalf("Verify after the next batch went bad found %v; want seqs %d-%d", found, first, last)
				}
			}
			before, next := dirContents(t, d.m), l.NextSeq()
			err := l.TruncateAfter(hs[3].baseSeq)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Damage.FirstSeq != first || ce.Damage.LastSeq != last {
				t.Fatalf("TruncateAfter(%d) in the batch that went bad later: %v, want a *CorruptError naming seqs %d-%d", hs[3].baseSeq, err, first, last)
			}
			if !reflect.DeepEqual(dirContents(t, d.m), before) || l.NextSeq() != next {
				t.Fatalf("the refused TruncateAfter changed the log (NextSeq %d, was %d)", l.NextSeq(), next)
			}
			if ds := l.Damage(); len(ds) != 1 || ds[0].Offset != off || ds[0].FirstSeq != first || ds[0].LastSeq != last {
				t.Fatalf("damage %v; want one range at offset %d, seqs %d-%d", ds, off, first, last)
			}
			if refused := readAround(t, l, &d.mod); !reflect.DeepEqual(refused, []uint64{first}) {
				t.Fatalf("refused %v, want only %d", refused, first)
			}
		})
	}
}

// TestTruncateKeepsDamageOnlyProven guards TruncateAfter's
// keptDamageProven: a sealed segment's batches were written with no sync
// between them, and the scrubber found one of them flipped. A cut after
// a later batch of that segment would keep the damage with nothing after
// it that proves it durable, where recovery takes it for a torn tail: it
// is refused naming the damage, the log unchanged, and a cut just before
// the damage drops it and survives a reopen. With the batches synced one
// by one the same cut is made, and the reopened log still serves every
// kept record around the damage. Without the guard the cut was made, and
// the reopen cut the damage and the kept records after it as a torn
// tail, and handed their seqs out again.
func TestTruncateKeepsDamageOnlyProven(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(fmt.Sprintf("synced %v", synced), func(t *testing.T) {
			m, opts, mod := vfs.NewMem(), Options{SegmentBytesMax: 2048, IndexIntervalBytes: 1 << 20}, &model{}
			l := openLog(t, m, opts)
			defer func() { l.Close() }()
			for range 40 {
				mod.append(t, l, 1, []Record{testRecord(len(mod.records) + 1), testRecord(len(mod.records) + 2)})
				if synced {
					if err := l.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			name := l.segments[1].path
			offs, hs := batchOffsets(t, m, name)
			flipRecord(t, m, name, offs[1])
			if found := verifyEverySealed(t, l); len(found) != 1 || found[0].FirstSeq != hs[1].baseSeq {
				t.Fatalf("setup: the scrubber found %v; want seqs from %d", found, hs[1].baseSeq)
			}
			seq, first := hs[3].baseSeq, hs[1].baseSeq
			before, next := dirContents(t, m), l.NextSeq()
			err := l.TruncateAfter(seq)
			var ce *CorruptError
			if !synced {
				if !errors.As(err, &ce) || ce.Damage.FirstSeq != first {
					t.Fatalf("TruncateAfter(%d), keeping damage at %d that nothing after proves: %v; want a *CorruptError naming it", seq, first, err)
				}
				if !reflect.DeepEqual(dirContents(t, m), before) || l.NextSeq() != next {
					t.Fatalf("the refused TruncateAfter(%d) changed the log", seq)
				}
				seq = first - 1
				if err = l.TruncateAfter(seq); err != nil {
					t.Fatalf("TruncateAfter(%d), just before the damage: %v", seq, err)
				}
			} else if err != nil {
				t.Fatalf("TruncateAfter(%d), keeping damage at %d proven by the batches after it: %v", seq, first, err)
			}
			mod.truncate(seq)
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			l.Close()
			l = openLog(t, m, opts)
			if tt, cut := l.TornTail(); cut || l.NextSeq() != seq+1 {
				t.Fatalf("reopened after the cut after %d: NextSeq %d, torn tail %+v %v", seq, l.NextSeq(), tt, cut)
			}
			want := []uint64(nil)
			if synced {
				want = []uint64{first}
			}
			if refused := readAround(t, l, mod); !reflect.DeepEqual(refused, want) {
				t.Fatalf("reopened: refused %v, want %v", refused, want)
			}
		})
	}
}

// TestTruncateWhoseVerificationCannotReadChangesNothing pins
// verifyBeforeCut's read failure: a truncation whose verification of the
// segment it would end in cannot read returns the error, changes no byte
// and leaves the log usable (not failed): it syncs, and the same cut is
// made once reads work again. Nothing had changed yet, so there was
// nothing to fail the log for.
func TestTruncateWhoseVerificationCannotReadChangesNothing(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	defer l.Close()
	var mod model
	appendSynced(t, l, &mod, 40, -1)
	seq := l.segments[1].baseSeq + 1
	before, next := dirContents(t, m), l.NextSeq()
	broken := errors.New("injected read error")
	m.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpRead {
			return broken
		}
		return nil
	})
	err := l.TruncateAfter(seq)
	m.SetInjector(nil)
	if !errors.Is(err, broken) {
		t.Fatalf("TruncateAfter(%d) with reads failing: %v, want the read error", seq, err)
	}
	if !reflect.DeepEqual(dirContents(t, m), before) || l.NextSeq() != next {
		t.Fatalf("TruncateAfter(%d) that could not read changed the log", seq)
	}
	if err := l.Sync(); err != nil {
		t.Fatalf("Sync after the failed verification: %v (the log failed)", err)
	}
	if err := l.TruncateAfter(seq); err != nil {
		t.Fatalf("TruncateAfter(%d) once reads work: %v", seq, err)
	}
	mod.truncate(seq)
	checkAgainst(t, l, &mod)
}

// readableRecords reads the whole log, stepping over what it refuses, and
// returns each seq it serves with its record and epoch encoded. A record
// served must be the one appended at its seq (mod): a record whose
// checksum did not verify is never served. Refusals must be damage: a
// *CorruptError (recorded), a *GapError, or an error matching ErrCorrupt
// (a batch nobody has read since it went bad).
func readableRecords(t *testing.T, l *Log, mod *model) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	for seq := l.StartSeq(); seq < l.NextSeq(); {
		es, err := l.Read(seq, 64, 1<<20)
		var ce *CorruptError
		var gap *GapError
		switch {
		case errors.As(err, &ce):
			seq = ce.Damage.LastSeq + 1
			continue
		case errors.As(err, &gap):
			seq = gap.Next
			continue
		case errors.Is(err, ErrCorrupt):
			seq++
			continue
		case err != nil:
			t.Fatalf("Read(%d): %v", seq, err)
		}
		for i, e := range es {
			if e.Seq != seq+uint64(i) || e.Seq > uint64(len(mod.records)) ||
				!sameRecord(e.Record, mod.records[e.Seq-1]) || e.Epoch != mod.epochs[e.Seq-1] {
				t.Fatalf("Read(%d) served seq %d that was not appended there (%d appended)", seq, e.Seq, len(mod.records))
			}
			out[e.Seq] = fmt.Sprintf("%d/%x", e.Epoch, AppendRecord(nil, &e.Record))
		}
		seq += uint64(len(es))
	}
	return out
}

// stillReadable fails unless every seq through through that before
// served is served by after with the same record. (A refusal may serve
// more than before: the damage it records indexes the batch after it.)
func stillReadable(t *testing.T, before, after map[uint64]string, through uint64, what string) {
	t.Helper()
	for seq, rec := range before {
		if seq <= through && after[seq] != rec {
			t.Fatalf("%s (through seq %d): seq %d was readable before and is not now", what, through, seq)
		}
	}
}

// FuzzTruncateIntoDamage runs a program of appends, syncs, bit flips in
// the written part of any segment (sealed ones trusted through their
// index, the active one), scrubber steps, clean reopens and truncations
// at fuzzed seqs. Around each truncation: it either succeeds — every seq
// at or below the cut that was readable before still is, with the same
// record, and the log ends at the cut — or it is refused with a
// *CorruptError naming damage at or below the cut and the log is unchanged (every byte on disk, its end,
// what it serves). It never fails the log (the log syncs after it), and
// no read ever serves a record other than the one appended at its seq. A
// clean reopen that cuts no torn tail, followed by a scrub, serves every
// record served before it.
func FuzzTruncateIntoDamage(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 9, 77, 5, 20}, uint64(1))
	f.Add(append(bytes.Repeat([]byte{2, 10, 3}, 20), 4, 1, 1, 40, 6, 1, 5, 30, 4, 2, 3, 9, 5, 12, 7, 5, 5), uint64(2))
	f.Add(append(bytes.Repeat([]byte{1, 26, 3}, 25), 4, 3, 200, 14, 4, 0, 0, 60, 5, 41, 5, 7, 0, 3, 5, 3), uint64(3))
	f.Fuzz(runTruncateProgram)
}

// runTruncateProgram runs one program of FuzzTruncateIntoDamage.
func runTruncateProgram(t *testing.T, prog []byte, seed uint64) {
	{
		if len(prog) > 300 {
			return
		}
		m := vfs.NewMem()
		opts := Options{SegmentBytesMax: 1024, IndexIntervalBytes: 128}
		l := openLog(t, m, opts)
		defer func() { l.Close() }()
		var mod model
		epoch := uint64(1)
		arg := func(pc *int) (uint64, bool) {
			if *pc+1 >= len(prog) {
				return 0, false
			}
			*pc++
			return uint64(prog[*pc]), true
		}
		for pc := 0; pc < len(prog); pc++ {
			switch op := prog[pc] % 8; op {
			case 0, 1, 2: // append 1-4 records of a size set by op
				var recs []Record
				for j := range 1 + int(prog[pc]/8)%4 {
					r := testRecord(len(mod.records) + j + 1)
					r.Value = bytes.Repeat([]byte{byte(seed)}, int(op)*30+int(prog[pc]/32))
					recs = append(recs, r)
				}
				mod.append(t, l, epoch, recs)
			case 3:
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
			case 4: // flip a bit: segment, offset (two bytes), bit
				which, ok1 := arg(&pc)
				hi, ok2 := arg(&pc)
				lo, ok3 := arg(&pc)
				if !ok1 || !ok2 || !ok3 {
					continue
				}
				s := l.segments[int(which)%len(l.segments)]
				if s.sizeBytes == 0 {
					continue
				}
				if err := m.FlipBit(s.path, int64(hi<<8|lo)%s.sizeBytes, uint(which>>5)); err != nil {
					t.Fatal(err)
				}
			case 5: // truncate after the seq given by the next byte
				b, ok := arg(&pc)
				if !ok {
					continue
				}
				next := l.NextSeq()
				seq := (b + seed) % next
				files, readable := dirContents(t, m), readableRecords(t, l, &mod)
				err := l.TruncateAfter(seq)
				var ce *CorruptError
				switch {
				case errors.As(err, &ce):
					if seq < ce.Damage.FirstSeq {
						t.Fatalf("TruncateAfter(%d) refused naming seqs %d-%d, above the cut", seq, ce.Damage.FirstSeq, ce.Damage.LastSeq)
					}
					if !reflect.DeepEqual(dirContents(t, m), files) || l.NextSeq() != next {
						t.Fatalf("the refused TruncateAfter(%d) changed the log (NextSeq %d, was %d)", seq, l.NextSeq(), next)
					}
					stillReadable(t, readable, readableRecords(t, l, &mod), next, "a refused TruncateAfter")
				case err != nil:
					t.Fatalf("TruncateAfter(%d) of a log ending at %d: %v", seq, next-1, err)
				default:
					if want := min(seq+1, next); l.NextSeq() != want {
						t.Fatalf("TruncateAfter(%d): NextSeq %d, want %d", seq, l.NextSeq(), want)
					}
					mod.truncate(min(seq, uint64(len(mod.records))))
					stillReadable(t, readable, readableRecords(t, l, &mod), seq, "TruncateAfter")
					epoch++
				}
				if err := l.Sync(); err != nil {
					t.Fatalf("Sync after TruncateAfter(%d): %v", seq, err)
				}
			case 6: // a scrubber step from the seq given by the next byte
				b, ok := arg(&pc)
				if !ok {
					continue
				}
				if _, _, _, err := l.Verify(b%l.NextSeq()+1, 1); err != nil {
					t.Fatal(err)
				}
			case 7: // close and reopen: recovery may cut what it cannot prove
				readable := readableRecords(t, l, &mod)
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				l = openLog(t, m, opts)
				// Recovery trusts sealed segments' indexes: damage found
				// in them is found again by the scrubber.
				if _, err := l.VerifyAll(); err != nil {
					t.Fatal(err)
				}
				if _, cut := l.TornTail(); !cut {
					stillReadable(t, readable, readableRecords(t, l, &mod), math.MaxUint64, "a reopen that cut nothing, and a scrub")
				}
				mod.truncate(min(l.NextSeq()-1, uint64(len(mod.records))))
				epoch = max(epoch, l.LastEpoch())
			}
			readableRecords(t, l, &mod)
		}
	}
}
