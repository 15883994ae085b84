package sim

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// TestClusterScheduledDeliveryCampaign runs the scheduled-delivery
// workload in whole-cluster runs with every fault (crashes, power loss,
// kill points, partitions, network and disk faults, clock jumps, client
// faults, destination outages): NeverEarly and ExactlyOnce on every seed,
// the scheduler ghost's checks (schedghost.go), every acknowledged
// schedule published after healing, and the run replays bit for bit.
// NEREUS_SIM_SCHED_SEEDS raises the seed count for a soak.
func TestClusterScheduledDeliveryCampaign(t *testing.T) {
	seeds := uint64(6)
	if v, err := strconv.ParseUint(os.Getenv("NEREUS_SIM_SCHED_SEEDS"), 10, 64); err == nil && v > 0 {
		seeds = v
	}
	scheduled := 0
	var list []uint64
	for seed := uint64(1); seed <= seeds; seed++ {
		list = append(list, seed)
	}
	// Seed 16 found an owner publishing after its fence in the same pass
	// (sched.TestFenceDropsEffectsNotYetTaken): NoPublishWithoutBothGates.
	list = append(list, 16)
	for _, seed := range list {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\nreproduce: %s\ntrace tail:\n%v", seed, r.Violation, ClusterReproduce(o), r.Tail)
		}
		if r.Scheduled == 0 || r.SchedPublished < r.Scheduled {
			t.Fatalf("seed %d: %d schedules acknowledged, %d published", seed, r.Scheduled, r.SchedPublished)
		}
		scheduled += r.Scheduled
		if seed == 1 {
			if again := RunCluster(o); again.TraceHash != r.TraceHash {
				t.Fatalf("seed 1 replayed differently")
			}
		}
	}
	t.Logf("%d seeds, %d schedules acknowledged and published", len(list), scheduled)
}

// TestClusterSchedDestinationOutagesAlone runs the scheduled-delivery
// workload with destination outages as the only fault: the cluster is
// quiet but for them most of the run, so BlockedLaneIsolated,
// ScheduledOnTime and IntakeNeverBlocked are checked on most events (under
// every fault they seldom apply). Seed 3 fails when a blocked lane holds
// the other lanes back (a temporary kernel break, NOTES-sched-sim.md).
func TestClusterSchedDestinationOutagesAlone(t *testing.T) {
	for _, seed := range []uint64{1, 3} {
		o := ClusterOptions{Seed: seed, Faults: ClusterFaults{Outage: true}, Schedules: 30}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\nreproduce: %s\ntrace tail:\n%v", seed, r.Violation, ClusterReproduce(o), r.Tail)
		}
		st := r.SchedStats
		if st["lanes BLOCKED while their destination was out"] == 0 || st["lanes READY again after BLOCKED"] == 0 ||
			st["intake probes answered OK during an outage"] == 0 || r.SchedPublished < r.Scheduled {
			t.Fatalf("seed %d: an outage must block a lane, which gets READY by itself, and intake must go on meanwhile: %v; %d acknowledged, %d published",
				seed, st, r.Scheduled, r.SchedPublished)
		}
		t.Logf("seed %d: %v", seed, r.SchedStats)
	}
}

// TestClusterSchedShardsCompactUnderFaults runs the scheduled workload
// with every fault while its shards checkpoint every 16 records in 2 KiB
// segments and compact, and leaders keep a silent follower's log for
// only 200 ms: followers left behind are rebuilt from the leader's
// snapshot point and their runners restore the shard from its
// checkpoint ("rebuilt"; restarted nodes restore from their checkpoint
// hint: "restored"). Every
// invariant holds, and the campaign saw checkpoints, truncations,
// restores and due messages published by restored states (checked like
// every publish: the right message, once, not early).
func TestClusterSchedShardsCompactUnderFaults(t *testing.T) {
	seen := map[string]int{}
	// A follower rebuilt from a checkpoint is rare (seeds 42, 72, 102 and
	// 114 of 41-160 since partitions heartbeat every 3 ticks, none of
	// 1-40; one of the first 24 before): the campaign runs at least 6
	// seeds, and on until every event was seen, up to 80.
	all := func() bool {
		return seen["checkpoint"] > 0 && seen["truncated"] > 0 && seen["rebuilt"] > 0 && seen["publishes after a restore"] > 0
	}
	for seed := uint64(1); seed <= 80 && (seed <= 6 || !all()); seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, Retention: ClusterRetention{ReservationMs: 200}}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\nreproduce: %s\ntrace tail:\n%v", seed, r.Violation, ClusterReproduce(o), r.Tail)
		}
		if r.SchedPublished < r.Scheduled {
			t.Fatalf("seed %d: %d schedules acknowledged, %d published", seed, r.Scheduled, r.SchedPublished)
		}
		for _, ev := range []string{"checkpoint", "truncated", "restored", "rebuilt"} {
			seen[ev] += r.SchedStats["shard "+ev]
		}
		seen["publishes after a restore"] += r.SchedStats["publishes from a state restored from a checkpoint"]
	}
	t.Logf("shard compaction seen: %v", seen)
	if !all() {
		t.Fatalf("the campaign must checkpoint, truncate and restore shards: %v", seen)
	}
}

