package sim

import "testing"

// TestMetadataAgreesCatchesAShortSavedState: with every cluster fault
// and two group deletes, the nodes' applied metadata is compared after
// every event (MetadataAgrees). A member whose meta.json forgets the
// deleted group incarnations (meta-state-forgets-group-deletes) holds,
// once restarted, a state unlike the others' at the same seq: caught by
// the first seed that restarts a node after a delete. Without the
// mutation the same seeds compare states and find them equal.
func TestMetadataAgreesCatchesAShortSavedState(t *testing.T) {
	o := ClusterOptions{Faults: AllClusterFaults, GroupDeletes: 2}
	seed := firstSeedCatching(t, o, "meta-state-forgets-group-deletes", MetadataAgrees, 6)
	o.Seed = seed
	r := RunCluster(o)
	if r.Violation != nil {
		t.Fatalf("seed %d without the mutation: %v", seed, r.Violation)
	}
	if r.MetadataCompared == 0 {
		t.Fatalf("seed %d compared no metadata state", seed)
	}
	t.Logf("seed %d: %d states compared", seed, r.MetadataCompared)
}
