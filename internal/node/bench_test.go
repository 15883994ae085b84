package node

import (
	"io"
	"log/slog"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// BenchmarkPublishSyncNode1KiB is one durable publish at a time straight
// into a node on the real disk (no TCP, no SDK): the broker's own share of
// a sync publish's latency. Compare it with storage's BenchmarkAppendSyncOS
// (one append + fdatasync) and server's BenchmarkPublishSync1KiB (the same
// through the SDK over loopback TCP).
func BenchmarkPublishSyncNode1KiB(b *testing.B) {
	n, err := Open(Config{DataDir: b.TempDir(), FS: vfs.OS(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		b.Fatal(err)
	}
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
