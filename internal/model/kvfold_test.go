package model

import (
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/kvfold"
)

func runKV(t *testing.T, name string, check func(KVConfig) KVResult, cfg KVConfig) KVResult {
	t.Helper()
	start := time.Now()
	r := check(cfg)
	t.Logf("%s: %d states, %d pruned, complete=%v, %v; applies %d, store failures %d, restarts %d, trips %d, benign gaps %d, resyncs %d, stopped %d, paused %d, quiescent %d",
		name, r.States, r.Pruned, r.Complete, time.Since(start).Round(time.Millisecond), r.Applies, r.StoreFailures, r.Restarts, r.Trips, r.BenignGaps, r.Resyncs, r.Stopped, r.Paused, r.Quiescent)
	if r.Violation != "" {
		t.Fatalf("%s: %s\ntrace:\n  %s", name, r.Violation, strings.Join(r.Trace, "\n  "))
	}
	if !r.Complete || r.Pruned != 0 {
		t.Fatalf("%s: exploration incomplete (%d states, %d pruned)", name, r.States, r.Pruned)
	}
	return r
}

// TestKVAppliedCursorAuthority explores delivery, every flush boundary,
// store failures and restarts of a four-record history: the store never
// holds anything but the bucket folded to its cursor, and a quiescent
// loop has folded all of it. With a stop after two failures, the stopped
// loop's store still matches its cursor, and a restart carries on; with
// one op held at most, the loop pauses the watch and resumes it.
func TestKVAppliedCursorAuthority(t *testing.T) {
	r := runKV(t, "applied", CheckKVApplied, KVConfig{Failures: 3, Restarts: 2})
	if r.StoreFailures == 0 || r.Restarts == 0 || r.Quiescent == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
	r = runKV(t, "applied, stop after 2 failures", CheckKVApplied, KVConfig{Failures: 2, Restarts: 2, StoreFailuresMax: 2})
	if r.Stopped == 0 {
		t.Fatalf("the failure stop was never reached: %+v", r)
	}
	r = runKV(t, "applied, one op held at most", CheckKVApplied, KVConfig{Failures: 2, Restarts: 1, PendingOpsMax: 1})
	if r.Paused == 0 {
		t.Fatalf("the pending bound was never reached: %+v", r)
	}
}

// TestKVResyncOrdering explores a resync while a key is deleted and
// recreated around the listing, with store failures, a restart, the
// floor moving on (a second expiry mid-resync) and interior compaction;
// and a failing listing, which stops the loop.
func TestKVResyncOrdering(t *testing.T) {
	r := runKV(t, "resync", CheckKVResync, KVConfig{Failures: 2, Restarts: 1, Compactions: 2, Overwrites: 1})
	if r.Resyncs == 0 || r.Quiescent == 0 || r.StoreFailures == 0 || r.BenignGaps == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
	r = runKV(t, "resync, a listing fails", CheckKVResync, KVConfig{ListingFailures: 1, Restarts: 1})
	if r.Stopped == 0 {
		t.Fatalf("the failed listing never stopped the loop: %+v", r)
	}
}

// TestKVLiveWatchFloorGuard explores retention overrunning a live
// watcher: the floor moves past its cursor while records are in flight,
// and overwritten records are compacted above the floor (benign gaps).
// Every maximal run ends with the fold equal to the bucket.
func TestKVLiveWatchFloorGuard(t *testing.T) {
	r := runKV(t, "live", CheckKVLive, KVConfig{Compactions: 4, Overwrites: 2})
	if r.Trips == 0 || r.Resyncs == 0 || r.Quiescent == 0 || r.BenignGaps == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
	if testing.Short() {
		return
	}
	runKV(t, "live, a restart", CheckKVLive, KVConfig{Compactions: 4, Overwrites: 2, Restarts: 1})
	runKV(t, "live, a store failure", CheckKVLive, KVConfig{Compactions: 4, Overwrites: 2, Failures: 1})
}

// TestKVMutationsHaveCounterexamples: each deliberate bug of the loop
// breaks a named invariant: the first two leave a hole behind the store's
// cursor (a restart resumes after it: the hole survives), the last two a
// quiescent store that differs from the bucket for good.
func TestKVMutationsHaveCounterexamples(t *testing.T) {
	for _, c := range []struct {
		name  string
		check func(KVConfig) KVResult
		cfg   KVConfig
		want  string
	}{
		{"drop failed batch", CheckKVApplied, KVConfig{Failures: 1, Mutations: kvfold.Mutations{DropFailedBatch: true}}, KVStoreMatchesCursor},
		{"resume from memory", CheckKVApplied, KVConfig{Failures: 1, Restarts: 1, Mutations: kvfold.Mutations{ResumeFromMemApplied: true}}, KVStoreMatchesCursor},
		{"no ack barrier", CheckKVResync, KVConfig{Mutations: kvfold.Mutations{NoAckBarrier: true}}, KVFoldConverges},
		{"unguarded live watch", CheckKVLive, KVConfig{Compactions: 3, Mutations: kvfold.Mutations{UnguardedLiveWatch: true}}, KVFoldConverges},
	} {
		r := c.check(c.cfg)
		if !strings.HasPrefix(r.Violation, c.want) {
			t.Errorf("%s: want a %s counterexample, got %q after %d states", c.name, c.want, r.Violation, r.States)
			continue
		}
		t.Logf("%s: %s after %d states (%d actions)\n  %s", c.name, r.Violation, r.States, len(r.Trace), strings.Join(r.Trace, "\n  "))
	}
}
