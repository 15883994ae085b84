package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Checkpoints: a bucket's state carried in its own log.
//
// A checkpoint is Count consecutive records of the bucket's log, its
// chunks (OpCheckpoint), whose Values concatenated encode a Checkpoint:
// the configuration that shapes the state and the bucket's Snapshot as of
// seq Base, the seq just before the first chunk. The leader proposes one
// as a single run of records, only when it has applied everything in its
// log, so that the run lands right after Base. Applying a chunk changes no
// state (a replica that has the state already has what it carries); it
// only tells the bucket, once the last chunk is applied, that the log up
// to Base is no longer needed to rebuild it (LastCheckpoint): the node
// truncates the log through it, and a replica whose log starts after what
// it applied — a restart after truncation, a follower reset to its
// leader's snapshot point — reads on from the log's start to the first
// complete checkpoint (Seeker), loads the bucket from it and applies what
// follows. The watch is served from the bucket, which keeps every kept
// revision (they are in the checkpoint), so truncation moves no floor:
// the chunks' seqs hold no revision, SKIPPED like a compaction record's.
//
// Rules (a chunk that breaks one is void: it changes nothing and counts
// toward no checkpoint, on every replica alike):
//
//   - CheckpointBaseIsPrecedingSeq: chunk Index of base Base counts only
//     at seq Base+1+Index — in particular a checkpoint's first chunk
//     declares the seq just before it. A checkpoint proposed against a
//     state that something else in the log then followed (an install
//     entry, another proposal slipped in before it) would otherwise claim
//     to carry a state it does not: a replica loading it would miss the
//     records between its base and its first chunk.
//   - CheckpointChunksContiguous: chunk Index > 0 counts only right after
//     chunk Index-1 of the same checkpoint (Base and Count); a checkpoint
//     is complete at its chunk Count-1. A run cut short (a leader that
//     lost office in the middle of it) completes nothing.
//
// And one that stops the replica instead:
//
//   - CheckpointMatchesState: a replica that has the state checks, as it
//     applies a checkpoint's last chunk, that the checkpoint carries that
//     very state (a CRC-32C of the chunks' bytes against one of its own
//     encoding as of the base). A mismatch means replicas diverged, or
//     the leader's state is damaged: Apply fails with
//     ErrCheckpointMismatch (the node stops applying the bucket,
//     DATA_CORRUPT) rather than let that checkpoint become what the log
//     is truncated to and every later rebuild loads.

// Checkpoint limits.
const (
	// CheckpointChunksMax bounds a checkpoint's chunks (with 1 MiB chunks,
	// a 64 GiB bucket).
	CheckpointChunksMax = 1 << 16
	chunkHeaderBytes    = 8 + 4 + 4
	checkpointMagic     = 'C'
	checkpointVersion   = 1
	checkpointHeadBytes = 2 + 1 + 8
	// recordOverheadBytes is what a record costs in the log beyond its
	// key, value and headers (seq, epoch, lengths, checksum share), for
	// LogBytesSinceCheckpoint.
	recordOverheadBytes = 32
)

// CheckpointChunk places a chunk record in its checkpoint.
type CheckpointChunk struct {
	Base         uint64 // the checkpoint's state is the bucket's as of Base
	Index, Count uint32 // chunk Index of Count (Index < Count)
}

func (c CheckpointChunk) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, c.Base)
	dst = binary.BigEndian.AppendUint32(dst, c.Index)
	return binary.BigEndian.AppendUint32(dst, c.Count)
}

