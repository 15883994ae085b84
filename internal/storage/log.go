package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// Options configures a Log. Zero values select the defaults.
type Options struct {
	// SegmentBytesMax rolls to a new segment when an append would make the
	// active one exceed it; default 64 MiB. A batch larger than it gets a
	// segment of its own. It also caps the active segment's preallocation.
	SegmentBytesMax int64
	// IndexIntervalBytes is the spacing of sparse index entries; default
	// 4 KiB.
	IndexIntervalBytes int64
	// RetentionBytes bounds the total size of the log for ApplyRetention;
	// 0 = unlimited.
	RetentionBytes int64
	// RetentionAgeMs makes ApplyRetention delete sealed segments whose
	// records are all older than it; 0 = unlimited.
	RetentionAgeMs int64
	// RecordBytesMax bounds one encoded record; default 8 MiB + 64 KiB.
	RecordBytesMax int
	// BatchBytesMax bounds one encoded batch (one Append); default the
	// larger of 16 MiB and one maximal record. At most 1 GiB.
	BatchBytesMax int
	// CachedTailBytes is how much of the log, behind its durable end,
	// Sync leaves in the operating system's page cache; older synced
	// bytes are dropped from it (vfs.File.DropCache), so that a log
	// written faster than it is read reuses its page-cache memory instead
	// of taking fresh pages, which cost a page fault each; default 32 MiB,
	// negative = never drop. Readers of older records read the disk.
	CachedTailBytes int64
	// BeforeTornTailCut, when set, is called by Open with a torn tail
	// before it is cut off; an error fails Open and cuts nothing. A
	// replicated log records there, durably, that it may have lost
	// entries it acknowledged: a flipped bit in the last batch looks
	// exactly like a torn write, and only the cut bytes told them apart.
	BeforeTornTailCut func(TornTail) error
	// DurableThrough is a seq the caller knows the log held durably (a
	// single node's dedup snapshot point: it stands only for synced
	// records). A log that would end below it after recovery lost records
	// that were durable — a bit flip in its last batches, which looks
	// exactly like a torn write, or its end gone — and Open refuses it
	// with a *CorruptError naming the seqs up to DurableThrough, cutting
	// nothing (DurableTailNotTorn); Repair drops them as damage, never
	// to be handed out again. 0: nothing known.
	DurableThrough uint64
	// KeepTornSeqs: a torn tail whose batch headers still name their seqs
	// (TornTail.LastSeq) is replaced by a fill of those seqs instead of
	// cut — gap batches, or copies of Filler — so they are never handed
	// out again. For a log with no other copy: a bit flipped in its
	// acknowledged last batch looks exactly like a torn write, and a
	// reader that went past it (a KV watcher's revision, a consumer's
	// seq) must not find new records there (TornSeqsNotReused). A cut
	// batch whose header no longer decodes names the most records its
	// bytes could hold (a flushed batch is whole); one that decodes names
	// its count, or more when more of its records decode (a flip into
	// its count); one whose header claims a batch larger than
	// BatchBytesMax names only the records that decode within
	// BatchBytesMax (a flip into its length), one of all zeroes none,
	// and a tail that names nothing is cut as before.
	KeepTornSeqs bool
	// Filler, when set, is what a kept torn tail and RepairFilled put at
	// each seq they drop instead of a gap: for a log whose reader applies
	// every seq in turn (a replicated member's kernel), and which knows
	// the filler for what it is.
	Filler *Record
}

const (
	defaultSegmentBytesMax    = 64 << 20
	defaultIndexIntervalBytes = 4 << 10
	defaultRecordBytesMax     = 8<<20 + 64<<10
	defaultBatchBytesMax      = 16 << 20
	defaultCachedTailBytes    = 32 << 20
)

func (o Options) withDefaults() (Options, error) {
	if o.SegmentBytesMax < 0 || o.IndexIntervalBytes < 0 || o.RetentionBytes < 0 ||
		o.RetentionAgeMs < 0 || o.RecordBytesMax < 0 || o.BatchBytesMax < 0 {
		return o, fmt.Errorf("%w: negative value in %+v", ErrInvalidOptions, o)
	}
	if o.SegmentBytesMax == 0 {
		o.SegmentBytesMax = defaultSegmentBytesMax
	}
	if o.IndexIntervalBytes == 0 {
		o.IndexIntervalBytes = defaultIndexIntervalBytes
	}
	if o.RecordBytesMax == 0 {
		o.RecordBytesMax = defaultRecordBytesMax
	}
	if o.BatchBytesMax == 0 {
		o.BatchBytesMax = max(defaultBatchBytesMax, o.RecordBytesMax+batchOverheadBytes)
	}
	if o.CachedTailBytes == 0 {
		o.CachedTailBytes = defaultCachedTailBytes
	}
	if o.BatchBytesMax > batchBytesLimit {
		return o, fmt.Errorf("%w: BatchBytesMax %d exceeds %d", ErrInvalidOptions, o.BatchBytesMax, batchBytesLimit)
	}
	if o.RecordBytesMax+batchOverheadBytes > o.BatchBytesMax {
		return o, fmt.Errorf("%w: RecordBytesMax %d does not fit BatchBytesMax %d", ErrInvalidOptions, o.RecordBytesMax, o.BatchBytesMax)
	}
	return o, nil
}

