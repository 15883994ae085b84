package storage

import (
	"fmt"
	"math"
	"sort"
)

// EpochStart is where an epoch's entries begin in the log.
type EpochStart struct{ Epoch, Seq uint64 }

// EpochStarts returns where each epoch begins among the entries from
// fromSeq on (the first at fromSeq), in order. It reads only the batch
// headers — a batch is written under one epoch — so it costs a small read
// per batch, not the log's bytes; the records are verified when they are
// read (Read, Verify, the scrubber). A known damaged range or a repair's
// gap from fromSeq on is an error, as for Read.
func (l *Log) EpochStarts(fromSeq uint64) ([]EpochStart, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.epochStarts(fromSeq, math.MaxUint64)
}

// EpochAt returns the epoch of the entry at seq, from its batch's header
// alone: damage or a repair's gap after seq does not concern it (a dedup
// snapshot at seq, kept by a repair that dropped later records, is
// checked with it).
func (l *Log) EpochAt(seq uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if seq >= l.nextSeq {
		return 0, fmt.Errorf("%w: seq %d at or past the log's end %d", ErrOutOfRange, seq, l.nextSeq)
	}
	starts, err := l.epochStarts(seq, seq+1)
	if err != nil {
		return 0, err
	}
	return starts[0].Epoch, nil
}

// epochStarts is EpochStarts over the entries from fromSeq below
// untilSeq; l.mu is held.
func (l *Log) epochStarts(fromSeq, untilSeq uint64) ([]EpochStart, error) {
	if err := l.readableFrom(fromSeq); err != nil {
		return nil, err
	}
	for _, d := range l.damage {
		if d.Seqs() > 0 && d.LastSeq >= fromSeq && d.FirstSeq < untilSeq {
			return nil, &CorruptError{Damage: d}
		}
	}
	var (
		out    []EpochStart
		header [batchHeaderBytes]byte
		seq    = fromSeq
	)
	end := min(l.nextSeq, untilSeq)
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].baseSeq > fromSeq }) - 1
	for ; i < len(l.segments) && seq < end; i++ {
		s := l.segments[i]
		off, expectSeq := s.lookup(seq)
		for off < s.sizeBytes && expectSeq < s.nextSeq && seq < end {
			h, err := readBatchHeader(s, off, expectSeq, header[:])
			if err != nil {
				return nil, err
			}
			if h.gap() && h.nextSeq() > seq {
				return nil, &GapError{Next: h.nextSeq()}
			}
			if !h.gap() && len(out) > 0 && h.epoch < out[len(out)-1].Epoch {
				// EpochsNeverDecrease: a log's epochs only grow (a newer
				// leader's entries replace an older one's, never the
				// reverse), so a header that says otherwise was damaged —
				// one of the two. The header alone is read here; the
				// batch's checksum, which covers it, says which.
				return nil, fmt.Errorf("%w: segment %d offset %d: batch at seq %d has epoch %d, below the epoch %d before it",
					ErrCorrupt, s.baseSeq, off, h.baseSeq, h.epoch, out[len(out)-1].Epoch)
			}
			if h.nextSeq() > seq && (len(out) == 0 || out[len(out)-1].Epoch != h.epoch) {
				out = append(out, EpochStart{Epoch: h.epoch, Seq: max(seq, h.baseSeq)})
			}
			seq = max(seq, h.nextSeq())
			off += h.totalBytes
			expectSeq = h.nextSeq()
		}
		if expectSeq < s.nextSeq && seq < end {
			return nil, fmt.Errorf("%w: segment %d ends before seq %d", ErrCorrupt, s.baseSeq, s.nextSeq)
		}
	}
	return out, nil
}
