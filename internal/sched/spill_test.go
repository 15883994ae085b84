package sched_test

import (
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
