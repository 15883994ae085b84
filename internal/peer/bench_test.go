package peer

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// BenchmarkSendReplicate is a leader sending each REPLICATE of n entries of
// size bytes to its two followers, as a partition leader of an R3 topic
// does; one op is one frame to each follower, received and decoded.
func BenchmarkSendReplicate(b *testing.B) {
	for _, c := range []struct{ n, size int }{{64, 1 << 10}, {64, 64 << 10}} {
		b.Run(fmt.Sprintf("%dx%d", c.n, c.size), func(b *testing.B) {
			got := &counter{ch: make(chan struct{}, 1)}
			ts, _ := clusterTuned(b, 3, func(cfg *Config) {
				cfg.Handler = func(uint32, wire.Frame) { got.add() }
			})
			data := make([]byte, c.size)
			frame := func(to uint32, i int) *wire.Replicate {
				f := &wire.Replicate{Topic: "orders", Kind: 2, From: 1, To: to, Epoch: 7, PrevSeq: uint64(i * c.n)}
				for j := 0; j < c.n; j++ {
					f.Entries = append(f.Entries, wire.ReplicaEntry{Seq: uint64(i*c.n + j + 1), Epoch: 7, Data: data})
				}
				return f
			}
			// The connections are up once a frame went through each.
			for _, to := range []uint32{2, 3} {
				ts[0].Send(to, frame(to, 0))
			}
			waitReceived(b, got, 2)
			got.n.Store(0)
			b.SetBytes(int64(2 * c.n * c.size))
			b.ReportAllocs()
			b.ResetTimer()
			sent := int64(0)
			for i := 0; i < b.N; i++ {
				for _, to := range []uint32{2, 3} {
					for !ts[0].Send(to, frame(to, i)) {
						waitReceived(b, got, sent) // the queue is full: let it drain
					}
					sent++
				}
				if i%16 == 15 {
					waitReceived(b, got, sent)
				}
			}
			waitReceived(b, got, sent)
		})
	}
}

// counter counts received frames and pokes ch at each.
type counter struct {
	n  atomic.Int64
	ch chan struct{}
}

func (c *counter) add() {
	c.n.Add(1)
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

// waitReceived waits until n frames were received.
func waitReceived(b *testing.B, got *counter, n int64) {
	deadline := time.After(30 * time.Second)
	for got.n.Load() < n {
		select {
		case <-got.ch:
		case <-deadline:
			b.Fatalf("received %d frames, want %d", got.n.Load(), n)
		}
	}
}

// TestFrameBuffersComeInFittingClasses: a buffer from the pool holds the
// frame it was asked for, and a returned buffer is reused for a frame of
// the class its capacity fills (so a larger frame never takes it).
func TestFrameBuffersComeInFittingClasses(t *testing.T) {
	for _, n := range []int{0, 1, 4 << 10, 4<<10 + 1, 1 << 20, 3 << 20, 16 << 20, 16<<20 + 1} {
		if b := getFrameBuffer(n); len(b) != 0 || cap(b) < n {
			t.Fatalf("getFrameBuffer(%d): len %d cap %d", n, len(b), cap(b))
		}
	}
	// 1 MiB + 1 byte takes a 2 MiB buffer: handed back, it is in the
	// 2 MiB class, so a frame of 2 MiB fits it and one just over does not.
	b := getFrameBuffer(1<<20 + 1)
	if cap(b) != 2<<20 {
		t.Fatalf("cap %d, want the 2 MiB class", cap(b))
	}
	putFrameBuffer(append(b, 1, 2, 3))
	if b := getFrameBuffer(2<<20 + 1); cap(b) < 2<<20+1 {
		t.Fatalf("a frame of 2 MiB + 1 got a buffer of %d", cap(b))
	}
}
