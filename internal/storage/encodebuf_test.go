package storage

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// recordsOfBytes returns records of at most 64 KiB of value each whose
// encodings take exactly total bytes together.
func recordsOfBytes(total int) []Record {
	var recs []Record
	for total > 0 {
		value := min(64<<10, total-recordBytesMin)
		recs = append(recs, Record{TimestampMs: 1, Value: make([]byte, value)})
		total -= recordBytesMin + value
	}
	return recs
}

// TestBatchesUpToTheReusedBoundShareOneBuffer: a writer that cuts its
// batches at BatchRecordBytesReused of records (replog does) has every
// batch encoded in the one buffer the log keeps — also after a smaller
// batch first sized the buffer, where growing it by a factor would
// overshoot the kept size and leave every full batch a new allocation.
func TestBatchesUpToTheReusedBoundShareOneBuffer(t *testing.T) {
	l, err := Open(vfs.NewMem(), "/p", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Append(1, recordsOfBytes(600<<10)); err != nil {
		t.Fatal(err)
	}
	full := recordsOfBytes(BatchRecordBytesReused)
	if _, err := l.Append(1, full); err != nil {
		t.Fatal(err)
	}
	if cap(l.encodeBuf) < encodeBufferBytesMax {
		t.Fatalf("after a batch of %d bytes of records the log keeps a buffer of %d", BatchRecordBytesReused, cap(l.encodeBuf))
	}
	kept := &l.encodeBuf[:1][0]
	for i := 0; i < 3; i++ {
		if _, err := l.Append(1, full); err != nil {
			t.Fatal(err)
		}
		if &l.encodeBuf[:1][0] != kept {
			t.Fatalf("append %d encoded its batch in a new buffer", i)
		}
	}
	got, err := l.Read(1, 1<<20, 64<<20)
	if err != nil || len(got) != int(l.NextSeq()-1) {
		t.Fatalf("read back %d of %d records: %v", len(got), l.NextSeq()-1, err)
	}
}