// Log is the segmented append-only log of one partition replica.
//
// Concurrency: one writer goroutine calls Append, Sync, TruncateAfter,
// ApplyRetention and Close (they are also serialized by a mutex, so misuse
// is safe but slow); any number of goroutines may call Read, StartSeq,
// NextSeq, SyncedSeq and LastEpoch concurrently with the writer.
//
// Errors: a failed write or fsync leaves the log failed; every later writer
// call returns an error matching ErrFailed (and the original cause). Close
// it and Open it again to recover the durable state.
type Log struct {
	fsys vfs.FS
	dir  string
	opts Options

	// writeMu serializes writer methods. Fields below "writer state" are
	// owned by its holder; fields below "published state" are written only
	// by its holder, under mu.
	writeMu sync.Mutex
	// syncMu serializes Sync; it is taken before writeMu, never after.
	syncMu sync.Mutex

	// mu guards the published state against concurrent readers.
	mu sync.RWMutex

	// published state
	segments  []*segment // sorted by baseSeq, contiguous; the last is active
	nextSeq   uint64
	syncedSeq uint64
	lastEpoch uint64
	closed    bool
	// damage lists the known damaged ranges, sorted by FirstSeq: found by
	// recovery or Verify, dropped when truncation, deletion or a reset
	// removes their seqs.
	damage []Damage
	// tornTail is what recovery cut off the last segment, if anything.
	tornTail *TornTail
	// truncations counts the TruncateAfter calls that changed the log:
	// Verify records no damage read before one (recordDamage).
	truncations uint64

	// dropSeg and dropOff: the page cache was last told to drop the log
	// up to dropOff in dropSeg (dropBehind). Guarded by syncMu.
	dropSeg   *segment
	dropOff   int64
	dropSpans []dropSpan // dropBehind's scratch

	// writer state
	failedErr   error
	activeDirty bool // the active segment has unsynced writes
	dirDirty    bool // the directory has unsynced creates or removes
	encodeBuf   []byte
}

// Open opens the log in dir, creating dir if needed, and recovers it: torn
// or invalid tails are truncated and the recovered state is synced.
func Open(fsys vfs.FS, dir string, opts Options) (*Log, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := fsys.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", dir, err)
	}
	if err := fsys.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("%w: parent of %s: %w", ErrSyncFailed, dir, err)
	}
	l := &Log{fsys: fsys, dir: dir, opts: opts}
	if err := l.recover(); err != nil {
		for _, s := range l.segments {
			_ = s.file.Close()
		}
		return nil, err
	}
	return l, nil
}

