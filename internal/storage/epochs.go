package storage

import (
	"fmt"
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
	if err := l.readableFrom(fromSeq); err != nil {
		return nil, err
	}
	for _, d := range l.damage {
		if d.Seqs() > 0 && d.LastSeq >= fromSeq {
			return nil, &CorruptError{Damage: d}
		}
	}
	var (
		out    []EpochStart
		header [batchHeaderBytes]byte
		seq    = fromSeq
	)
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].baseSeq > fromSeq }) - 1
	for ; i < len(l.segments) && seq < l.nextSeq; i++ {
		s := l.segments[i]
		off, expectSeq := s.lookup(seq)
		for off < s.sizeBytes && expectSeq < s.nextSeq {
			h, err := readBatchHeader(s, off, expectSeq, header[:])
			if err != nil {
				return nil, err
			}
			if h.gap() && h.nextSeq() > seq {
				return nil, &GapError{Next: h.nextSeq()}
			}
			if h.nextSeq() > seq && (len(out) == 0 || out[len(out)-1].Epoch != h.epoch) {
				out = append(out, EpochStart{Epoch: h.epoch, Seq: max(seq, h.baseSeq)})
			}
			seq = max(seq, h.nextSeq())
			off += h.totalBytes
			expectSeq = h.nextSeq()
		}
		if expectSeq < s.nextSeq {
			return nil, fmt.Errorf("%w: segment %d ends before seq %d", ErrCorrupt, s.baseSeq, s.nextSeq)
		}
	}
	return out, nil
}
