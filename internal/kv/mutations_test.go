package kv

import (
	"fmt"
	"testing"
)

// failureRecorder is a tb that records a failure instead of failing the
// test: Fatal stops the scenario with a panic that runRecorded recovers.
type failureRecorder struct {
	failed bool
	first  string
}

type stopScenario struct{}

func (r *failureRecorder) Helper() {}
func (r *failureRecorder) Errorf(format string, args ...any) {
	if !r.failed {
		r.failed, r.first = true, fmt.Sprintf(format, args...)
	}
}
func (r *failureRecorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(stopScenario{})
}
func (r *failureRecorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func runRecorded(scenario func(tb, Mutations), m Mutations) (r *failureRecorder) {
	r = &failureRecorder{}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stopScenario); !ok {
				r.failed, r.first = true, fmt.Sprintf("panic: %v", p)
			}
		}
	}()
	scenario(r, m)
	return r
}

// TestMutationsAreCaught: each guard is load-bearing — switching it off
// fails the scenario written for it, and the random histories where
// applicable (the seed that catches it is printed).
func TestMutationsAreCaught(t *testing.T) {
	for _, tc := range []struct {
		name      string
		m         Mutations
		scenarios map[string]func(tb, Mutations)
		histories bool // the random histories catch it too
	}{
		{"CASAgainstCommittedOnly", Mutations{CASAgainstCommittedOnly: true},
			map[string]func(tb, Mutations){"concurrentCASOnlyOneProposed": concurrentCASOnlyOneProposed}, false},
		{"ApplyIgnoresCondition", Mutations{ApplyIgnoresCondition: true},
			map[string]func(tb, Mutations){"casBehindTruncatedPredecessor": casBehindTruncatedPredecessor, "applyChecksCASCondition": applyChecksCASCondition}, true},
		{"WatchJumpsFloor", Mutations{WatchJumpsFloor: true},
			map[string]func(tb, Mutations){"watchCursorExpired": watchCursorExpired}, true},
		{"EvictLiveRevision", Mutations{EvictLiveRevision: true},
			map[string]func(tb, Mutations){"compactionPurgesExpiredTombstones": compactionPurgesExpiredTombstones}, true},
		{"CheckpointAnyBase", Mutations{CheckpointAnyBase: true},
			map[string]func(tb, Mutations){"voidCheckpointChangesNothing": voidCheckpointChangesNothing}, true},
		{"CheckpointSkipsChunks", Mutations{CheckpointSkipsChunks: true},
			map[string]func(tb, Mutations){"cutCheckpointCompletesNothing": cutCheckpointCompletesNothing}, true},
		{"SubmitBeforeReignStart", Mutations{SubmitBeforeReignStart: true},
			map[string]func(tb, Mutations){"leaderWaitsForItsReignStart": leaderWaitsForItsReignStart}, false},
		{"DropKeepsFloor", Mutations{DropKeepsFloor: true},
			map[string]func(tb, Mutations){"droppedSeqsExpireWatchers": droppedSeqsExpireWatchers}, false},
		{"FenceKeepsFloor", Mutations{FenceKeepsFloor: true},
			map[string]func(tb, Mutations){"fenceExpiresEveryCursor": fenceExpiresEveryCursor}, false},
		{"CheckpointUnverified", Mutations{CheckpointUnverified: true},
			map[string]func(tb, Mutations){"divergedReplicaStopsAtCheckpoint": divergedReplicaStopsAtCheckpoint}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, scenario := range tc.scenarios {
				if r := runRecorded(scenario, Mutations{}); r.failed {
					t.Fatalf("%s fails without the mutation: %s", name, r.first)
				}
				r := runRecorded(scenario, tc.m)
				if !r.failed {
					t.Errorf("%s passes with %s on", name, tc.name)
					continue
				}
				t.Logf("%s caught it: %s", name, r.first)
			}
			if !tc.histories {
				return
			}
			for seed := uint64(1); seed <= 300; seed++ {
				if err := randomHistory(seed, tc.m); err != nil {
					t.Logf("random histories caught it at seed %d: %v", seed, err)
					return
				}
			}
			t.Errorf("300 random histories pass with %s on", tc.name)
		})
	}
}
