package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/nereus-broker/nereus/internal/vfs"
)

const (
	segmentSuffix  = ".log"
	indexSuffix    = ".idx"
	baseNameDigits = 20
	// indexFixedBytes is the index payload before its entries.
	indexFixedBytes = 8 + 8 + 8 + 8 + 8 + 4
	indexEntryBytes = 16
)

// indexEntry maps the base seq of a batch to its file offset.
type indexEntry struct {
	seq    uint64
	offset int64
}

// segment is one segment file. baseSeq and file are immutable while the
// segment is in Log.segments except file, which the writer may replace
// under Log.mu; the other fields but allocBytes are written by the writer
// under Log.mu and read under Log.mu (read or write).
type segment struct {
	baseSeq uint64
	file    vfs.File
	// path is the file's name, for reports.
	path string
	// nextSeq is the seq after the last record published in the segment.
	nextSeq uint64
	// sizeBytes is the published size, the used length of the file:
	// readers never read at or past it.
	sizeBytes int64
	// allocBytes is the size of the file: [sizeBytes, allocBytes) is
	// preallocated zeroes (see Log.preallocate). Only the writer uses it.
	allocBytes int64
	// lastEpoch is the epoch of the last batch, 0 when empty.
	lastEpoch uint64
	// maxTimestampMs is the largest record timestamp, MinInt64 when empty.
	maxTimestampMs int64
	// index holds one entry per IndexIntervalBytes, first at offset 0.
	index []indexEntry
}

func newSegment(dir string, baseSeq uint64, file vfs.File) *segment {
	return &segment{baseSeq: baseSeq, file: file, path: segmentPath(dir, baseSeq), nextSeq: baseSeq, maxTimestampMs: math.MinInt64}
}

// addBatch records a batch written at offset off.
func (s *segment) addBatch(off int64, h batchHeader, indexIntervalBytes int64) {
	if len(s.index) == 0 || off-s.index[len(s.index)-1].offset >= indexIntervalBytes {
		s.index = append(s.index, indexEntry{seq: h.baseSeq, offset: off})
	}
	s.nextSeq = h.nextSeq()
	s.sizeBytes = off + h.totalBytes
	s.lastEpoch = h.epoch
	s.maxTimestampMs = max(s.maxTimestampMs, h.maxTimestampMs)
}

// lookup returns the offset and base seq of the last indexed batch that
// starts at or before seq.
func (s *segment) lookup(seq uint64) (int64, uint64) {
	i := sort.Search(len(s.index), func(i int) bool { return s.index[i].seq > seq })
	if i == 0 {
		return 0, s.baseSeq
	}
	return s.index[i-1].offset, s.index[i-1].seq
}

func baseName(baseSeq uint64) string {
	return fmt.Sprintf("%0*d", baseNameDigits, baseSeq)
}

// parseBaseName parses "<20 digits><suffix>".
func parseBaseName(name, suffix string) (uint64, bool) {
	stem, ok := strings.CutSuffix(name, suffix)
	if !ok || len(stem) != baseNameDigits {
		return 0, false
	}
	v, err := strconv.ParseUint(stem, 10, 64)
	if err != nil || v == 0 {
		return 0, false
	}
	return v, true
}

func segmentPath(dir string, baseSeq uint64) string {
	return filepath.Join(dir, baseName(baseSeq)+segmentSuffix)
}

func indexPath(dir string, baseSeq uint64) string {
	return filepath.Join(dir, baseName(baseSeq)+indexSuffix)
}

// readFull reads len(p) bytes at off, treating a short read as an error.
func readFull(f vfs.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: short read of %d bytes at offset %d", ErrCorrupt, n, off)
	}
	return err
}

// scanResult is where and why a scan stopped.
type scanResult struct {
	validEnd int64
	// stopErr explains why scanning stopped before the end of the file at
	// an invalid batch (nil when it stopped at a zero tail).
	stopErr error
	// zeroTail is set when every byte from validEnd to the end of the file
	// is zero: the preallocated, never written tail of a segment, which
	// ends the log cleanly.
	zeroTail bool
	// damage lists the damaged ranges the scan stepped over: in a sealed
	// segment (limitSeq > 0) every invalid range, in the last segment
	// only those that a later batch proves were durable.
	damage []Damage
	// namedNext, when the scan stopped at an invalid tail, is the seq
	// after the last one a valid batch in that tail named (one after an
	// unproven invalid range); no higher than validEnd's next seq when
	// none did. tornHeader is the invalid last batch's own header when it
	// still decodes at the seq that continues the log (its CRC or its end
	// is what failed), zero otherwise. tornBytes: that batch is at tornAt
	// and its header is not all zeroes (something was written there)
	// (TornTail.LastSeq).
	namedNext  uint64
	tornHeader batchHeader
	tornBytes  bool
	tornAt     int64
}

