package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Header is an application header of a record.
type Header struct {
	Key   string
	Value []byte
}

// Record is one message. Decoded records alias the buffer they were read
// into; zero-length Key and Value decode as nil.
type Record struct {
	// TimestampMs is the producer or broker time in unix milliseconds.
	TimestampMs int64
	Key, Value  []byte
	Headers     []Header
	// ProducerID identifies an idempotent producer; 0 = not idempotent.
	ProducerID uint64
	// ProducerSeq is the producer's sequence number for this record.
	ProducerSeq uint64
}

// Entry is a record with its position in the log.
type Entry struct {
	// Seq is the record's 1-based sequence number.
	Seq uint64
	// Epoch is the leader epoch of the batch that holds the record.
	Epoch  uint64
	Record Record
}

const (
	batchMagic = 0xB7
	// Batch format versions. Version 1 (written before the synced-through
	// prefix existed) is still read. Version 2 starts its body with the
	// writer's synced-through seq. A gap batch has no body: its count
	// names seqs that a repair dropped on purpose.
	batchVersionV1  = 1
	batchVersionV2  = 2
	batchVersionGap = 3
	// syncedThroughBytes is the size of a version-2 body's prefix.
	syncedThroughBytes = 8
	// batchOverheadBytes is what a version-2 batch adds to its records.
	batchOverheadBytes = batchHeaderBytes + syncedThroughBytes
	// batchHeaderBytes is the size of the fixed batch header.
	batchHeaderBytes = 38
	// batchCRCOffset is where the CRC field starts; the CRC covers
	// everything after it.
	batchCRCOffset = 6
	batchCRCEnd    = 10
	// batchBytesLimit bounds one encoded batch, header included. It is a
	// property of the format, not of Options, so that recovery never
	// rejects a batch written under other Options.
	batchBytesLimit = 1 << 30
	// recordBytesMin is the encoding of a record with no key, value or
	// headers.
	recordBytesMin = 8 + 8 + 8 + 4 + 4 + 4
	headerBytesMin = 4 + 4
)

// encodeBufferBytesMax is the largest batch encoding buffer a Log keeps
// for its next Append; a larger batch is encoded into a new buffer.
const encodeBufferBytesMax = 1 << 20

// BatchRecordBytesReused bounds the records (their encoded size together,
// RecordBytes) of a batch that a Log encodes in the buffer it keeps: a
// writer that cuts its batches there allocates no encoding buffer per
// Append.
const BatchRecordBytesReused = encodeBufferBytesMax - batchOverheadBytes

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// batchHeader is the decoded fixed header of a batch.
type batchHeader struct {
	// totalBytes is the size of the whole batch, header included.
	totalBytes     int64
	crc            uint32
	baseSeq        uint64
	epoch          uint64
	count          uint32
	maxTimestampMs int64
	version        byte
}

// gap reports whether h is a gap batch (seqs dropped by a repair).
func (h batchHeader) gap() bool { return h.version == batchVersionGap }

// nextSeq returns the seq after the last record of the batch.
func (h batchHeader) nextSeq() uint64 { return h.baseSeq + uint64(h.count) }

// appendBatch appends the encoding of recs as one version-2 batch to dst.
// syncedThrough is the writer's last durable seq when it wrote the batch:
// recovery trusts a damaged range below it to have been durable (so it is
// corruption, not a torn tail).
func appendBatch(dst []byte, baseSeq, epoch, syncedThrough uint64, recs []Record, recordBytesMax, batchBytesMax int) ([]byte, error) {
	if len(recs) == 0 {
		return dst, ErrEmptyBatch
	}
	total := batchHeaderBytes + syncedThroughBytes
	maxTimestampMs := int64(math.MinInt64)
	for i := range recs {
		n := RecordBytes(&recs[i])
		if n > recordBytesMax {
			return dst, fmt.Errorf("%w: record %d is %d bytes, max %d", ErrRecordTooLarge, i, n, recordBytesMax)
		}
		total += n
		if total > batchBytesMax {
			return dst, fmt.Errorf("%w: more than %d bytes", ErrBatchTooLarge, batchBytesMax)
		}
		maxTimestampMs = max(maxTimestampMs, recs[i].TimestampMs)
	}
	start := len(dst)
	if cap(dst)-len(dst) < total {
		// Once, to the exact size: a batch of large records would grow it
		// many times, and a buffer grown by a factor could overshoot
		// encodeBufferBytesMax and not be kept.
		dst = append(make([]byte, 0, len(dst)+total), dst...)
	}
	dst = appendBatchHeader(dst, batchVersionV2, total, baseSeq, epoch, uint32(len(recs)), maxTimestampMs)
	dst = binary.LittleEndian.AppendUint64(dst, syncedThrough)
	for i := range recs {
		dst = AppendRecord(dst, &recs[i])
	}
	return sealBatch(dst, start), nil
}

