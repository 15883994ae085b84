package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// validSegment returns the bytes of a segment holding a few batches,
// followed by its preallocated zeroes.
func validSegment(tb testing.TB) []byte {
	seg, _ := validSegmentUsed(tb)
	return seg
}

// validSegmentUsed is validSegment and the length of its batches.
func validSegmentUsed(tb testing.TB) ([]byte, int) {
	m := vfs.NewMem()
	l := openLog(tb, m, Options{})
	var mod model
	appendMany(tb, l, &mod, 9, 3)
	used := int(l.active().sizeBytes)
	l.Close()
	b, err := m.ReadFile(testDir + "/00000000000000000001.log")
	if err != nil {
		tb.Fatal(err)
	}
	if len(b) <= used {
		tb.Fatalf("segment of %d bytes for %d used: not preallocated", len(b), used)
	}
	return b, used
}

// verifiedSeqs walks the batches of seg independently of the package's
// decoder and returns the seqs of batches whose CRC verifies.
func verifiedSeqs(seg []byte) map[uint64]bool {
	ok := map[uint64]bool{}
	for off := 0; len(seg)-off >= batchHeaderBytes; {
		b := seg[off:]
		total := int(binary.LittleEndian.Uint32(b[2:])) + 6
		if total < batchHeaderBytes || total > len(b) {
			break
		}
		if crc32.Checksum(b[10:total], crc32.MakeTable(crc32.Castagnoli)) == binary.LittleEndian.Uint32(b[6:]) {
			base := binary.LittleEndian.Uint64(b[10:])
			count := binary.LittleEndian.Uint32(b[26:])
			for i := uint64(0); i < uint64(count) && i < 1<<16; i++ {
				ok[base+i] = true
			}
		}
		off += total
	}
	return ok
}

// FuzzRecovery feeds arbitrary bytes as a segment file: as the active
// segment (recovered by scanning) when asSealed is false, or as a sealed
// segment trusted through a forged index when it is true. Open must not
// panic, Read must serve only records from CRC-verified batches, and only
// zeroes may follow the active segment's last batch.
func FuzzRecovery(f *testing.F) {
	seg, used := validSegmentUsed(f)
	f.Add(seg, false)
	f.Add(seg, true)
	f.Add(seg[:len(seg)-7], false)
	f.Add(seg[:len(seg)-7], true)
	f.Add(seg[:used], false)
	f.Add(seg[:used-7], false)
	zeroes := make([]byte, len(seg)-used)
	// A torn batch, then zeroes.
	torn := append(append([]byte(nil), seg[:used]...), seg[:batchHeaderBytes+9]...)
	f.Add(append(torn, zeroes...), false)
	// Zeroes, then batches (stale, out of sequence).
	gap := append(append([]byte(nil), seg[:used]...), zeroes[:100]...)
	f.Add(append(gap, seg[:used]...), false)
	// One stray byte after the batches.
	f.Add(append(append([]byte(nil), seg[:used]...), 1), false)
	f.Add([]byte{}, false)
	f.Add([]byte{batchMagic, batchVersionV2, 0xff, 0xff, 0xff, 0x7f}, false)
	f.Fuzz(func(t *testing.T, data []byte, asSealed bool) {
		m := vfs.NewMem()
		if err := m.MkdirAll(testDir); err != nil {
			t.Fatal(err)
		}
		segName := testDir + "/00000000000000000001.log"
		if err := m.WriteFile(segName, data); err != nil {
			t.Fatal(err)
		}
		if asSealed && len(data) > 0 {
			// Claim the segment holds 1000 records and trust it.
			s := &segment{baseSeq: 1, nextSeq: 1001, sizeBytes: int64(len(data)), lastEpoch: 3,
				index: []indexEntry{{seq: 1, offset: 0}}}
			if err := WriteFileAtomic(m, testDir+"/00000000000000000001.idx", s.encodeIndex()); err != nil {
				t.Fatal(err)
			}
			if err := m.WriteFile(testDir+"/00000000000000001001.log", nil); err != nil {
				t.Fatal(err)
			}
		}
		l, err := Open(m, testDir, Options{IndexIntervalBytes: 64})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer l.Close()
		recovered, err := m.ReadFile(segName)
		if err != nil {
			t.Fatal(err)
		}
		verified := verifiedSeqs(recovered)
		if !asSealed && len(recovered) > len(data) {
			t.Fatalf("recovery grew the segment")
		}
		checkLayout(t, m, l)
		for seq := l.StartSeq(); seq < l.NextSeq(); {
			es, err := l.Read(seq, 1000, 1<<20)
			var damaged *CorruptError
			var gap *GapError
			switch {
			case errors.As(err, &damaged):
				seq = damaged.Damage.LastSeq + 1 // recorded damage: refused, stepped over
				continue
			case errors.As(err, &gap):
				seq = gap.Next
				continue
			case err != nil && asSealed:
				seq++
				continue
			case err != nil:
				t.Fatalf("Read(%d) on a recovered log: %v", seq, err)
			}
			for i, e := range es {
				if e.Seq != seq+uint64(i) {
					t.Fatalf("Read(%d) entry %d has seq %d", seq, i, e.Seq)
				}
				if e.Seq < 1001 && !verified[e.Seq] {
					t.Fatalf("seq %d served from a batch whose CRC does not verify", e.Seq)
				}
			}
			seq += uint64(len(es))
		}
	})
}