// decodeChunk finishes DecodeRecord for a checkpoint chunk.
func decodeChunk(r Record, w Write) (Write, error) {
	if len(r.Headers) != 2 || r.Headers[1].Key != CheckpointHeader || len(r.Headers[1].Value) != chunkHeaderBytes {
		return Write{}, fmt.Errorf("%w: a checkpoint chunk needs %q of %d bytes second and last", ErrMalformed, CheckpointHeader, chunkHeaderBytes)
	}
	h := r.Headers[1].Value
	c := CheckpointChunk{Base: binary.BigEndian.Uint64(h), Index: binary.BigEndian.Uint32(h[8:]), Count: binary.BigEndian.Uint32(h[12:])}
	switch {
	case c.Count == 0 || c.Count > CheckpointChunksMax || c.Index >= c.Count:
		return Write{}, fmt.Errorf("%w: checkpoint chunk %d of %d (at most %d)", ErrMalformed, c.Index, c.Count, CheckpointChunksMax)
	case c.Base > math.MaxUint64-uint64(c.Count):
		return Write{}, fmt.Errorf("%w: checkpoint base %d", ErrMalformed, c.Base)
	case len(r.Key) != 0:
		return Write{}, fmt.Errorf("%w: a checkpoint chunk with a key", ErrMalformed)
	case len(r.Value) == 0 || len(r.Value) > ValueBytesLimit:
		return Write{}, fmt.Errorf("%w: a checkpoint chunk of %d bytes (1..%d)", ErrMalformed, len(r.Value), ValueBytesLimit)
	}
	w.Chunk = c
	return w, nil
}

// Checkpoint is what a checkpoint carries: the Config fields that shape a
// bucket's state (every replica must apply under the same ones) and the
// state as of the checkpoint's base (Snapshot.Applied).
type Checkpoint struct {
	HistoryMax     int
	TombstoneTTLms int64
	Snapshot       Snapshot
}

// Checkpoint body layout, version 1 (big endian; canonical):
//
//	magic u8 = 'C', version u8 = 1, historyMax u8, tombstoneTTLms i64,
//	the Snapshot (AppendSnapshot's layout) to the end

// ErrCheckpoint: a checkpoint body that does not decode or make sense.
var ErrCheckpoint = errors.New("kv: bad checkpoint")

// ErrCheckpointMismatch: a complete checkpoint does not carry the state
// of the replica applying it (CheckpointMatchesState).
var ErrCheckpointMismatch = errors.New("kv: a checkpoint does not carry this replica's state")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendCheckpoint appends the encoding of c to dst.
func AppendCheckpoint(dst []byte, c Checkpoint) []byte {
	dst = append(dst, checkpointMagic, checkpointVersion, byte(c.HistoryMax))
	dst = binary.BigEndian.AppendUint64(dst, uint64(c.TombstoneTTLms))
	return AppendSnapshot(dst, c.Snapshot)
}

// DecodeCheckpoint decodes AppendCheckpoint's encoding (values alias b).
// It never panics: anything else is ErrCheckpoint.
func DecodeCheckpoint(b []byte) (Checkpoint, error) {
	if len(b) < checkpointHeadBytes || b[0] != checkpointMagic || b[1] != checkpointVersion {
		return Checkpoint{}, fmt.Errorf("%w: no version-%d header in %d bytes", ErrCheckpoint, checkpointVersion, len(b))
	}
	c := Checkpoint{HistoryMax: int(b[2]), TombstoneTTLms: int64(binary.BigEndian.Uint64(b[3:]))}
	if c.HistoryMax < 1 || c.HistoryMax > HistoryLimit || c.TombstoneTTLms <= 0 {
		return Checkpoint{}, fmt.Errorf("%w: history %d, tombstone TTL %d ms", ErrCheckpoint, c.HistoryMax, c.TombstoneTTLms)
	}
	s, err := DecodeSnapshot(b[checkpointHeadBytes:])
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	c.Snapshot = s
	return c, nil
}

