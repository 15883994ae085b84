// Package kv is the kernel of a KV bucket (DESIGN §2 "KV bucket", §3): a
// bucket is one replicated partition whose committed records are applied,
// in seq order, to a Bucket; a revision is the seq of the write. The
// kernel decides how a write is laid out as a record, what the applied
// state holds (current value, the last HistoryMax revisions of each key,
// tombstones until they expire), which revisions compaction removes and
// how the floor rises, what a watcher sees (never a silent jump over an
// evicted revision: CURSOR_EXPIRED at that point), and, at the leader,
// which compare-and-set writes to propose (Leader, an overlay of the
// writes in flight).
//
// It is pure: no goroutines, I/O, clock or locks. Time arrives as unix
// milliseconds in records and arguments. The node shell will propose the
// records it returns, apply the committed log to it, and serve reads and
// watches from it.
package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Record is the part of a partition's record (storage.Record) that KV
// reads and writes: the node copies these fields across (the kernel may not
// import storage). Decoded records alias the caller's bytes.
type Record struct {
	// TimestampMs is the leader's unix ms when it proposed the record: a
	// tombstone's deletion time, a compaction's "now". Every replica reads
	// the same value, so state derived from it is replicated state.
	TimestampMs int64
	Key, Value  []byte
	Headers     []Header
}

// Header is an application header of a record (storage.Header).
type Header struct {
	Key   string
	Value []byte
}

// Record layout. A KV record is an ordinary record of the bucket's
// partition (not a control record: replog.ControlHeader is absent, so a
// plain consumer of the partition would read the writes):
//
//	Headers[0] = {OpHeader, "put" | "del" | "compact" | "checkpoint"}
//	Headers[1] = {ExpectHeader, expected revision, 8 bytes big endian}  (optional: a CAS)
//	           | {CheckpointHeader, base u64, index u32, count u32}     (checkpoint: required)
//	Key        = the KV key   (put, del: 1..KeyBytesLimit bytes; compact, checkpoint: empty)
//	Value      = the value    (put: 0..ValueBytesLimit bytes; del, compact: empty;
//	             checkpoint: 1..ValueBytesLimit bytes of the checkpoint's body)
//	TimestampMs = the leader's unix ms at proposal
//
// A checkpoint's records are its chunks: chunk index of count, of the
// checkpoint of the bucket's state as of seq base (checkpoint.go).
//
// A record whose first header is not OpHeader is not a KV record (an
// epoch's install entry, say): applying it advances the cursor and changes
// nothing. A record that carries OpHeader but breaks this layout is
// corrupt.
const (
	OpHeader         = "nereus-kv"
	ExpectHeader     = "nereus-kv-expect"
	CheckpointHeader = "nereus-kv-checkpoint"
)

// Format limits: what the decoder accepts whatever the Config, so that a
// replica never refuses a record its leader wrote under other limits.
// Config limits (checked when a write is submitted) are at most these.
const (
	KeyBytesLimit   = 1024
	ValueBytesLimit = 1 << 20
	expectBytes     = 8
)

// Op is what a KV record does.
type Op uint8

const (
	// OpPut writes a value: a new revision of the key.
	OpPut Op = iota + 1
	// OpDelete writes a tombstone: a revision that says "deleted".
	OpDelete
	// OpCompact purges the tombstones expired at the record's TimestampMs
	// (not a revision: it holds no key).
	OpCompact
	// OpCheckpoint is one chunk of a checkpoint (checkpoint.go): not a
	// revision, and it changes no state.
	OpCheckpoint
	// OpFence follows a repair that dropped seqs of the bucket's log (not
	// a revision; no key; its value lists the dropped spans it answers,
	// FenceSpans): the floor rises above it, so every watcher whose cursor
	// is at or below it — every one that may have seen a lost write —
	// lists the bucket again (LossExpiresEveryCursor).
	OpFence
)

func (o Op) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "del"
	case OpCompact:
		return "compact"
	case OpCheckpoint:
		return "checkpoint"
	case OpFence:
		return "fence"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

func opOf(name []byte) (Op, bool) {
	for _, o := range []Op{OpPut, OpDelete, OpCompact, OpCheckpoint, OpFence} {
		if string(name) == o.String() {
			return o, true
		}
	}
	return 0, false
}

// Errors of the record layout.
var (
	// ErrNotKV: the record is not a KV record (no OpHeader first).
	ErrNotKV = errors.New("kv: not a KV record")
	// ErrMalformed: the record carries OpHeader but breaks the layout.
	ErrMalformed = errors.New("kv: malformed KV record")
	// ErrEmptyKey, ErrKeyTooLarge, ErrValueTooLarge refuse a write.
	ErrEmptyKey      = errors.New("kv: empty key")
	ErrKeyTooLarge   = errors.New("kv: key too large")
	ErrValueTooLarge = errors.New("kv: value too large")
)

// Write is one decoded KV record (or a write before it is encoded).
type Write struct {
	Op Op
	// Key and Value alias the record they were decoded from.
	Key   []byte
	Value []byte
	// Conditional: a CAS. It applies only if the key's latest revision is
	// Expected (0: the key is absent or deleted); otherwise the record is
	// applied as a refusal that changes nothing.
	Conditional bool
	Expected    uint64
	// Chunk places an OpCheckpoint record in its checkpoint.
	Chunk       CheckpointChunk
	TimestampMs int64
}

