package node

import (
	"slices"
	"sync"
	"testing"
	"time"

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
