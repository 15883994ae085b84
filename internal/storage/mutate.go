package storage

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// TruncateAfter drops every record with a seq above seq, splitting a batch
// if needed; a seq at or above NextSeq-1 changes nothing, and a seq below
// StartSeq-1 returns ErrOutOfRange. A seq inside a damaged range or at
// its end returns a *CorruptError naming the range and changes nothing:
// the log stays usable (cutOutsideDamage). That holds for damage nobody
// had recorded too: the segment the log will end in is verified up to the
// cut before anything changes, and what that finds is recorded, as Verify
// records it (cutVerifiedFirst). A cut that would keep a damaged range in
// that segment with nothing after it proving it durable is refused alike,
// naming that range (keptDamageProven). Removed segments are gone durably when
// TruncateAfter returns; the truncation of the remaining tail is durable
// after the next Sync (a crash before it may bring the dropped records of
// that segment back). A read failure of that verification returns the
// error and changes nothing; any I/O failure after it fails the log.
func (l *Log) TruncateAfter(seq uint64) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return err
	}
	if seq >= l.nextSeq-1 {
		return nil
	}
	if seq+1 < l.segments[0].baseSeq {
		return fmt.Errorf("%w: truncate after %d below start seq %d", ErrOutOfRange, seq, l.segments[0].baseSeq)
	}
	if err := refuseCutInDamage(l.damage, seq); err != nil {
		return err
	}
	cut := seq + 1 // first seq to drop
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].baseSeq > cut }) - 1
	if cut == l.segments[i].baseSeq && i > 0 {
		i-- // drop the whole segment; the previous one ends at seq
	}
	if err := l.verifyBeforeCut(l.segments[i], cut); err != nil {
		return err
	}
	if err := refuseCutInDamage(l.damage, seq); err != nil {
		return err // damage nobody had recorded: recorded now, refused alike
	}
	if d, ok, err := l.unprovenKept(l.segments[i], cut); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("storage: truncate after %d would end the log with damage at %s offset %d that nothing after proves durable (after %d would drop it): %w",
			seq, d.Segment, d.Offset, d.FirstSeq-1, &CorruptError{Damage: d})
	}
	// Readers must not run while published bytes change.
	l.mu.Lock()
	defer l.mu.Unlock()
	l.truncations++
	// Remove later segments first, durably, so that nothing written after
	// the truncation can ever be followed by a stale segment.
	if i+1 < len(l.segments) {
		for j := len(l.segments) - 1; j > i; j-- {
			s := l.segments[j]
			_ = s.file.Close()
			if err := l.removeSegmentFiles(s.baseSeq); err != nil {
				return l.fail(err)
			}
		}
		l.segments = l.segments[:i+1]
		if err := l.fsys.SyncDir(l.dir); err != nil {
			return l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
		}
		// The new active segment may have an index; it is now stale.
		if err := l.removeFile(indexPath(l.dir, l.segments[i].baseSeq)); err != nil {
			return l.fail(err)
		}
		l.dirDirty = true
	}
	s := l.segments[i]
	if cut < s.nextSeq {
		if err := l.truncateSegment(s, cut); err != nil {
			return l.fail(err)
		}
		l.activeDirty = true
	}
	l.nextSeq = cut
	l.syncedSeq = min(l.syncedSeq, seq)
	l.lastEpoch = l.computeLastEpoch()
	l.damage = keepDamage(l.damage, 0, seq)
	return nil
}

// refuseCutInDamage returns the refusal of a cut after seq inside a
// damaged range of ds or at its end (cutOutsideDamage), nil elsewhere.
func refuseCutInDamage(ds []Damage, seq uint64) error {
	d, ok := damageAround(ds, seq)
	if !ok {
		return nil
	}
	return fmt.Errorf("storage: truncate after %d inside damaged seqs (after %d would drop them whole): %w",
		seq, d.FirstSeq-1, &CorruptError{Damage: d})
}