// tornLastSeq is the last seq the torn tail the scan stopped at named
// (below first, its first seq, when none), the tail in f of fileBytes.
// Its invalid last batch's header counts only when it fits in
// batchBytesMax, as a batch this log wrote does, and its records are read
// no further — a header made up of damage must not have a fill grow
// without bound. A header that no longer decodes where the log expected
// it (a flip into its magic, its length or its base seq) names the most
// records its bytes could hold:
// a flushed batch that a flip made look torn is whole, so its bytes
// bound its records (a torn write's were never acknowledged). A header
// that decodes names its count, or more when more of its records decode
// (recordsWritten).
func (r scanResult) tornLastSeq(f vfs.File, first uint64, fileBytes int64, batchBytesMax int) (uint64, error) {
	next := max(r.namedNext, first)
	switch h := r.tornHeader; {
	case h.gap():
		next = max(next, h.nextSeq())
	case h.count > 0:
		// A length a flip made larger than any batch this log writes
		// leaves the records whole: they are read, as far as a batch of
		// batchBytesMax reaches.
		if h.totalBytes <= int64(batchBytesMax) {
			next = max(next, h.nextSeq())
		}
		n, err := recordsWritten(f, r.tornAt, min(h.totalBytes, int64(batchBytesMax)), h, fileBytes)
		if err != nil {
			return 0, err
		}
		next = max(next, h.baseSeq+n)
	case r.tornBytes:
		end, err := nonZeroEnd(f, r.tornAt, min(fileBytes, r.tornAt+int64(batchBytesMax)))
		if err != nil {
			return 0, err
		}
		if n := (end - r.tornAt - batchOverheadBytes) / recordBytesMin; n > 0 {
			next = max(next, r.namedNext+uint64(n))
		}
	}
	return next - 1, nil
}