// recover loads the segments of l.dir.
func (l *Log) recover() error {
	names, err := l.fsys.List(l.dir)
	if err != nil {
		return fmt.Errorf("storage: list %s: %w", l.dir, err)
	}
	var bases []uint64
	hasIndex := map[uint64]bool{}
	for _, name := range names {
		if base, ok := parseBaseName(name, segmentSuffix); ok {
			bases = append(bases, base)
		} else if base, ok := parseBaseName(name, indexSuffix); ok {
			hasIndex[base] = true
		} else if filepath.Ext(name) == tmpSuffix {
			if err := l.removeFile(filepath.Join(l.dir, name)); err != nil {
				return err
			}
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	for base := range hasIndex {
		if i := sort.Search(len(bases), func(i int) bool { return bases[i] >= base }); i == len(bases) || bases[i] != base {
			if err := l.removeFile(indexPath(l.dir, base)); err != nil {
				return err
			}
		}
	}

	var scanned []*segment
	dropFrom := len(bases)
	for i, base := range bases {
		last := i == len(bases)-1
		var limitSeq uint64 // the next segment's base: where this one must end
		if !last {
			limitSeq = bases[i+1]
		}
		if i > 0 {
			prev := l.segments[i-1]
			if base < prev.nextSeq {
				dropFrom = i // overlaps its predecessor: not a continuation
				break
			}
			if base > prev.nextSeq {
				// The predecessor (trusted through its index) ends early:
				// the seqs in between are missing.
				l.damage = append(l.damage, Damage{Segment: prev.path, Offset: prev.sizeBytes,
					FirstSeq: prev.nextSeq, LastSeq: base - 1, Cause: "seqs missing between segments", epoch: prev.lastEpoch})
				prev.nextSeq = base
			}
		}
		f, err := l.fsys.OpenRW(segmentPath(l.dir, base))
		if err != nil {
			return fmt.Errorf("storage: open segment: %w", err)
		}
		s := newSegment(l.dir, base, f)
		l.segments = append(l.segments, s)
		size, err := f.Size()
		if err != nil {
			return fmt.Errorf("storage: size of segment %d: %w", base, err)
		}
		s.allocBytes = size
		if !last && hasIndex[base] {
			if data, err := ReadFileAtomic(l.fsys, indexPath(l.dir, base)); err == nil {
				if s.decodeIndex(data, size) == nil {
					continue
				}
				*s = *newSegment(l.dir, base, f)
				s.allocBytes = size
			}
		}
		if err := l.scanSegment(s, size, limitSeq); err != nil {
			return err
		}
		scanned = append(scanned, s)
		if !last {
			if err := f.Sync(); err != nil {
				return fmt.Errorf("%w: segment %d: %w", ErrSyncFailed, base, err)
			}
			if err := WriteFileAtomic(l.fsys, indexPath(l.dir, base), s.encodeIndex()); err != nil {
				return err
			}
		}
	}
	if n := len(l.segments); l.opts.DurableThrough > 0 && (n == 0 || l.segments[n-1].nextSeq <= l.opts.DurableThrough) {
		// Segments that do not continue the log, or none at all: what
		// remains ends below what was durable.
		d := noSegmentsLeft(l.dir, l.opts.DurableThrough)
		if n > 0 {
			last := l.segments[n-1]
			d = durableTailLost(last, last.sizeBytes, last.sizeBytes, l.opts.DurableThrough)
		}
		return &CorruptError{Damage: d}
	}
	// Delete what does not continue the recovered log, newest first.
	for i := len(bases) - 1; i >= dropFrom; i-- {
		if err := l.removeSegmentFiles(bases[i]); err != nil {
			return err
		}
	}
	if len(l.segments) == 0 {
		f, err := l.createSegment(1)
		if err != nil {
			return fmt.Errorf("storage: create first segment: %w", err)
		}
		l.segments = append(l.segments, newSegment(l.dir, 1, f))
		scanned = append(scanned, l.segments[0])
	}
	active := l.segments[len(l.segments)-1]
	if len(scanned) == 0 || scanned[len(scanned)-1] != active {
		// The active segment was loaded from its index (the segments
		// after it were dropped); scan it anyway as the last segment.
		size := active.sizeBytes
		*active = *newSegment(l.dir, active.baseSeq, active.file)
		active.allocBytes = size
		if err := l.scanSegment(active, size, 0); err != nil {
			return err
		}
		scanned = append(scanned, active)
	}
	// The active segment never has an index file.
	if err := l.removeFile(indexPath(l.dir, active.baseSeq)); err != nil {
		return err
	}
	// Make the recovered state durable before anyone relies on it.
	for _, s := range scanned {
		if err := s.file.Sync(); err != nil {
			return fmt.Errorf("%w: segment %d: %w", ErrSyncFailed, s.baseSeq, err)
		}
	}
	if err := l.fsys.SyncDir(l.dir); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err)
	}
	l.nextSeq = active.nextSeq
	l.syncedSeq = l.nextSeq - 1
	l.lastEpoch = l.computeLastEpoch()
	return nil
}

