package delivery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// SeqRange is the inclusive run of seqs First..Last.
type SeqRange struct {
	First, Last uint64
}

// DoneState is the durable done-state of one cursor: every seq below Floor
// is done (acked or dead-lettered), and above it exactly the seqs of Ranges
// are. Ranges are run-length encoded so a consumer that leaves one old
// message unacked while it acks millions of later ones costs one range, not
// millions of seqs.
//
// Invariants (Validate): Ranges are sorted, every First > Floor, Last ≥
// First, consecutive ranges are separated by at least one seq that is not
// done (they are maximal runs), and Last < math.MaxUint64.
type DoneState struct {
	Floor  uint64
	Ranges []SeqRange
}

// ErrBadDoneState is returned by DecodeDoneState and Cursor.Restore for an
// encoding or a state that breaks the DoneState invariants.
var ErrBadDoneState = errors.New("delivery: bad done state")

// Validate checks the DoneState invariants.
func (s DoneState) Validate() error {
	next := s.Floor // lowest seq that may start the next range, minus one
	for i, r := range s.Ranges {
		if r.First <= next || r.Last < r.First || r.Last == math.MaxUint64 {
			return fmt.Errorf("%w: range %d [%d,%d] after %d", ErrBadDoneState, i, r.First, r.Last, next)
		}
		next = r.Last + 1 // not done: ranges are maximal
	}
	return nil
}

// DoneSeqs is the number of done seqs above Floor (the sum of the range
// lengths), saturating at math.MaxUint64.
func (s DoneState) DoneSeqs() uint64 {
	var n uint64
	for _, r := range s.Ranges {
		l := r.Last - r.First + 1
		if l == 0 || n+l < n {
			return math.MaxUint64
		}
		n += l
	}
	return n
}

// doneStateVersion is the first byte of an encoded DoneState.
const doneStateVersion = 1

// doneRangeBytesMin is the smallest encoding of one range (two one-byte
// uvarints); the decoder bounds its allocation with it.
const doneRangeBytesMin = 2

// AppendDoneState appends the encoding of s to dst:
//
//	version u8 = 1
//	floor   uvarint
//	count   uvarint                  number of ranges
//	count × { skip uvarint, extra uvarint }
//
// where, with prev = floor before the first range and Last+1 after each,
// First = prev + 1 + skip and Last = First + extra. prev is never done, so
// every encoding that decodes without overflow satisfies the invariants,
// and each state has exactly one encoding. s must be valid.
func AppendDoneState(dst []byte, s DoneState) []byte {
	dst = append(dst, doneStateVersion)
	dst = binary.AppendUvarint(dst, s.Floor)
	dst = binary.AppendUvarint(dst, uint64(len(s.Ranges)))
	prev := s.Floor
	for _, r := range s.Ranges {
		dst = binary.AppendUvarint(dst, r.First-prev-1)
		dst = binary.AppendUvarint(dst, r.Last-r.First)
		prev = r.Last + 1
	}
	return dst
}

// DecodeDoneState decodes an encoding made by AppendDoneState. It rejects
// trailing bytes, overflow and unknown versions, never panics, and
// allocates at most len(b)/2 ranges.
func DecodeDoneState(b []byte) (DoneState, error) {
	if len(b) == 0 || b[0] != doneStateVersion {
		return DoneState{}, fmt.Errorf("%w: missing or unknown version", ErrBadDoneState)
	}
	d := uvarintReader{b: b[1:]}
	floor := d.next()
	count := d.next()
	if d.err != nil {
		return DoneState{}, d.err
	}
	if count > uint64(len(d.b)/doneRangeBytesMin) {
		return DoneState{}, fmt.Errorf("%w: %d ranges in %d bytes", ErrBadDoneState, count, len(d.b))
	}
	s := DoneState{Floor: floor}
	if count > 0 {
		s.Ranges = make([]SeqRange, 0, count)
	}
	prev := floor
	for i := uint64(0); i < count; i++ {
		skip, extra := d.next(), d.next()
		if d.err != nil {
			return DoneState{}, d.err
		}
		// First = prev+1+skip and Last = First+extra must not overflow,
		// and Last+1 (the next prev) must not either.
		if prev >= math.MaxUint64-1 || skip > math.MaxUint64-2-prev {
			return DoneState{}, fmt.Errorf("%w: range %d overflows", ErrBadDoneState, i)
		}
		first := prev + 1 + skip
		if extra > math.MaxUint64-1-first {
			return DoneState{}, fmt.Errorf("%w: range %d overflows", ErrBadDoneState, i)
		}
		last := first + extra
		s.Ranges = append(s.Ranges, SeqRange{First: first, Last: last})
		prev = last + 1
	}
	if len(d.b) != 0 {
		return DoneState{}, fmt.Errorf("%w: %d trailing bytes", ErrBadDoneState, len(d.b))
	}
	return s, nil
}

// uvarintReader reads uvarints and keeps the first error.
type uvarintReader struct {
	b   []byte
	err error
}

func (r *uvarintReader) next() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || (n > 1 && r.b[n-1] == 0) { // a zero last byte is a non-minimal encoding
		r.err = fmt.Errorf("%w: truncated, overlong or non-minimal varint", ErrBadDoneState)
		return 0
	}
	r.b = r.b[n:]
	return v
}
