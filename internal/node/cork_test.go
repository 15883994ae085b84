package node

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// recordingCorker records its Cork and Uncork calls and the replies made in
// between.
type recordingCorker struct {
	mu     sync.Mutex
	events []string
}

func (c *recordingCorker) add(e string) {
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
}

func (c *recordingCorker) Cork()   { c.add("cork") }
func (c *recordingCorker) Uncork() { c.add("uncork") }

func (c *recordingCorker) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// An idle partition's fsync acknowledges on the syncer, corked: the burst
// of PUB_OKs goes out in one write from the goroutine the fsync returned on.
func TestIdlePartitionAcknowledgesCorked(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	c := &recordingCorker{}
	replied := make(chan *wire.Error, 1)
	h.node.PublishCorked(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")}, func(_ wire.PubOK, err *wire.Error) {
		c.add("reply")
		replied <- err
	}, c)
	select {
	case err := <-replied:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitMax):
		t.Fatal("no reply")
	}
	want := []string{"cork", "reply", "uncork"}
	deadline := time.Now().Add(waitMax)
	for got := c.snapshot(); !slices.Equal(got, want); got = c.snapshot() {
		if len(got) >= len(want) || time.Now().After(deadline) {
			t.Fatalf("events %v, want %v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
	// A publish without a corker is answered as before.
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
}

// A duplicate that waits for its original's commit is answered when the
// syncer acknowledges the original by itself: the syncer wakes the
// partition goroutine when duplicates wait, instead of leaving the result
// for whenever it next wakes (here: never, as nothing else happens and
// retention runs once an hour).
func TestDuplicateWaitingForAnIdleAckIsAnswered(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{}, 1)
	var holding atomic.Bool
	fsys := heldSyncFS{FS: vfs.NewMem(), hold: func(string) {
		if holding.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-release
		}
	}}
	n := openWithTopic(t, Config{DataDir: "/data", Env: env.Env{FS: fsys}, RetentionCheckMs: 3_600_000})
	holding.Store(true)
	pub := &wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("v")}
	type res struct {
		ok  wire.PubOK
		err *wire.Error
	}
	first, dup := make(chan res, 1), make(chan res, 1)
	n.Publish(pub, func(ok wire.PubOK, err *wire.Error) { first <- res{ok, err} })
	<-entered // the original's fsync is running
	n.Publish(pub, func(ok wire.PubOK, err *wire.Error) { dup <- res{ok, err} })
	// The duplicate reaches the partition goroutine and waits: give it the
	// time to, as nothing observable says it has.
	time.Sleep(50 * time.Millisecond)
	release <- struct{}{}
	var got [2]res
	for i, ch := range []chan res{first, dup} {
		select {
		case got[i] = <-ch:
		case <-time.After(waitMax):
			t.Fatalf("publish %d not answered", i)
		}
	}
	if got[0].err != nil || got[1].err != nil || !got[1].ok.Duplicate || got[1].ok.Seq != got[0].ok.Seq {
		t.Fatalf("original %+v, duplicate %+v", got[0], got[1])
	}
}