// scanSegment scans s (fileBytes long) during recovery and records what
// it found: damage, or a torn tail that it cuts off. A zero tail is
// unused preallocated space: the last segment (limitSeq 0) keeps it for
// its next appends, an earlier one (whose trim at roll was not durable) is
// trimmed.
func (l *Log) scanSegment(s *segment, fileBytes int64, limitSeq uint64) error {
	res, err := s.scan(fileBytes, l.opts.IndexIntervalBytes, limitSeq)
	if err != nil {
		return fmt.Errorf("storage: scan segment %d: %w", s.baseSeq, err)
	}
	l.damage = append(l.damage, res.damage...)
	if limitSeq == 0 && s.nextSeq <= l.opts.DurableThrough {
		return &CorruptError{Damage: durableTailLost(s, res.validEnd, fileBytes, l.opts.DurableThrough)}
	}
	if res.validEnd == fileBytes || (res.zeroTail && limitSeq == 0) {
		return nil
	}
	var torn *TornTail
	if !res.zeroTail {
		if torn, err = l.describeTornTail(s, res, fileBytes); err != nil {
			return err
		}
		if l.opts.BeforeTornTailCut != nil {
			if err := l.opts.BeforeTornTailCut(*torn); err != nil {
				return fmt.Errorf("storage: before cutting the torn tail of segment %d: %w", s.baseSeq, err)
			}
		}
		if torn.Kept {
			l.tornTail = torn
			return l.fillTornTail(s, *torn)
		}
	}
	if err := s.file.Truncate(res.validEnd); err != nil {
		return fmt.Errorf("storage: truncate segment %d: %w", s.baseSeq, err)
	}
	s.allocBytes = res.validEnd
	if torn != nil {
		l.tornTail = torn
	}
	return nil
}

// describeTornTail describes the torn tail of the last segment s that a scan
// (res) stopped at.
func (l *Log) describeTornTail(s *segment, res scanResult, fileBytes int64) (*TornTail, error) {
	var prev *segment
	if len(l.segments) > 1 {
		prev = l.segments[len(l.segments)-2]
	}
	return newTornTail(s, prev, res, fileBytes, l.opts)
}

// newTornTail describes the torn tail of segment s (fileBytes long) that a
// scan (res) stopped at; prev is the segment before s, if any. Open and
// Repair both describe it so: the seqs it names, the epoch a fill takes
// (the batch before it, prev's last when s holds none), and whether the
// seqs are kept.
func newTornTail(s, prev *segment, res scanResult, fileBytes int64, opts Options) (*TornTail, error) {
	last, err := res.tornLastSeq(s.file, s.nextSeq, fileBytes, opts.BatchBytesMax)
	if err != nil {
		return nil, fmt.Errorf("storage: read the torn tail of segment %d: %w", s.baseSeq, err)
	}
	t := &TornTail{Segment: s.path, Offset: res.validEnd, Bytes: fileBytes - res.validEnd, FirstSeq: s.nextSeq,
		LastSeq: last, epoch: s.lastEpoch}
	if s.nextSeq == s.baseSeq && prev != nil {
		t.epoch = prev.lastEpoch // s holds no batch before the cut
	}
	t.Kept = opts.KeepTornSeqs && t.Named()
	return t, nil
}

// fillTornTail replaces the torn tail t of the last segment s by its fill
// (Options.KeepTornSeqs). The segment is rewritten whole and renamed over
// the old one, so that a crash leaves the torn tail, filled again by the
// next open, or the fill; never the seqs free.
func (l *Log) fillTornTail(s *segment, t TornTail) error {
	fill, err := t.fill(l.opts.Filler)
	if err != nil {
		return fmt.Errorf("storage: fill the torn tail of segment %d: %w", s.baseSeq, err)
	}
	if err := cutSegment(l.fsys, l.dir, s, t.Offset, fill); err != nil {
		return err
	}
	_ = s.file.Close()
	if s.file, err = l.fsys.OpenRW(s.path); err != nil {
		return fmt.Errorf("storage: open segment: %w", err)
	}
	for off := 0; off < len(fill); {
		h, err := decodeBatchHeader(fill[off:])
		if err != nil {
			return fmt.Errorf("storage: the torn tail's fill: %w", err)
		}
		s.addBatch(t.Offset+int64(off), h, l.opts.IndexIntervalBytes)
		off += int(h.totalBytes)
	}
	s.allocBytes = s.sizeBytes
	return nil
}

// durableTailLost is the damage of a last segment s that ends (its valid
// batches, validEnd of fileBytes) below durableThrough
// (Options.DurableThrough).
func durableTailLost(s *segment, validEnd, fileBytes int64, durableThrough uint64) Damage {
	return Damage{Segment: s.path, Offset: validEnd, Bytes: fileBytes - validEnd, FirstSeq: s.nextSeq, LastSeq: durableThrough,
		Cause: fmt.Sprintf("the log ends at seq %d, below seq %d known durable (not a torn write)", s.nextSeq-1, durableThrough),
		epoch: s.lastEpoch}
}

// noSegmentsLeft is the damage of a log directory without a segment whose
// seqs up to durableThrough were durable.
func noSegmentsLeft(dir string, durableThrough uint64) Damage {
	return Damage{Segment: dir, FirstSeq: 1, LastSeq: durableThrough,
		Cause: fmt.Sprintf("no segment holds seqs up to %d, known durable", durableThrough)}
}

