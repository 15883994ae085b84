package node

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// openBenchNode opens a node on the real disk with the one-partition topic
// "t", closed when the benchmark ends.
func openBenchNode(b *testing.B) *Node {
	b.Helper()
	n, err := Open(Config{DataDir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(n.Close)
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkPublishSyncNode1KiB is one durable publish at a time straight
// into a node on the real disk (no TCP, no SDK): the broker's own share of
// a sync publish's latency. Compare it with storage's BenchmarkAppendSyncOS
// (one append + fdatasync) and server's BenchmarkPublishSync1KiB (the same
// through the SDK over loopback TCP).
func BenchmarkPublishSyncNode1KiB(b *testing.B) {
	n := openBenchNode(b)
	value := make([]byte, 1024)
	done := make(chan *wire.Error, 1)
	b.ReportAllocs()
	for b.Loop() {
		n.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: value}, func(_ wire.PubOK, err *wire.Error) { done <- err })
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishAsyncNode1KiB is publishing with 256 in flight straight
// into a node on the real disk (no TCP, no SDK): the broker's own ceiling
// for server's BenchmarkPublishAsync1KiB, which adds the SDK and loopback
// TCP on both sides of the same group commit.
func BenchmarkPublishAsyncNode1KiB(b *testing.B) {
	n := openBenchNode(b)
	value := make([]byte, 1024)
	window := make(chan struct{}, 256)
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		window <- struct{}{}
		n.Publish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: uint64(i + 1), Value: value}, func(_ wire.PubOK, err *wire.Error) {
			if err != nil {
				b.Error(err)
			}
			<-window
		})
	}
	for range cap(window) {
		window <- struct{}{} // every reply has come
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