// appendGapBatch appends a gap batch: seqs [baseSeq, baseSeq+count) were
// dropped by a repair and are absent on purpose. epoch keeps the log's
// epochs non-decreasing (the epoch of the batch before it).
func appendGapBatch(dst []byte, baseSeq, epoch uint64, count uint32) []byte {
	start := len(dst)
	dst = appendBatchHeader(dst, batchVersionGap, batchHeaderBytes, baseSeq, epoch, count, math.MinInt64)
	return sealBatch(dst, start)
}

// appendBatchHeader appends a batch header with a zero CRC.
func appendBatchHeader(dst []byte, version byte, total int, baseSeq, epoch uint64, count uint32, maxTimestampMs int64) []byte {
	dst = append(dst, batchMagic, version)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(total-batchCRCOffset))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // CRC, filled by sealBatch
	dst = binary.LittleEndian.AppendUint64(dst, baseSeq)
	dst = binary.LittleEndian.AppendUint64(dst, epoch)
	dst = binary.LittleEndian.AppendUint32(dst, count)
	return binary.LittleEndian.AppendUint64(dst, uint64(maxTimestampMs))
}

// sealBatch fills in the CRC of the batch encoded at dst[start:].
func sealBatch(dst []byte, start int) []byte {
	batch := dst[start:]
	binary.LittleEndian.PutUint32(batch[batchCRCOffset:], crc32.Checksum(batch[batchCRCEnd:], castagnoli))
	return dst
}

// RecordBytes returns the exact size of AppendRecord's encoding of r.
func RecordBytes(r *Record) int {
	n := recordBytesMin + len(r.Key) + len(r.Value)
	for i := range r.Headers {
		n += headerBytesMin + len(r.Headers[i].Key) + len(r.Headers[i].Value)
	}
	return n
}

// EncodeRecord returns AppendRecord's encoding of r in a new slice of
// exactly its size (one allocation; appending to nil grows it several
// times on the way).
func EncodeRecord(r *Record) []byte {
	return AppendRecord(make([]byte, 0, RecordBytes(r)), r)
}

// AppendRecord appends the encoding of one record (as it is laid out inside
// a batch) to dst. Replication carries records between nodes in it.
func AppendRecord(dst []byte, r *Record) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.TimestampMs))
	dst = binary.LittleEndian.AppendUint64(dst, r.ProducerID)
	dst = binary.LittleEndian.AppendUint64(dst, r.ProducerSeq)
	dst = appendBytes(dst, r.Key)
	dst = appendBytes(dst, r.Value)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Headers)))
	for _, h := range r.Headers {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendBytes(dst, h.Value)
	}
	return dst
}

// DecodeRecord decodes one record encoded by AppendRecord; the record
// aliases b. Trailing bytes are an error.
func DecodeRecord(b []byte) (Record, error) {
	d := decoder{b: b}
	r := d.record()
	if d.err == nil && d.off != len(b) {
		d.err = fmt.Errorf("%w: %d trailing bytes after record", ErrCorrupt, len(b)-d.off)
	}
	return r, d.err
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...)
}

// decodeBatchHeader decodes and bounds-checks the fixed header in
// b[:batchHeaderBytes]. It does not verify the CRC.
func decodeBatchHeader(b []byte) (batchHeader, error) {
	if len(b) < batchHeaderBytes {
		return batchHeader{}, fmt.Errorf("%w: short batch header (%d bytes)", ErrCorrupt, len(b))
	}
	if b[0] != batchMagic || b[1] < batchVersionV1 || b[1] > batchVersionGap {
		return batchHeader{}, fmt.Errorf("%w: bad batch magic or version %#x %#x", ErrCorrupt, b[0], b[1])
	}
	h := batchHeader{
		totalBytes:     int64(binary.LittleEndian.Uint32(b[2:])) + batchCRCOffset,
		crc:            binary.LittleEndian.Uint32(b[6:]),
		baseSeq:        binary.LittleEndian.Uint64(b[10:]),
		epoch:          binary.LittleEndian.Uint64(b[18:]),
		count:          binary.LittleEndian.Uint32(b[26:]),
		maxTimestampMs: int64(binary.LittleEndian.Uint64(b[30:])),
		version:        b[1],
	}
	if h.gap() {
		if h.totalBytes != batchHeaderBytes || h.count == 0 {
			return batchHeader{}, fmt.Errorf("%w: gap batch of %d bytes for %d seqs", ErrCorrupt, h.totalBytes, h.count)
		}
	} else {
		bodyMin := int64(batchHeaderBytes + h.prefixBytes())
		if h.totalBytes < bodyMin+recordBytesMin || h.totalBytes > batchBytesLimit {
			return batchHeader{}, fmt.Errorf("%w: batch length %d out of bounds", ErrCorrupt, h.totalBytes)
		}
		if h.count == 0 || int64(h.count) > (h.totalBytes-bodyMin)/recordBytesMin {
			return batchHeader{}, fmt.Errorf("%w: batch record count %d does not fit %d bytes", ErrCorrupt, h.count, h.totalBytes)
		}
	}
	if h.baseSeq == 0 || h.baseSeq > math.MaxUint64-uint64(h.count) {
		return batchHeader{}, fmt.Errorf("%w: batch base seq %d out of range", ErrCorrupt, h.baseSeq)
	}
	return h, nil
}

