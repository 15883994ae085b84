package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Snapshot is the applied state of a bucket as a value: the applied seq,
// the floor and every kept revision in seq order. Its Values alias the
// bucket's until encoded.
type Snapshot struct {
	Applied, Floor uint64
	Revisions      []Revision
}

// Snapshot layout, version 1 (big endian; no checksum: the storage layer
// checksums the file or record that carries it). It is canonical: one
// state has one encoding, and DecodeSnapshot refuses any other.
//
//	magic u8 = 'K', version u8 = 1
//	applied u64, floor u64, revisions u32
//	per revision, seq strictly ascending:
//	    seq u64, op u8 (1 put, 2 del), timestampMs i64,
//	    key length u16, key, value length u32, value (empty for del)
const (
	snapshotMagic       = 'K'
	snapshotVersion     = 1
	snapshotHeaderBytes = 2 + 8 + 8 + 4
	revisionBytesMin    = 8 + 1 + 8 + 2 + 4
)

// ErrSnapshot: a snapshot that does not decode or does not make sense.
var ErrSnapshot = errors.New("kv: bad snapshot")

// Snapshot captures the applied state.
func (b *Bucket) Snapshot() Snapshot {
	s := Snapshot{Applied: b.applied, Floor: b.floor, Revisions: make([]Revision, 0, len(b.bySeq))}
	for _, seq := range b.order {
		if key, kept := b.bySeq[seq]; kept {
			s.Revisions = append(s.Revisions, b.revisionAt(key, seq))
		}
	}
	return s
}

// AppendSnapshot appends the encoding of s to dst.
func AppendSnapshot(dst []byte, s Snapshot) []byte {
	dst = append(dst, snapshotMagic, snapshotVersion)
	dst = binary.BigEndian.AppendUint64(dst, s.Applied)
	dst = binary.BigEndian.AppendUint64(dst, s.Floor)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s.Revisions)))
	for _, rev := range s.Revisions {
		dst = binary.BigEndian.AppendUint64(dst, rev.Seq)
		dst = append(dst, byte(rev.Op))
		dst = binary.BigEndian.AppendUint64(dst, uint64(rev.TimestampMs))
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(rev.Key)))
		dst = append(dst, rev.Key...)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(rev.Value)))
		dst = append(dst, rev.Value...)
	}
	return dst
}

// DecodeSnapshot decodes AppendSnapshot's encoding; the revisions' Values
// alias b. It never panics: anything else is ErrSnapshot.
func DecodeSnapshot(b []byte) (Snapshot, error) {
	fail := func(format string, args ...any) (Snapshot, error) {
		return Snapshot{}, fmt.Errorf("%w: %s", ErrSnapshot, fmt.Sprintf(format, args...))
	}
	if len(b) < snapshotHeaderBytes {
		return fail("%d bytes, header needs %d", len(b), snapshotHeaderBytes)
	}
	if b[0] != snapshotMagic || b[1] != snapshotVersion {
		return fail("magic %#x version %d", b[0], b[1])
	}
	s := Snapshot{Applied: binary.BigEndian.Uint64(b[2:]), Floor: binary.BigEndian.Uint64(b[10:])}
	count := binary.BigEndian.Uint32(b[18:])
	if s.Floor == 0 || s.Floor-1 > s.Applied {
		return fail("floor %d with applied %d", s.Floor, s.Applied)
	}
	rest := b[snapshotHeaderBytes:]
	if uint64(count) > uint64(len(rest)/revisionBytesMin) {
		return fail("%d revisions in %d bytes", count, len(rest))
	}
	s.Revisions = make([]Revision, 0, count)
	var prev uint64
	for i := range count {
		if len(rest) < revisionBytesMin {
			return fail("revision %d truncated", i)
		}
		rev := Revision{Seq: binary.BigEndian.Uint64(rest), Op: Op(rest[8]), TimestampMs: int64(binary.BigEndian.Uint64(rest[9:]))}
		keyBytes := int(binary.BigEndian.Uint16(rest[17:]))
		rest = rest[19:]
		if rev.Seq <= prev || rev.Seq > s.Applied {
			return fail("revision %d: seq %d after %d, applied %d", i, rev.Seq, prev, s.Applied)
		}
		if rev.Op != OpPut && rev.Op != OpDelete {
			return fail("revision %d: op %v", i, rev.Op)
		}
		if keyBytes == 0 || keyBytes > KeyBytesLimit || len(rest) < keyBytes+4 {
			return fail("revision %d: key of %d bytes", i, keyBytes)
		}
		rev.Key = string(rest[:keyBytes])
		valueBytes := uint64(binary.BigEndian.Uint32(rest[keyBytes:]))
		rest = rest[keyBytes+4:]
		if valueBytes > ValueBytesLimit || valueBytes > uint64(len(rest)) || (rev.Op == OpDelete && valueBytes > 0) {
			return fail("revision %d: %v value of %d bytes", i, rev.Op, valueBytes)
		}
		rev.Value, rest = rest[:valueBytes:valueBytes], rest[valueBytes:]
		s.Revisions = append(s.Revisions, rev)
		prev = rev.Seq
	}
	if len(rest) != 0 {
		return fail("%d trailing bytes", len(rest))
	}
	return s, nil
}

// Restore returns the bucket a snapshot captured (values copied). A key
// with more revisions than cfg.HistoryMax keeps its newest ones: the
// older ones are overwritten, as if applied under this Config.
func Restore(cfg Config, s Snapshot) (*Bucket, error) {
	if s.Floor == 0 || s.Floor-1 > s.Applied {
		return nil, fmt.Errorf("%w: floor %d with applied %d", ErrSnapshot, s.Floor, s.Applied)
	}
	b, err := newBucketAt(cfg, s.Floor)
	if err != nil {
		return nil, err
	}
	b.applied = s.Applied
	var prev uint64
	for _, rev := range s.Revisions {
		if rev.Seq <= prev || rev.Seq > s.Applied || (rev.Op != OpPut && rev.Op != OpDelete) || rev.Key == "" {
			return nil, fmt.Errorf("%w: revision %d (%v of %q) after %d, applied %d", ErrSnapshot, rev.Seq, rev.Op, rev.Key, prev, s.Applied)
		}
		rev.Value = cloneValue(rev.Value)
		b.insert(rev)
		prev = rev.Seq
	}
	return b, nil
}

// Entry is a committed record at its seq.
type Entry struct {
	Seq    uint64
	Record Record
}

// Rebuild returns the bucket of a snapshot (nil: an empty bucket from seq
// 1) with the log's tail applied; tail entries at or below the snapshot's
// applied seq are passed over, and the rest must follow it without a gap.
func Rebuild(cfg Config, snapshot *Snapshot, tail []Entry) (*Bucket, error) {
	var b *Bucket
	var err error
	if snapshot == nil {
		b, err = NewBucket(cfg)
	} else {
		b, err = Restore(cfg, *snapshot)
	}
	if err != nil {
		return nil, err
	}
	for _, e := range tail {
		if e.Seq <= b.applied {
			continue
		}
		if _, err := b.Apply(e.Seq, e.Record); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func cloneValue(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}
