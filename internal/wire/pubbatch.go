package wire

import (
	"encoding/binary"
)

// Frame types of protocol v2: many publishes of one producer in one frame,
// and their answers in one frame.
const (
	TypePubBatch   FrameType = 31
	TypePubBatchOK FrameType = 32
)

// PubBatchRecordsMax bounds the records of one PUB_BATCH (and so the
// results of its PUB_BATCH_OK).
const PubBatchRecordsMax = 4096

// PubBatch is what PUBs of one producer to one topic and partition (or
// PartitionAuto) say, sent as one frame (PubBatchWriter sends a lone one
// as a PUB): the fields they share once, then
// each record with its own correlation id. The broker handles each record
// as it would that PUB, in order, and answers all of them in one
// PUB_BATCH_OK once every record has its outcome. The frame's own
// correlation id is unused (0).
type PubBatch struct {
	Topic      string
	Partition  int32
	ProducerID uint64
	Records    []PubRecord
}

// PubRecord is one record of a PUB_BATCH: a PUB's own fields.
type PubRecord struct {
	Corr        uint64 // the correlation id its result answers
	ProducerSeq uint64
	TimestampMs int64
	Key, Value  []byte
	Headers     []Header
}

// pubBatchRecordBytesMin is the smallest encoded record: corr, seq,
// timestamp, two empty byte fields and no headers.
const pubBatchRecordBytesMin = 8 + 8 + 8 + 4 + 4 + 4

func (*PubBatch) Type() FrameType { return TypePubBatch }
func (f *PubBatch) appendBody(b []byte) []byte {
	b = appendPubBatchHead(b, f.Topic, f.Partition, f.ProducerID)
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Records)))
	for i := range f.Records {
		b = appendPubRecord(b, &f.Records[i])
	}
	return b
}
func (f *PubBatch) decodeBody(d *decoder) {
	f.Topic = d.str()
	f.Partition = int32(d.u32())
	f.ProducerID = d.u64()
	n := d.listLen(pubBatchRecordBytesMin)
	if n > PubBatchRecordsMax {
		d.fail("%d records exceed the limit of %d", n, PubBatchRecordsMax)
		return
	}
	if n == 0 {
		d.fail("no records")
		return
	}
	f.Records = make([]PubRecord, n)
	for i := 0; i < n && d.err == nil; i++ {
		r := &f.Records[i]
		r.Corr, r.ProducerSeq, r.TimestampMs = d.u64(), d.u64(), int64(d.u64())
		r.Key, r.Value = d.bytes(), d.bytes()
		r.Headers = decodeHeaders(d)
	}
}

// Pub is the PUB record i of the batch stands for; its byte fields alias
// the batch's.
func (f *PubBatch) Pub(i int) Pub {
	r := &f.Records[i]
	return Pub{Topic: f.Topic, Partition: f.Partition, ProducerID: f.ProducerID, ProducerSeq: r.ProducerSeq,
		TimestampMs: r.TimestampMs, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

func appendPubBatchHead(b []byte, topic string, partition int32, producerID uint64) []byte {
	b = appendStr(b, topic)
	b = binary.BigEndian.AppendUint32(b, uint32(partition))
	return binary.BigEndian.AppendUint64(b, producerID)
}

func appendPubRecord(b []byte, r *PubRecord) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Corr)
	b = binary.BigEndian.AppendUint64(b, r.ProducerSeq)
	b = binary.BigEndian.AppendUint64(b, uint64(r.TimestampMs))
	b = appendBytes(b, r.Key)
	b = appendBytes(b, r.Value)
	return appendHeaders(b, r.Headers)
}

// PubBatchWriter builds a PUB_BATCH in place at the end of a buffer of
// frames, a record at a time, so that a sender can go on adding PUBs to
// the frame it last queued until it is written: Open starts the frame,
// Add appends a record, Seal writes its count, length and checksum. Until
// Seal the buffer holds an incomplete frame.
type PubBatchWriter struct {
	start, countAt int // offsets in the buffer of the open batch's frame and of its count
	count          int
	Topic          string
	Partition      int32
	ProducerID     uint64
}

// Open starts a PUB_BATCH for pub's topic, partition and producer at the
// end of dst, sealing the one open before, and adds pub as its first
// record under corr.
func (w *PubBatchWriter) Open(dst []byte, corr uint64, pub *Pub) []byte {
	dst = w.Seal(dst)
	w.start = len(dst)
	w.Topic, w.Partition, w.ProducerID = pub.Topic, pub.Partition, pub.ProducerID
	dst = appendFrameHead(dst, TypePubBatch, 0)
	dst = appendPubBatchHead(dst, pub.Topic, pub.Partition, pub.ProducerID)
	w.countAt = len(dst)
	dst = binary.BigEndian.AppendUint32(dst, 0)
	w.count = 0
	return w.Add(dst, corr, pub)
}

// Fits reports whether pub may join the open batch: same topic, partition
// and producer, under the record bound, and the frame, with pub, no more
// than frameBytesMax (as the length prefix counts it) after dst grows by
// recordBytes.
func (w *PubBatchWriter) Fits(dst []byte, pub *Pub, recordBytes, frameBytesMax int) bool {
	return w.IsOpen() && pub.Topic == w.Topic && pub.Partition == w.Partition && pub.ProducerID == w.ProducerID &&
		w.count < PubBatchRecordsMax && len(dst)+recordBytes+4-w.start-frameHeaderBytes <= frameBytesMax
}

