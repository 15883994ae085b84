package sim

import (
	"slices"
	"testing"
)

// TestLoneBucketLossesAreSaid runs the KV workload on a bucket of one
// replica (--replicas 1 --kv 30) under every fault, bit flips into the
// bucket's only copy among them (flipLoneBucket): no healthy copy is
// left, so the operator repairs its node when it asks, and acknowledged
// writes may be lost there — never silently. The history is checked era
// by era between the losses, and the watcher, once it went past a lost
// revision, must hear CURSOR_EXPIRED before anything else
// (LossExpiresEveryCursor). Seed 1: a loss a checkpoint after it held;
// 10: a loss the watcher is told of by the leader's fence; 18: two
// losses; 114: a bucket that could not be rebuilt, deleted and created
// again by the operator; 48: a member alone of the workload topic whose
// restart in place met damage in a sealed segment (it was retried in
// silence for good, no repair asked: Liveness; LoneDamageAtRestartIsSaid);
// 100: a flip into the bucket's last batch while its node was down after
// a crash, cut as a torn tail past the watcher's cursor — its seqs kept,
// the watcher told (TornSeqsNotReused; `torn-seqs-reused` hands them out
// again and the watcher misses the writes that took them). Seed 730
// (under `kv-watch-before-fence` only): a watch started after a repair's
// gap was stepped over and before its fence applied went on past the gap
// (FenceBeforeWatch).
//
// The runs found, before their fixes: the lost records a member alone's
// repair fills dropped seqs with read as control records, every lost
// write gone in silence (`kv-lost-record-skipped`); a watcher that saw a
// lost write never told — the drop's floor reaches only cursors below it
// (the fence; `kv-fence-keeps-floor`); a replayed fence taken to answer a
// later repair's gap below it (`kv-fence-answers-any-gap`, the one seed
// of 1-180 that catches it; the node's TestKVFenceAnswersOnlyItsGaps
// scripts it); a bucket
// whose creation record was lost answering NOT_FOUND for good
// (`kv-lost-creation-skipped`); one flipped checkpoint chunk costing the
// whole bucket (the node's
// TestKVBucketOfOneReplicaSurvivesADamagedCheckpoint); and a watcher of
// a deleted bucket going on on the one created again
// (TestKVRecreatedBucketExpiresOldCursors).
func TestLoneBucketLossesAreSaid(t *testing.T) {
	counts := map[string]int{}
	for _, seed := range []uint64{1, 10, 18, 48, 100, 114} {
		o := ClusterOptions{Seed: seed, Replicas: 1, KV: 30, Faults: AllClusterFaults}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\n%s", seed, r.Violation, ClusterReproduce(o))
		}
		addCounts(counts, r.Repaired)
	}
	t.Logf("%v", counts)
	for _, what := range []string{"bucket losses", "watcher told of a loss", "bucket losses a checkpoint held", "buckets created again",
		"bucket torn tails a watcher went past"} {
		if counts[what] == 0 {
			t.Errorf("no run had %s: the test no longer reaches it", what)
		}
	}
	// Several seeds each, the first that catches it enough: any change to
	// the runs' traces moves which seeds do.
	for _, tc := range []struct {
		mutation string
		seeds    []uint64
		want     []string
	}{
		{"kv-lost-record-skipped", []uint64{1, 3, 5}, []string{LossExpiresEveryCursor}},
		{"kv-fence-keeps-floor", []uint64{10, 14, 18}, []string{LossExpiresEveryCursor}},
		{"kv-fence-answers-any-gap", []uint64{180}, []string{LossExpiresEveryCursor}},
		// The bucket answers NOT_FOUND for good: its operations never run.
		{"kv-lost-creation-skipped", []uint64{3, 23, 27}, []string{LossExpiresEveryCursor, Liveness}},
		// A flipped last batch cut as torn and its seqs written again:
		// the watcher past them is never told.
		{"torn-seqs-reused", []uint64{100}, []string{LossExpiresEveryCursor}},
		// A watch started between a gap stepped over and its fence: the
		// watcher past the gap goes on (seed 730 found it; 1420 since
		// the metadata answers wait for meta.json).
		{"kv-watch-before-fence", []uint64{1420}, []string{LossExpiresEveryCursor}},
	} {
		caught := false
		for _, seed := range tc.seeds {
			o := ClusterOptions{Seed: seed, Replicas: 1, KV: 30, Faults: AllClusterFaults, Mutations: ClusterMutations[tc.mutation]}
			v := RunCluster(o).Violation
			if v == nil {
				continue
			}
			if !slices.Contains(tc.want, v.Invariant) {
				t.Errorf("%s at seed %d: %v, want one of %v", tc.mutation, seed, v, tc.want)
			}
			caught = true
			break
		}
		if !caught {
			t.Errorf("none of seeds %v catches %s any more (search again: nereus sim --replicas 1 --kv 30 --mutation %s)", tc.seeds, tc.mutation, tc.mutation)
		}
	}
}
