package model

import (
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/kv"
)

// The client's writes the configurations use.
var (
	kvPutA    = KVWrite{Key: 0, Op: kv.OpPut}
	kvDelA    = KVWrite{Key: 0, Op: kv.OpDelete}
	kvCreateA = KVWrite{Key: 0, Op: kv.OpPut, CAS: KVCreate}
	kvKnownA  = KVWrite{Key: 0, Op: kv.OpPut, CAS: KVKnown}
	kvPutB    = KVWrite{Key: 1, Op: kv.OpPut}
)

// Configurations small enough for every interleaving in seconds, each
// for one part of the KV kernel.
var (
	// A PUT and two CASes of one key, two in flight, a lease lapse and a
	// change of leader keeping any prefix of what was proposed: a CAS
	// parked behind a write in flight, refused at once against committed
	// state or as it applies, refused ErrLeaseLapsed by a deposed leader
	// that still takes writes.
	kvBucketCAS = KVBucketConfig{Replicas: 2, Writes: []KVWrite{kvPutA, kvCreateA, kvKnownA}, InflightMax: 2, Elections: 1, Lapses: 1}
	// A PUT and a create parked behind it, a proposal refused before its
	// append, a degraded leader whose proposals are answered failed while
	// they stay in flight: the create, decided again when the PUT is
	// answered failed, is proposed against a state the PUT then changes
	// (it commits after all) and refused as it applies.
	kvBucketFaults = KVBucketConfig{Replicas: 2, Writes: []KVWrite{kvPutA, kvCreateA}, InflightMax: 2, Elections: 1, Lapses: 1, Refusals: 1, Degrades: 1}
	// Three replicas, a lost answer, a CAS of the revision the client
	// heard.
	kvBucketThree = KVBucketConfig{Replicas: 3, Writes: []KVWrite{kvPutA, kvKnownA}, InflightMax: 1, Elections: 1, Lapses: 1, LostReplies: 1}
	// A watcher resuming at whichever leader serves it while a
	// compaction purges a tombstone (CURSOR_EXPIRED), across a change of
	// leader.
	kvBucketWatch = KVBucketConfig{Replicas: 2, Writes: []KVWrite{kvDelA, kvPutB}, InflightMax: 1, Elections: 1, Lapses: 1, Compactions: 1, Watch: true}
	// Checkpoints, a log truncated through one, a follower restarted or
	// reset and rebuilt from it (kv.Seeker), compaction and a watcher.
	kvBucketCheckpoint = KVBucketConfig{Replicas: 2, Writes: []KVWrite{kvDelA}, InflightMax: 1, Compactions: 1, Checkpoints: 1, Truncations: 1, Restarts: 1, Watch: true}
	// A checkpoint (two chunks) around a change of leader: a run cut by
	// it, a rebuilt replica that leads.
	kvBucketCheckpointFailover = KVBucketConfig{Replicas: 2, Writes: []KVWrite{kvPutA}, InflightMax: 1, Elections: 1, Lapses: 1, Checkpoints: 1, Truncations: 1, Restarts: 1}
)

func runKVBucket(t *testing.T, name string, cfg KVBucketConfig) KVBucketResult {
	t.Helper()
	start := time.Now()
	r := CheckKVBucket(cfg)
	t.Logf("%s: %d states, complete=%v, %v; written %d, mismatches %d, apply refusals %d, parked %d, lease lapsed %d, not ready %d, unknown %d, elections %d, deposed leader's writes %d, compactions %d, watch events %d, cursor expired %d, checkpoints %d, rebuilds %d, reads %d, settled %d",
		name, r.States, r.Complete, time.Since(start).Round(time.Millisecond), r.Written, r.Mismatches, r.ApplyRefusals, r.Parked, r.LeaseLapsed, r.NotReady,
		r.Unknown, r.Elections, r.ZombieSubmits, r.Compactions, r.WatchEvents, r.CursorExpired, r.Checkpoints, r.Rebuilds, r.Reads, r.Settled)
	return r
}

func TestKVBucketModelGuarded(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  KVBucketConfig
		// reached asserts the exploration got where the configuration is for.
		reached func(KVBucketResult) bool
	}{
		{"cas", kvBucketCAS, func(r KVBucketResult) bool {
			return r.Mismatches > 0 && r.ApplyRefusals > 0 && r.Parked > 0 && r.LeaseLapsed > 0 && r.ZombieSubmits > 0 && r.Elections > 0
		}},
		{"faults", kvBucketFaults, func(r KVBucketResult) bool {
			return r.ApplyRefusals > 0 && r.Parked > 0 && r.Unknown > 0 && r.Elections > 0
		}},
		{"three replicas", kvBucketThree, func(r KVBucketResult) bool { return r.Mismatches > 0 && r.Elections > 0 }},
		{"watch", kvBucketWatch, func(r KVBucketResult) bool {
			return r.WatchEvents > 0 && r.CursorExpired > 0 && r.Compactions > 0 && r.Elections > 0
		}},
		{"checkpoint", kvBucketCheckpoint, func(r KVBucketResult) bool {
			return r.Checkpoints > 0 && r.Rebuilds > 0 && r.WatchEvents > 0 && r.CursorExpired > 0
		}},
		{"checkpoint and failover", kvBucketCheckpointFailover, func(r KVBucketResult) bool {
			return r.Checkpoints > 0 && r.Rebuilds > 0 && r.Elections > 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runKVBucket(t, tc.name, tc.cfg)
			if r.Violation != "" {
				t.Fatalf("%s\ntrace:\n  %s", r.Violation, strings.Join(r.Trace, "\n  "))
			}
			if !r.Complete {
				t.Fatalf("exploration incomplete at %d states", r.States)
			}
			if r.Written == 0 || r.Settled == 0 || r.Reads == 0 || !tc.reached(r) {
				t.Fatalf("the exploration did not reach what it is for: %+v", r)
			}
		})
	}
}