// recordsWritten counts the records of the batch with header h at off in
// f (fileBytes long, the batch read as at most batchBytes) that decode
// and start before its last non-zero byte: what was written of it. A
// flip into the count field of a whole batch can leave a count that
// still decodes but names too few records (TornSeqsNotReused); its
// records, read one by one, name them all. A torn write's zeroes after
// what it wrote start no record.
func recordsWritten(f vfs.File, off, batchBytes int64, h batchHeader, fileBytes int64) (uint64, error) {
	b := make([]byte, min(batchBytes, fileBytes-off))
	if err := readFull(f, b, off); err != nil {
		return 0, err
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	d := decoder{b: b[:len(b):len(b)], off: batchHeaderBytes + h.prefixBytes()}
	var n uint64
	for d.off < end {
		if d.record(); d.err != nil {
			break
		}
		n++
	}
	return n, nil
}

// nonZeroEnd is the offset after the last byte of [off, end) of f that
// is not zero (off when there is none).
func nonZeroEnd(f vfs.File, off, end int64) (int64, error) {
	buf := make([]byte, min(end-off, 64<<10))
	last := off
	for at := off; at < end; {
		b := buf[:min(end-at, int64(len(buf)))]
		if err := readFull(f, b, at); err != nil {
			return 0, err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != 0 {
				last = at + int64(i) + 1
				break
			}
		}
		at += int64(len(b))
	}
	return last, nil
}

// scanMark is the state of a segment at the start of an unproven invalid
// range of the last segment, to return to if nothing after it proves it
// was durable (then it is a torn tail).
type scanMark struct {
	off    int64
	seg    segment
	damage Damage
}

// scan validates every batch of s.file from offset 0 up to fileBytes and
// fills s. limitSeq is the base seq of the next segment (0 for the last
// segment).
//
// A scan ends cleanly at the end of the file or at a batch header of all
// zeroes when every byte after it is zero too. At any other invalid batch
// it looks for the next valid batch that continues the segment:
//   - in a sealed segment (synced whole when it was rolled) the invalid
//     bytes are damage; without a valid batch after them the damage runs
//     to the end of the file and the seqs up to limitSeq-1;
//   - in the last segment the invalid bytes are damage only when a later
//     valid batch says (by its synced-through seq) that they were durable
//     when it was written. Otherwise they may be the unsynced end of the
//     log, which a crash tore: the scan stops at the first unproven
//     invalid batch and reports its offset in validEnd (a torn tail,
//     with whatever follows it).
//
// It returns an error only for I/O failures.
func (s *segment) scan(fileBytes, indexIntervalBytes int64, limitSeq uint64) (scanResult, error) {
	var (
		off     int64
		header  [batchHeaderBytes]byte
		buf     []byte
		damage  []Damage
		pending []scanMark // unproven invalid ranges of the last segment
		forceIx bool       // index the next batch: it follows damage
	)
	// stop ends the scan at an invalid batch at off, or at the first
	// unproven one before it.
	// torn is the invalid last batch's header, when it named its seqs
	// (scanResult.tornHeader).
	stop := func(cause error, torn batchHeader, tornBytes bool) scanResult {
		res := scanResult{validEnd: off, stopErr: cause, damage: damage, namedNext: s.nextSeq, tornHeader: torn, tornBytes: tornBytes, tornAt: off}
		if len(pending) > 0 {
			*s = pending[0].seg
			res.validEnd, res.stopErr = pending[0].off, fmt.Errorf("%w: %s", ErrCorrupt, pending[0].damage.Cause)
		}
		return res
	}
	for off < fileBytes {
		n := min(fileBytes-off, batchHeaderBytes)
		if err := readFull(s.file, header[:n], off); err != nil {
			return scanResult{}, err
		}
		var cause error
		if allZero(header[:n]) {
			zero, err := zeroFrom(s.file, off+n, fileBytes, buf)
			if err != nil {
				return scanResult{}, err
			}
			if zero {
				if len(pending) > 0 {
					return stop(nil, batchHeader{}, false), nil
				}
				return scanResult{validEnd: off, zeroTail: true, damage: damage}, nil
			}
			cause = fmt.Errorf("%w: zeroed batch header followed by non-zero bytes", ErrCorrupt)
		}
		var h batchHeader
		if cause == nil {
			h, cause = s.checkBatchHeader(header[:n], fileBytes-off)
		}
		if cause == nil {
			if int64(cap(buf)) < h.totalBytes {
				buf = make([]byte, h.totalBytes)
			}
			b := buf[:h.totalBytes]
			if err := readFull(s.file, b, off); err != nil {
				return scanResult{}, err
			}
			if _, _, err := verifyBatch(h, b, nil, nil); err != nil {
				cause = err
			} else {
				// A batch written after its writer had synced through a
				// pending range's first seq proves that range durable.
				if st := syncedThrough(h, b); len(pending) > 0 && st >= pending[0].damage.FirstSeq {
					for len(pending) > 0 && st >= pending[0].damage.FirstSeq {
						damage = append(damage, pending[0].damage)
						pending = pending[1:]
					}
				}
				if forceIx {
					s.index = append(s.index, indexEntry{seq: h.baseSeq, offset: off})
					forceIx = false
				}
				s.addBatch(off, h, indexIntervalBytes)
				off += h.totalBytes
				continue
			}
		}
		// An invalid batch at off: find what continues the segment, first
		// where its header (if it decoded) says the next batch starts.
		hint := int64(0)
		if h.totalBytes > 0 {
			hint = off + h.totalBytes
		}
		at, next, found, err := nextValidBatch(s.file, off, hint, fileBytes, s.nextSeq, s.lastEpoch, limitSeq)
		if err != nil {
			return scanResult{}, err
		}
		d := Damage{Segment: s.path, Offset: off, Bytes: fileBytes - off, FirstSeq: s.nextSeq, Cause: cause.Error(), epoch: s.lastEpoch}
		if found {
			d.Bytes, d.LastSeq = at-off, next.baseSeq-1
		} else if limitSeq > 0 {
			d.LastSeq = limitSeq - 1
		}
		switch {
		case limitSeq > 0 && !found:
			// A sealed segment whose end is unreadable: the seqs up to
			// the next segment are damaged.
			damage = append(damage, d)
			s.nextSeq, s.sizeBytes = limitSeq, fileBytes
			return scanResult{validEnd: fileBytes, damage: damage}, nil
		case limitSeq > 0:
			damage = append(damage, d)
		case !found:
			if h.baseSeq != s.nextSeq {
				h = batchHeader{}
			}
			return stop(cause, h, !allZero(header[:n])), nil
		default:
			pending = append(pending, scanMark{off: off, seg: *s, damage: d})
			pending[len(pending)-1].seg.index = slices.Clone(s.index)
		}
		off, forceIx = at, true
		s.nextSeq = next.baseSeq
	}
	if len(pending) > 0 {
		return stop(nil, batchHeader{}, false), nil
	}
	return scanResult{validEnd: off, damage: damage}, nil
}

// checkBatchHeader decodes the header of a batch that should continue s
// and has at most remaining bytes of file.
func (s *segment) checkBatchHeader(header []byte, remaining int64) (batchHeader, error) {
	if len(header) < batchHeaderBytes {
		return batchHeader{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(header))
	}
	h, err := decodeBatchHeader(header)
	switch {
	case err != nil:
		return h, err
	case h.totalBytes > remaining:
		return h, fmt.Errorf("%w: batch of %d bytes overruns the file", ErrCorrupt, h.totalBytes)
	case h.baseSeq != s.nextSeq:
		return h, fmt.Errorf("%w: batch base seq %d, want %d", ErrCorrupt, h.baseSeq, s.nextSeq)
	case h.epoch < s.lastEpoch:
		return h, fmt.Errorf("%w: batch epoch %d below %d", ErrCorrupt, h.epoch, s.lastEpoch)
	}
	return h, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// zeroFrom reports whether every byte of f in [off, end) is zero, reading
// through buf (grown as needed). The tail it reads is the active segment's
// preallocation: at most its used length or 1 MiB.
func zeroFrom(f vfs.File, off, end int64, buf []byte) (bool, error) {
	if want := min(end-off, 64<<10); int64(cap(buf)) < want {
		buf = make([]byte, want)
	}
	for off < end {
		b := buf[:min(end-off, int64(cap(buf)))]
		if err := readFull(f, b, off); err != nil {
			return false, err
		}
		if !allZero(b) {
			return false, nil
		}
		off += int64(len(b))
	}
	return true, nil
}

// encodeIndex serializes the sparse index of a sealed segment.
func (s *segment) encodeIndex() []byte {
	b := make([]byte, 0, indexFixedBytes+indexEntryBytes*len(s.index))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.sizeBytes))
	b = binary.LittleEndian.AppendUint64(b, s.baseSeq)
	b = binary.LittleEndian.AppendUint64(b, s.nextSeq)
	b = binary.LittleEndian.AppendUint64(b, s.lastEpoch)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.maxTimestampMs))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.index)))
	for _, e := range s.index {
		b = binary.LittleEndian.AppendUint64(b, e.seq)
		b = binary.LittleEndian.AppendUint64(b, uint64(e.offset))
	}
	return b
}