// verifyBeforeCut verifies, read-only, the part of s that a cut before
// seq cut needs — every batch holding a seq below cut, from the
// segment's start: the batches the cut walks over, the batch it splits,
// the batch it ends the log after — and records the damage it finds, as
// Verify does. s is the segment the log will end in. A read failure
// returns the error and changes nothing. Writer only.
//
// Invariant cutVerifiedFirst: a truncation changes nothing (removes no
// segment, cuts no byte) before it has verified what it keeps at the
// cut. A flip after open in a segment trusted through its index, or in
// the active segment, is known to nobody until read; met midway — a
// batch header that does not decode on the walk, a split batch whose CRC
// fails — it failed the whole log after the later segments were already
// gone, and a cut at the end of such a batch left the log ending in
// damage recorded nowhere, which a reopen took for a torn tail and cut
// with seqs the caller kept. Found first, the damage is recorded and a
// cut inside it or at its end is refused like one inside known damage
// (cutOutsideDamage); a cut elsewhere goes on, stepping over it.
func (l *Log) verifyBeforeCut(s *segment, cut uint64) error {
	// Every batch below cut lies before the first indexed batch that
	// starts at or after it.
	end, limitSeq, rest := s.sizeBytes, s.nextSeq, []indexEntry(nil)
	if j := sort.Search(len(s.index), func(j int) bool { return s.index[j].seq >= cut }); j < len(s.index) {
		end, limitSeq, rest = s.index[j].offset, s.index[j].seq, s.index[j:]
	}
	fresh := newSegment(l.dir, s.baseSeq, s.file)
	res, err := fresh.scan(end, l.opts.IndexIntervalBytes, limitSeq)
	if err != nil {
		return fmt.Errorf("storage: truncate: verify segment %d: %w", s.baseSeq, err)
	}
	if len(res.damage) > 0 {
		l.mu.Lock()
		l.addDamage(s, append(fresh.index, rest...), res.damage)
		l.mu.Unlock()
	}
	return nil
}

// unprovenKept returns a damaged range of s that a cut before seq cut
// keeps with nothing after it that proves it durable, if there is one.
// s is the segment the log will end in. Writer only.
//
// Invariant keptDamageProven: a truncation keeps a damaged range only
// with a batch after it whose synced-through seq proves it durable.
// After the cut s is the log's last segment, which recovery scans as the
// active one: an invalid range there is damage only when a later batch
// says it was synced, and otherwise a torn tail, cut with everything
// after it. A range found in a sealed segment (synced whole at roll)
// needs no such proof while the segment is sealed, and the batches after
// it may have been written before a sync; kept by a cut into that
// segment, the next reopen took it for a torn tail and cut it, with the
// records after it that the truncation kept and a Sync made durable, and
// handed their seqs out again. The truncation is refused instead, naming
// the range; the caller drops it whole.
func (l *Log) unprovenKept(s *segment, cut uint64) (Damage, bool, error) {
	kept := func(d Damage) bool { return d.Segment == s.path && d.FirstSeq < cut }
	if cut <= s.baseSeq || !slices.ContainsFunc(l.damage, kept) {
		return Damage{}, false, nil
	}
	// What s keeps ends with the batch holding cut-1; a split batch
	// keeps the synced-through seq it had.
	off, expectSeq := s.lookup(cut - 1)
	var header [batchHeaderBytes]byte
	for {
		h, err := readBatchHeader(s, off, expectSeq, header[:])
		if err != nil {
			return Damage{}, false, fmt.Errorf("storage: truncate: %w", err)
		}
		off, expectSeq = off+h.totalBytes, h.nextSeq()
		if expectSeq >= cut {
			break
		}
	}
	// Scanned as recovery will scan it: as the log's last segment.
	res, err := newSegment(l.dir, s.baseSeq, s.file).scan(off, l.opts.IndexIntervalBytes, 0)
	if err != nil {
		return Damage{}, false, fmt.Errorf("storage: truncate: verify segment %d: %w", s.baseSeq, err)
	}
	if res.validEnd == off {
		return Damage{}, false, nil
	}
	if i := slices.IndexFunc(l.damage, func(d Damage) bool { return kept(d) && d.Offset == res.validEnd }); i >= 0 {
		return l.damage[i], true, nil
	}
	return Damage{}, false, fmt.Errorf("%w: segment %d up to seq %d ends at offset %d, where no known damage starts: %v",
		ErrCorrupt, s.baseSeq, cut-1, res.validEnd, res.stopErr)
}

