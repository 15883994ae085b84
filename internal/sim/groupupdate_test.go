package sim

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
)

// TestGroupUpdatesCampaign: the operator sets the group's ack wait with
// group updates under every fault while producers and the group (members
// in one run, dead letters in another) go on; every invariant holds, the
// updates are answered, and at the end every runner of the group on
// every node holds the last one (GroupSettingsOnEveryNode) — one started
// only after the final power loss included. With the node's
// GroupSettingsPerNode mutation a runner started after an update takes
// its consumers' settings, and the checker says so (seed 2).
func TestGroupUpdatesCampaign(t *testing.T) {
	updates, runners := 0, 0
	for seed := uint64(1); seed <= 3; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, GroupUpdates: 6, Members: seed == 2, DeadLetters: seed == 3}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		updates, runners = updates+r.GroupUpdates, runners+r.GroupRunnersChecked
	}
	if updates < 9 || runners < 3 {
		t.Fatalf("%d group updates answered and %d runners checked in 3 runs of 6: the campaign proves little", updates, runners)
	}
	o := ClusterOptions{Seed: 2, Faults: AllClusterFaults, GroupUpdates: 6, Mutations: node.Mutations{GroupSettingsPerNode: true}}
	if r := RunCluster(o); r.Violation == nil || r.Violation.Invariant != GroupSettingsOnEveryNode {
		t.Fatalf("GroupSettingsPerNode, seed 2: %v, want a GroupSettingsOnEveryNode violation", r.Violation)
	}
	if err := (ClusterOptions{GroupUpdates: 1, GroupDeletes: 1}).Validate(); err == nil {
		t.Fatal("group updates with group deletes accepted")
	}
}
