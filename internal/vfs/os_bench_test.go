package vfs

import (
	"path/filepath"
	"strconv"
	"testing"
)

// BenchmarkOSWriteSync measures the raw disk: append a block and fsync it,
// the floor under any durable acknowledgement. Compare group-commit numbers
// with it (`go test -bench OSWriteSync ./internal/vfs`).
func BenchmarkOSWriteSync(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(byteSize(size), func(b *testing.B) {
			f, err := OS().Create(filepath.Join(b.TempDir(), "f"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := f.Write(buf); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOSWriteAtSyncAllocated is BenchmarkOSWriteSync inside a
// preallocated file, as storage writes segments: the file is grown with
// Allocate 1 MiB ahead of the writes (timed), so most fdatasyncs need not
// flush a new file size.
func BenchmarkOSWriteAtSyncAllocated(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(byteSize(size), func(b *testing.B) {
			f, err := OS().OpenRW(filepath.Join(b.TempDir(), "f"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			var off, allocated int64
			for i := 0; i < b.N; i++ {
				if end := off + int64(size); end > allocated {
					allocated = end + 1<<20
					if err := f.Allocate(allocated); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				off += int64(size)
			}
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}