// CheckpointRecords returns the chunk records of a checkpoint of b's
// state as of Applied(), each Value at most chunkBytesMax bytes (at most
// ValueBytesLimit), stamped nowMs. The leader proposes them as one run,
// only when it has applied everything in its log: the first must land at
// Applied()+1 (CheckpointBaseIsPrecedingSeq). It fails when the state
// needs more than CheckpointChunksMax chunks.
func (b *Bucket) CheckpointRecords(chunkBytesMax int, nowMs int64) ([]Record, error) {
	chunkBytesMax = min(chunkBytesMax, ValueBytesLimit)
	if chunkBytesMax < 1 {
		return nil, fmt.Errorf("%w: chunks of %d bytes", ErrConfig, chunkBytesMax)
	}
	body := AppendCheckpoint(make([]byte, 0, b.snapshotBytes+checkpointHeadBytes),
		Checkpoint{HistoryMax: b.cfg.HistoryMax, TombstoneTTLms: b.cfg.TombstoneTTLms, Snapshot: b.Snapshot()})
	count := (len(body) + chunkBytesMax - 1) / chunkBytesMax
	if count > CheckpointChunksMax {
		return nil, fmt.Errorf("kv: a checkpoint of %d bytes needs %d chunks of %d bytes, more than %d", len(body), count, chunkBytesMax, CheckpointChunksMax)
	}
	recs := make([]Record, 0, count)
	for i := range count {
		chunk := body[i*chunkBytesMax : min(len(body), (i+1)*chunkBytesMax)]
		recs = append(recs, EncodeRecord(Write{Op: OpCheckpoint, Value: chunk, TimestampMs: nowMs,
			Chunk: CheckpointChunk{Base: b.applied, Index: uint32(i), Count: uint32(count)}}))
	}
	return recs, nil
}

// LastCheckpoint is the base of the latest complete checkpoint applied (0:
// none): the log through it is not needed to rebuild the bucket.
func (b *Bucket) LastCheckpoint() uint64 { return b.lastCheckpoint }

// SnapshotBytes is the size of the bucket's Snapshot encoding, kept as
// revisions come and go.
func (b *Bucket) SnapshotBytes() int64 { return b.snapshotBytes }

// LogBytesSinceCheckpoint is about how many bytes of log were applied
// since the latest complete checkpoint (since the start when none), its
// chunks excluded.
func (b *Bucket) LogBytesSinceCheckpoint() int64 { return b.logBytesSince }

// CheckpointDue reports whether the leader should write a checkpoint: the
// log since the last one outgrew both minBytes and the state a checkpoint
// would write, so that checkpoints at most about double what the log
// takes (each one costs less than the log written since the one before).
func (b *Bucket) CheckpointDue(minBytes int64) bool {
	return b.logBytesSince > max(minBytes, b.snapshotBytes)
}

