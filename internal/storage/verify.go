package storage

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Verify re-reads sealed segments, starting with the one that holds
// fromSeq, and checks every batch (the scrubber's step). It stops once it
// has read at least bytesMax bytes (always at least one segment) or before
// the active segment, which recovery scanned and appends are extending.
// Damage it finds is recorded (Damage, and Read then refuses those seqs
// with a *CorruptError and serves the records after them) and returned;
// so is a known range found longer than recorded (damageGrows).
// next is the seq to continue from, or 0 when no sealed segment is left;
// readBytes is how much it read.
//
// Verify reads without blocking the writer: a sealed segment never
// changes, and one that retention or truncation removes meanwhile is
// skipped. A segment that lies wholly behind the cached tail
// (Options.CachedTailBytes) is then dropped from the page cache: the
// next pass reads the disk, not memory.
func (l *Log) Verify(fromSeq uint64, bytesMax int64) (next uint64, readBytes int64, found []Damage, err error) {
	for {
		l.mu.RLock()
		if l.closed {
			l.mu.RUnlock()
			return 0, readBytes, found, ErrClosed
		}
		i := max(0, segmentHolding(l.segments, fromSeq))
		if i >= len(l.segments)-1 {
			l.mu.RUnlock()
			return 0, readBytes, found, nil
		}
		s, limitSeq := l.segments[i], l.segments[i+1].baseSeq
		sizeBytes, nextSeq, truncations := s.sizeBytes, s.nextSeq, l.truncations
		var after int64 // the log's bytes after s
		for _, later := range l.segments[i+1:] {
			after += later.sizeBytes
		}
		l.mu.RUnlock()

		fresh := newSegment(l.dir, s.baseSeq, s.file)
		res, err := fresh.scan(sizeBytes, l.opts.IndexIntervalBytes, limitSeq)
		if err != nil {
			if l.stillHolds(s) {
				return 0, readBytes, found, fmt.Errorf("storage: verify segment %d: %w", s.baseSeq, err)
			}
			res.damage = nil // removed meanwhile
		}
		if len(res.damage) > 0 {
			found = append(found, l.recordDamage(s, sizeBytes, nextSeq, truncations, true, fresh, res.damage)...)
		}
		if keep := l.opts.CachedTailBytes; keep >= 0 && after >= keep {
			// Behind the cached tail: the next pass reads the disk
			// again, and this one's pages are reused (Log.dropBehind).
			_ = s.file.DropCache(0, sizeBytes)
		}
		readBytes += sizeBytes
		fromSeq = limitSeq
		if readBytes >= bytesMax {
			return fromSeq, readBytes, found, nil
		}
	}
}

// segmentHolding returns the index of the segment holding seq (or the
// first one for a seq below the log, -1 for an empty list).
func segmentHolding(segments []*segment, seq uint64) int {
	i := len(segments) - 1
	for i > 0 && segments[i].baseSeq > seq {
		i--
	}
	return i
}

// stillHolds reports whether s is still one of the log's segments.
func (l *Log) stillHolds(s *segment) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return slices.Contains(l.segments, s)
}

// recordDamage takes the rescanned state of segment s (whose index now
// steps over the damage) and adds the damage that is new. It records
// nothing when s changed since it was read — deleted, truncated (a
// replica's truncation may cut a sealed segment and make it the active
// one), or no longer sealed when sealedOnly: what was read may not be
// what the segment holds. sizeBytes, nextSeq and truncations are s's size
// and next seq and l.truncations when it was read: a segment truncated
// and appended to again up to the same size and seqs (the new leader's
// records) and rolled again is told by truncations alone.
func (l *Log) recordDamage(s *segment, sizeBytes int64, nextSeq, truncations uint64, sealedOnly bool, rescanned *segment, damage []Damage) []Damage {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.Index(l.segments, s)
	if i < 0 || s.sizeBytes != sizeBytes || s.nextSeq != nextSeq || l.truncations != truncations || (sealedOnly && i == len(l.segments)-1) {
		return nil
	}
	return l.addDamage(s, rescanned.index, damage)
}

// addDamage gives s index, which steps over damage (a rescan's), and adds
// the damage that is new; it returns what it added. Writer, under l.mu.
//
// Invariant damageGrows: a range found where a known one starts (same
// segment and offset) that reaches further replaces it. The batches after
// a known range can go bad too; the rescan then finds one longer range
// from the same offset. Taken for the known one, the seqs it added were
// recorded nowhere: a truncation inside them went ahead and failed the
// whole log on the split batch's CRC (FuzzTruncateIntoDamage found it).
func (l *Log) addDamage(s *segment, index []indexEntry, damage []Damage) []Damage {
	// Only the index changes: s still ends where it did. A sealed
	// segment whose records end early (seqs missing before the next one)
	// ends at the next segment's base, which its rescan does not know.
	s.index = index
	var added []Damage
	for _, d := range damage {
		i := slices.IndexFunc(l.damage, func(k Damage) bool { return k.Segment == d.Segment && k.Offset == d.Offset })
		switch {
		case i < 0:
			l.damage = append(l.damage, d)
		case d.Bytes > l.damage[i].Bytes || d.LastSeq > l.damage[i].LastSeq:
			l.damage[i] = d
		default:
			continue
		}
		added = append(added, d)
	}
	slices.SortFunc(l.damage, func(a, b Damage) int { return cmp.Compare(a.FirstSeq, b.FirstSeq) })
	return added
}

// VerifyAll checks every segment, the active one included up to what was
// appended, records the damage it finds and returns it. In the active
// segment every invalid range counts (it was read back wrong; no crash
// came between its write and this read). Writer only: unlike Verify it
// must not run concurrently with appends or truncation.
func (l *Log) VerifyAll() ([]Damage, error) {
	var found []Damage
	for next := l.StartSeq(); ; {
		var ds []Damage
		var err error
		if next, _, ds, err = l.Verify(next, math.MaxInt64); err != nil {
			return found, err
		}
		found = append(found, ds...)
		if next == 0 {
			break
		}
	}
	ds, err := l.VerifyActive()
	return append(found, ds...), err
}

// VerifyAt checks the segment holding seq, where a read failed on damage
// no check had located: the sealed one (Verify), else the active one
// (VerifyActive). It records and returns what it finds. Writer only, as
// VerifyAll.
func (l *Log) VerifyAt(seq uint64) ([]Damage, error) {
	_, _, found, err := l.Verify(seq, 1) // a sealed segment holding seq, if one does
	if err != nil || len(found) > 0 {
		return found, err
	}
	return l.VerifyActive()
}

// VerifyActive checks the active segment up to what was appended (the
// scrubber reads only sealed ones), records the damage it finds and
// returns it: every invalid range counts there (it was read back wrong;
// no crash came between its write and this read). Writer only, as
// VerifyAll.
func (l *Log) VerifyActive() ([]Damage, error) {
	var found []Damage
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return found, ErrClosed
	}
	s := l.active()
	sizeBytes, nextSeq, truncations := s.sizeBytes, s.nextSeq, l.truncations
	l.mu.RUnlock()
	fresh := newSegment(l.dir, s.baseSeq, s.file)
	res, err := fresh.scan(sizeBytes, l.opts.IndexIntervalBytes, nextSeq)
	if err != nil {
		return found, fmt.Errorf("storage: verify segment %d: %w", s.baseSeq, err)
	}
	if len(res.damage) > 0 {
		found = append(found, l.recordDamage(s, sizeBytes, nextSeq, truncations, false, fresh, res.damage)...)
	}
	return found, nil
}
