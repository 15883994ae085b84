package storage

import (
	"fmt"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// BenchmarkAppendSyncOS is one durable append at a time on the real disk:
// Append of one 1 KiB record, then Sync (fdatasync). Its ns/op is the
// storage part of an acknowledgement's latency; compare it with vfs
// BenchmarkOSWriteSync. Segments are small enough that the run crosses
// several rolls.
func BenchmarkAppendSyncOS(b *testing.B) {
	l, err := Open(vfs.OS(), b.TempDir()+"/p0", Options{SegmentBytesMax: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	recs := []Record{{TimestampMs: 1, Key: []byte("key"), Value: make([]byte, 1024)}}
	b.SetBytes(1024)
	for b.Loop() {
		if _, err := l.Append(1, recs); err != nil {
			b.Fatal(err)
		}
		if err := l.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendLargeBatchSyncOS is the large-record path on the real
// disk: one op appends a batch of 64 KiB records, then syncs it. 64
// records (4 MiB) is what a replicated leader or follower writes at once
// when 64 KiB publishes are in flight; 4 and 16 records (256 KiB, 1 MiB)
// sit at and around the size from which a batch is preallocated no
// further than its own end (largeBatchBytes). Segments of 64 MiB (the
// default) roll every 16 ops of 64 records.
func BenchmarkAppendLargeBatchSyncOS(b *testing.B) {
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			l, err := Open(vfs.OS(), b.TempDir()+"/p0", Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			recs := make([]Record, n)
			for i := range recs {
				recs[i] = Record{TimestampMs: 1, Key: []byte("key"), Value: make([]byte, 64<<10)}
			}
			b.SetBytes(int64(n) * 64 << 10)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Append(1, recs); err != nil {
					b.Fatal(err)
				}
				if err := l.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