// damageAround returns the damaged range of ds that holds seq: a cut
// after seq would end the log inside it or at its end.
//
// Invariant cutOutsideDamage: a truncation drops a damaged range whole or
// keeps it with records after it (that prove it durable:
// keptDamageProven); it never ends the log inside one or at
// its end. A damaged range's bytes are unreadable — where its batches
// begin and end, and what they hold, is unknown — so the log cannot end at
// seq+1 inside it, and cutting lower, at the range's start, would drop
// seqs at or below seq that the caller keeps (a replica appends the next
// entries at seq+1: a log that ended lower would give them other seqs).
// Kept whole at the end of the log, nothing after it would prove it
// durable to recovery, and when it holds no bytes (seqs missing between
// segments) the next append lands where it starts: the reopened log took
// that durable batch for a torn tail and cut it. The truncation is
// refused and changes nothing; the caller drops the range whole (a
// replica truncates after FirstSeq-1 and rebuilds). Such ranges come from
// the scrubber (Verify) and from sealed segments that end early; a cut
// inside one used to fail the log.
func damageAround(ds []Damage, seq uint64) (Damage, bool) {
	for _, d := range ds {
		if d.Seqs() > 0 && d.FirstSeq <= seq && seq <= d.LastSeq {
			return d, true
		}
	}
	return Damage{}, false
}

// truncateSegment drops the records of s from cut on and rescans s.
func (l *Log) truncateSegment(s *segment, cut uint64) error {
	off, expectSeq := s.lookup(cut)
	var header [batchHeaderBytes]byte
	for {
		if expectSeq == cut {
			// The batch at off starts at the cut: cut there without
			// reading it (it may be the first damaged batch).
			if err := s.file.Truncate(off); err != nil {
				return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
			}
			break
		}
		h, err := readBatchHeader(s, off, expectSeq, header[:])
		if err != nil {
			return fmt.Errorf("storage: truncate: %w", err)
		}
		if h.nextSeq() <= cut {
			off += h.totalBytes
			expectSeq = h.nextSeq()
			continue
		}
		var keep []byte
		if h.baseSeq < cut {
			var err error
			if keep, err = splitBatch(s, off, h, cut); err != nil {
				return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
			}
		}
		// Cutting the file (rather than only moving the write position)
		// drops the preallocated tail too: no stale batch may survive
		// after the new end. The next Append preallocates again.
		if err := s.file.Truncate(off); err != nil {
			return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
		}
		if len(keep) > 0 {
			if _, err := s.file.WriteAt(keep, off); err != nil {
				return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
			}
		}
		break
	}
	size, err := s.file.Size()
	if err != nil {
		return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
	}
	*s = *newSegment(l.dir, s.baseSeq, s.file)
	s.allocBytes = size
	// Scanned as a segment that must end at cut: damage below the cut
	// (already known) is stepped over, not taken for a torn tail.
	res, err := s.scan(size, l.opts.IndexIntervalBytes, cut)
	if err != nil {
		return fmt.Errorf("storage: rescan segment %d: %w", s.baseSeq, err)
	}
	if res.validEnd != size || s.nextSeq != cut {
		return fmt.Errorf("%w: segment %d after truncation ends at seq %d: %v", ErrCorrupt, s.baseSeq, s.nextSeq, res.stopErr)
	}
	return nil
}

// splitBatch reads and verifies the batch h at off of s and returns its
// encoding cut before seq cut (h.baseSeq < cut < h.nextSeq()).
//
// Invariant gapSplitStaysAGap: the first seqs of a gap batch (seqs a
// repair dropped) stay a gap. A gap has no records to keep; taking its
// first seqs for records made up empty records where the repair had
// recorded a loss, and readers were served them.
func splitBatch(s *segment, off int64, h batchHeader, cut uint64) ([]byte, error) {
	b := make([]byte, h.totalBytes)
	if err := readFull(s.file, b, off); err != nil {
		return nil, err
	}
	entries, _, err := verifyBatch(h, b, make([]Entry, 0, h.count), nil)
	if err != nil {
		return nil, err
	}
	if h.gap() {
		return appendGapBatch(nil, h.baseSeq, h.epoch, uint32(cut-h.baseSeq)), nil
	}
	recs := make([]Record, 0, cut-h.baseSeq)
	for _, e := range entries[:cut-h.baseSeq] {
		recs = append(recs, e.Record)
	}
	// The shortened batch keeps the claim the original made.
	return appendBatch(nil, h.baseSeq, h.epoch, syncedThrough(h, b), recs, batchBytesLimit, batchBytesLimit)
}

