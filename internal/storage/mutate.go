package storage

import (
	"fmt"
	"sort"
)

// TruncateAfter drops every record with a seq above seq, splitting a batch
// if needed; a seq at or above NextSeq-1 changes nothing, and a seq below
// StartSeq-1 returns ErrOutOfRange. Removed segments are gone durably when
// TruncateAfter returns; the truncation of the remaining tail is durable
// after the next Sync (a crash before it may bring the dropped records of
// that segment back). Any I/O failure fails the log.
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
	// Readers must not run while published bytes change.
	l.mu.Lock()
	defer l.mu.Unlock()
	cut := seq + 1 // first seq to drop
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].baseSeq > cut }) - 1
	if cut == l.segments[i].baseSeq && i > 0 {
		i-- // drop the whole segment; the previous one ends at seq
	}
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
	return nil
}

// truncateSegment drops the records of s from cut on and rescans s.
func (l *Log) truncateSegment(s *segment, cut uint64) error {
	off, expectSeq := s.lookup(cut)
	var header [batchHeaderBytes]byte
	for {
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
			// Split the batch: rewrite its first records.
			b := make([]byte, h.totalBytes)
			if err := readFull(s.file, b, off); err != nil {
				return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
			}
			entries, _, err := verifyBatch(h, b, make([]Entry, 0, h.count), nil)
			if err != nil {
				return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
			}
			recs := make([]Record, 0, cut-h.baseSeq)
			for _, e := range entries[:cut-h.baseSeq] {
				recs = append(recs, e.Record)
			}
			keep, err = appendBatch(nil, h.baseSeq, h.epoch, recs, batchBytesLimit, batchBytesLimit)
			if err != nil {
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
	*s = *newSegment(s.baseSeq, s.file)
	s.allocBytes = size
	res, err := s.scan(size, l.opts.IndexIntervalBytes)
	if err != nil {
		return fmt.Errorf("storage: rescan segment %d: %w", s.baseSeq, err)
	}
	if res.validEnd != size || s.nextSeq != cut {
		return fmt.Errorf("%w: segment %d after truncation ends at seq %d: %v", ErrCorrupt, s.baseSeq, s.nextSeq, res.stopErr)
	}
	return nil
}

// ApplyRetention deletes whole sealed segments, oldest first, while the
// log exceeds RetentionBytes or while the oldest segment's records are all
// older than RetentionAgeMs at nowMs (unix milliseconds). It never deletes
// the active segment. Each deletion is durable before the next one starts.
func (l *Log) ApplyRetention(nowMs int64) (segmentsDeleted int, err error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return 0, err
	}
	var totalBytes int64
	for _, s := range l.segments {
		totalBytes += s.sizeBytes
	}
	for len(l.segments) > 1 {
		s := l.segments[0]
		overBytes := l.opts.RetentionBytes > 0 && totalBytes > l.opts.RetentionBytes
		expired := l.opts.RetentionAgeMs > 0 && olderThan(s.maxTimestampMs, nowMs, l.opts.RetentionAgeMs)
		if !overBytes && !expired {
			break
		}
		l.mu.Lock()
		l.segments = l.segments[1:]
		l.mu.Unlock()
		// No reader holds s: readers keep mu read-locked while they use
		// a segment, and s is no longer reachable.
		_ = s.file.Close()
		if err := l.removeSegmentFiles(s.baseSeq); err != nil {
			return segmentsDeleted, l.fail(err)
		}
		if err := l.fsys.SyncDir(l.dir); err != nil {
			return segmentsDeleted, l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
		}
		totalBytes -= s.sizeBytes
		segmentsDeleted++
	}
	return segmentsDeleted, nil
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