// createSegment creates the file of a new, empty segment, opened for
// positional writes. The name is normally unused; a leftover is emptied.
func (l *Log) createSegment(base uint64) (vfs.File, error) {
	f, err := l.fsys.OpenRW(segmentPath(l.dir, base))
	if err != nil {
		return nil, err
	}
	size, err := f.Size()
	if err == nil && size > 0 {
		err = f.Truncate(0)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// removeFile removes name, ignoring a missing file.
func (l *Log) removeFile(name string) error {
	if err := l.fsys.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("storage: remove %s: %w", name, err)
	}
	return nil
}

// removeSegmentFiles removes a segment's index and log files.
func (l *Log) removeSegmentFiles(base uint64) error {
	if err := l.removeFile(indexPath(l.dir, base)); err != nil {
		return err
	}
	return l.removeFile(segmentPath(l.dir, base))
}

func (l *Log) computeLastEpoch() uint64 {
	for i := len(l.segments) - 1; i >= 0; i-- {
		if l.segments[i].nextSeq > l.segments[i].baseSeq {
			return l.segments[i].lastEpoch
		}
	}
	return 0
}

func (l *Log) active() *segment { return l.segments[len(l.segments)-1] }

// writerCheck returns the error a writer method must fail with, if any.
func (l *Log) writerCheck() error {
	if l.closed {
		return ErrClosed
	}
	if l.failedErr != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.failedErr)
	}
	return nil
}

// fail records err as the reason the log is failed and returns it.
func (l *Log) fail(err error) error {
	if l.failedErr == nil {
		l.failedErr = err
	}
	return err
}

// Append writes recs as one batch with the given leader epoch and returns
// the seq of its first record. The batch is not synced: call Sync.
func (l *Log) Append(epoch uint64, recs []Record) (firstSeq uint64, err error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.writerCheck(); err != nil {
		return 0, err
	}
	if epoch < l.lastEpoch {
		return 0, fmt.Errorf("%w: epoch %d, last epoch %d", ErrEpochRegression, epoch, l.lastEpoch)
	}
	base := l.nextSeq
	if uint64(len(recs)) > math.MaxUint32 || base > math.MaxUint64-uint64(len(recs)) {
		return 0, fmt.Errorf("%w: %d records at seq %d", ErrBatchTooLarge, len(recs), base)
	}
	l.mu.RLock()
	synced := l.syncedSeq
	l.mu.RUnlock()
	buf, err := appendBatch(l.encodeBuf[:0], base, epoch, synced, recs, l.opts.RecordBytesMax, l.opts.BatchBytesMax)
	if err != nil {
		return 0, err
	}
	if cap(buf) <= encodeBufferBytesMax {
		l.encodeBuf = buf
	}
	h, err := decodeBatchHeader(buf)
	if err != nil {
		panic(fmt.Sprintf("storage: encoded batch fails to decode: %v", err))
	}
	active := l.active()
	if active.sizeBytes > 0 && active.sizeBytes+h.totalBytes > l.opts.SegmentBytesMax {
		if err := l.roll(); err != nil {
			return 0, err
		}
		active = l.active()
	}
	if end := active.sizeBytes + h.totalBytes; end > active.allocBytes {
		// Before the write, so that a failed Append wrote nothing.
		if err := l.preallocate(active, end); err != nil {
			return 0, l.fail(fmt.Errorf("storage: preallocate segment %d: %w", active.baseSeq, err))
		}
	}
	n, err := active.file.WriteAt(buf, active.sizeBytes)
	if err == nil && n != len(buf) {
		err = fmt.Errorf("short write of %d of %d bytes", n, len(buf))
	}
	if err != nil {
		return 0, l.fail(fmt.Errorf("storage: append to segment %d: %w", active.baseSeq, err))
	}
	l.activeDirty = true
	l.mu.Lock()
	active.addBatch(active.sizeBytes, h, l.opts.IndexIntervalBytes)
	l.nextSeq = h.nextSeq()
	l.lastEpoch = epoch
	l.mu.Unlock()
	return base, nil
}

// preallocBytesMax bounds how far past its used length the active segment
// is preallocated.
const preallocBytesMax = 1 << 20

