package sim

import "testing"

// TestLoneReplicaDamageIsRepaired runs clusters whose workload topic has
// one replica — three nodes, and one node alone — under crashes and bit
// flips into the partitions' only copies (flipLoneReplica): no healthy
// replica is left, so a damaged partition refuses what it cannot vouch
// for until the operator stops its node and runs `nereus repair
// --salvage` (clusterrepair.go). Records may be lost there, but never
// silently and never served damaged: the repair's dropped seqs and every
// torn tail cut of committed records are said (the cut by the node's
// WARN line, which the checker hears), and everything else acknowledged
// is read back.
//
// One node alone also takes flips into its metadata log, its only copy
// (flipLoneMeta): the node refuses to start until `nereus repair --salvage
// --one-node-cluster`, whose dropped entries the checker forgets (what
// they did stays in meta.json).
//
// Before the cut was said, a member alone cut a flipped last batch as a
// torn tail in silence (seed 6: its committed seq 1 came back as another
// entry); `lone-torn-tail-silent` brings that back and is caught.
func TestLoneReplicaDamageIsRepaired(t *testing.T) {
	repaired := map[string]int{}
	for _, nodes := range []int{3, 1} {
		for seed := uint64(1); seed <= 6; seed++ {
			o := ClusterOptions{Seed: seed, Nodes: nodes, Replicas: 1, Faults: ClusterFaults{Crash: true, BitFlip: true}}
			r := RunCluster(o)
			if r.Violation != nil {
				t.Fatalf("%d node(s), seed %d: %v\n%s", nodes, seed, r.Violation, ClusterReproduce(o))
			}
			addCounts(repaired, r.Repaired)
		}
	}
	// An ACK naming a partition whose only replica is unopened for damage
	// was answered NOT_LEADER, "ask its leader": there is none until the
	// repair, and a consumer of a one-node cluster took it for a
	// redelivery to come while the ack was durable, and waited for good
	// (seed 1127 of `--nodes 1`, every fault: Liveness). It is answered
	// DATA_CORRUPT now, as the partition's publishes are, and asked again.
	//
	// A member alone whose restart in place after a failed fsync found
	// its log damaged retried in silence for good: its partition answered
	// nothing and no repair was asked (seed 1728 of `--replicas 1 --policy
	// all --members`: Liveness). It is said and the partition goes corrupt
	// now (LoneDamageAtRestartIsSaid).
	//
	// An ACK naming a partition whose only replica, here, was restarting
	// in place (a failed fsync of its hard state) was answered NOT_LEADER
	// after the wait: there is no other node, the ack was durable, and the
	// consumer of a one-node cluster waited for a redelivery that never
	// came (seed 7 of `--nodes 1`, every fault, the metadata log flipped:
	// Liveness). It is answered UNAVAILABLE now, and asked again
	// (LoneAckAskedAgainHere; `lone-ack-redirected` brings it back). Its
	// replica was slow to come back because its restarts in place met
	// damage they did not say (LoneDamageAtRestartIsSaid, fixed since):
	// seed 7 no longer reaches the guard alone, nor do seeds 1-160 of
	// `--nodes 1` or 1-80 of `--replicas 1`; TestOneNodeClusterAcksAwaitOffice
	// catches it, with acks that do not await the office.
	for _, o := range []ClusterOptions{{Seed: 1127, Nodes: 1, Faults: AllClusterFaults},
		{Seed: 1728, Replicas: 1, SyncAll: true, Members: true, Faults: AllClusterFaults},
		{Seed: 7, Nodes: 1, Faults: AllClusterFaults}} {
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\n%s", o.Seed, r.Violation, ClusterReproduce(o))
		}
		addCounts(repaired, r.Repaired)
	}
	t.Logf("repaired: %v", repaired)
	for _, what := range []string{"partition ranges dropped", "committed records cut as a torn tail", "metadata entries dropped"} {
		if repaired[what] == 0 {
			t.Errorf("no run had %s: the test no longer reaches it", what)
		}
	}
	expectCaught(t, 8, []string{CommittedPrefixAgreement, VisibleMonotonic, AckedNeverLost}, func(seed uint64) *Violation {
		return RunCluster(ClusterOptions{Seed: seed, Nodes: 3, Replicas: 1, Faults: ClusterFaults{Crash: true, BitFlip: true},
			Mutations: ClusterMutations["lone-torn-tail-silent"]}).Violation
	})
}

// TestLoneRepairForgetsOnlyWhatItDropped: the group's acks of a partition
// of one replica live in its log, and a repair or a cut of that log
// makes the checker forget only the acks of the seqs it dropped, as the
// flips showed them (every ack of the partition when a dropped seq held a
// checkpoint or no flip showed it). `group-replay-stops-at-lost` replays
// the acks only up to the first record the repair dropped, so those
// after it are delivered again: caught at seed 17 of `--replicas 1`,
// every fault. The checker that forgot every ack of the partition at
// each flip and each repair let it pass seeds 1-181. A change that moves
// the simulator's traces may move both.
func TestLoneRepairForgetsOnlyWhatItDropped(t *testing.T) {
	expectCaught(t, 40, []string{AckFloorNeverRedelivered}, func(seed uint64) *Violation {
		return RunCluster(ClusterOptions{Seed: seed, Replicas: 1, Faults: AllClusterFaults,
			Mutations: ClusterMutations["group-replay-stops-at-lost"]}).Violation
	})
}
