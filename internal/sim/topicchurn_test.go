package sim

import (
	"strings"
	"testing"
)

// TestClusterTopicChurnCampaign (TD10): a topic deleted and declared again
// 20 times under every fault of a cluster run: no node ever runs a deleted
// incarnation (DeletedNeverResurrected, after every event), none keeps a
// deleted incarnation's files after the final restart
// (DeletedDataRemoved), and the run's other invariants stay clean.
// Breaking the node's guards makes it fail: without the applier stopping
// the deleted topic, DeletedNeverResurrected at once; without the removal
// (inline and at start), DeletedDataRemoved (seed 1 of each; NOTES).
func TestClusterTopicChurnCampaign(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, TopicChurn: 20}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\nreproduce: %s\ntrace tail:\n%s", seed, r.Violation, ClusterReproduce(o), strings.Join(r.Tail, "\n"))
		}
		if r.TopicDeletes < 10 {
			t.Fatalf("seed %d: only %d topic deletes answered (reproduce: %s)", seed, r.TopicDeletes, ClusterReproduce(o))
		}
		t.Logf("seed %d: %d deletes, %d declares, %d faults", seed, r.TopicDeletes, r.TopicDeclares, r.Faults)
	}
}
