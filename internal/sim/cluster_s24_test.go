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
func TestS24LostPromisesAtNodeLevel(t *testing.T) {
	seeds := uint64(8)
	if testing.Short() {
		seeds = 3
	}
	lost := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: ClusterFaults{Crash: true, Partition: true, Network: true, BitFlip: true}}
		r := RunCluster(o)
		if r.Violation != nil {
			failClusterRun(t, o, r)
			return
		}
		lost += r.ReplicaStates["PromiseLost (self)"]
	}
	if lost == 0 {
		t.Fatalf("no replica ever reported its promise lost in %d seeds", seeds)
	}
	t.Logf("replicas reported themselves PromiseLost %d times", lost)
}