// largeBatchBytes: a batch at least this long is preallocated up to its
// own end and no further. The zeroes written ahead of a log's end reach
// the disk with the next fdatasync (it flushes every dirty page of the
// file) and are written again when records land on them. Small appends
// pay that once per step, and in return most of their fdatasyncs need not
// flush a new file size. A large batch grows the file every few appends
// anyway, and its fdatasync is long enough that a new size is a small part
// of it: at 64 KiB records the zeroes ahead made an r3 cluster write 8%
// more to the disk, for nothing (docs/PERFORMANCE.md, Round 15).
const largeBatchBytes = 256 << 10

// preallocate grows the file of s, whose next batch will end at end, with
// zeroes up to end and past it: by as many bytes as the segment will use,
// at most preallocBytesMax, and not past SegmentBytesMax; a large batch
// (largeBatchBytes) only up to end. Appends then write inside the file
// instead of growing it, and their fdatasync need not flush the file's
// size (see vfs.File.Allocate). The step follows the used length so that
// a small log stays small; a big segment grows once per MiB. An empty
// segment (a new log, a new ledger) takes no space.
func (l *Log) preallocate(s *segment, end int64) error {
	size := end
	if end-s.sizeBytes < largeBatchBytes {
		size = max(end, min(end+min(end, preallocBytesMax), l.opts.SegmentBytesMax))
	}
	if err := s.file.Allocate(size); err != nil {
		return err
	}
	s.allocBytes = size
	return nil
}

// roll seals the active segment (trim its preallocated tail, sync, persist
// its index) and starts a new one. Any failure fails the log.
func (l *Log) roll() error {
	old := l.active()
	if old.allocBytes > old.sizeBytes {
		// A sealed segment holds exactly its batches: its size on disk
		// is its used length, as its index records.
		if err := old.file.Truncate(old.sizeBytes); err != nil {
			return l.fail(fmt.Errorf("storage: trim segment %d: %w", old.baseSeq, err))
		}
		old.allocBytes = old.sizeBytes
		l.activeDirty = true
	}
	if l.activeDirty {
		if err := old.file.Sync(); err != nil {
			return l.fail(fmt.Errorf("%w: segment %d: %w", ErrSyncFailed, old.baseSeq, err))
		}
		l.activeDirty = false
	}
	f, err := l.createSegment(l.nextSeq)
	if err != nil {
		return l.fail(fmt.Errorf("storage: create segment %d: %w", l.nextSeq, err))
	}
	// WriteFileAtomic ends with SyncDir, which also makes the new
	// segment's creation (and any earlier namespace change) durable.
	if err := WriteFileAtomic(l.fsys, indexPath(l.dir, old.baseSeq), old.encodeIndex()); err != nil {
		_ = f.Close()
		return l.fail(err)
	}
	l.dirDirty = false
	l.mu.Lock()
	l.segments = append(l.segments, newSegment(l.dir, l.nextSeq, f))
	l.syncedSeq = l.nextSeq - 1
	l.mu.Unlock()
	return nil
}

// Sync makes every appended record durable: it fsyncs the active segment
// and, when segments were created or removed since the last Sync, the
// directory. A failure matches ErrSyncFailed (and the underlying error)
// and fails the log.
//
// Sync does not block Append while the fsync runs (group commit pipelines
// the next batch's write with this batch's fsync); it makes durable what
// was appended before it was called. Concurrent Syncs are serialized.
func (l *Log) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.writeMu.Lock()
	if err := l.writerCheck(); err != nil {
		l.writeMu.Unlock()
		return err
	}
	target := l.nextSeq - 1
	active, fileDirty, dirDirty := l.active(), l.activeDirty, l.dirDirty
	syncedBytes := active.sizeBytes
	l.activeDirty, l.dirDirty = false, false
	l.writeMu.Unlock()

	var err error
	if fileDirty {
		if serr := active.file.Sync(); serr != nil {
			err = fmt.Errorf("%w: segment %d: %w", ErrSyncFailed, active.baseSeq, serr)
		}
	}
	if err == nil && dirDirty {
		if serr := l.fsys.SyncDir(l.dir); serr != nil {
			err = fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, serr)
		}
	}
	if err != nil {
		l.writeMu.Lock()
		defer l.writeMu.Unlock()
		return l.fail(err)
	}
	l.mu.Lock()
	l.syncedSeq = max(l.syncedSeq, target)
	l.mu.Unlock()
	l.dropBehind(active, syncedBytes)
	return nil
}

// dropStepBytes: dropBehind waits until this much can go, so that a log
// of small appends makes one DropCache call per few MiB, not per Sync.
const dropStepBytes = 4 << 20

