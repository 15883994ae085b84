package partition

import (
	"cmp"
	"encoding/binary"
	"maps"
	"slices"
)

// Copies and canonical encodings of the kernel's state, for the model
// checker (internal/model): it explores from independent copies and
// hashes states by their encodings.

// Clone returns an independent copy of the table.
func (p *Producers) Clone() *Producers {
	d := &Producers{byID: make(map[uint64]*producerWindow, len(p.byID)), windowMax: p.windowMax, producersMax: p.producersMax,
		outOfOrderMoves: p.outOfOrderMoves, sealAtLowest: p.sealAtLowest}
	for w := p.oldest; w != nil; w = w.newer {
		c := &producerWindow{ring: slices.Clone(w.ring), head: w.head, n: w.n, floor: w.floor,
			lastSeq: w.lastSeq, maxSeen: w.maxSeen, id: w.id, older: d.newest}
		if d.newest == nil {
			d.oldest = c
		} else {
			d.newest.newer = c
		}
		d.newest = c
		d.byID[c.id] = c
	}
	return d
}

// AppendDigest appends a canonical encoding of the table to b: its
// bounds, then each producer in id order with its floor, latest
// mention, highest producer_seq seen and remembered entries in
// producer_seq order. Equal tables encode equally (the recency list is
// ordered by (lastSeq, id), so it is encoded by them).
func (p *Producers) AppendDigest(b []byte) []byte {
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	u(uint64(p.windowMax))
	u(uint64(p.producersMax))
	u(uint64(len(p.byID)))
	for _, id := range slices.Sorted(maps.Keys(p.byID)) {
		w := p.byID[id]
		u(id)
		u(w.floor)
		u(w.lastSeq)
		u(w.maxSeen)
		u(uint64(w.n))
		for i := range w.n {
			e := w.at(i)
			u(e.producerSeq)
			u(e.seq)
			u(e.epoch)
		}
	}
	return b
}

// Clone returns an independent copy of the member; replies are copied
// as values. The copy cuts its one-reply slices from a block of its own.
func (m *Member[R]) Clone() *Member[R] {
	d := *m
	d.producers = m.producers.Clone()
	d.groups = m.groups.Clone()
	d.inflight = make(map[ProposalKey][]R, len(m.inflight))
	for k, rs := range m.inflight {
		if rs == nil {
			d.inflight[k] = nil // answered by Degraded, still in flight
		} else {
			d.inflight[k] = slices.Clone(rs)
		}
	}
	d.unapplied = maps.Clone(m.unapplied)
	d.singles = nil
	return &d
}

// AppendDigest appends a canonical encoding of the member's state to b,
// each reply encoded by reply: equal members encode equally. The
// deleted-groups predicate is not encoded (the shell's, not state).
func (m *Member[R]) AppendDigest(b []byte, reply func([]byte, R) []byte) []byte {
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	u(uint64(m.cfg.DedupWindowMax))
	u(uint64(m.cfg.ProducersMax))
	u(m.applied)
	if m.truncated {
		u(1)
	} else {
		u(0)
	}
	u(m.sealedEpoch)
	u(m.anon)
	b = m.producers.AppendDigest(b)
	b = m.groups.AppendDigest(b)
	keys := m.inflightKeys()
	u(uint64(len(keys)))
	for _, k := range keys {
		u(k.ProducerID)
		u(k.ProducerSeq)
		rs := m.inflight[k]
		u(uint64(len(rs)))
		for _, r := range rs {
			b = reply(b, r)
		}
	}
	unapplied := slices.SortedFunc(maps.Keys(m.unapplied), func(a, b ProposalKey) int {
		return cmp.Or(cmp.Compare(a.ProducerID, b.ProducerID), cmp.Compare(a.ProducerSeq, b.ProducerSeq))
	})
	u(uint64(len(unapplied)))
	for _, k := range unapplied {
		u(k.ProducerID)
		u(k.ProducerSeq)
		u(m.unapplied[k])
	}
	return b
}

// Lookup is the dedup table's verdict on a producer identity, as Publish
// would take it once admitted, without admitting or changing anything
// (the model checker holds every replica's table to the log with it).
func (m *Member[R]) Lookup(producerID, producerSeq uint64) (v Verdict, seq, epoch uint64) {
	return m.producers.Check(producerID, producerSeq)
}
