package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"sort"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// RepairMode says what Repair does with damaged ranges.
type RepairMode int

const (
	// RepairSalvage replaces each damaged range by a gap batch and keeps
	// every valid record after it at its seq.
	RepairSalvage RepairMode = iota + 1
	// RepairTruncate cuts the log at its first damaged range; one gap
	// batch then covers every seq from there to the old end, so that new
	// records get seqs above anything the log ever held.
	RepairTruncate
)

func (m RepairMode) String() string {
	switch m {
	case RepairSalvage:
		return "salvage"
	case RepairTruncate:
		return "truncate"
	}
	return fmt.Sprintf("RepairMode(%d)", int(m))
}

// RepairReport says what Repair found and what it dropped (or would drop,
// in a dry run).
type RepairReport struct {
	// Damage lists every damaged range, sorted by seq.
	Damage []Damage
	// TornTail is the incomplete end of the log, cut off as Open would.
	TornTail *TornTail
	// Dropped lists the seq ranges turned into gaps.
	Dropped []SeqRange
	// DroppedSeqs counts the seqs in Dropped; ValidRecordsDropped counts
	// the readable records among them (RepairTruncate drops the records
	// after the first damage).
	DroppedSeqs, ValidRecordsDropped uint64
	// NextSeq is the seq the next record will get: above every seq the
	// log held before the repair.
	NextSeq uint64
}

// SeqRange is an inclusive range of seqs.
type SeqRange struct{ First, Last uint64 }

// Repair checks every segment of the log in dir (which must not be open),
// ignoring the indexes, and unless dryRun makes the log readable end to
// end: each damaged range becomes a gap batch (the seqs are skipped by
// readers, never reused), or with RepairTruncate everything from the first
// damaged range on does. Each rewritten segment replaces the old one
// atomically (temp file, fsync, rename, directory fsync), so an
// interrupted repair leaves the log as it was or repaired, and can be run
// again.
func Repair(fsys vfs.FS, dir string, opts Options, mode RepairMode, dryRun bool) (RepairReport, error) {
	return repair(fsys, dir, opts, mode, dryRun)
}

// RepairFilled is Repair in RepairSalvage mode that puts a copy of filler
// at each seq of a damaged range, in the epoch of the batch before it,
// instead of a gap: for a log whose reader applies every seq in turn (a
// replicated member's kernel), and which knows filler for what it is.
func RepairFilled(fsys vfs.FS, dir string, opts Options, filler Record, dryRun bool) (RepairReport, error) {
	opts.Filler = &filler
	return repair(fsys, dir, opts, RepairSalvage, dryRun)
}

