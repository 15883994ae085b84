package sim

import (
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
)

// TestSingleNodeRetentionCampaign runs a single node whose topic keeps
// 4 KiB a partition (RetentionPreset) under every fault, and with group
// members: retention deletes records all the time, every producer's
// among them, across crashes, repairs and bit flips into the dedup
// snapshots; every invariant holds for what it keeps, and retries stay
// duplicates (the logWatcher). A repair that rebuilt topics.json (both
// copies flipped) has the operator set the retention again with a topic
// update, and the topic keeps it from then on (SettingsKept).
// NEREUS_SIM_SEEDS sets the count.
func TestSingleNodeRetentionCampaign(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_SEEDS", 20)
	if testing.Short() {
		seeds = min(seeds, 5)
	}
	var acked, restarts, stateFlips int
	repaired := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		for _, members := range []bool{false, true} {
			o := Options{Seed: seed, Faults: AllFaults, Retention: RetentionPreset, Members: members}
			r := Run(o)
			acked, restarts = acked+r.Acked, restarts+r.Restarts
			for _, n := range r.StateFlips {
				stateFlips += n
			}
			addCounts(repaired, r.Repaired)
			if r.Violation != nil {
				failRun(t, o, r)
				return
			}
		}
	}
	t.Logf("%d seeds (with and without members): %d acked, %d restarts, %d state-file flips; repairs %v", seeds, acked, restarts, stateFlips, repaired)
	if restarts == 0 || stateFlips == 0 {
		t.Fatalf("the campaign restarted the node %d times and flipped %d state-file bits", restarts, stateFlips)
	}
	if !testing.Short() && repaired["retention set again"] == 0 {
		t.Fatalf("no repair rebuilt topics.json and had its retention set again by a topic update (repairs %v)", repaired)
	}
}

// TestSingleNodeRetentionMutationsAreCaught: the single-node retention
// run is load-bearing for dedup across retention. Under client
// partitions and bit flips (`--retention --faults partition,bitflip`) a
// producer cut off while the others write has its every record in a
// partition deleted, and its retries of records whose PUB_OK was lost
// come after a restart: with RetentionPastDedupSnapshot the restart
// rebuilds the table from the kept log, with DedupSnapshotOnce a flip in
// the snapshot (no copy) does, and a retry appends again
// (NoDuplicateFromReplay, seen by the logWatcher, since retention deleted
// the first copy before the final read-back). The searches start at
// seed 1 (the first catching seed moves with every change to the runs'
// traces): 9 and 20 today.
func TestSingleNodeRetentionMutationsAreCaught(t *testing.T) {
	const seedsMax = 40
	for _, name := range []string{"retention-past-dedup-snapshot", "dedup-snapshot-once"} {
		t.Run(name, func(t *testing.T) {
			firstSingleNodeSeedCatching(t, NodeMutations[name], Faults{Partition: true, BitFlip: true}, []string{NoDuplicateFromReplay}, seedsMax)
		})
	}
	// Restarts are what cut a flipped tail: crashes, not partitions.
	t.Run("torn-tail-below-durable-point", func(t *testing.T) {
		firstSingleNodeSeedCatching(t, NodeMutations["torn-tail-below-durable-point"], Faults{Crash: true, BitFlip: true},
			[]string{DurableTailNotTorn}, 120)
	})
}

// firstSingleNodeSeedCatching runs a single node with retention under
// faults, carrying m, on seeds 1, 2, ... seedsMax until one breaks an
// invariant of want, and returns that seed; it fails the test when none
// does.
func firstSingleNodeSeedCatching(t *testing.T, m node.Mutations, faults Faults, want []string, seedsMax uint64) uint64 {
	t.Helper()
	for seed := uint64(1); seed <= seedsMax; seed++ {
		o := Options{Seed: seed, Faults: faults, Retention: RetentionPreset, Mutations: m}
		r := Run(o)
		switch {
		case r.Violation == nil:
		case slices.Contains(want, r.Violation.Invariant):
			t.Logf("seed %d breaks %v (%s)", seed, r.Violation, Reproduce(o))
			return seed
		default:
			t.Logf("seed %d breaks %s first", seed, r.Violation.Invariant)
		}
	}
	t.Fatalf("no seed of 1-%d breaks one of %v", seedsMax, want)
	return 0
}

// TestRetentionByAgeCampaign (IdleLogExpires): with a retention by age as
// well (`--retention --retention-age`), records expire a virtual second or
// less after they were written, so partitions idle for that long (a
// producer cut off, a node down, the end of a run) seal their active
// segment and retention deletes their last records too — on a single node
// and on every replica of a cluster, under every fault — and every
// invariant holds for what is kept.
func TestRetentionByAgeCampaign(t *testing.T) {
	age := RetentionPreset
	age.AgeMs = 1000
	for seed := uint64(1); seed <= 3; seed++ {
		o := Options{Seed: seed, Faults: AllFaults, Retention: age, Members: seed%2 == 0}
		if r := Run(o); r.Violation != nil {
			failRun(t, o, r)
			return
		}
	}
	for seed := uint64(1); seed <= 2; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Retention: age, Members: seed == 2}
		if r := RunCluster(o); r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
	}
}

// TestRetentionUpdatesCampaign: the operator changes the topic's
// retention with topic updates under every fault — its size to none,
// below, at or above the preset's, its age too in a run with one — while
// producers, a group (members in one run) and retention's carries,
// checkpoints and rebuilds go on (on a single node, repairs of
// topics.json and the operator's restoring of the retention too); every
// invariant holds across the changes, the updates are answered, and every
// node ends with the last one's settings (SettingsKept).
func TestRetentionUpdatesCampaign(t *testing.T) {
	updates := 0
	for seed := uint64(1); seed <= 10; seed++ {
		ret := RetentionPreset
		ret.Updates = 5
		if seed%3 == 0 {
			ret.AgeMs = 800
		}
		o := Options{Seed: seed, Faults: AllFaults, Retention: ret, Members: seed%2 == 0}
		r := Run(o)
		if r.Violation != nil {
			failRun(t, o, r)
			return
		}
		updates += r.RetentionUpdates
	}
	if updates < 20 {
		t.Fatalf("%d retention updates answered in 10 single-node runs of 5: the campaign did not change the retention", updates)
	}
	updates = 0
	for seed := uint64(1); seed <= 3; seed++ {
		ret := RetentionPreset
		ret.Updates = 5
		if seed == 3 {
			ret.AgeMs = 1000
		}
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, Retention: ret, Members: seed == 2}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		updates += r.RetentionUpdates
	}
	if updates < 6 {
		t.Fatalf("%d retention updates answered in 3 runs of 5: the campaign did not change the retention", updates)
	}
}
