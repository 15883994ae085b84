package sim

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/node"
)

// TestSingleNodeMembersCampaign: three consumers JOIN a single node's
// group as members (members.go) under crashes, kill points, fsync errors
// and bit flips — which also hit groups.json and its copy, where a single
// node keeps the membership (N24g in the simulator): the node starts from
// the copy that verifies and writes both again; with both damaged (a
// third of those flips hit the other copy too) it refuses to start until
// the operator's repair removes them, and the members join again. ExclusiveDelivery is checked on every message a
// member accepts.
func TestSingleNodeMembersCampaign(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_SEEDS", 200)
	if testing.Short() {
		seeds = min(seeds, 40)
	}
	members, flips, repaired := map[string]int{}, map[string]int{}, map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		o := Options{Seed: seed, Faults: Faults{Crash: true, KillPoint: true, Fsync: true, BitFlip: true}, Members: true, Consumers: 3}
		r := Run(o)
		if r.Violation != nil {
			failRun(t, o, r)
			return
		}
		addCounts(members, r.Members)
		addCounts(flips, r.StateFlips)
		addCounts(repaired, r.Repaired)
	}
	t.Logf("%d seeds: members %v; groups.json flipped %d times, its copy %d times, both reset by a repair %d times",
		seeds, members, flips["groups.json"], flips["groups.json.copy"], repaired["groups reset"])
	if testing.Short() {
		return
	}
	for _, k := range []string{"joins", "assigns", "revokes", "fenced"} {
		if members[k] == 0 {
			t.Errorf("no member went through %q: %v", k, members)
		}
	}
	if flips["groups.json"] == 0 || flips["groups.json.copy"] == 0 || repaired["groups reset"] == 0 {
		t.Errorf("groups.json flipped %d times, its copy %d times, both reset %d times; want each", flips["groups.json"], flips["groups.json.copy"], repaired["groups reset"])
	}
}

// TestSingleNodeMembersMutationIsCaught: a single node that assigns a
// moving partition before its owner answered the REVOKE lets two members
// hold it at once.
func TestSingleNodeMembersMutationIsCaught(t *testing.T) {
	expectCaught(t, 30, []string{invariant.ExclusiveDelivery}, func(seed uint64) *Violation {
		return Run(Options{Seed: seed, Faults: AllFaults, Members: true, Consumers: 3,
			Mutations: node.Mutations{Group: group.Mutations{AssignBeforeRevoke: true}}}).Violation
	})
}