// prefixBytes is the size of the body's prefix before the records.
func (h batchHeader) prefixBytes() int {
	if h.version == batchVersionV2 {
		return syncedThroughBytes
	}
	return 0
}

// syncedThrough returns the synced-through seq of a verified version-2
// batch b, and 0 (proves nothing) for other versions.
func syncedThrough(h batchHeader, b []byte) uint64 {
	if h.version != batchVersionV2 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[batchHeaderBytes:])
}

// verifyBatch checks the CRC and the record structure of a whole batch b
// (header included, len(b) == h.totalBytes). When out is non-nil the
// records are decoded into it as entries (aliasing b), with sizes holding
// each record's encoded size. A gap batch verifies with no entries.
func verifyBatch(h batchHeader, b []byte, out []Entry, sizes []int) ([]Entry, []int, error) {
	if int64(len(b)) != h.totalBytes {
		return out, sizes, fmt.Errorf("%w: batch is %d bytes, header says %d", ErrCorrupt, len(b), h.totalBytes)
	}
	if got := crc32.Checksum(b[batchCRCEnd:], castagnoli); got != h.crc {
		return out, sizes, fmt.Errorf("%w: batch at seq %d: crc %#08x, want %#08x", ErrCorrupt, h.baseSeq, got, h.crc)
	}
	if h.gap() {
		return out, sizes, nil
	}
	if st := syncedThrough(h, b); st >= h.baseSeq {
		return out, sizes, fmt.Errorf("%w: batch at seq %d claims seq %d synced", ErrCorrupt, h.baseSeq, st)
	}
	d := decoder{b: b[batchHeaderBytes+h.prefixBytes():]}
	for i := uint32(0); i < h.count; i++ {
		start := d.off
		r := d.record()
		if d.err != nil {
			return out, sizes, fmt.Errorf("batch at seq %d record %d: %w", h.baseSeq, i, d.err)
		}
		if out != nil || sizes != nil {
			out = append(out, Entry{Seq: h.baseSeq + uint64(i), Epoch: h.epoch, Record: r})
			sizes = append(sizes, d.off-start)
		}
	}
	if d.off != len(d.b) {
		return out, sizes, fmt.Errorf("%w: batch at seq %d has %d trailing bytes", ErrCorrupt, h.baseSeq, len(d.b)-d.off)
	}
	return out, sizes, nil
}

// decoder reads little-endian fields with bounds checks; the first error
// sticks and later reads return zero values.
type decoder struct {
	b   []byte
	off int
	err error
}

// record decodes one record at the decoder's position.
func (d *decoder) record() Record {
	var r Record
	r.TimestampMs = int64(d.u64())
	r.ProducerID = d.u64()
	r.ProducerSeq = d.u64()
	r.Key = d.bytes()
	r.Value = d.bytes()
	nh := d.u32()
	if d.err == nil && uint64(nh) > uint64(len(d.b)-d.off)/headerBytesMin {
		d.err = fmt.Errorf("%w: header count %d too large", ErrCorrupt, nh)
	}
	if d.err == nil && nh > 0 {
		r.Headers = make([]Header, nh)
		for j := range r.Headers {
			r.Headers[j].Key = string(d.bytes())
			r.Headers[j].Value = d.bytes()
		}
	}
	return r
}

func (d *decoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || n > len(d.b)-d.off {
		d.err = fmt.Errorf("%w: field of %d bytes overruns record", ErrCorrupt, n)
		return false
	}
	return true
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

func (d *decoder) bytes() []byte {
	n := d.u32()
	if !d.need(int(n)) {
		return nil
	}
	if n == 0 {
		return nil
	}
	v := d.b[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return v
}

// SegmentBatch is one batch of a segment file: its byte range and its
// entries (aliasing the content it was decoded from).
type SegmentBatch struct {
	Offset, End int64
	Entries     []Entry
	// Gap holds the seqs of a gap batch (a repair dropped them; it has
	// no entries); nil for a batch of records.
	Gap *SeqRange
}

// SegmentBatches decodes the batches of a segment file's content b from
// its start, up to the first that does not verify (a torn or damaged one,
// or the preallocated zeroes after the last). It reads no file: a tool
// (the simulator) learns from it what a range of bytes holds.
func SegmentBatches(b []byte) []SegmentBatch {
	var out []SegmentBatch
	for off := int64(0); off+batchHeaderBytes <= int64(len(b)); {
		h, err := decodeBatchHeader(b[off:])
		if err != nil || h.totalBytes > int64(len(b))-off {
			break
		}
		entries, _, err := verifyBatch(h, b[off:off+h.totalBytes], []Entry{}, nil)
		if err != nil {
			break
		}
		sb := SegmentBatch{Offset: off, End: off + h.totalBytes, Entries: entries}
		if h.gap() && h.count > 0 {
			sb.Gap = &SeqRange{First: h.baseSeq, Last: h.baseSeq + uint64(h.count) - 1}
		}
		out = append(out, sb)
		off += h.totalBytes
	}
	return out
}
