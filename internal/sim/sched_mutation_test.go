package sim

import (
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// schedMutationSeeds are seeds on which the cluster simulator with every
// fault and the scheduled workload catches a scheduler mutation
// (ClusterMutations "sched-*"), found by the search below, with the
// invariant that catches it; the default test runs them in order until
// one catches it. Several per mutation: any change to the runs' traces
// moves which seeds catch one, and a single recorded seed broke at every
// such change.
var schedMutationSeeds = map[string]struct {
	seeds     []uint64
	invariant string
}{
	"sched-publish-without-lease": {[]uint64{1, 2, 3}, "NoPublishWithoutBothGates"},  // each of seeds 1-3
	"sched-publish-before-intent": {[]uint64{1, 2, 3}, "NoPublishBeforeIntent"},      // each of seeds 1-3
	"sched-claims-before-due":     {[]uint64{1, 2, 3}, "NeverEarly"},                 // each of seeds 1-6
	"sched-fenced-still-fires":    {[]uint64{4, 5, 10}, "NoPublishWithoutBothGates"}, // the first three of seeds 1-60 (17 of them) since acks await their partition's office (9, 13, 41 before; 4, 15, 22 before the stall fault and the monotonic clock; 1, 3, 30 before partitions heartbeat every 3 ticks; 5, 7, 26 before the dedup snapshots)
	// The replication kernel's lease dated from the answers' arrival: a
	// paused leader renews it from answers to heartbeats sent before its
	// pause and acts after another node took office. Which invariant it
	// breaks first moves with the runs' traces: through the scheduler's
	// gates (NoPublishWithoutBothGates) on one seed of 1-300 in the last
	// search that found any (108), on none of 1-150 since the coordinator
	// decides only once it took office; through delivery, which the lease
	// guards too (AckFloorNeverRedelivered), on 15 of 1-150 before acks
	// awaited their partition's office, on 4 of 1-60 (7, 8, 10, 34) since,
	// the first three recorded. It needs a pause across an election; the
	// kernel's TestLeaseDatesFromTheAppendNotTheAnswer catches it directly.
	"lease-from-receipt": {[]uint64{7, 8, 10}, "AckFloorNeverRedelivered"},
}

// schedMutationsNotReached are the scheduler mutations the campaign has
// not caught, and why (NOTES-sched-sim.md; the model and the kernel's
// tests catch them).
var schedMutationsNotReached = map[string]string{
	"sched-ready-not-revalidated":         "a READY certificate outlives its 5 s only if its lane publishes nothing for 5 s while its destination stays unwritable; the workload's schedules fall due within 3 s and a refused publish blocks the lane anyway",
	"sched-guard-from-ticks":              "the guard outlasts the lease only while the owner's member is held up (a hung fsync), which no campaign fault does: TestSchedHeldUpOwnerFenced scripts it and catches it on seeds 1 and 2",
	"sched-reuse-fire-seq":                "the owner proposes a used fire sequence only when it is re-activated in the same epoch with its own intent still uncommitted (its claims reset by the fence); not met on the seeds searched",
	"sched-cancel-firing":                 "it needs schedule cancels (--sched-cancels), which this campaign does not run: TestScheduleCancelsHold catches it (CancelledNeverPublished, seeds 4, 8 and 10 of 1-12 with six cancels)",
	"sched-retry-refused-on-closed-lane":  "it needs lane closes (--lane-pauses), which this campaign does not run: TestLanePausesHold catches it (RefusedNeverPublished, seeds 7 and 53 of 1-80)",
	"sched-retire-retried-refused":        "it needs a lane retire (--lane-pauses --lane-retire), which this campaign does not run: TestLaneRetireUnderFaults catches it (Liveness, seed 4)",
	"sched-pause-ignored":                 "it needs lane pauses (--lane-pauses), which this campaign does not run (its recorded seeds would move): TestLanePausesHold catches it (PauseHolds, seeds 6, 7 and 10 of 1-12)",
	"sched-gate-not-rechecked-at-take":    "it needs lane pauses (--lane-pauses) and a pause applied in the pass of an intent: TestLanePausesHold catches it (PauseHolds, seeds 108 and 112 of 100-140 with --members --pub-batch --lane-pauses 5)",
	"sched-follows-recreated-destination": "it needs destination re-creations (--lane-pauses --lane-recreate), which this campaign does not run: TestLaneRecreateUnderFaults catches it (LaneFiresOnlyIntoItsIncarnation, seeds 3 and 8 of 2-8)",
	"sched-later-incarnation-admitted":    "it needs destination re-creations (--lane-pauses --lane-recreate) and a schedule admitted for the new topic while its lane's certificate for the deleted one holds; reached at seeds 13, 25 and 33 of 1-80 with --lane-pauses 4 (Liveness, 120 s of virtual time each, too long for CI): sched's TestScheduleOfALaterIncarnationBreaksTheLane and the model (NoClaimForAnEarlierIncarnation) catch it",
	"sched-refusal-not-recorded":          "it needs lane closes (--lane-pauses) and two sends of one schedule in flight across a CLOSE and its RESUME: TestClosedLaneRefusalIsFinal catches it (RefusedNeverPublished, seed 616 of --replicas 1 --lane-pauses 4 --lane-recreate)",
	"sched-forwards-to-first-replica":     "it needs a shard owner without a replica of the destination partition, so fewer replicas than nodes; this campaign runs three nodes and three replicas. TestScheduledPublishFindsALeaderItHasNoReplicaOf catches it on five nodes and three replicas (ScheduledOnTime, seed 1)",
}

// TestClusterSimCatchesSchedMutations runs the scheduled-delivery
// workload with each scheduler mutation on its recorded seeds and
// requires the recorded invariant to break. NEREUS_SIM_SCHED_MUTATION_SEEDS=N
// instead searches seeds 1..N for every scheduler mutation and reports
// which catch it (a soak, not run in CI): it fails for a mutation caught
// on none unless schedMutationsNotReached explains why.
func TestClusterSimCatchesSchedMutations(t *testing.T) {
	search, _ := strconv.ParseUint(os.Getenv("NEREUS_SIM_SCHED_MUTATION_SEEDS"), 10, 64)
	for _, name := range slices.Sorted(maps.Keys(ClusterMutations)) {
		if _, ok := schedMutationSeeds[name]; !ok && !strings.HasPrefix(name, "sched-") {
			continue
		}
		known, recorded := schedMutationSeeds[name]
		if _, why := schedMutationsNotReached[name]; !recorded && !why {
			t.Errorf("scheduler mutation %s has neither a seed that catches it nor a reason why none does", name)
			continue
		}
		seeds := known.seeds
		if search > 0 {
			seeds = nil
			for seed := uint64(1); seed <= search; seed++ {
				seeds = append(seeds, seed)
			}
		}
		if len(seeds) == 0 {
			continue // not reached: schedMutationsNotReached
		}
		t.Run(name, func(t *testing.T) {
			var caught []string
			for _, seed := range seeds {
				o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, Mutations: ClusterMutations[name]}
				r := RunCluster(o)
				switch {
				case search > 0 && r.Violation != nil:
					caught = append(caught, strconv.FormatUint(seed, 10)+":"+r.Violation.Invariant)
				case search > 0, r.Violation == nil:
				case r.Violation.Invariant != known.invariant:
					t.Errorf("seed %d: %s broke %s, want %s: %v\nreproduce: %s", seed, name, r.Violation.Invariant, known.invariant, r.Violation, ClusterReproduce(o))
					return
				default:
					return // caught: one recorded seed is enough
				}
			}
			if search == 0 {
				t.Errorf("none of seeds %v catches %s any more (their runs moved: search again with NEREUS_SIM_SCHED_MUTATION_SEEDS)", seeds, name)
				return
			}
			t.Logf("%s caught on %d of %d seeds: %v", name, len(caught), len(seeds), caught)
			if _, why := schedMutationsNotReached[name]; len(caught) == 0 && !why {
				t.Errorf("%d seeds do not catch %s", search, name)
			}
		})
	}
}