// IsOpen reports whether a batch is open (added to, not yet sealed).
func (w *PubBatchWriter) IsOpen() bool { return w.count > 0 }

// Add appends pub as a record under corr to the open batch.
func (w *PubBatchWriter) Add(dst []byte, corr uint64, pub *Pub) []byte {
	w.count++
	return appendPubRecord(dst, &PubRecord{Corr: corr, ProducerSeq: pub.ProducerSeq, TimestampMs: pub.TimestampMs,
		Key: pub.Key, Value: pub.Value, Headers: pub.Headers})
}

// Seal completes the open batch at the end of dst (nothing when none is
// open): its record count, its checksum and its length. A batch of one
// record becomes the PUB it stands for — the same bytes but for the
// count and the record's correlation id, which becomes the frame's — so
// a lone publish travels and is answered as in version 1.
func (w *PubBatchWriter) Seal(dst []byte) []byte {
	if !w.IsOpen() {
		return dst
	}
	if w.count == 1 {
		recAt := w.countAt + 4
		dst[w.start+frameHeaderBytes] = byte(TypePub)
		copy(dst[w.start+frameHeaderBytes+1:], dst[recAt:recAt+8]) // the record's corr
		dst = append(dst[:w.countAt], dst[recAt+8:]...)
	} else {
		binary.BigEndian.PutUint32(dst[w.countAt:], uint32(w.count))
	}
	w.count = 0
	return finishFrame(dst, w.start)
}

// Abandon forgets the open batch without sealing it: the caller cut the
// buffer back to before it.
func (w *PubBatchWriter) Abandon() { w.count = 0 }

// PubBatchOneExtraBytes is how much larger a batch of one record is than
// the PUB Seal turns it into: the count and the record's corr.
const PubBatchOneExtraBytes = 4 + 8

// PubRecordBytes is how many bytes pub adds to a PUB_BATCH as a record.
func PubRecordBytes(pub *Pub) int {
	n := pubBatchRecordBytesMin + len(pub.Key) + len(pub.Value)
	for _, h := range pub.Headers {
		n += 2 + len(h.Key) + 4 + len(h.Value)
	}
	return n
}

// PubResult is one record's outcome in a PUB_BATCH_OK: its PUB_OK, or,
// when Code is not 0, the ERR it would have had.
type PubResult struct {
	Corr      uint64
	Partition uint32
	Seq       uint64
	Epoch     uint64
	Duplicate bool
	Code      Code
	Message   string
}

// PubBatchOK answers a PUB_BATCH: one result per record, in its order.
type PubBatchOK struct {
	Results []PubResult
}

// pubResultBytesMin is the smallest encoded result.
const pubResultBytesMin = 8 + 4 + 8 + 8 + 1 + 2 + 2

func (*PubBatchOK) Type() FrameType { return TypePubBatchOK }
func (f *PubBatchOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Results)))
	for _, r := range f.Results {
		b = binary.BigEndian.AppendUint64(b, r.Corr)
		b = binary.BigEndian.AppendUint32(b, r.Partition)
		b = binary.BigEndian.AppendUint64(b, r.Seq)
		b = binary.BigEndian.AppendUint64(b, r.Epoch)
		b = appendBool(b, r.Duplicate)
		b = binary.BigEndian.AppendUint16(b, uint16(r.Code))
		b = appendStr(b, r.Message)
	}
	return b
}
func (f *PubBatchOK) decodeBody(d *decoder) {
	n := d.listLen(pubResultBytesMin)
	if n > PubBatchRecordsMax {
		d.fail("%d results exceed the limit of %d", n, PubBatchRecordsMax)
		return
	}
	if n == 0 {
		return
	}
	f.Results = make([]PubResult, n)
	for i := 0; i < n && d.err == nil; i++ {
		r := &f.Results[i]
		r.Corr, r.Partition, r.Seq, r.Epoch = d.u64(), d.u32(), d.u64(), d.u64()
		r.Duplicate, r.Code, r.Message = d.boolean(), Code(d.u16()), d.str()
	}
}

// NewPubResult is the result of the record under corr: ok, or err when
// it is not nil.
func NewPubResult(corr uint64, ok PubOK, err *Error) PubResult {
	if err != nil {
		return PubResult{Corr: corr, Code: err.Code, Message: err.Message}
	}
	return PubResult{Corr: corr, Partition: ok.Partition, Seq: ok.Seq, Epoch: ok.Epoch, Duplicate: ok.Duplicate}
}

// Result is r as the frame a PUB would have been answered with: a PUB_OK,
// or an ERR when r carries an error code.
func (r *PubResult) Result() Frame { return r.ResultIn(nil) }

// ResultIn is Result with the PUB_OK written into ok when ok is not nil,
// so that the answers of a batch can share one allocation.
func (r *PubResult) ResultIn(ok *PubOK) Frame {
	if r.Code != 0 {
		return &Err{Code: r.Code, Message: r.Message}
	}
	if ok == nil {
		ok = new(PubOK)
	}
	*ok = PubOK{Partition: r.Partition, Seq: r.Seq, Epoch: r.Epoch, Duplicate: r.Duplicate}
	return ok
}
