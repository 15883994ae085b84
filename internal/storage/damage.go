package storage

import (
	"errors"
	"fmt"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// Damage is a range of a log that failed verification and is not a torn
// tail: its bytes were durable once (a later batch says so, or it lies in
// a sealed segment) and are now unreadable. The seqs it held are neither
// served nor reused; only a repair (Repair) turns them into a recorded
// gap.
type Damage struct {
	// Segment is the path of the segment file that holds the damage.
	Segment string
	// Offset and Bytes locate the unreadable bytes in it. Bytes is 0 when
	// seqs are missing between two segments.
	Offset, Bytes int64
	// FirstSeq..LastSeq are the seqs the damaged bytes held (LastSeq <
	// FirstSeq when the bytes held no seq of the log, e.g. garbage between
	// two valid batches).
	FirstSeq, LastSeq uint64
	// Cause says why the first damaged batch failed verification.
	Cause string
	// epoch is the epoch of the last valid batch before the damage: a
	// gap batch that replaces it keeps the log's epochs non-decreasing.
	epoch uint64
}

// Seqs returns how many seqs the damage holds.
func (d Damage) Seqs() uint64 {
	if d.LastSeq < d.FirstSeq {
		return 0
	}
	return d.LastSeq - d.FirstSeq + 1
}

func (d Damage) String() string {
	return fmt.Sprintf("%s offset %d (%d bytes), seqs %d-%d: %s", d.Segment, d.Offset, d.Bytes, d.FirstSeq, d.LastSeq, d.Cause)
}

// CorruptError is returned by Read for a seq inside a known damaged
// range. It matches ErrCorrupt.
type CorruptError struct{ Damage Damage }

func (e *CorruptError) Error() string { return "storage: corrupt data: " + e.Damage.String() }

// Unwrap makes CorruptError match ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// GapError is returned by Read for a seq that a repair dropped on purpose
// (a gap batch): every seq below Next from there is gone; readers skip to
// Next. It does not match ErrCorrupt: the loss is recorded, not silent.
type GapError struct{ Next uint64 }

func (e *GapError) Error() string {
	return fmt.Sprintf("storage: seqs below %d were dropped by a repair", e.Next)
}

// TornTail describes the incomplete end of the last segment that Open cut
// off: a batch that was never completely written (or never synced) with
// nothing valid after it that proves it was durable.
type TornTail struct {
	Segment string
	Offset  int64
	// Bytes is how much was cut off (up to the end of the file, any
	// preallocated zeroes excluded).
	Bytes int64
	// FirstSeq is the seq the cut bytes would have held first: the next
	// seq after the last valid batch.
	FirstSeq uint64
	// LastSeq is the last seq a batch header in the cut bytes named
	// where the log expected it (a torn batch's header is written first;
	// an invalid one counts only within Options.BatchBytesMax); below
	// FirstSeq when none did, and what the bytes held is unknown.
	LastSeq uint64
	// Kept: the seqs FirstSeq..LastSeq were not cut but filled
	// (Options.KeepTornSeqs), never to be handed out again.
	Kept bool
	// epoch is the epoch of the batch before the cut, which a fill takes.
	epoch uint64
}

// Named reports whether the cut bytes' headers named any seq.
func (t TornTail) Named() bool { return t.LastSeq >= t.FirstSeq }

// fill is what KeepTornSeqs puts in place of t: gap batches for its
// named seqs, or batches of filler copies.
func (t TornTail) fill(filler *Record) ([]byte, error) {
	if filler == nil {
		return appendGaps(nil, t.FirstSeq, t.LastSeq, t.epoch), nil
	}
	return appendFillers(nil, t.FirstSeq, t.LastSeq, t.epoch, filler)
}

// nextValidBatch searches f for the first batch after off (exclusive) that
// verifies and could continue a segment whose next seq is nextSeq and last
// epoch lastEpoch: its base seq is at least nextSeq, its epoch at least
// lastEpoch, and (when limitSeq > 0) it ends at or before limitSeq. It
// tries hint first (where the invalid batch's header says the next one
// starts, when it decoded), so that a batch-shaped payload inside a
// damaged batch is not taken for the next batch when the damage spares
// the header. Otherwise it reads [off, end) in windows: one pass over the
// rest of the file plus one read per candidate header.
//
// Its cost is bounded: the candidates' CRCs may read at most verifyBudget
// bytes in all. A file built to defeat the
// search (a fuzzer's, or an attacker's with write access to the data
// directory) then ends it early: the damage is reported to the end of the
// segment, or in the last segment the rest is a torn tail.
func nextValidBatch(f vfs.File, off, hint, end int64, nextSeq, lastEpoch, limitSeq uint64) (int64, batchHeader, bool, error) {
	budget := verifyBudget(end - off)
	try := func(at int64, hb []byte) (batchHeader, bool, error) {
		h, err := decodeBatchHeader(hb)
		if err != nil || h.baseSeq < nextSeq || h.epoch < lastEpoch || h.totalBytes > end-at ||
			(limitSeq > 0 && h.nextSeq() > limitSeq) {
			return h, false, nil
		}
		if budget -= h.totalBytes; budget < 0 {
			return h, false, errSearchBudget
		}
		whole := make([]byte, h.totalBytes)
		if err := readFull(f, whole, at); err != nil {
			return h, false, err
		}
		_, _, err = verifyBatch(h, whole, nil, nil)
		return h, err == nil, nil
	}
	var header [batchHeaderBytes]byte
	if hint > off && end-hint >= batchHeaderBytes {
		if err := readFull(f, header[:], hint); err != nil {
			return 0, batchHeader{}, false, err
		}
		if h, ok, err := try(hint, header[:]); err != nil || ok {
			return hint, h, ok, ignoreBudget(err)
		}
	}
	const window = 4 << 20
	buf := make([]byte, min(window, end-off)+batchHeaderBytes)
	for start := off + 1; start < end; start += window {
		b := buf[:min(int64(len(buf)), end-start)]
		if err := readFull(f, b, start); err != nil {
			return 0, batchHeader{}, false, err
		}
		for i := 0; i < min(len(b), window); i++ {
			at := start + int64(i)
			if b[i] != batchMagic || end-at < batchHeaderBytes {
				continue
			}
			hb := header[:]
			if i+batchHeaderBytes <= len(b) {
				hb = b[i : i+batchHeaderBytes]
			} else if err := readFull(f, hb, at); err != nil {
				return 0, batchHeader{}, false, err
			}
			if h, ok, err := try(at, hb); err != nil || ok {
				return at, h, ok, ignoreBudget(err)
			}
		}
	}
	return 0, batchHeader{}, false, nil
}

// errSearchBudget ends a search that spent its verification budget.
var errSearchBudget = errors.New("storage: resync search budget spent")

// verifyBudget is how many bytes a resync search over n bytes may read to
// check candidates' CRCs: several times the bytes searched, which a real
// file (where a random header almost never passes the plausibility
// checks) never approaches.
func verifyBudget(n int64) int64 { return 8*n + 1<<20 }

// ignoreBudget turns a spent budget into "not found".
func ignoreBudget(err error) error {
	if errors.Is(err, errSearchBudget) {
		return nil
	}
	return err
}