// ApplyRetention deletes whole sealed segments, oldest first, while the
// log exceeds RetentionBytes or while the oldest segment's records are all
// older than RetentionAgeMs at nowMs (unix milliseconds). It never deletes
// the active segment. Each deletion is durable before the next one starts.
func (l *Log) ApplyRetention(nowMs int64) (segmentsDeleted int, err error) {
	return l.DeleteThrough(l.RetentionPoint(nowMs, math.MaxUint64))
}

// SetRetention replaces the log's RetentionAgeMs and RetentionBytes (a
// topic's retention changed); the next retention pass applies them. Any
// goroutine may call it.
func (l *Log) SetRetention(ageMs, bytes int64) error {
	if ageMs < 0 || bytes < 0 {
		return fmt.Errorf("storage: negative retention (age %d ms, %d bytes)", ageMs, bytes)
	}
	l.mu.Lock()
	l.opts.RetentionAgeMs, l.opts.RetentionBytes = ageMs, bytes
	l.mu.Unlock()
	return nil
}

// Retention reports the log's RetentionAgeMs and RetentionBytes.
func (l *Log) Retention() (ageMs, bytes int64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.opts.RetentionAgeMs, l.opts.RetentionBytes
}

// SealExpired seals the active segment (rolls the log) when it holds a
// dated record (a timestamp above 0) and all of its records are older than
// RetentionAgeMs at nowMs, and reports whether it did. Retention deletes
// only sealed segments: without it the last records of a log that stopped
// growing would outlive RetentionAgeMs for good (IdleLogExpires). Undated
// records (a replicated log's control records) never make a segment
// expire on their own, so the records written when retention deletes (a
// dedup carry, a group's checkpoint) do not roll the log again and again.
func (l *Log) SealExpired(nowMs int64) (bool, error) {
	return l.sealIf(func(active *segment) bool {
		return l.opts.RetentionAgeMs > 0 && active.maxTimestampMs > 0 &&
			olderThan(active.maxTimestampMs, nowMs, l.opts.RetentionAgeMs)
	})
}

// Seal seals the active segment (rolls the log) when it holds records, and
// reports whether it did: a replica follows its leader's SealExpired with
// it, so that what the leader appends after its seal starts a segment on
// every replica.
func (l *Log) Seal() (bool, error) {
	return l.sealIf(func(active *segment) bool { return active.nextSeq > active.baseSeq })
}

// sealIf rolls the log when due says so of its active segment.
func (l *Log) sealIf(due func(active *segment) bool) (bool, error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return false, err
	}
	l.mu.RLock()
	sealing := due(l.active())
	l.mu.RUnlock()
	if !sealing {
		return false, nil
	}
	if err := l.roll(); err != nil {
		return false, err
	}
	return true, nil
}

// RetentionPoint is the last seq of the newest sealed segment that
// retention (RetentionBytes, RetentionAgeMs at nowMs) would delete, oldest
// first, without deleting any segment that holds a seq above limit: the
// point DeleteThrough may then delete through. 0 when nothing is due. A
// replicated log passes its replication kernel's retain floor as limit.
func (l *Log) RetentionPoint(nowMs int64, limit uint64) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var totalBytes int64
	for _, s := range l.segments {
		totalBytes += s.sizeBytes
	}
	var point uint64
	for _, s := range l.segments[:len(l.segments)-1] {
		overBytes := l.opts.RetentionBytes > 0 && totalBytes > l.opts.RetentionBytes
		expired := l.opts.RetentionAgeMs > 0 && olderThan(s.maxTimestampMs, nowMs, l.opts.RetentionAgeMs)
		if (!overBytes && !expired) || s.nextSeq-1 > limit {
			break
		}
		point = s.nextSeq - 1
		totalBytes -= s.sizeBytes
	}
	return point
}