// EncodeRecord lays w out as a record (the layout above). It does not
// check sizes: Leader.Submit does, with the Config's limits.
func EncodeRecord(w Write) Record {
	r := Record{TimestampMs: w.TimestampMs, Key: w.Key, Value: w.Value,
		Headers: []Header{{Key: OpHeader, Value: []byte(w.Op.String())}}}
	if w.Conditional {
		r.Headers = append(r.Headers, Header{Key: ExpectHeader, Value: binary.BigEndian.AppendUint64(nil, w.Expected)})
	}
	if w.Op == OpCheckpoint {
		r.Headers = append(r.Headers, Header{Key: CheckpointHeader, Value: w.Chunk.append(nil)})
	}
	return r
}

// DecodeRecord decodes a KV record. It never panics: a record without
// OpHeader first is ErrNotKV, one that breaks the layout ErrMalformed.
func DecodeRecord(r Record) (Write, error) {
	if len(r.Headers) == 0 || r.Headers[0].Key != OpHeader {
		return Write{}, ErrNotKV
	}
	op, ok := opOf(r.Headers[0].Value)
	if !ok {
		return Write{}, fmt.Errorf("%w: op %q", ErrMalformed, r.Headers[0].Value)
	}
	w := Write{Op: op, Key: r.Key, Value: r.Value, TimestampMs: r.TimestampMs}
	if op == OpCheckpoint {
		return decodeChunk(r, w)
	}
	switch len(r.Headers) {
	case 1:
	case 2:
		h := r.Headers[1]
		if h.Key != ExpectHeader || len(h.Value) != expectBytes {
			return Write{}, fmt.Errorf("%w: second header %q of %d bytes, want %q of %d", ErrMalformed, h.Key, len(h.Value), ExpectHeader, expectBytes)
		}
		if op == OpCompact || op == OpFence {
			return Write{}, fmt.Errorf("%w: a conditional %s", ErrMalformed, op)
		}
		w.Conditional, w.Expected = true, binary.BigEndian.Uint64(h.Value)
	default:
		return Write{}, fmt.Errorf("%w: %d headers", ErrMalformed, len(r.Headers))
	}
	if op == OpCompact || op == OpFence {
		if len(r.Key) != 0 || op == OpCompact && len(r.Value) != 0 {
			return Write{}, fmt.Errorf("%w: a %s with a key or value", ErrMalformed, op)
		}
		if _, err := FenceSpans(w); op == OpFence && err != nil {
			return Write{}, err
		}
		return w, nil
	}
	if err := checkKey(r.Key, KeyBytesLimit); err != nil {
		return Write{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if op == OpDelete && len(r.Value) != 0 {
		return Write{}, fmt.Errorf("%w: a delete with a %d-byte value", ErrMalformed, len(r.Value))
	}
	if len(r.Value) > ValueBytesLimit {
		return Write{}, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrMalformed, ErrValueTooLarge, len(r.Value), ValueBytesLimit)
	}
	return w, nil
}

func checkKey(key []byte, keyBytesMax int) error {
	if len(key) == 0 {
		return ErrEmptyKey
	}
	if len(key) > keyBytesMax {
		return fmt.Errorf("%w: %d bytes, max %d", ErrKeyTooLarge, len(key), keyBytesMax)
	}
	return nil
}

// CompactRecord is the record that purges the tombstones expired at nowMs
// (the leader proposes it; every replica purges at the same log position
// with the same time).
func CompactRecord(nowMs int64) Record {
	return EncodeRecord(Write{Op: OpCompact, TimestampMs: nowMs})
}

// Span is a range of seqs, First through Last.
type Span struct{ First, Last uint64 }

// FenceSpansMax bounds the spans one fence record lists.
const FenceSpansMax = 4096

const spanBytes = 16

// FenceRecord is the record that expires every watcher's cursor at or
// below its seq (OpFence): the leader of a bucket whose log lost seqs to
// a repair proposes it once it stepped over them, naming them (at most
// FenceSpansMax), so that a replay tells a loss fenced then from one a
// later repair made below it.
func FenceRecord(lost []Span) Record {
	value := make([]byte, 0, spanBytes*len(lost))
	for _, sp := range lost {
		value = binary.BigEndian.AppendUint64(value, sp.First)
		value = binary.BigEndian.AppendUint64(value, sp.Last)
	}
	return EncodeRecord(Write{Op: OpFence, Value: value})
}

// FenceSpans decodes the spans a fence record answers.
func FenceSpans(w Write) ([]Span, error) {
	if len(w.Value)%spanBytes != 0 || len(w.Value) > spanBytes*FenceSpansMax {
		return nil, fmt.Errorf("%w: a fence of %d bytes", ErrMalformed, len(w.Value))
	}
	spans := make([]Span, 0, len(w.Value)/spanBytes)
	for b := w.Value; len(b) > 0; b = b[spanBytes:] {
		sp := Span{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}
		if sp.First == 0 || sp.Last < sp.First {
			return nil, fmt.Errorf("%w: a fence naming seqs %d-%d", ErrMalformed, sp.First, sp.Last)
		}
		spans = append(spans, sp)
	}
	return spans, nil
}
