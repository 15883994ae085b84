package replog

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// BenchmarkLeaderReplicates is the replicated write path of one partition
// in one process: a leader and two followers on an in-memory file system,
// every message encoded as the peer transport sends it (a REPLICATE frame)
// and decoded by its receiver. One op proposes 64 records of size bytes at
// the leader, waits until they commit and applies them there as the
// partition's applier does (applyCommitted, bench_apply_test.go).
func BenchmarkLeaderReplicates(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("64x%d", size), func(b *testing.B) {
			leader := benchLeader(b, vfs.NewMem(), "")
			rec := storage.Record{Value: make([]byte, size)}
			applied := leader.CommitSeq()
			b.SetBytes(int64(64 * size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				wg.Add(64)
				for j := 0; j < 64; j++ {
					leader.ProposeFunc(rec, func(seq, epoch uint64, err error) {
						if err != nil {
							panic(err)
						}
						wg.Done()
					})
				}
				wg.Wait()
				for commit := leader.CommitSeq(); applied < commit; {
					entries := applyCommitted(leader, applied+1, int(commit-applied))
					if len(entries) == 0 {
						b.Fatalf("no committed entries from %d", applied+1)
					}
					applied = entries[len(entries)-1].Seq
				}
			}
		})
	}
}

// benchLeader starts three members under root on fsys, every message
// encoded as the peer transport sends it (a REPLICATE frame) and decoded by
// its receiver, and returns member 1 once it leads; they close with b.
func benchLeader(b *testing.B, fsys vfs.FS, root string) *Log {
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
		l, err := Open(Config{ID: id, Members: members, Dir: fmt.Sprintf("%s/n%d", root, id), FS: fsys, Logger: quiet, Clock: env.Wall{},
			Tick: 5 * time.Millisecond, ElectionTicks: 400, Seed: uint64(id), Send: route})
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		logs[id] = l
		mu.Unlock()
		b.Cleanup(func() { l.Close() })
	}
	leader := logs[1]
	leader.Campaign()
	for leader.Status().Role != replica.Leader {
		time.Sleep(time.Millisecond)
	}
	return leader
}

// BenchmarkNewProposal is the leader's per-record work before the kernel
// sees a publish: encoding the record into the proposal's entry.
func BenchmarkNewProposal(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			rec := storage.Record{TimestampMs: 1, ProducerID: 7, ProducerSeq: 9, Key: []byte("key"), Value: make([]byte, size)}
			done := func(seq, epoch uint64, err error) {}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if p := NewProposalFunc(rec, done); len(p.data) == 0 {
					b.Fatal("empty proposal")
				}
			}
		})
	}
}

// BenchmarkWireConversion converts an Append of 64 entries to its peer
// frame and back, as the sending and the receiving member do (the frame's
// encoding is BenchmarkAppendFrameReplicate's, internal/wire).
func BenchmarkWireConversion(b *testing.B) {
	m := replica.Message{Type: replica.MsgAppend, From: 1, To: 2, Epoch: 3, PrevSeq: 10, PrevEpoch: 3, CommitSeq: 9}
	for i := range 64 {
		m.Entries = append(m.Entries, replica.Entry{Seq: 11 + uint64(i), Epoch: 3, Data: make([]byte, 1<<10)})
	}
	b.ReportAllocs()
	for b.Loop() {
		if back := FromWire(ToWire("t", 0, m)); len(back.Entries) != 64 {
			b.Fatalf("%d entries", len(back.Entries))
		}
	}
}
