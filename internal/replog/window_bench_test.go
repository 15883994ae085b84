package replog

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
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
			members := []replica.NodeID{1, 2, 3}
			var mu sync.Mutex
			logs := map[replica.NodeID]*Log{}
			route := func(m replica.Message) {
				frame := wire.AppendFrame(nil, 0, ToWire("t", 0, m))
				_, f, err := wire.DecodeFrame(frame[4:])
				if err != nil {
					panic(err)
				}
				mu.Lock()
				to := logs[m.To]
				mu.Unlock()
				if to != nil {
					to.Step(FromWire(f.(*wire.Replicate)))
				}
			}
			for _, id := range members {
				l, err := Open(Config{ID: id, Members: members, Dir: fmt.Sprintf("%s/n%d", dir, id), FS: vfs.OS(), Logger: quiet, Clock: env.Wall{},
					Tick: 5 * time.Millisecond, ElectionTicks: 400, Seed: uint64(id), Send: route})
				if err != nil {
					b.Fatal(err)
				}
				mu.Lock()
				logs[id] = l
				mu.Unlock()
				defer l.Close()
			}
			logs[1].Campaign()
			leader := logs[1]
			for leader.Status().Role != replica.Leader {
				time.Sleep(time.Millisecond)
			}
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
