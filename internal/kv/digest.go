package kv

import (
	"encoding/binary"
	"maps"
	"slices"
)

// Clone returns an independent copy of the bucket (the model checker
// explores from copies). Revision values are shared: the bucket never
// modifies one in place.
func (b *Bucket) Clone() *Bucket {
	d := *b
	d.keys = make(map[string][]Revision, len(b.keys))
	for key, history := range b.keys {
		d.keys[key] = slices.Clip(slices.Clone(history))
	}
	d.live = slices.Clone(b.live)
	d.bySeq = maps.Clone(b.bySeq)
	d.order = slices.Clone(b.order)
	return &d
}

// AppendDigest appends a canonical encoding of the bucket's state to dst:
// the cursor, the floor, the checkpoint bookkeeping and every kept
// revision in seq order. Equal states encode equally whatever the caches
// (the live keys, the dropped seqs still in order) hold.
func (b *Bucket) AppendDigest(dst []byte) []byte {
	u := func(v uint64) { dst = binary.BigEndian.AppendUint64(dst, v) }
	u(b.applied)
	u(b.floor)
	u(b.lastCheckpoint)
	u(uint64(b.logBytesSince))
	u(uint64(b.snapshotBytes))
	// The pending checkpoint: its CRC outlives a complete one, unread
	// until the next first chunk resets it.
	if t := b.pending; t.next != 0 {
		u(t.base)
		u(uint64(t.count))
		u(uint64(t.next))
		u(uint64(t.crc))
	} else {
		u(0)
	}
	u(uint64(len(b.bySeq)))
	for _, seq := range b.order {
		key, kept := b.bySeq[seq]
		if !kept {
			continue
		}
		rev := b.revisionAt(key, seq)
		u(rev.Seq)
		u(uint64(rev.Op))
		u(uint64(rev.TimestampMs))
		dst = appendBytes(dst, []byte(rev.Key))
		dst = appendBytes(dst, rev.Value)
	}
	return dst
}

// Clone returns an independent copy of the leader kernel. Requests'
// bytes are shared: the kernel never modifies them.
func (l *Leader) Clone() *Leader {
	d := *l
	d.inflight = slices.Clone(l.inflight)
	d.parked = slices.Clone(l.parked)
	return &d
}

// AppendDigest appends a canonical encoding of the leader kernel's state
// to dst: its reign's start, its lease, the overlay in log order and the
// parked writes in arrival order.
func (l *Leader) AppendDigest(dst []byte) []byte {
	u := func(v uint64) { dst = binary.BigEndian.AppendUint64(dst, v) }
	u(l.reignStartSeq)
	if l.lease {
		u(1)
	} else {
		u(0)
	}
	u(uint64(len(l.inflight)))
	for _, w := range l.inflight {
		u(w.id)
		dst = appendBytes(dst, []byte(w.key))
		u(uint64(w.op))
		u(w.expected)
	}
	u(uint64(len(l.parked)))
	for _, p := range l.parked {
		w := p.req.Write
		u(p.req.ID)
		u(p.behind)
		u(uint64(w.Op))
		dst = appendBytes(dst, w.Key)
		dst = appendBytes(dst, w.Value)
		if w.Conditional {
			u(1)
		} else {
			u(0)
		}
		u(w.Expected)
		u(uint64(w.TimestampMs))
	}
	return dst
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

// Clone returns an independent copy of the seeker.
func (s *Seeker) Clone() *Seeker {
	d := *s
	d.body = slices.Clone(s.body)
	return &d
}