// SpanPoint is the last seq with more than bytes of the log after it,
// counting the whole segments after the one that holds it (0: none): a
// reader of the log from a seq at or below it reads more than bytes.
func (l *Log) SpanPoint(bytes int64) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var after int64
	for i := len(l.segments) - 1; i > 0; i-- {
		after += l.segments[i].sizeBytes
		if after > bytes {
			return l.segments[i-1].nextSeq - 1
		}
	}
	return 0
}

// DeleteThrough deletes the sealed segments whose records all have seqs at
// or below seq, oldest first; the active segment stays. Each deletion is
// durable before the next one starts.
func (l *Log) DeleteThrough(seq uint64) (segmentsDeleted int, err error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return 0, err
	}
	for len(l.segments) > 1 && l.segments[0].nextSeq-1 <= seq {
		s := l.segments[0]
		l.mu.Lock()
		l.segments = l.segments[1:]
		l.mu.Unlock()
		// No reader holds s: readers keep mu read-locked while they use
		// a segment, and s is no longer reachable.
		l.mu.Lock()
		l.damage = keepDamage(l.damage, l.segments[0].baseSeq, math.MaxUint64)
		l.mu.Unlock()
		_ = s.file.Close()
		if err := l.removeSegmentFiles(s.baseSeq); err != nil {
			return segmentsDeleted, l.fail(err)
		}
		if err := l.fsys.SyncDir(l.dir); err != nil {
			return segmentsDeleted, l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
		}
		segmentsDeleted++
	}
	return segmentsDeleted, nil
}

// Reset replaces the whole log by an empty one whose first record will get
// startSeq (a replica installing a snapshot at startSeq-1). It removes
// every segment, durably, then creates the new one: a crash in between
// leaves an empty log starting at 1, never a mix of the two, so the caller
// records the reset it intends before and repeats it on restart.
func (l *Log) Reset(startSeq uint64) error {
	if startSeq == 0 {
		return fmt.Errorf("%w: reset to seq 0", ErrOutOfRange)
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.segments) - 1; i >= 0; i-- {
		s := l.segments[i]
		_ = s.file.Close()
		l.segments = l.segments[:i]
		if err := l.removeSegmentFiles(s.baseSeq); err != nil {
			return l.fail(err)
		}
	}
	if err := l.fsys.SyncDir(l.dir); err != nil {
		return l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
	}
	f, err := l.createSegment(startSeq)
	if err != nil {
		return l.fail(fmt.Errorf("storage: create segment %d: %w", startSeq, err))
	}
	l.segments = []*segment{newSegment(l.dir, startSeq, f)}
	if err := l.fsys.SyncDir(l.dir); err != nil {
		return l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
	}
	l.nextSeq, l.syncedSeq, l.lastEpoch = startSeq, startSeq-1, 0
	l.activeDirty, l.dirDirty = false, false
	l.damage = nil
	return nil
}

// olderThan reports whether nowMs - tsMs > ageMs without overflow.
func olderThan(tsMs, nowMs, ageMs int64) bool {
	if tsMs >= nowMs {
		return false
	}
	return uint64(nowMs)-uint64(tsMs) > uint64(ageMs)
}

// Close syncs the log (unless it is failed) and closes its files. It
// returns the sync error, if any; the files are closed either way.
func (l *Log) Close() error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if l.closed {
		return ErrClosed
	}
	var err error
	if l.failedErr == nil {
		err = l.syncLocked()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, s := range l.segments {
		if cerr := s.file.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("storage: close segment %d: %w", s.baseSeq, cerr)
		}
	}
	return err
}

// keepDamage returns the damaged ranges of ds that still hold a seq in
// [from, through], clipped to it (ds is sorted; the result reuses it).
func keepDamage(ds []Damage, from, through uint64) []Damage {
	out := ds[:0]
	for _, d := range ds {
		if d.Seqs() > 0 && (d.LastSeq < from || d.FirstSeq > through) {
			continue
		}
		if d.Seqs() == 0 && (d.FirstSeq < from || d.FirstSeq > through) {
			continue
		}
		d.FirstSeq, d.LastSeq = max(d.FirstSeq, from), min(d.LastSeq, through)
		out = append(out, d)
	}
	return out
}
