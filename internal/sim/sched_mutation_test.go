package sim

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// schedMutationSeeds are seeds on which the cluster simulator with every
// fault catches each scheduler mutation (ClusterMutations "sched-*"),
// found by the search below; the default test runs only these.
var schedMutationSeeds = map[string][]uint64{
	"sched-publish-without-lease": {1},
}

// TestClusterSimCatchesSchedMutations runs the scheduled-delivery
// workload with each scheduler mutation on its recorded seeds and
// requires a violation on each. NEREUS_SIM_SCHED_MUTATION_SEEDS=N instead
// searches seeds 1..N for every mutation and reports which fail (a soak:
// not run in CI).
func TestClusterSimCatchesSchedMutations(t *testing.T) {
	search, _ := strconv.ParseUint(os.Getenv("NEREUS_SIM_SCHED_MUTATION_SEEDS"), 10, 64)
	for name, m := range ClusterMutations {
		if !strings.HasPrefix(name, "sched-") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			seeds := schedMutationSeeds[name]
			if search > 0 {
				seeds = nil
				for seed := uint64(1); seed <= search; seed++ {
					seeds = append(seeds, seed)
				}
			}
			if len(seeds) == 0 {
				t.Skipf("no seed known to catch %s", name)
			}
			var caught []string
			for _, seed := range seeds {
				o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Schedules: 30, Mutations: m}
				r := RunCluster(o)
				if r.Violation == nil {
					if search == 0 {
						t.Errorf("seed %d: the simulator no longer catches %s\nreproduce: %s", seed, name, ClusterReproduce(o))
					}
					continue
				}
				caught = append(caught, strconv.FormatUint(seed, 10)+":"+r.Violation.Invariant)
			}
			slices.Sort(caught)
			t.Logf("%s caught on %d of %d seeds: %v", name, len(caught), len(seeds), caught)
			if search > 0 && len(caught) == 0 {
				t.Errorf("%d seeds do not catch %s", search, name)
			}
		})
	}
}