// FuzzDecodeBatch checks the batch decoder never panics and accepts only
// batches that re-encode to the same bytes.
func FuzzDecodeBatch(f *testing.F) {
	seg := validSegment(f)
	f.Add(seg)
	f.Add(seg[:batchHeaderBytes])
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := decodeBatchHeader(data)
		if err != nil || h.totalBytes > int64(len(data)) {
			return
		}
		b := data[:h.totalBytes]
		entries, _, err := verifyBatch(h, b, []Entry{}, []int{})
		if err != nil {
			return
		}
		recs := make([]Record, len(entries))
		for i, e := range entries {
			recs[i] = e.Record
		}
		if h.gap() {
			if again := appendGapBatch(nil, h.baseSeq, h.epoch, h.count); string(again[:30]) != string(b[:30]) {
				t.Fatalf("gap batch does not re-encode to its bytes")
			}
			return
		}
		again, err := appendBatch(nil, h.baseSeq, h.epoch, syncedThrough(h, b), recs, batchBytesLimit, batchBytesLimit)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		// The max timestamp field is derived; everything else must match
		// (a version-1 batch re-encodes as version 2, with a prefix).
		if string(again[10:30]) != string(b[10:30]) ||
			string(again[batchHeaderBytes+syncedThroughBytes:]) != string(b[batchHeaderBytes+h.prefixBytes():]) {
			t.Fatalf("decoded batch does not re-encode to its bytes")
		}
	})
}

// FuzzDecodeRecord: DecodeRecord never panics, and what it accepts
// re-encodes to the same bytes, whose size RecordBytes tells exactly.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, &Record{TimestampMs: 1, Key: []byte("k"), Value: []byte("v"),
		Headers: []Header{{Key: "h", Value: []byte("x")}}, ProducerID: 7, ProducerSeq: 9}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if got := AppendRecord(nil, &r); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", got, b)
		}
		if n := RecordBytes(&r); n != len(b) {
			t.Fatalf("RecordBytes = %d for a record of %d bytes", n, len(b))
		}
		if got := EncodeRecord(&r); !bytes.Equal(got, b) || cap(got) != len(b) {
			t.Fatalf("EncodeRecord: %d bytes (capacity %d), equal %v; want the record's %d", len(got), cap(got), bytes.Equal(got, b), len(b))
		}
	})
}

// SegmentBatches reads the batches of a valid segment, and stops at the
// first that does not verify.
func TestSegmentBatches(t *testing.T) {
	seg, used := validSegmentUsed(t)
	batches := SegmentBatches(seg)
	var bases []uint64
	for _, b := range batches {
		bases = append(bases, b.Entries[0].Seq)
	}
	if fmt.Sprint(bases) != "[1 2 4 8]" || batches[len(batches)-1].End != int64(used) {
		t.Fatalf("batches starting at %v, the last ending at %d; want [1 2 4 8] ending at %d", bases, batches[len(batches)-1].End, used)
	}
	flipped := append([]byte(nil), seg...)
	flipped[(batches[2].Offset+batches[2].End)/2] ^= 1
	if got := SegmentBatches(flipped); len(got) != 2 || got[1].End != batches[2].Offset {
		t.Fatalf("after a flip in the third batch: %d batches", len(got))
	}
	// A repair's gap batch has no entries: it names the seqs it stands for.
	last := batches[len(batches)-1].Entries
	next := last[len(last)-1].Seq + 1
	withGap := appendGapBatch(append([]byte(nil), seg[:used]...), next, 1, 3)
	got := SegmentBatches(withGap)
	if g := got[len(got)-1]; len(got) != 5 || len(g.Entries) != 0 || g.Gap == nil || *g.Gap != (SeqRange{next, next + 2}) || batches[0].Gap != nil {
		t.Fatalf("a gap of seqs %d-%d after the batches: %d batches, the last %+v", next, next+2, len(got), g)
	}
}

// FuzzSegmentBatches: whatever the bytes, the batches are contiguous from
// offset 0 inside the content, each with consecutive seqs.
func FuzzSegmentBatches(f *testing.F) {
	seg, used := validSegmentUsed(f)
	f.Add(seg)
	f.Add(seg[:used-7])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		at := int64(0)
		for _, b := range SegmentBatches(data) {
			if b.Offset != at || b.End <= b.Offset || b.End > int64(len(data)) {
				t.Fatalf("batch [%d, %d) after %d in %d bytes", b.Offset, b.End, at, len(data))
			}
			for i, e := range b.Entries {
				if e.Seq != b.Entries[0].Seq+uint64(i) {
					t.Fatalf("batch at %d: entry %d has seq %d", b.Offset, i, e.Seq)
				}
			}
			at = b.End
		}
	})
}