// Each mutation removes one guard, of the kernel or of the shell the
// model drives it with; the model must find what it lets through. Each
// invariant is the first to catch one of them (KVReplyTruthful once the
// two that catch a wrong apply earlier are off: a write is answered after
// its replica applied it).
func TestKVBucketModelMutations(t *testing.T) {
	defer func() { kvBucketOff = nil }()
	for _, tc := range []struct {
		name, want string // want "": the guards left hold
		cfg        KVBucketConfig
		m          kv.Mutations
		shell      KVShellMutations
		off        []string // invariants turned off
	}{
		{name: "CASAgainstCommittedOnly", want: KVCASProposedOnlyIfItMayHold, cfg: kvBucketCAS, m: kv.Mutations{CASAgainstCommittedOnly: true}},
		// A deposed leader refuses a CAS of the revision the new one
		// acknowledged, against its own stale state. (In kvBucketCAS a
		// GET at the new leader catches it first: a deposed leader's
		// refusal showed a revision the new one had not applied yet.)
		{name: "RefuseWithoutLease", want: KVRefusalLinearizable, cfg: kvBucketThree, m: kv.Mutations{RefuseWithoutLease: true}},
		{name: "ApplyIgnoresCondition", want: KVStateMatchesLog, cfg: kvBucketCAS, m: kv.Mutations{ApplyIgnoresCondition: true}},
		{name: "ApplyIgnoresCondition, answered", want: KVReplyTruthful, cfg: kvBucketCAS, m: kv.Mutations{ApplyIgnoresCondition: true},
			off: []string{KVStateMatchesLog, KVGetLinearizable}},
		// The reign's-start gate is in the shell (kvRunner.ready) and in
		// the kernel (ErrLeaderNotReady): either holds alone.
		{name: "SkipReadyGate", cfg: kvBucketCAS, shell: KVShellMutations{SkipReadyGate: true}},
		{name: "SkipReadyGate+SubmitBeforeReignStart", want: KVLeaderHoldsAcked, cfg: kvBucketCAS, m: kv.Mutations{SubmitBeforeReignStart: true}, shell: KVShellMutations{SkipReadyGate: true}},
		{name: "ReadWithoutLease", want: KVGetLinearizable, cfg: kvBucketCAS, shell: KVShellMutations{ReadWithoutLease: true}},
		{name: "FailedAsUnavailable", want: KVRefusedNotWritten, cfg: kvBucketFaults, shell: KVShellMutations{FailedAsUnavailable: true}},
		{name: "EvictLiveRevision", want: KVStateMatchesLog, cfg: kvBucketWatch, m: kv.Mutations{EvictLiveRevision: true}},
		{name: "WatchJumpsFloor", want: KVWatchNoSilentGap, cfg: kvBucketWatch, m: kv.Mutations{WatchJumpsFloor: true}},
		// A checkpoint proposed with a write in flight is void (the write
		// lands between its base and its chunks) unless the kernel counts
		// chunks wherever they sit; then the replicas that applied the
		// write refuse it (CheckpointMatchesState), unless that check is
		// off too, and a replica rebuilt from it misses the write.
		{name: "CheckpointWithoutDrain", cfg: kvBucketCheckpoint, shell: KVShellMutations{CheckpointWithoutDrain: true}},
		{name: "CheckpointWithoutDrain+CheckpointAnyBase", want: KVAppliesEveryRecord, cfg: kvBucketCheckpoint, m: kv.Mutations{CheckpointAnyBase: true}, shell: KVShellMutations{CheckpointWithoutDrain: true}},
		{name: "CheckpointWithoutDrain+CheckpointAnyBase+CheckpointUnverified", want: KVReplicasAgree, cfg: kvBucketCheckpoint,
			m: kv.Mutations{CheckpointAnyBase: true, CheckpointUnverified: true}, shell: KVShellMutations{CheckpointWithoutDrain: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Mutations, cfg.Shell = tc.m, tc.shell
			kvBucketOff = map[string]bool{}
			for _, inv := range tc.off {
				kvBucketOff[inv] = true
			}
			r := runKVBucket(t, tc.name, cfg)
			if tc.want == "" {
				if r.Violation != "" || !r.Complete {
					t.Fatalf("complete=%v, %s\ntrace:\n  %s", r.Complete, r.Violation, strings.Join(r.Trace, "\n  "))
				}
				return
			}
			if !strings.HasPrefix(r.Violation, tc.want+":") {
				t.Fatalf("got %q, want %s", r.Violation, tc.want)
			}
			t.Logf("%s\ntrace (%d actions):\n  %s", r.Violation, len(r.Trace), strings.Join(r.Trace, "\n  "))
		})
	}
}
