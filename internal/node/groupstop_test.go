package node

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// A group stopped while other goroutines send it commands answers every
// one: refused once it is stopping, or answered by its drain, never left
// in its queue (groupRunner.send against stop).
func TestGroupStopAnswersEveryCommand(t *testing.T) {
	h := newHarness(t)
	if _, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	for round := range 200 {
		s := newSink()
		if _, err := h.node.Subscribe("t", "g", GroupOptions{}, s); err != nil {
			t.Fatal(err)
		}
		g := groupOf(h.node, "g", "t")
		var sent, answered atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					g.send(groupCmd{kind: cmdAck, entries: []wire.AckEntry{{Partition: 0, Seq: 1, DeliveryID: 1}},
						reply: func([]wire.Code, *wire.Error) { answered.Add(1) }})
				}
			}()
		}
		time.Sleep(time.Millisecond)
		h.node.mu.Lock()
		delete(h.node.groups, groupKey{group: "g", topic: "t"})
		h.node.mu.Unlock()
		g.stop()
		close(stop)
		wg.Wait()
		deadline := time.Now().Add(waitMax)
		for answered.Load() != sent.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d commands sent, %d answered", round, sent.Load(), answered.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
}