func recordBytes(r Record) int64 {
	n := recordOverheadBytes + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// checkpointTracker follows the checkpoint whose chunks are being applied
// (none when next is 0); crc is the CRC-32C of the chunks' bytes so far.
type checkpointTracker struct {
	base        uint64
	count, next uint32
	crc         uint32
}

// step takes the chunk at seq; it reports whether the chunk counts toward
// a checkpoint (else it is void, and so is any checkpoint pending), and
// whether it completes one. Other records need not reset it: after one,
// the pending run's next chunk can no longer sit where its base says.
func (t *checkpointTracker) step(seq uint64, c CheckpointChunk, m Mutations) (counts, complete bool) {
	// CheckpointBaseIsPrecedingSeq: a chunk sits where its base says.
	atItsSeq := seq == c.Base+1+uint64(c.Index) || m.CheckpointAnyBase
	// CheckpointChunksContiguous: the next chunk of the pending one.
	continues := c.Index == 0 || (t.next != 0 && t.base == c.Base && t.count == c.Count && t.next == c.Index) ||
		(m.CheckpointSkipsChunks && t.next != 0 && t.base == c.Base && t.count == c.Count)
	if !atItsSeq || !continues {
		*t = checkpointTracker{}
		return false, false
	}
	if c.Index+1 == c.Count {
		*t = checkpointTracker{crc: t.crc}
		return true, true
	}
	crc := t.crc
	if c.Index == 0 {
		crc = 0
	}
	*t = checkpointTracker{base: c.Base, count: c.Count, next: c.Index + 1, crc: crc}
	return true, false
}

// applyChunk applies the checkpoint chunk w at seq.
func (b *Bucket) applyChunk(seq uint64, w Write) (ApplyResult, error) {
	c := w.Chunk
	counts, complete := b.pending.step(seq, c, b.cfg.Mutations)
	if counts {
		if c.Index == 0 {
			b.pending.crc = 0
		}
		b.pending.crc = crc32.Update(b.pending.crc, castagnoli, w.Value)
	}
	if complete && !b.cfg.Mutations.CheckpointUnverified {
		// CheckpointMatchesState: the chunks changed nothing, so this
		// bucket is still the state as of the base.
		s := b.Snapshot()
		s.Applied = c.Base
		own := AppendCheckpoint(make([]byte, 0, b.snapshotBytes+checkpointHeadBytes),
			Checkpoint{HistoryMax: b.cfg.HistoryMax, TombstoneTTLms: b.cfg.TombstoneTTLms, Snapshot: s})
		if got, want := crc32.Checksum(own, castagnoli), b.pending.crc; got != want {
			b.pending = checkpointTracker{}
			return ApplyResult{}, fmt.Errorf("seq %d: %w: the checkpoint of base %d has CRC-32C %08x, this replica's state %08x", seq, ErrCheckpointMismatch, c.Base, want, got)
		}
	}
	b.applied = seq
	if complete {
		b.lastCheckpoint, b.logBytesSince = c.Base, 0
	}
	return ApplyResult{Outcome: Checkpointed, ChunkCounted: counts, CheckpointComplete: complete}, nil
}

// Seeker finds the first complete checkpoint in a log that starts after
// what a replica applied, and loads the bucket from it. Feed it the log's
// records in seq order from the log's start; the ones before that
// checkpoint's last chunk are passed over (the checkpoint carries their
// effect). It bounds what it holds: one checkpoint's chunks.
type Seeker struct {
	t    checkpointTracker
	body []byte
	m    Mutations
}

// NewSeeker returns a Seeker whose chunk rules carry m (tests only).
func NewSeeker(m Mutations) *Seeker { return &Seeker{m: m} }

// Add takes the record at seq. Once it completes a checkpoint, Add
// returns it (its values copied), with the log through seq covered:
// LoadCheckpoint then gives the bucket as of seq. A complete checkpoint
// that does not decode is an error (corruption: what a leader wrote and
// the storage checksummed does not decode).
func (s *Seeker) Add(seq uint64, r Record) (*Checkpoint, error) {
	w, err := DecodeRecord(r)
	if err != nil && !errors.Is(err, ErrNotKV) {
		return nil, fmt.Errorf("seq %d: %w", seq, err)
	}
	if err != nil || w.Op != OpCheckpoint {
		return nil, nil // a pending run it interrupts can no longer count (step)
	}
	counts, complete := s.t.step(seq, w.Chunk, s.m)
	switch {
	case !counts:
		s.body = s.body[:0]
		return nil, nil
	case w.Chunk.Index == 0:
		s.body = s.body[:0]
	}
	s.body = append(s.body, w.Value...)
	if !complete {
		return nil, nil
	}
	body := append([]byte(nil), s.body...)
	s.body = s.body[:0]
	c, err := DecodeCheckpoint(body)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint of base %d ending at seq %d: %w", w.Chunk.Base, seq, err)
	}
	if c.Snapshot.Applied != w.Chunk.Base {
		return nil, fmt.Errorf("%w: the checkpoint of base %d carries the state at %d", ErrCheckpoint, w.Chunk.Base, c.Snapshot.Applied)
	}
	return &c, nil
}

// LoadCheckpoint returns the bucket a complete checkpoint carries, as of
// lastSeq, the seq of its last chunk: the state a replica that applied
// the whole log holds there (its chunks changed nothing), with the
// checkpoint recorded as the latest.
func LoadCheckpoint(cfg Config, c Checkpoint, lastSeq uint64) (*Bucket, error) {
	if cfg.HistoryMax != c.HistoryMax || cfg.TombstoneTTLms != c.TombstoneTTLms {
		return nil, fmt.Errorf("%w: history %d and tombstone TTL %d ms, the checkpoint's %d and %d", ErrConfig, cfg.HistoryMax, cfg.TombstoneTTLms, c.HistoryMax, c.TombstoneTTLms)
	}
	if lastSeq <= c.Snapshot.Applied {
		return nil, fmt.Errorf("%w: last chunk at %d, base %d", ErrCheckpoint, lastSeq, c.Snapshot.Applied)
	}
	b, err := Restore(cfg, c.Snapshot)
	if err != nil {
		return nil, err
	}
	b.applied, b.lastCheckpoint = lastSeq, c.Snapshot.Applied
	return b, nil
}
