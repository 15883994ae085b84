package storage

import (
	"fmt"
	"hash/crc32"
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
	return l.epochStarts(fromSeq, math.MaxUint64, false)
}

// EpochAt returns the epoch of the entry at seq, from its batch's header
// alone: damage or a repair's gap after seq does not concern it (a dedup
// snapshot at seq, kept by a repair that dropped later records, is
// checked with it). A seq in a gap has its gap batch's epoch: the log's
// last epoch when the gap was written, which a dedup snapshot taken at
// that point (a torn tail's kept seqs the last of the log) recorded.
func (l *Log) EpochAt(seq uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if seq >= l.nextSeq {
		return 0, fmt.Errorf("%w: seq %d at or past the log's end %d", ErrOutOfRange, seq, l.nextSeq)
	}
	starts, err := l.epochStarts(seq, seq+1, true)
	if err != nil {
		return 0, err
	}
	return starts[0].Epoch, nil
}

// epochStarts is EpochStarts over the entries from fromSeq below
// untilSeq; l.mu is held. With gapEpochs a gap's seqs have its batch's
// epoch, as entries do.
func (l *Log) epochStarts(fromSeq, untilSeq uint64, gapEpochs bool) ([]EpochStart, error) {
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
		prev   batchAt // the batch before h: verified with it at a boundary
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
			if h.gap() && h.nextSeq() > seq && !gapEpochs {
				return nil, &GapError{Next: h.nextSeq()}
			}
			if h.nextSeq() > seq && (len(out) == 0 || out[len(out)-1].Epoch != h.epoch) {
				// EpochBoundariesVerified: headers are read here without
				// their checksums, and a flip in a header's epoch makes or
				// moves a boundary (a log's epochs never decrease, so the
				// flipped batch starts a run or ends one), so the batch
				// where an epoch starts and the one before it are read
				// whole and checked: the epochs come out right or as
				// damage. A kernel took a flipped 2^58+1 for a seq's epoch
				// before (cluster simulator seed 26 of --kv 30).
				for _, b := range []batchAt{prev, {s, off, h}} {
					if err := b.verify(); err != nil {
						return nil, err
					}
				}
				out = append(out, EpochStart{Epoch: h.epoch, Seq: max(seq, h.baseSeq)})
			}
			prev = batchAt{s, off, h}
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

// batchAt is a batch of a segment, by its header (s nil: none).
type batchAt struct {
	s   *segment
	off int64
	h   batchHeader
}

// verifyChunkBytes bounds one read of verify.
const verifyChunkBytes = 64 << 10

// verify reads the batch whole and checks its checksum, which covers its
// header; an error wraps ErrCorrupt for a mismatch.
func (b batchAt) verify() error {
	if b.s == nil {
		return nil
	}
	buf := make([]byte, min(b.h.totalBytes, verifyChunkBytes))
	crc := uint32(0)
	for at := b.off + batchCRCEnd; at < b.off+b.h.totalBytes; {
		n := min(int64(len(buf)), b.off+b.h.totalBytes-at)
		if err := readFull(b.s.file, buf[:n], at); err != nil {
			return fmt.Errorf("storage: read segment %d at %d: %w", b.s.baseSeq, at, err)
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		at += n
	}
	if crc != b.h.crc {
		return fmt.Errorf("%w: segment %d offset %d: batch at seq %d: crc %#08x, want %#08x", ErrCorrupt, b.s.baseSeq, b.off, b.h.baseSeq, crc, b.h.crc)
	}
	return nil
}