// TestSchedIntakeJudgedUnderTheGatesOfNow (SC13): on seed 7002 of the
// scheduled and group workloads with every fault, a SCHEDULE reached its
// shard's active owner the very millisecond the guard set by the runner's
// previous pass ran out; the lease had been renewed since, but the owner
// judged the intake under the old guard, fenced itself and refused it
// (IntakeNeverBlocked). A runner now gives its owner the gates of now
// before it judges commands (schedRunner.refreshGates). Found by a
// 60-seed soak from seed 7000; a seed-pinned regression, which a change
// to the runs' traces may move.
func TestSchedIntakeJudgedUnderTheGatesOfNow(t *testing.T) {
	o := ClusterOptions{Seed: 7002, Nodes: 3, Steps: 20000, Faults: AllClusterFaults, Members: true, Schedules: 200}
	if r := RunCluster(o); r.Violation != nil {
		t.Fatalf("%v\nreproduce: %s", r.Violation, ClusterReproduce(o))
	}
}

// TestLanePausesHold runs the scheduled-delivery workload with the
// operator pausing or closing a destination's lane and resuming it
// (lanepause.go): PauseHolds at every publish, RefusedNeverPublished for
// what a closed lane refused, the held lane's schedules published after
// the resume (ScheduledOnTime from its answer in a quiet cluster,
// Liveness after healing), under every fault and with destination outages
// alone. Seed 108 with members, PUB_BATCH and five pauses found a
// publish decided in the pass that applied the pause, sent after its
// answer (sched.Owner.TakeEffects: GateClosesAtItsAnswer). Each mutation
// breaks PauseHolds on its recorded seeds (the test stops at the first).
func TestLanePausesHold(t *testing.T) {
	paused, heldBack, closed, refused := 0, 0, 0, 0
	busy := func(seed uint64) ClusterOptions {
		return ClusterOptions{Seed: seed, Faults: AllClusterFaults, Members: true, PubBatch: true, Schedules: 30, LanePauses: 5}
	}
	for _, o := range []ClusterOptions{
		{Seed: 1, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
		{Seed: 2, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
		{Seed: 4, Faults: ClusterFaults{Outage: true}, Schedules: 30, LanePauses: 3},
		busy(108),
		// Seed 809: a closed lane's refusal of one send of sch-20 ended
		// the schedule for the client while a later send to the shard's
		// owner was on its way; the client dropped that send's answer
		// before the ghost heard it, which then took the probe for
		// unanswered (a false IntakeNeverBlocked). The ghost hears every
		// answer now.
		{Seed: 809, Faults: AllClusterFaults, Schedules: 30, LanePauses: 5},
	} {
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("%v\nreproduce: %s\ntrace tail:\n%v", r.Violation, ClusterReproduce(o), r.Tail)
		}
		if r.Scheduled == 0 || r.SchedPublished < r.Scheduled {
			t.Fatalf("seed %d: %d schedules acknowledged, %d published", o.Seed, r.Scheduled, r.SchedPublished)
		}
		paused += r.SchedStats["lane pauses answered"]
		heldBack += r.SchedStats["schedules due on a paused lane"]
		closed += r.SchedStats["of which closes"]
		refused += r.SchedStats["schedules refused by a closed lane"]
	}
	if paused == 0 || heldBack == 0 || closed == 0 || refused == 0 {
		t.Fatalf("%d holds answered (%d closes), %d schedules due on a held lane, %d refused by a closed one: the runs did not hold and refuse", paused, closed, heldBack, refused)
	}
	t.Logf("%d holds answered (%d closes), %d schedules due on a held lane, %d refused by a closed one", paused, closed, heldBack, refused)

	for _, m := range []struct {
		name, invariant string
		runs            []ClusterOptions
	}{
		// Seeds 6, 7 and 10 of 1-12 (half the holds are CLOSEs, which it
		// does not touch).
		{"sched-pause-ignored", PauseHolds, []ClusterOptions{
			{Seed: 6, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
			{Seed: 7, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
		}},
		// None of seeds 1-30 with three pauses; 108 and 112 of 100-140
		// with members, PUB_BATCH and five.
		{"sched-gate-not-rechecked-at-take", PauseHolds, []ClusterOptions{busy(108), busy(112)}},
		// Seeds 7 and 53 of 1-80 (none of 100-130 busy): a retry across
		// a CLOSE, of a schedule admitted before it.
		{"sched-retry-refused-on-closed-lane", RefusedNeverPublished, []ClusterOptions{
			{Seed: 7, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
			{Seed: 53, Faults: AllClusterFaults, Schedules: 30, LanePauses: 3},
		}},
	} {
		var got []string
		caught := false
		for _, o := range m.runs {
			o.Mutations = ClusterMutations[m.name]
			r := RunCluster(o)
			if caught = r.Violation != nil && r.Violation.Invariant == m.invariant; caught {
				break
			}
			got = append(got, fmt.Sprintf("seed %d: %v", o.Seed, r.Violation))
		}
		if !caught {
			t.Errorf("%s not caught by %s: %v", m.name, m.invariant, got)
		}
	}
}

// TestScheduleCancelsHold runs the scheduled-delivery workload with the
// client cancelling acknowledged schedules under the faults
// (schedcancel.go): a schedule whose cancel was answered OK is never
// published (CancelledNeverPublished), one found too late is published
// once, and the rest as always. With a cancel taking a FIRING schedule
// (`sched-cancel-firing`) CancelledNeverPublished breaks.
func TestScheduleCancelsHold(t *testing.T) {
	outcomes := map[string]int{}
	for _, o := range []ClusterOptions{
		{Seed: 1, Faults: AllClusterFaults, Schedules: 30, SchedCancels: 6},
		{Seed: 3, Faults: AllClusterFaults, Schedules: 30, SchedCancels: 6},
		{Seed: 6, Faults: AllClusterFaults, Schedules: 30, SchedCancels: 6, LanePauses: 3},
	} {
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("%v\nreproduce: %s\ntrace tail:\n%v", r.Violation, ClusterReproduce(o), r.Tail)
		}
		for _, o := range []string{"cancelled", "too late", "uncertain"} {
			outcomes[o] += r.SchedStats["cancels "+o]
		}
	}
	if outcomes["cancelled"] == 0 || outcomes["too late"]+outcomes["uncertain"] == 0 {
		t.Fatalf("cancels by outcome %v: want some cancelled and some not", outcomes)
	}
	t.Logf("cancels by outcome: %v", outcomes)

	var got []string
	for _, seed := range []uint64{4, 8, 10} { // of seeds 1-12
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, SchedCancels: 6, Mutations: ClusterMutations["sched-cancel-firing"]}
		r := RunCluster(o)
		if r.Violation != nil && r.Violation.Invariant == CancelledNeverPublished {
			return
		}
		got = append(got, fmt.Sprintf("seed %d: %v", seed, r.Violation))
	}
	t.Fatalf("sched-cancel-firing not caught by CancelledNeverPublished: %v", got)
}

// TestLaneRetireUnderFaults: the operator's last hold retires a lane for
// good (lanepause.go, LaneRetire): nothing of it is published after a
// shard answered the RETIRE (PauseHolds), nothing it refused ever, its
// schedules at most once, the other lane's all. Seed 4 found a retried
// RETIRE refused (the lane RETIRED) — an operator whose first answer was
// lost could never see it done; with that refusal back
// (`sched-retire-retried-refused`) the run breaks Liveness.
func TestLaneRetireUnderFaults(t *testing.T) {
	retired := 0
	for _, seed := range []uint64{2, 3, 4} {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, LanePauses: 2, LaneRetire: true}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("%v\nreproduce: %s\ntrace tail:\n%v", r.Violation, ClusterReproduce(o), r.Tail)
		}
		retired += r.SchedStats["lane retired"]
	}
	if retired == 0 {
		t.Fatal("no run retired a lane")
	}
	o := ClusterOptions{Seed: 4, Faults: AllClusterFaults, Schedules: 30, LanePauses: 2, LaneRetire: true, Mutations: ClusterMutations["sched-retire-retried-refused"]}
	if r := RunCluster(o); r.Violation == nil || r.Violation.Invariant != Liveness {
		t.Fatalf("sched-retire-retried-refused at seed 4: %v, want Liveness", r.Violation)
	}
}

