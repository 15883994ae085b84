package wire

import (
	"fmt"
	"testing"
)

// replicateBatch is a leader's REPLICATE of n entries of size bytes each.
func replicateBatch(n, size int) *Replicate {
	f := &Replicate{Topic: "orders", Partition: 3, Kind: 2, From: 1, To: 2, Epoch: 7, PrevSeq: 1000, PrevEpoch: 7, CommitSeq: 990}
	for i := 0; i < n; i++ {
		f.Entries = append(f.Entries, ReplicaEntry{Seq: uint64(1001 + i), Epoch: 7, Data: make([]byte, size)})
	}
	return f
}

// BenchmarkAppendFrameReplicate encodes one REPLICATE into a fresh buffer,
// as the peer transport does once per follower.
func BenchmarkAppendFrameReplicate(b *testing.B) {
	for _, c := range []struct{ n, size int }{{64, 1 << 10}, {64, 64 << 10}} {
		f := replicateBatch(c.n, c.size)
		b.Run(fmt.Sprintf("%dx%d", c.n, c.size), func(b *testing.B) {
			b.SetBytes(int64(c.n * c.size))
			b.ReportAllocs()
			for b.Loop() {
				AppendFrame(nil, 0, f)
			}
		})
	}
}