// dropBehind tells the page cache to drop what lies more than
// CachedTailBytes behind the durable end: synced, the length of active
// that the last fsync covered. Everything before it is durable: sealed
// segments were synced when they rolled. A failed DropCache loses
// nothing (a hint), so its error is not the log's. Called under syncMu.
func (l *Log) dropBehind(active *segment, synced int64) {
	if l.opts.CachedTailBytes < 0 {
		return
	}
	off := l.dropOff
	spans := l.dropSpans[:0]
	l.mu.RLock()
	last := lastIndex(l.segments, active)
	first := lastIndex(l.segments, l.dropSeg)
	if first < 0 || first > last {
		first, off = 0, 0 // the first drop, or the log was reset or trimmed past dropSeg
	}
	if last >= 0 {
		for _, s := range l.segments[first:last] {
			spans = append(spans, dropSpan{s, s.sizeBytes})
		}
	}
	l.mu.RUnlock()
	if last < 0 {
		return // rolled and retired meanwhile: the next Sync drops
	}
	spans = append(spans, dropSpan{active, synced})
	l.dropSpans = spans
	off = min(off, spans[0].end) // a truncation may have cut below it
	l.dropSeg, l.dropOff = spans[0].s, off
	behind := -off
	for _, sp := range spans {
		behind += sp.end
	}
	excess := behind - l.opts.CachedTailBytes
	if excess < dropStepBytes {
		return
	}
	for i, sp := range spans {
		if i > 0 {
			off = 0
		}
		n := min(sp.end-off, excess)
		if n > 0 {
			_ = sp.s.file.DropCache(off, n)
			off += n
			excess -= n
		}
		if excess == 0 || i == len(spans)-1 {
			l.dropSeg, l.dropOff = sp.s, off
			return
		}
	}
}

// dropSpan is a segment and how far dropBehind may drop it.
type dropSpan struct {
	s   *segment
	end int64
}

// lastIndex is slices.Index searching from the end, where the active
// segment and the one dropBehind reached usually are: O(1) per Sync
// however many segments the log keeps.
func lastIndex(segments []*segment, s *segment) int {
	for i := len(segments) - 1; i >= 0; i-- {
		if segments[i] == s {
			return i
		}
	}
	return -1
}

func (l *Log) syncLocked() error {
	target := l.nextSeq - 1
	if l.activeDirty {
		active := l.active()
		if err := active.file.Sync(); err != nil {
			return l.fail(fmt.Errorf("%w: segment %d: %w", ErrSyncFailed, active.baseSeq, err))
		}
		l.activeDirty = false
	}
	if l.dirDirty {
		if err := l.fsys.SyncDir(l.dir); err != nil {
			return l.fail(fmt.Errorf("%w: %s: %w", ErrSyncFailed, l.dir, err))
		}
		l.dirDirty = false
	}
	l.mu.Lock()
	l.syncedSeq = target
	l.mu.Unlock()
	return nil
}

// SyncedSeq returns the last seq known durable (0 if none).
func (l *Log) SyncedSeq() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.syncedSeq
}

// StartSeq returns the oldest retained seq; it equals NextSeq when the log
// is empty.
func (l *Log) StartSeq() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segments) == 0 {
		return l.nextSeq
	}
	return l.segments[0].baseSeq
}

// NextSeq returns the seq the next appended record gets.
func (l *Log) NextSeq() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.nextSeq
}

// LastEpoch returns the epoch of the last batch in the log, 0 if the log
// holds none.
func (l *Log) LastEpoch() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.lastEpoch
}

