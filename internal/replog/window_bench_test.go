package replog

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// BenchmarkWindowOnDisk is a producer's window over one partition of
// three members in one process, on the real file system (real fsyncs, one
// disk): 256 proposals always in flight, a new one as each completes, as
// the bench module's async publisher keeps them. It reports the
// proposal-to-completion latency's p50 and p99 besides the throughput:
// what the member's driver adds to the fsyncs.
func BenchmarkWindowOnDisk(b *testing.B) {
	const window = 256
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			dir, err := os.MkdirTemp(os.Getenv("NEREUS_BENCH_DIR"), "replog-window-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			leader := benchLeader(b, vfs.OS(), dir)
			rec := storage.Record{Value: make([]byte, size)}
			var (
				lmu     sync.Mutex
				lat     []time.Duration
				started int
				done    = make(chan struct{})
				wg      sync.WaitGroup
			)
			var propose func()
			propose = func() {
				t0 := time.Now()
				leader.ProposeFunc(rec, func(seq, epoch uint64, err error) {
					if err != nil {
						panic(err)
					}
					d := time.Since(t0)
					lmu.Lock()
					lat = append(lat, d)
					more, last := started < b.N, len(lat) == b.N
					if more {
						started++
					}
					lmu.Unlock()
					if more {
						wg.Add(1)
						go func() { defer wg.Done(); propose() }()
					}
					if last {
						close(done)
					}
				})
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			lmu.Lock()
			for started < min(window, b.N) {
				started++
				wg.Add(1)
				go func() { defer wg.Done(); propose() }()
			}
			lmu.Unlock()
			<-done
			b.StopTimer()
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