// decodeIndex fills s from an index payload and checks it against the
// segment's base seq and file size.
func (s *segment) decodeIndex(b []byte, fileBytes int64) error {
	if len(b) < indexFixedBytes {
		return fmt.Errorf("%w: index of %d bytes", ErrCorrupt, len(b))
	}
	size := int64(binary.LittleEndian.Uint64(b[0:]))
	base := binary.LittleEndian.Uint64(b[8:])
	next := binary.LittleEndian.Uint64(b[16:])
	lastEpoch := binary.LittleEndian.Uint64(b[24:])
	maxTimestampMs := int64(binary.LittleEndian.Uint64(b[32:]))
	count := binary.LittleEndian.Uint32(b[40:])
	if size != fileBytes || size == 0 || base != s.baseSeq || next <= base {
		return fmt.Errorf("%w: index does not match segment (size %d/%d, base %d/%d, next %d)",
			ErrCorrupt, size, fileBytes, base, s.baseSeq, next)
	}
	if count == 0 || uint64(len(b)-indexFixedBytes) != uint64(count)*indexEntryBytes {
		return fmt.Errorf("%w: index entry count %d does not match %d bytes", ErrCorrupt, count, len(b))
	}
	index := make([]indexEntry, count)
	for i := range index {
		p := b[indexFixedBytes+i*indexEntryBytes:]
		e := indexEntry{seq: binary.LittleEndian.Uint64(p), offset: int64(binary.LittleEndian.Uint64(p[8:]))}
		if i == 0 && (e.seq != base || e.offset != 0) {
			return fmt.Errorf("%w: first index entry %+v", ErrCorrupt, e)
		}
		if i > 0 && (e.seq <= index[i-1].seq || e.offset <= index[i-1].offset) {
			return fmt.Errorf("%w: index entries out of order", ErrCorrupt)
		}
		if e.seq >= next || e.offset < 0 || e.offset >= size {
			return fmt.Errorf("%w: index entry %+v out of range", ErrCorrupt, e)
		}
		index[i] = e
	}
	s.index, s.nextSeq, s.sizeBytes = index, next, size
	s.lastEpoch, s.maxTimestampMs = lastEpoch, maxTimestampMs
	return nil
}