// Read returns entries from fromSeq on, at most maxRecords and at most
// maxBytes of encoded records, but always at least one entry when
// fromSeq < NextSeq (values below 1 act as 1 record). The entries are
// contiguous and start at fromSeq. fromSeq == NextSeq returns no entries;
// fromSeq below StartSeq or above NextSeq returns ErrOutOfRange. A fromSeq
// inside a gap (seqs a repair dropped) returns a *GapError naming where
// the gap ends, and a read that reaches a gap ends before it. A fromSeq
// inside a known damaged range returns a *CorruptError; a read that
// reaches one ends before it. Every batch is CRC-verified: a damaged
// batch returns an error matching ErrCorrupt if it is the first one
// needed, and otherwise ends the result just before it. Returned records
// alias buffers owned by the caller.
func (l *Log) Read(fromSeq uint64, maxRecords int, maxBytes int) ([]Entry, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.readableFrom(fromSeq); err != nil {
		return nil, err
	}
	endSeq := l.nextSeq // the read stops before endSeq
	for _, d := range l.damage {
		if d.Seqs() == 0 || d.LastSeq < fromSeq {
			continue
		}
		if d.FirstSeq <= fromSeq {
			return nil, &CorruptError{Damage: d}
		}
		endSeq = d.FirstSeq
		break
	}
	maxRecords = max(maxRecords, 1)
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].baseSeq > fromSeq }) - 1
	var (
		out        []Entry
		totalBytes int
		seq        = fromSeq
		header     [batchHeaderBytes]byte
	)
	for ; i < len(l.segments) && seq < endSeq; i++ {
		s := l.segments[i]
		off, expectSeq := s.lookup(seq)
		for off < s.sizeBytes && seq < s.nextSeq && seq < endSeq {
			h, err := readBatchHeader(s, off, expectSeq, header[:])
			if err != nil {
				return readResult(out, err)
			}
			if h.nextSeq() <= seq {
				off += h.totalBytes
				expectSeq = h.nextSeq()
				continue
			}
			if h.gap() {
				if len(out) > 0 {
					return out, nil
				}
				return nil, &GapError{Next: h.nextSeq()}
			}
			b := make([]byte, h.totalBytes)
			if err := readFull(s.file, b, off); err != nil {
				return readResult(out, fmt.Errorf("storage: read segment %d at %d: %w", s.baseSeq, off, err))
			}
			entries, sizes, err := verifyBatch(h, b, make([]Entry, 0, h.count), make([]int, 0, h.count))
			if err != nil {
				return readResult(out, fmt.Errorf("storage: segment %d offset %d: %w", s.baseSeq, off, err))
			}
			for j, e := range entries {
				if e.Seq < seq {
					continue
				}
				if len(out) > 0 && (len(out) >= maxRecords || totalBytes+sizes[j] > maxBytes) {
					return out, nil
				}
				out = append(out, e)
				totalBytes += sizes[j]
			}
			seq = h.nextSeq()
			off += h.totalBytes
			expectSeq = seq
		}
		if seq < s.nextSeq && seq < endSeq {
			return readResult(out, fmt.Errorf("%w: segment %d ends before seq %d", ErrCorrupt, s.baseSeq, s.nextSeq))
		}
	}
	return out, nil
}

// readableFrom checks that a read may start at fromSeq (under l.mu).
func (l *Log) readableFrom(fromSeq uint64) error {
	if l.closed {
		return ErrClosed
	}
	if len(l.segments) == 0 {
		return fmt.Errorf("%w: no segment left (a reset failed)", ErrFailed)
	}
	if start := l.segments[0].baseSeq; fromSeq < start || fromSeq > l.nextSeq {
		return fmt.Errorf("%w: seq %d outside [%d, %d]", ErrOutOfRange, fromSeq, start, l.nextSeq)
	}
	return nil
}

// Damage returns the known damaged ranges of the log, sorted by FirstSeq:
// those recovery found, and those Verify found since. A log with damage
// still appends (after its last valid record, never reusing a seq); the
// caller decides whether it may.
func (l *Log) Damage() []Damage {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return slices.Clone(l.damage)
}

// TornTail returns what Open cut off the end of the log, if anything.
func (l *Log) TornTail() (TornTail, bool) {
	if l.tornTail == nil {
		return TornTail{}, false
	}
	return *l.tornTail, true
}

// readResult returns the entries read so far, or err if there are none.
func readResult(out []Entry, err error) ([]Entry, error) {
	if len(out) > 0 {
		return out, nil
	}
	return nil, err
}

// readBatchHeader reads and checks the header of the batch at off, which
// must start at expectSeq and lie within the published part of s.
func readBatchHeader(s *segment, off int64, expectSeq uint64, buf []byte) (batchHeader, error) {
	if s.sizeBytes-off < batchHeaderBytes {
		return batchHeader{}, fmt.Errorf("%w: segment %d offset %d: truncated batch header", ErrCorrupt, s.baseSeq, off)
	}
	if err := readFull(s.file, buf, off); err != nil {
		return batchHeader{}, fmt.Errorf("storage: read segment %d at %d: %w", s.baseSeq, off, err)
	}
	h, err := decodeBatchHeader(buf)
	if err != nil {
		return batchHeader{}, fmt.Errorf("storage: segment %d offset %d: %w", s.baseSeq, off, err)
	}
	if h.baseSeq != expectSeq || h.totalBytes > s.sizeBytes-off || h.nextSeq() > s.nextSeq {
		return batchHeader{}, fmt.Errorf("%w: segment %d offset %d: batch [%d, %d) of %d bytes does not fit (want seq %d)",
			ErrCorrupt, s.baseSeq, off, h.baseSeq, h.nextSeq(), h.totalBytes, expectSeq)
	}
	return h, nil
}
