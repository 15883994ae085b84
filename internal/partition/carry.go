package partition

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Carrying producers across compaction.
//
// A replica whose log starts after compacted entries (a restart without a
// usable dedup snapshot, a rebuild from the leader's snapshot point)
// builds its dedup table from the kept log. A producer whose every entry
// was compacted would be unknown there, and its retry would pass as new
// and append twice — a scheduler shard, compacted at every checkpoint,
// then fires a message twice. So the table bounds compaction
// (ProducersKeptInLog): the log keeps every known producer's latest
// mention — its latest entry, or a dedup carry, a control record that
// re-states its window. When the table is what holds compaction back, the leader
// proposes a carry of the producers mentioned longest ago
// (Member.AppendCarry); every replica applies it alike: a producer it
// knows is now mentioned at the carry's seq, one it does not know (its
// entries are gone from this replica's log) is learnt from the carry. A
// replica that does not know a producer its leader knew has a truncated
// log, so it seals every window before it takes publishes
// (Member.Admit): below the entries carried it knows nothing.
//
// A carry holds at most carryProducersMax producers, each with its
// carryEntriesMax highest producer_seqs: a retry of an older one of a
// producer known only from a carry is PRODUCER_SEQ_TOO_OLD, never a
// second append.

const (
	carryVersion = 1
	// carryProducersMax bounds the producers of one carry (about 1 MiB
	// at carryEntriesMax entries each); more go in the next.
	carryProducersMax = 4096
	// carryEntriesMax is how many of a producer's highest producer_seqs
	// a carry re-states.
	carryEntriesMax = 8
	// carryProducerBytes is a carried producer's fixed part: id and its
	// entry count.
	carryProducerBytes = 8 + 4
	carryEntryBytes    = 24
)

// CompactLimit is the last seq the log may be compacted through without
// forgetting a producer the table knows: just below the oldest latest
// mention (math.MaxUint64 with no producer).
func (p *Producers) CompactLimit() uint64 {
	if p.oldest == nil {
		return math.MaxUint64
	}
	return p.oldest.lastSeq - 1
}

// appendCarry encodes a carry of the producers whose latest mention is at
// or below through, least recent first, at most carryProducersMax of
// them, leaving out those busy names; n is how many (0: none, b
// unchanged).
func (p *Producers) appendCarry(b []byte, through uint64, busy map[uint64]bool) (_ []byte, n int) {
	var ws []*producerWindow
	for w := p.oldest; w != nil && w.lastSeq <= through && len(ws) < carryProducersMax; w = w.newer {
		if !busy[w.id] {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return b, 0
	}
	// By id: each lands at the newest end of the recency list (same
	// lastSeq, higher id) when applied, in O(1).
	slices.SortFunc(ws, func(a, b *producerWindow) int { return cmp.Compare(a.id, b.id) })
	b = append(b, carryVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ws)))
	for _, w := range ws {
		k := min(w.n, carryEntriesMax)
		first := w.n - k
		b = binary.LittleEndian.AppendUint64(b, w.id)
		b = binary.LittleEndian.AppendUint32(b, uint32(k))
		for i := first; i < w.n; i++ {
			e := w.at(i)
			b = binary.LittleEndian.AppendUint64(b, e.producerSeq)
			b = binary.LittleEndian.AppendUint64(b, e.seq)
			b = binary.LittleEndian.AppendUint64(b, e.epoch)
		}
	}
	return b, len(ws)
}

// carriedProducer is one producer of a decoded carry.
type carriedProducer struct {
	id      uint64
	entries []dedupEntry // ascending producer_seq
}

// decodeCarry decodes a carry applied at seq under epoch: producers in
// ascending id, each with 1 to carryEntriesMax entries in ascending
// producer_seq, every one before seq under an epoch up to epoch. A
// replica whose window is smaller than the leader's keeps the highest
// of them (producerWindow.insert).
func decodeCarry(b []byte, seq, epoch uint64) ([]carriedProducer, error) {
	d := snapDecoder{b: b}
	if v := d.u8(); d.err == nil && v != carryVersion {
		return nil, fmt.Errorf("partition: dedup carry version %d, want %d", v, carryVersion)
	}
	n := d.count(carryProducerBytes + carryEntryBytes)
	if d.err == nil && (n == 0 || n > carryProducersMax) {
		d.fail("%d producers, want 1 to %d", n, carryProducersMax)
	}
	ps := make([]carriedProducer, 0, n)
	for ; n > 0 && d.err == nil; n-- {
		c := carriedProducer{id: d.u64()}
		k := d.count(carryEntryBytes)
		switch {
		case d.err != nil:
		case c.id == 0 || len(ps) > 0 && ps[len(ps)-1].id >= c.id:
			d.fail("producer %d out of order", c.id)
		case k == 0 || k > carryEntriesMax:
			d.fail("producer %d carries %d seqs, want 1 to %d", c.id, k, carryEntriesMax)
		}
		c.entries = make([]dedupEntry, 0, k)
		for ; k > 0 && d.err == nil; k-- {
			e := dedupEntry{producerSeq: d.u64(), seq: d.u64(), epoch: d.u64()}
			switch {
			case d.err != nil:
			case e.seq == 0 || e.seq >= seq || e.epoch == 0 || e.epoch > epoch,
				len(c.entries) > 0 && c.entries[len(c.entries)-1].producerSeq >= e.producerSeq:
				d.fail("producer %d seq %d at %d (epoch %d) outside its carry", c.id, e.producerSeq, e.seq, e.epoch)
			}
			c.entries = append(c.entries, e)
		}
		ps = append(ps, c)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the carry", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return ps, nil
}

// applyCarry applies a carry at seq: each producer it names is mentioned
// at seq; one this table does not know is learnt from it, and a known
// one takes the carried entries it lacks (the replica's log starts after
// them; true facts, even below its floor). A carry that does not decode
// changes nothing, on every replica alike.
func (p *Producers) applyCarry(b []byte, seq, epoch uint64) error {
	ps, err := decodeCarry(b, seq, epoch)
	if err != nil {
		return err
	}
	for _, c := range ps {
		w := p.byID[c.id]
		if w == nil {
			if len(p.byID) >= p.producersMax {
				p.evictLeastRecent()
			}
			w = &producerWindow{id: c.id}
			p.byID[c.id] = w
		} else {
			p.unlink(w)
		}
		for _, e := range c.entries {
			if _, ok := w.find(e.producerSeq); !ok {
				w.insert(e, p.windowMax)
			}
		}
		w.lastSeq = seq
		p.link(w)
	}
	return nil
}
