package node

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// TestCloseDrainsTheSchedulerOwner (issue 14, drain on shutdown): a node
// closed in the middle of a burst lets each shard's owner drain first —
// no new claims, its publishes and their FIRED records in flight
// finished — so after a restart no schedule it had published is
// published again (it would be, were it left firing). Three rounds: a
// close may fall where nothing is in flight (without the drain about one
// round in four passes).
func TestCloseDrainsTheSchedulerOwner(t *testing.T) {
	for round := range 3 {
		again, sent := closeMidBurst(t)
		if len(again) > 0 || sent == 0 {
			t.Fatalf("round %d: %d of the %d schedules published before the close were published again after it (not drained): %v",
				round, len(again), sent, again[:min(len(again), 10)])
		}
	}
}

// closeMidBurst closes a node once its burst of 2,000 schedules has
// published 100, restarts it, waits for every message, and returns the
// schedules published both before and after the close, and how many were
// published before.
func closeMidBurst(t *testing.T) (again []uint64, sent int) {
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	var mu sync.Mutex
	before, after := map[uint64]bool{}, map[uint64]bool{}
	published := before
	started := make(chan struct{})
	h.tune = func(c *Config) {
		c.SchedPublishObserver = func(shard uint32, p sched.Publish) {
			mu.Lock()
			defer mu.Unlock()
			published[uint64(shard)<<48|p.ID] = true
			if len(before) == 100 && published[uint64(shard)<<48|p.ID] && len(after) == 0 {
				select {
				case <-started:
				default:
					close(started)
				}
			}
		}
	}
	h.open()
	t.Cleanup(func() { h.node.Close() })
	h.declare("t", 1)
	now := h.nowMs.Load()
	var all []string
	for i := range 2000 {
		all = append(all, fmt.Sprintf("m%d", i))
		h.mustSchedule("t", all[i], now+100)
	}
	h.at(now + 200)
	select {
	case <-started:
	case <-time.After(waitMax):
		t.Fatal("the burst did not start")
	}
	h.node.Close() // mid-burst
	mu.Lock()
	published = after
	sent = len(before)
	mu.Unlock()
	h.open()
	h.at(now + 300)
	h.waitValues("t", all...)
	mu.Lock()
	defer mu.Unlock()
	for key := range after {
		if before[key] {
			again = append(again, key&(1<<48-1))
		}
	}
	return again, sent
}
