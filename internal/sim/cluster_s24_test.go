package sim

import "testing"

// TestS24LostPromisesAtNodeLevel: bit flips in replicas' hard states
// (flipStateFile: a partition's, or the metadata member's), most followed
// by a kill -9, beside crashes, partitions and lossy links. A replica
// that restarts with its promise unknown reports itself PromiseLost,
// waits for every other replica's promise and takes part again; every
// invariant holds — InstallNeedsQuorumPromise counting the promises the
// flips took — and every acknowledged record is read back. The guard
// itself (waiting for every peer, not a majority, not none) is proven
// load-bearing by the model checker and internal/replica's S24 scenario:
// a soak reaches it only with a grant in flight at the flip.
//
// It runs at least 8 seeds, and on until a replica lost its promise (32
// at most): which seeds see one moves with every change to the runs'
// traces (seed 9 is the first since groups keep two incarnation copies).
func TestS24LostPromisesAtNodeLevel(t *testing.T) {
	seeds, seedsMax := uint64(8), uint64(32)
	if testing.Short() {
		seeds, seedsMax = 3, 3
	}
	lost := 0
	for seed := uint64(1); seed <= seeds || lost == 0 && seed <= seedsMax; seed++ {
		o := ClusterOptions{Seed: seed, Faults: ClusterFaults{Crash: true, Partition: true, Network: true, BitFlip: true}}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		lost += r.ReplicaStates["PromiseLost (self)"]
	}
	if lost == 0 && !testing.Short() {
		t.Fatalf("no replica ever reported its promise lost in %d seeds", seedsMax)
	}
	t.Logf("replicas reported themselves PromiseLost %d times", lost)
}
