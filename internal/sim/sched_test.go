package sim

import (
	"os"
	"strconv"
	"testing"
)

// TestClusterScheduledDeliveryCampaign runs the scheduled-delivery
// workload in whole-cluster runs with every fault (crashes, power loss,
// kill points, partitions, network and disk faults, clock jumps, client
// faults): NeverEarly and ExactlyOnce on every seed, every acknowledged
// schedule published after healing, and the run replays bit for bit.
// NEREUS_SIM_SCHED_SEEDS raises the seed count for a soak.
func TestClusterScheduledDeliveryCampaign(t *testing.T) {
	seeds := uint64(6)
	if v, err := strconv.ParseUint(os.Getenv("NEREUS_SIM_SCHED_SEEDS"), 10, 64); err == nil && v > 0 {
		seeds = v
	}
	scheduled := 0
	for seed := uint64(1); seed <= seeds; seed++ {
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
	t.Logf("%d seeds, %d schedules acknowledged and published", seeds, scheduled)
}