// TestLaneRecreateUnderFaults: half the operator's lane holds delete the
// destination topic and declare it again, then resume its lanes
// (lanerecreate.go, LaneRecreate): no lane publishes into the new topic
// before a RESUME was asked (LaneFiresOnlyIntoItsIncarnation), no
// schedule lands in both topics (ExactlyOnce), every schedule admitted
// for the new topic is published. With the lane following the new topic on its
// own (`sched-follows-recreated-destination`) the first invariant breaks.
// These runs found a schedule acknowledged after its destination was
// declared again resolved UNKNOWN, never published: the lane, still
// pinned to the deleted topic with a valid certificate, claimed it for
// that topic (seed 128 of 100-159, Liveness); a schedule admitted for a
// later incarnation now breaks the lane as it applies
// (NoClaimForAnEarlierIncarnation, sched's
// TestScheduleOfALaterIncarnationBreaksTheLane and the model).
func TestLaneRecreateUnderFaults(t *testing.T) {
	stats := map[string]int{}
	for _, seed := range []uint64{2, 3, 8} {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, LanePauses: 4, LaneRecreate: true}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("%v\nreproduce: %s\ntrace tail:\n%v", r.Violation, ClusterReproduce(o), r.Tail)
		}
		for _, k := range []string{"destinations re-created", "publishes into a re-created destination"} {
			stats[k] += r.SchedStats[k]
		}
	}
	if stats["destinations re-created"] == 0 || stats["publishes into a re-created destination"] == 0 {
		t.Fatalf("the runs did not reach what they are for: %v", stats)
	}
	t.Logf("%v", stats)
	var got []string
	for _, seed := range []uint64{3, 8} { // of seeds 2-8
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, LanePauses: 4, LaneRecreate: true, Mutations: ClusterMutations["sched-follows-recreated-destination"]}
		r := RunCluster(o)
		if r.Violation != nil && r.Violation.Invariant == LaneFiresOnlyIntoItsIncarnation {
			return
		}
		got = append(got, fmt.Sprintf("seed %d: %v", seed, r.Violation))
	}
	t.Fatalf("sched-follows-recreated-destination not caught by %s: %v", LaneFiresOnlyIntoItsIncarnation, got)
}

// TestClosedLaneRefusalIsFinal: two sends of one schedule in flight
// across a CLOSE and its RESUME — the first refused by the CLOSED lane,
// the second arriving 40 ms later, after the RESUME applied. With nothing
// written for the refusal (`sched-refusal-not-recorded`, as before) the
// second was taken as new and the schedule fired, its client told
// "refused" (RefusedNeverPublished, found at this seed); the refusal is
// now written and the producer_seq keeps it (RefusalIsFinal).
func TestClosedLaneRefusalIsFinal(t *testing.T) {
	o := ClusterOptions{Seed: 616, Replicas: 1, Faults: AllClusterFaults, Schedules: 30, LanePauses: 4, LaneRecreate: true}
	if r := RunCluster(o); r.Violation != nil {
		t.Fatalf("%v\nreproduce: %s\ntrace tail:\n%v", r.Violation, ClusterReproduce(o), r.Tail)
	}
	o.Mutations = ClusterMutations["sched-refusal-not-recorded"]
	if r := RunCluster(o); r.Violation == nil || r.Violation.Invariant != RefusedNeverPublished {
		t.Fatalf("sched-refusal-not-recorded at seed 616: %v, want %s", r.Violation, RefusedNeverPublished)
	}
}
