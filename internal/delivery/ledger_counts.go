package delivery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrBadCounts is returned by DecodeCounts for an encoding that breaks the
// counts invariants.
var ErrBadCounts = errors.New("delivery: bad delivery counts")

// countsVersion is the first byte of encoded counts.
const countsVersion = 1

// countBytesMin is the smallest encoding of one count (two one-byte
// uvarints); the decoder bounds its allocation with it.
const countBytesMin = 2

// AppendCounts appends the encoding of counts (sorted by strictly
// increasing Seq, every Count ≥ 1, as Cursor.Counts returns them) to dst:
//
//	version u8 = 1
//	n       uvarint
//	n × { skip uvarint, count uvarint }
//
// where the first Seq = skip and every later Seq = previous Seq + 1 + skip
// (so seqs strictly increase and each list has exactly one encoding).
func AppendCounts(dst []byte, counts []SeqCount) []byte {
	dst = append(dst, countsVersion)
	dst = binary.AppendUvarint(dst, uint64(len(counts)))
	var prev uint64
	for i, sc := range counts {
		skip := sc.Seq - prev
		if i > 0 {
			skip--
		}
		dst = binary.AppendUvarint(dst, skip)
		dst = binary.AppendUvarint(dst, uint64(sc.Count))
		prev = sc.Seq
	}
	return dst
}

// DecodeCounts decodes an encoding made by AppendCounts. It rejects
// trailing bytes, overflow, zero counts and unknown versions, never
// panics, and allocates at most len(b)/2 entries.
func DecodeCounts(b []byte) ([]SeqCount, error) {
	if len(b) == 0 || b[0] != countsVersion {
		return nil, fmt.Errorf("%w: missing or unknown version", ErrBadCounts)
	}
	d := uvarintReader{b: b[1:]}
	n := d.next()
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCounts, d.err)
	}
	if n > uint64(len(d.b)/countBytesMin) {
		return nil, fmt.Errorf("%w: %d counts in %d bytes", ErrBadCounts, n, len(d.b))
	}
	var out []SeqCount
	if n > 0 {
		out = make([]SeqCount, 0, n)
	}
	var prev uint64
	for i := uint64(0); i < n; i++ {
		skip, count := d.next(), d.next()
		if d.err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadCounts, d.err)
		}
		step := skip
		if i > 0 {
			if skip == math.MaxUint64 {
				return nil, fmt.Errorf("%w: entry %d overflows", ErrBadCounts, i)
			}
			step++
		}
		if step > math.MaxUint64-prev || count == 0 || count > math.MaxUint32 {
			return nil, fmt.Errorf("%w: entry %d out of range", ErrBadCounts, i)
		}
		prev += step
		out = append(out, SeqCount{Seq: prev, Count: uint32(count)})
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadCounts, len(d.b))
	}
	return out, nil
}