// repair is Repair; a torn tail is cut as Open would, or with
// Options.KeepTornSeqs filled as Open would.
func repair(fsys vfs.FS, dir string, opts Options, mode RepairMode, dryRun bool) (RepairReport, error) {
	var rep RepairReport
	if mode != RepairSalvage && mode != RepairTruncate {
		return rep, fmt.Errorf("storage: repair mode %v", mode)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return rep, err
	}
	names, err := fsys.List(dir)
	if err != nil {
		return rep, fmt.Errorf("storage: list %s: %w", dir, err)
	}
	var bases []uint64
	for _, name := range names {
		if base, ok := parseBaseName(name, segmentSuffix); ok {
			bases = append(bases, base)
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	type scanned struct {
		seg      *segment
		validEnd int64
		damage   []Damage
	}
	var segs []scanned
	defer func() {
		for _, s := range segs {
			_ = s.seg.file.Close()
		}
	}()
	for i, base := range bases {
		var limitSeq uint64
		if i+1 < len(bases) {
			limitSeq = bases[i+1]
		}
		f, err := fsys.OpenRW(segmentPath(dir, base))
		if err != nil {
			return rep, fmt.Errorf("storage: open segment: %w", err)
		}
		s := newSegment(dir, base, f)
		segs = append(segs, scanned{seg: s})
		cur := &segs[len(segs)-1]
		if i > 0 {
			prev := segs[i-1].seg
			if base < prev.nextSeq {
				return rep, fmt.Errorf("%w: segment %d overlaps the one before it (ends at seq %d); not repairable automatically", ErrCorrupt, base, prev.nextSeq)
			}
			if base > prev.nextSeq {
				d := Damage{Segment: prev.path, Offset: segs[i-1].validEnd, FirstSeq: prev.nextSeq, LastSeq: base - 1,
					Cause: "seqs missing between segments", epoch: prev.lastEpoch}
				segs[i-1].damage = append(segs[i-1].damage, d)
				prev.nextSeq = base
			}
		}
		size, err := f.Size()
		if err != nil {
			return rep, fmt.Errorf("storage: size of segment %d: %w", base, err)
		}
		res, err := s.scan(size, opts.IndexIntervalBytes, limitSeq)
		if err != nil {
			return rep, fmt.Errorf("storage: scan segment %d: %w", base, err)
		}
		cur.validEnd, cur.damage = res.validEnd, res.damage
		switch {
		case limitSeq == 0 && s.nextSeq <= opts.DurableThrough:
			// Its end below what was durable is damage, not a torn write
			// (DurableTailNotTorn): its seqs are dropped, never reused.
			cur.damage = append(cur.damage, durableTailLost(s, res.validEnd, size, opts.DurableThrough))
		case res.validEnd < size && !res.zeroTail && limitSeq == 0:
			var prev *segment
			if i > 0 {
				prev = segs[i-1].seg
			}
			t, err := newTornTail(s, prev, res, size, opts)
			if err != nil {
				return rep, err
			}
			rep.TornTail = t
		}
	}
	// tornFill is what replaces the torn tail: nothing (a cut), or the
	// fill of the seqs it named.
	var tornFill []byte
	if t := rep.TornTail; t != nil && t.Kept {
		if tornFill, err = t.fill(opts.Filler); err != nil {
			return rep, fmt.Errorf("storage: repair: fill the torn tail: %w", err)
		}
	}
	for _, s := range segs {
		rep.Damage = append(rep.Damage, s.damage...)
	}
	if len(segs) == 0 {
		rep.NextSeq = opts.DurableThrough + 1
		if d := opts.DurableThrough; d > 0 {
			// Every segment is gone: the log starts again after what was
			// durable (an empty first segment at d+1), never reusing it.
			rep.Damage = []Damage{noSegmentsLeft(dir, d)}
			rep.Dropped, rep.DroppedSeqs = []SeqRange{{1, d}}, d
			if !dryRun {
				if err := replaceSegment(fsys, dir, d+1, nil); err != nil {
					return rep, err
				}
			}
		}
		return rep, nil
	}
	rep.NextSeq = max(segs[len(segs)-1].seg.nextSeq, opts.DurableThrough+1)
	if t := rep.TornTail; t != nil && t.Kept {
		rep.NextSeq = max(rep.NextSeq, t.LastSeq+1)
	}
	if len(rep.Damage) == 0 {
		if rep.TornTail != nil && !dryRun {
			t := rep.TornTail
			if err := cutSegment(fsys, dir, segs[len(segs)-1].seg, t.Offset, tornFill); err != nil {
				return rep, err
			}
		}
		return rep, nil
	}

	switch mode {
	case RepairSalvage:
		for _, d := range rep.Damage {
			if d.Seqs() > 0 {
				rep.Dropped = append(rep.Dropped, SeqRange{d.FirstSeq, d.LastSeq})
				rep.DroppedSeqs += d.Seqs()
			}
		}
		if dryRun {
			return rep, nil
		}
		for i := range segs {
			s := &segs[i]
			if len(s.damage) == 0 {
				if i == len(segs)-1 && rep.TornTail != nil {
					if err := cutSegment(fsys, dir, s.seg, s.validEnd, tornFill); err != nil {
						return rep, err
					}
				}
				continue
			}
			var tail []byte
			if i == len(segs)-1 {
				tail = tornFill
			}
			if err := salvageSegment(fsys, dir, s.seg, s.validEnd, s.damage, opts.Filler, tail); err != nil {
				return rep, err
			}
		}
	case RepairTruncate:
		first := rep.Damage[0]
		var at int
		for i := range segs {
			if segs[i].seg.path == first.Segment {
				at = i
			}
		}
		last := rep.NextSeq - 1
		if last >= first.FirstSeq {
			rep.Dropped = []SeqRange{{first.FirstSeq, last}}
			rep.DroppedSeqs = last - first.FirstSeq + 1
			var damagedSeqs uint64
			for _, d := range rep.Damage {
				damagedSeqs += d.Seqs()
			}
			rep.ValidRecordsDropped = rep.DroppedSeqs - damagedSeqs
		}
		if dryRun {
			return rep, nil
		}
		// Later segments go first, durably, so that a crash never leaves
		// them behind a cut segment.
		for i := len(segs) - 1; i > at; i-- {
			_ = segs[i].seg.file.Close()
			for _, name := range []string{indexPath(dir, segs[i].seg.baseSeq), segmentPath(dir, segs[i].seg.baseSeq)} {
				if err := fsys.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return rep, fmt.Errorf("storage: repair: remove %s: %w", name, err)
				}
			}
		}
		segs = segs[:at+1]
		if err := fsys.SyncDir(dir); err != nil {
			return rep, fmt.Errorf("%w: %s: %w", ErrSyncFailed, dir, err)
		}
		var gaps []byte
		if last >= first.FirstSeq {
			gaps = appendGaps(nil, first.FirstSeq, last, first.epoch)
		}
		if err := cutSegment(fsys, dir, segs[at].seg, first.Offset, gaps); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// appendGaps appends gap batches for seqs first..last.
func appendGaps(dst []byte, first, last, epoch uint64) []byte {
	for first <= last {
		n := min(last-first+1, math.MaxUint32)
		dst = appendGapBatch(dst, first, epoch, uint32(n))
		first += n
	}
	return dst
}

// fillerBatchRecords bounds the records of one filler batch.
const fillerBatchRecords = 4096

// appendFillers appends batches holding a copy of filler at each of seqs
// first..last. Each batch says every seq before it synced: the repair
// makes the segment durable before anything reads it.
func appendFillers(dst []byte, first, last, epoch uint64, filler *Record) ([]byte, error) {
	recs := make([]Record, 0, min(last-first+1, fillerBatchRecords))
	for first <= last {
		n := min(last-first+1, fillerBatchRecords)
		recs = recs[:0]
		for range n {
			recs = append(recs, *filler)
		}
		var err error
		if dst, err = appendBatch(dst, first, epoch, first-1, recs, math.MaxInt, math.MaxInt); err != nil {
			return dst, err
		}
		first += n
	}
	return dst, nil
}

// salvageSegment rewrites s: its valid bytes up to validEnd, each damaged
// range replaced by gap batches, or by filler records when filler is set,
// then tail.
func salvageSegment(fsys vfs.FS, dir string, s *segment, validEnd int64, damage []Damage, filler *Record, tail []byte) error {
	var out []byte
	var off int64
	for _, d := range damage {
		b := make([]byte, d.Offset-off)
		if err := readFull(s.file, b, off); err != nil {
			return fmt.Errorf("storage: repair: read segment %d: %w", s.baseSeq, err)
		}
		out = append(out, b...)
		switch {
		case d.Seqs() == 0:
		case filler != nil:
			var err error
			if out, err = appendFillers(out, d.FirstSeq, d.LastSeq, d.epoch, filler); err != nil {
				return fmt.Errorf("storage: repair: fill seqs %d-%d: %w", d.FirstSeq, d.LastSeq, err)
			}
		default:
			out = appendGaps(out, d.FirstSeq, d.LastSeq, d.epoch)
		}
		off = d.Offset + d.Bytes
	}
	if validEnd > off {
		b := make([]byte, validEnd-off)
		if err := readFull(s.file, b, off); err != nil {
			return fmt.Errorf("storage: repair: read segment %d: %w", s.baseSeq, err)
		}
		out = append(out, b...)
	}
	return replaceSegment(fsys, dir, s.baseSeq, append(out, tail...))
}

// cutSegment rewrites s as its first `at` bytes followed by tail.
func cutSegment(fsys vfs.FS, dir string, s *segment, at int64, tail []byte) error {
	b := make([]byte, at, at+int64(len(tail)))
	if err := readFull(s.file, b, 0); err != nil {
		return fmt.Errorf("storage: repair: read segment %d: %w", s.baseSeq, err)
	}
	return replaceSegment(fsys, dir, s.baseSeq, append(b, tail...))
}

// replaceSegment atomically replaces a segment's file by data and removes
// its index (rebuilt on the next Open).
func replaceSegment(fsys vfs.FS, dir string, base uint64, data []byte) error {
	name := segmentPath(dir, base)
	tmp := name + tmpSuffix
	f, err := fsys.OpenRW(tmp)
	if err == nil {
		err = f.Truncate(0)
	}
	if err == nil {
		_, err = f.WriteAt(data, 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("storage: repair: write %s: %w", tmp, err)
	}
	if err := fsys.Remove(indexPath(dir, base)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("storage: repair: remove index: %w", err)
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return fmt.Errorf("storage: repair: rename %s: %w", tmp, err)
	}
	if err := fsys.SyncDir(filepath.Clean(dir)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrSyncFailed, dir, err)
	}
	return nil
}
