package node

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/budget"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// notYet is how long a test watches for something that must not happen.
const notYet = 50 * time.Millisecond

// A partition's queue holds at most PublishQueueBytesMax of clients'
// records: a publisher waits until the partition's goroutine takes what
// is queued, and is answered UNAVAILABLE if the partition stops first.
func TestPublishQueueBoundsBytes(t *testing.T) {
	p := &partitionRunner{node: &Node{}, reqs: make(chan *pubReq, 8192), reqBytes: budget.NewBytes(4096), done: make(chan struct{})}
	answers := make(chan *wire.Error, 4)
	req := func(bytes int64) *pubReq {
		return &pubReq{queuedBytes: bytes, reply: replyTo{fn: func(_ wire.PubOK, err *wire.Error) { answers <- err }}}
	}
	p.queue(req(3000))
	queued := make(chan struct{})
	go func() { p.queue(req(3000)); close(queued) }()
	select {
	case <-queued:
		t.Fatalf("6000 bytes queued under a bound of 4096 (%d hand-offs)", len(p.reqs))
	case <-time.After(notYet):
	}
	p.take(<-p.reqs)
	select {
	case <-queued:
	case <-time.After(waitMax):
		t.Fatal("taking the first hand-off did not let the second in")
	}
	go p.queue(req(3000))
	time.Sleep(notYet)
	close(p.done)
	select {
	case err := <-answers:
		if err == nil || err.Code != wire.CodeUnavailable {
			t.Fatalf("a publisher waiting for room when the partition stopped got %v, want UNAVAILABLE", err)
		}
	case <-time.After(waitMax):
		t.Fatal("a publisher waiting for room was not answered when the partition stopped")
	}
	// A hand-off that fits, to a stopped partition: answered, not counted.
	p.queue(req(100))
	if err := <-answers; err == nil || err.Code != wire.CodeUnavailable {
		t.Fatalf("a publish to a stopped partition got %v, want UNAVAILABLE", err)
	}
	if n := p.reqBytes.Held(); n != 3000 {
		t.Fatalf("%d bytes counted, want 3000 (the one hand-off still queued)", n)
	}
}

// A KV bucket's or a scheduler shard's own write (no counted bytes) does
// not wait for room: not even behind a hand-off larger than the bound.
func TestUncountedWritesDoNotWaitForBytes(t *testing.T) {
	p := &partitionRunner{node: &Node{}, reqs: make(chan *pubReq, 8), reqBytes: budget.NewBytes(4096), done: make(chan struct{})}
	defer close(p.done)
	ignore := replyTo{fn: func(wire.PubOK, *wire.Error) {}}
	p.queue(&pubReq{queuedBytes: 5000, reply: ignore}) // larger than the bound: in alone
	queued := make(chan struct{})
	go func() { p.queue(&pubReq{reply: ignore}); close(queued) }()
	select {
	case <-queued:
	case <-time.After(waitMax):
		t.Fatal("an uncounted write waited for room in the queue's bytes")
	}
}

// Every goroutine that takes from the queue gives its bytes back: far more
// than the bound goes through a local and a replicated partition.
func TestPublishesBeyondTheQueueBytesComplete(t *testing.T) {
	tune := func(c *Config) { c.PublishQueueBytesMax = 2048 }
	batch := func(topic string, i int) []wire.Pub {
		var pubs []wire.Pub
		for j := range 10 {
			pubs = append(pubs, wire.Pub{Topic: topic, Partition: 0, Key: []byte{byte(i), byte(j)}, Value: bytes.Repeat([]byte{'v'}, 1024)})
		}
		return pubs
	}
	check := func(t *testing.T, n *Node, topic string) {
		for i := range 20 {
			a := publishBatchOn(n, batch(topic, i))
			a.wait(t)
			for j, err := range a.errs {
				if err != nil {
					t.Fatalf("batch %d record %d: %v", i, j, err)
				}
			}
		}
		// Many small hand-offs at once, so the goroutine drains several
		// per turn: each drained one gives its bytes back too.
		var wg sync.WaitGroup
		answers := make(chan *batchAnswers, 200)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					answers <- publishBatchOn(n, []wire.Pub{{Topic: topic, Partition: 0, Key: []byte{byte(g), byte(i)}, Value: bytes.Repeat([]byte{'s'}, 256)}})
				}
			}()
		}
		wg.Wait()
		close(answers)
		for a := range answers {
			a.wait(t)
			if a.errs[0] != nil {
				t.Fatalf("a small publish: %v", a.errs[0])
			}
		}
		if held := n.topics[topic].partitions[0].reqBytes.Held(); held != 0 {
			t.Fatalf("%d bytes still counted in an empty queue", held)
		}
	}
	t.Run("local", func(t *testing.T) {
		h := newHarness(t)
		h.node.Close()
		h.tune = tune
		h.open()
		h.declare("orders", 1)
		check(t, h.node, "orders")
	})
	t.Run("replicated", func(t *testing.T) {
		tc := newTestClusterWith(t, 3, tune)
		tc.declare("n1", wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3})
		leader, _ := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("first")})
		check(t, tc.nodes[leader], "orders")
	})
}

// A hand-off's head carries the record bytes of its whole chain, which is
// what the queue counts: a single PUB its record's, a PUB_BATCH the records
// it has for that partition. (A Manual node keeps its queue in view.)
func TestHandOffCountsItsRecordBytes(t *testing.T) {
	var now atomic.Int64
	n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: vfs.NewMem(), Clock: testClock{nowMs: &now}}, Manual: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	pub := func(part int32, size int) wire.Pub {
		return wire.Pub{Topic: "t", Partition: part, Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, size)}
	}
	size := func(p wire.Pub) int64 {
		return int64(storage.RecordBytes(&storage.Record{Key: p.Key, Value: p.Value}))
	}
	single := pub(0, 700)
	n.Publish(&single, func(wire.PubOK, *wire.Error) {})
	batch := []wire.Pub{pub(0, 100), pub(1, 200), pub(0, 300), pub(1, 400), pub(0, 500)}
	publishBatchOn(n, batch)
	want := map[uint32][]int64{
		0: {size(single), size(batch[0]) + size(batch[2]) + size(batch[4]), 0, 0},
		1: {size(batch[1]) + size(batch[3]), 0},
	}
	for part, sizes := range want {
		q := n.topics["t"].partitions[part].manualQueue
		if len(q) != len(sizes) {
			t.Fatalf("partition %d: %d queued, want %d", part, len(q), len(sizes))
		}
		for i, r := range q {
			if r.queuedBytes != sizes[i] {
				t.Errorf("partition %d, queued %d: counts %d bytes, want %d", part, i, r.queuedBytes, sizes[i])
			}
		}
	}
}
