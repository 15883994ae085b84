package sim

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/node"
)

// TestClusterMembersCampaign runs three complete nodes under every fault
// with three consumers that JOIN the group as members (members.go):
// ExclusiveDelivery on every message a member accepts, the liveness phase
// (every acknowledged message acked by the group, so every partition ends
// owned and consumed: EventuallyOwned), and the final read-back. The
// members must have been assigned and revoked partitions, fenced and
// crashed across the seeds.
func TestClusterMembersCampaign(t *testing.T) {
	seeds := uint64(12)
	if testing.Short() {
		seeds = 4
	}
	start := time.Now()
	total := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Members: true, Consumers: 3}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		addCounts(total, r.Members)
	}
	t.Logf("%d seeds in %v: members %v", seeds, time.Since(start).Round(time.Millisecond), total)
	// The same seed, the same run.
	o := ClusterOptions{Seed: 3, Faults: AllClusterFaults, Members: true, Consumers: 3}
	if a, b := RunCluster(o), RunCluster(o); a.TraceHash != b.TraceHash || a.Events != b.Events {
		t.Errorf("seed 3 ran twice: traces %s and %s, %d and %d events", a.TraceHash, b.TraceHash, a.Events, b.Events)
	}
	for _, k := range []string{"joins", "assigns", "revokes", "fenced", "crashes", "rebalances checked"} {
		if total[k] == 0 {
			t.Errorf("no member went through %q in %d seeds: %v", k, seeds, total)
		}
	}
}

// TestClusterMembersMutationIsCaught: a coordinator that assigns a moving
// partition before its owner answered the REVOKE lets two members hold it
// at once.
func TestClusterMembersMutationIsCaught(t *testing.T) {
	expectCaught(t, 20, []string{invariant.ExclusiveDelivery}, func(seed uint64) *Violation {
		return RunCluster(ClusterOptions{Seed: seed, Faults: AllClusterFaults, Members: true, Consumers: 3,
			Mutations: node.Mutations{Group: group.Mutations{AssignBeforeRevoke: true}}}).Violation
	})
}

// TestRebalancesAreMinimalAtNodeLevel (CB2): each node checks
// MinimalRebalance as it applies each group entry of the metadata log
// (sim.groupApplied: CheckRebalance and CheckQuiet), so the campaigns
// above check it on every rebalance the real coordinator made; an
// assignment that ignores the previous one, or that assigns unmoved
// partitions again, is caught at once. Sampled after each event it was not: ten seeds of
// the mutation passed.
func TestRebalancesAreMinimalAtNodeLevel(t *testing.T) {
	for _, m := range []string{"group-non-sticky", "group-reassign-unmoved"} {
		t.Run(m, func(t *testing.T) {
			expectCaught(t, 5, []string{invariant.MinimalRebalance}, func(seed uint64) *Violation {
				return RunCluster(ClusterOptions{Seed: seed, Faults: AllClusterFaults, Members: true, Consumers: 3,
					Mutations: ClusterMutations[m]}).Violation
			})
		})
	}
}

// TestClusterSharedMembersCampaign: members of a shared group compete for
// every partition under every fault; every message is consumed
// (liveness) and read back.
func TestClusterSharedMembersCampaign(t *testing.T) {
	seeds := uint64(6)
	if testing.Short() {
		seeds = 2
	}
	joins := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Shared: true, Consumers: 3}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		joins += r.Members["joins"]
	}
	if joins == 0 {
		t.Fatal("no member joined")
	}
}
