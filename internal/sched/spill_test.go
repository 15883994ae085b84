package sched_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/sched/schedtest"
)

// A State bounded to a small window with its spill in memory behaves
// like one that keeps everything resident (SpillAfterWindow).
func TestBoundedStateEquivalent(t *testing.T) {
	for seed := range uint64(12) {
		for _, window := range []int{2, 5} {
			schedtest.Equivalence(t, seed, 1500, window, func(schedtest.Find) sched.Spill { return sched.NewMemSpill() })
		}
	}
}

// Each checkpoint and compaction rule is load-bearing: with its guard
// off, the equivalence of restored states (or the compaction limit's
// check) fails on some seed.
func TestCheckpointGuardsLoadBearing(t *testing.T) {
	for name, mut := range map[string]sched.StateMutations{
		"CheckpointAtItsBase":      {CheckpointAnyBase: true},
		"CheckpointChunksTogether": {CheckpointGaps: true},
		"CompactKeepsLiveMessages": {CompactPastMessages: true},
	} {
		caught := false
		for seed := range uint64(12) {
			if msg, failed := catchFatal(func(tb testing.TB) {
				schedtest.EquivalenceMutated(tb, seed, 1500, 2, func(schedtest.Find) sched.Spill { return sched.NewMemSpill() }, mut)
			}); failed {
				t.Logf("%s: seed %d: %s", name, seed, msg)
				caught = true
				break
			}
		}
		if !caught {
			t.Errorf("%s: no seed failed with its guard off", name)
		}
	}
}

// fatalCatcher is a testing.TB whose Fatalf ends the goroutine and
// records the message instead of failing the test.
type fatalCatcher struct {
	testing.TB
	msg    string
	failed bool
}

func (c *fatalCatcher) Helper() {}
func (c *fatalCatcher) Fatalf(format string, args ...any) {
	c.msg, c.failed = fmt.Sprintf(format, args...), true
	runtime.Goexit()
}

// catchFatal runs f with a fatalCatcher on a goroutine of its own.
func catchFatal(f func(testing.TB)) (string, bool) {
	c := &fatalCatcher{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(c)
	}()
	<-done
	return c.msg, c.failed
}
