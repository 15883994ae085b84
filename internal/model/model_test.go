package model

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
)

func run(t *testing.T, name string, cfg Config) Result {
	t.Helper()
	start := time.Now()
	r := Check(cfg)
	t.Logf("%s: %d states, %d pruned, complete=%v, %v", name, r.States, r.Pruned, r.Complete, time.Since(start).Round(time.Millisecond))
	if r.Violation != "" {
		t.Fatalf("%s: %s\ntrace:\n  %s", name, r.Violation, strings.Join(r.Trace, "\n  "))
	}
	return r
}

// TestExhaustiveSingleElection explores every interleaving of one election
// and one proposal with a crash and a lost message (sync_quorum), and with a
// lost message under sync_all, to the end: every reachable state is checked.
func TestExhaustiveSingleElection(t *testing.T) {
	if r := run(t, "sync_quorum", Config{Replicas: 3, Proposals: 1, Campaigns: 1, Crashes: 1, Drops: 1, NetworkMax: 8, DepthMax: 60, StatesMax: 1_000_000}); !r.Complete || r.States < 100_000 {
		t.Fatalf("expected a complete exploration of >100k states, got %d complete=%v", r.States, r.Complete)
	}
	if r := run(t, "sync_all", Config{Replicas: 3, Policy: replica.SyncAll, Proposals: 1, Campaigns: 1, Drops: 1, NetworkMax: 8, DepthMax: 60, StatesMax: 1_000_000}); !r.Complete {
		t.Fatalf("sync_all exploration incomplete at %d states", r.States)
	}
}

// TestExhaustivePreVoteElection explores every interleaving of an election
// that goes through a pre-vote round, as a timeout does in production, with
// a proposal and a lost message. (Two timeouts, so that two rounds race,
// pass 3M states without finishing here.)
func TestExhaustivePreVoteElection(t *testing.T) {
	r := run(t, "pre-vote", Config{Replicas: 3, PreVote: true, Proposals: 1, Campaigns: 1, Drops: 1,
		NetworkMax: 8, DepthMax: 60, StatesMax: 1_000_000})
	if !r.Complete || r.States < 100_000 || r.MaxEpoch < 1 || r.Committed < 2 {
		t.Fatalf("expected a complete exploration of >100k states reaching an elected leader and a committed value: %d states, complete=%v, max epoch %d, committed %d",
			r.States, r.Complete, r.MaxEpoch, r.Committed)
	}
}

// TestExhaustiveCrashPartial explores to the end one election and one
// proposal with a kill -9 that may land in the middle of any Ready — its
// leader's APPENDs sent before its own fsync (EarlyAppends), a follower's
// truncation and entries half written — keeping any prefix of its writes.
func TestExhaustiveCrashPartial(t *testing.T) {
	r := run(t, "crash-partial", Config{Replicas: 3, CrashPartial: true, EarlyAppends: true, Proposals: 1, Campaigns: 1, Crashes: 1,
		NetworkMax: 8, DepthMax: 60, StatesMax: 1_000_000})
	if !r.Complete || r.MidReadyCrashes == 0 || r.Committed < 2 {
		t.Fatalf("expected a complete exploration with crashes in the middle of Readys and a committed value: %d states, complete=%v, %d mid-Ready crashes, committed %d",
			r.States, r.Complete, r.MidReadyCrashes, r.Committed)
	}
}

// TestBoundedCrashPartialTwoElections explores the first 100k states of
// two elections and two proposals with a kill -9 that may land in the
// middle of any Ready: followers truncating a deposed leader's tail crash
// after part of it, and the truncated entries come back.
func TestBoundedCrashPartialTwoElections(t *testing.T) {
	r := run(t, "crash-partial, two elections", Config{Replicas: 3, CrashPartial: true, EarlyAppends: true, Proposals: 2, Campaigns: 2,
		Crashes: 1, NetworkMax: 6, DepthMax: 24, StatesMax: 100_000})
	if r.MidReadyCrashes == 0 || r.TruncationsUndone == 0 || r.MaxEpoch < 2 {
		t.Fatalf("expected mid-Ready crashes undoing truncations and a second epoch: %+v", r)
	}
	t.Logf("reached: %d mid-Ready crashes, %d undoing a truncation", r.MidReadyCrashes, r.TruncationsUndone)
}

// TestExhaustiveCompaction explores to the end one election, one
// proposal and one compaction by any node: compacted followers take
// APPENDs from below their snapshot point (S8), and every invariant holds.
func TestExhaustiveCompaction(t *testing.T) {
	r := run(t, "compaction", Config{Replicas: 3, Proposals: 1, Campaigns: 1, Compactions: 1, NetworkMax: 6, DepthMax: 40, StatesMax: 1_000_000})
	if !r.Complete || r.Compactions == 0 || r.AppendsBelowSnapshot == 0 {
		t.Fatalf("expected a complete exploration with compactions and APPENDs below a snapshot: %+v", r)
	}
}

// TestBoundedDegradedAndCompacting explores the first 100k states of one
// election, two proposals, an ack timeout and a compaction: leaders go
// read-only and come back, nodes compact, followers behind a leader's
// snapshot install it, compacted followers take APPENDs from below their
// snapshot point (S8) — and every invariant holds.
func TestBoundedDegradedAndCompacting(t *testing.T) {
	r := run(t, "degraded and compacting", Config{Replicas: 3, Proposals: 2, Campaigns: 1, AckTimeouts: 1, Compactions: 1,
		NetworkMax: 6, DepthMax: 20, StatesMax: 100_000})
	if r.ReadOnly == 0 || r.ReadOnlyBack == 0 || r.Compactions == 0 || r.SnapshotInstalls == 0 || r.AppendsBelowSnapshot == 0 || r.Committed < 3 {
		t.Fatalf("not every new dimension reached: %+v", r)
	}
	t.Logf("reached: %d read-only, %d back, %d compactions, %d snapshot installs, %d appends below a snapshot",
		r.ReadOnly, r.ReadOnlyBack, r.Compactions, r.SnapshotInstalls, r.AppendsBelowSnapshot)
}

// TestBoundedRicherConfiguration explores part of a configuration too large
// to finish here (two elections, two proposals, a crash, loss, duplication
// and a heartbeat): the first 200k states depth-first.
func TestBoundedRicherConfiguration(t *testing.T) {
	if testing.Short() {
		t.Skip("bounded exploration takes seconds")
	}
	run(t, "bounded", small())
}

func small() Config {
	return Config{Replicas: 3, Proposals: 2, Campaigns: 2, Heartbeats: 1, Crashes: 1, Drops: 1, Dups: 1,
		NetworkMax: 6, DepthMax: 30, StatesMax: 200_000}
}

// restartBeforeFsync is the small configuration S18 needs: APPENDs leave
// before the leader's own fsync (EarlyAppends) and one kill -9 may land
// before it, so a leader can restart without the entry a follower already
// flushed and answered FLUSHED for; two campaigns let the restarted leader
// take the next epoch and write its install entry at that very seq while
// the old FLUSHED is still in flight. One proposal makes the tail. The
// shortest such trace is 18 actions; a depth bound of 24 keeps the
// depth-first search from wandering deep first (the counterexample comes
// after ~20k states, against ~450k at depth 40). Too large to finish here.
func restartBeforeFsync() Config {
	return Config{Replicas: 3, EarlyAppends: true, Proposals: 1, Campaigns: 2, Crashes: 1,
		NetworkMax: 6, DepthMax: 24, StatesMax: 100_000}
}

// TestBoundedRestartBeforeFsync: with the guards in place, the first 100k
// states of restartBeforeFsync — leaders sending APPENDs before their own
// fsync, crashing before it, restarting and leading again — violate
// nothing.
func TestBoundedRestartBeforeFsync(t *testing.T) {
	r := run(t, "restart before fsync", restartBeforeFsync())
	if r.MaxEpoch < 2 || r.Committed < 2 {
		t.Fatalf("expected the exploration to reach epoch 2 and a committed value: %d states, max epoch %d, committed %d", r.States, r.MaxEpoch, r.Committed)
	}
}

// walk applies the named actions one after the other from the initial
// state, failing on a missing action or a violation. An action is named
// by a prefix of its name, or by parts joined with "…" that its name holds
// in that order (the first one as its prefix). A crash that follows a step
// at once ("…; n2 kill -9 …") is taken only when the name asks for it.
func walk(t *testing.T, cfg Config, actions ...string) *state {
	t.Helper()
	s := cfg.initial()
	for _, a := range actions {
		steps := cfg.successors(s)
		i := slices.IndexFunc(steps, func(st rstep) bool { return matches(st.action, a) })
		if i < 0 {
			names := make([]string, len(steps))
			for j, st := range steps {
				names[j] = st.action
			}
			t.Fatalf("no action %q among:\n  %s", a, strings.Join(names, "\n  "))
		}
		if steps[i].err != "" {
			t.Fatalf("%s: %s", a, steps[i].err)
		}
		s = steps[i].next
	}
	return s
}

func matches(action, pattern string) bool {
	parts := strings.Split(pattern, "…")
	if !strings.HasPrefix(action, parts[0]) || strings.Contains(action, "; ") && len(parts) == 1 {
		return false
	}
	rest := action[len(parts[0]):]
	for _, p := range parts[1:] {
		j := strings.Index(rest, p)
		if j < 0 {
			return false
		}
		rest = rest[j+len(p):]
	}
	return true
}

// TestEarlyAppendsLoseTheTailOnACrash: under EarlyAppends a leader's
// APPENDs of a new entry are in flight before the entry is durable; until
// the leader fsyncs it takes no message and has nothing to do but fsync
// or crash; a crash loses the entry, an fsync keeps it.
func TestEarlyAppendsLoseTheTailOnACrash(t *testing.T) {
	cfg := Config{Replicas: 3, EarlyAppends: true, Proposals: 1, Campaigns: 1, Crashes: 1}
	s := walk(t, cfg, "n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "n1 fsyncs", "deliver APPEND 1->2", "n1 proposes v1")
	if len(s.nodes[0].log) != 1 || s.nodes[0].held == nil {
		t.Fatalf("v1 should be written, not durable: log %v, held %v", s.nodes[0].log, s.nodes[0].held)
	}
	sent := slices.ContainsFunc(s.net, func(m replica.Message) bool {
		return m.Type == replica.MsgAppend && len(m.Entries) == 1 && string(m.Entries[0].Data) == "v1"
	})
	if !sent {
		t.Fatalf("no APPEND of v1 in flight: %v", s.net)
	}
	if !slices.ContainsFunc(s.net, func(m replica.Message) bool { return m.To == 1 }) {
		t.Fatalf("setup: no message for n1 in flight: %v", s.net)
	}
	for _, st := range cfg.successors(s) {
		if strings.HasPrefix(st.action, "n1 ") && st.action != "n1 fsyncs" && st.action != "n1 kill -9 and restart" ||
			strings.HasPrefix(st.action, "deliver ") && strings.Contains(st.action, "->1 ") {
			t.Errorf("n1 is in the middle of a Ready, yet %q is enabled", st.action)
		}
	}
	if crashed := walk(t, cfg, "n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "n1 fsyncs", "deliver APPEND 1->2", "n1 proposes v1", "n1 kill -9"); len(crashed.nodes[0].log) != 1 || crashed.nodes[0].held != nil {
		t.Fatalf("a crash before the fsync should lose v1: log %v", crashed.nodes[0].log)
	}
	if synced := walk(t, cfg, "n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "n1 fsyncs", "deliver APPEND 1->2", "n1 proposes v1", "n1 fsyncs"); len(synced.nodes[0].log) != 2 || synced.nodes[0].held != nil {
		t.Fatalf("the fsync should make v1 durable: log %v", synced.nodes[0].log)
	}
}

// TestMutationsHaveCounterexamples proves each kernel guard load-bearing:
// with it removed the checker finds a violating trace. The guards only the
// new dimensions reach (read-only mode, compaction) are checked on small
// configurations of their own, which the unmutated kernel passes for as
// many states as the mutated one needed.
func TestMutationsHaveCounterexamples(t *testing.T) {
	cases := []struct {
		name  string
		cfg   func() Config
		m     replica.Mutations
		want  string
		clean bool // also run unmutated on the same state budget
	}{
		{"commit on the leader's own fsync alone", small, replica.Mutations{CommitOnLeaderFlushAlone: true}, "VisibleImpliesQuorumFlushed", false},
		{"install without a promise majority", small, replica.Mutations{InstallWithoutQuorum: true}, "InstallNeedsQuorumPromise", false},
		{"accept a stale-epoch APPEND", small, replica.Mutations{AcceptStaleAppend: true}, "KernelAssertion", false},
		{"PREPARE grants ignore lineage", small, replica.Mutations{GrantIgnoresLineage: true}, "CommittedPrefixAgreement", false},
		{"count a stale-epoch FLUSHED (S18)", restartBeforeFsync, replica.Mutations{AcceptStaleFlushed: true}, "VisibleImpliesQuorumFlushed", false},
		{"accept a proposal while read-only", readOnlySpace, replica.Mutations{ProposeWhenReadOnly: true}, "ReadOnlyRefusesWrites", true},
		{"match an APPEND below the snapshot point (S8)", belowSnapshotSpace, replica.Mutations{AppendBelowSnapshot: true}, "KernelAssertion", true},
		{"trust an uncertain replica's grant (S22)", damagedTailSpace, replica.Mutations{TrustUncertainGrants: true}, "CommittedPrefixAgreement", true},
		{"an uncertain replica made whole by its old leader vouches again (S22)", damagedTailSpace, replica.Mutations{UncertainClearsOnAnyLeader: true}, "KernelAssertion", true},
		{"accept a proposal while handing leadership over", transferSpace, replica.Mutations{ProposeWhileTransferring: true}, "TransferRefusesWrites", true},
		{"a proposal lost once its leader is deposed, before the committed prefix moves on", small, replica.Mutations{OutcomeLostOnceDeposed: true}, "LostIsFinal", false},
		{"a node whose promise was lost takes part at once (S24)", lostPromiseSpace, replica.Mutations{PromiseLostNotRecovered: true}, "VisibleImpliesQuorumFlushed", true},
		{"a node whose promise was lost recovers on a majority's reports (S24)", lostPromiseSpace, replica.Mutations{PromiseFromQuorumReports: true}, "KernelAssertion", true},
		{"a rebuilding replica campaigns and grants as a whole one (RB)", rebuildSpace, replica.Mutations{RebuildingPromotable: true}, "CommittedPrefixAgreement", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg()
			cfg.Mutations = c.m
			r := Check(cfg)
			if r.Violation == "" {
				t.Fatalf("no counterexample in %d states (complete=%v)", r.States, r.Complete)
			}
			if !strings.HasPrefix(r.Violation, c.want) {
				t.Fatalf("violation %q, want %s", r.Violation, c.want)
			}
			t.Logf("%s after %d states, trace of %d actions", r.Violation, r.States, len(r.Trace))
			if c.clean {
				cfg.Mutations, cfg.StatesMax = replica.Mutations{}, r.States
				if clean := Check(cfg); clean.Violation != "" {
					t.Fatalf("unmutated: %s\ntrace:\n  %s", clean.Violation, strings.Join(clean.Trace, "\n  "))
				}
			}
		})
	}
}

// readOnlySpace: one election, two proposals and an ack timeout — a
// leader goes read-only and comes back.
func readOnlySpace() Config {
	return Config{Replicas: 3, Proposals: 2, Campaigns: 1, AckTimeouts: 1, NetworkMax: 6, DepthMax: 20, StatesMax: 200_000}
}

// belowSnapshotSpace: one election, one proposal, a heartbeat (to tell a
// follower the commit), a duplicated message and a compaction — S8.
func belowSnapshotSpace() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 1, Heartbeats: 1, Dups: 1, Compactions: 1, NetworkMax: 6, DepthMax: 16, StatesMax: 200_000}
}

// damagedTailSpace: two elections, one proposal, a heartbeat and one node
// whose last durable entry goes bad (S22): it restarts uncertain, having
// flushed — and maybe acknowledged — an entry it no longer holds.
func damagedTailSpace() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 2, Heartbeats: 1, Damages: 1, NetworkMax: 6, DepthMax: 24, StatesMax: 400_000}
}

// rebuildSpace: two elections, one proposal, a heartbeat and one node
// whose log goes bad inside (RB): it drops the entry and what follows —
// entries it flushed, maybe committed — and restarts rebuilding.
func rebuildSpace() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 2, Heartbeats: 1, Rebuilds: 1, NetworkMax: 6, DepthMax: 24, StatesMax: 400_000}
}

// TestBoundedRebuild: the first 100k states of rebuildSpace — a
// rebuilding node refusing candidates, then made whole by a leader —
// violate nothing.
func TestBoundedRebuild(t *testing.T) {
	cfg := rebuildSpace()
	cfg.StatesMax = 100_000
	r := run(t, "rebuild", cfg)
	if r.DamagedRefusals == 0 || r.Rebuilt == 0 || r.MaxEpoch < 2 || r.Committed < 2 {
		t.Fatalf("expected damaged refusals, a node rebuilt, a second epoch and a committed value: %+v", r)
	}
	t.Logf("reached: %d states entered by a damaged refusal, %d by a node made whole", r.DamagedRefusals, r.Rebuilt)
}

// lostPromiseSpace: two elections, one proposal, a heartbeat and one node
// whose hard state goes bad (S24): it restarts not knowing which epoch it
// promised, maybe to a candidate that has not counted its grant yet.
func lostPromiseSpace() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 2, Heartbeats: 1, PromiseLosses: 1, NetworkMax: 6, DepthMax: 26, StatesMax: 400_000}
}

// TestBoundedLostPromise: the first 100k states of lostPromiseSpace —
// a node that lost its promise asks every peer for theirs, and takes part
// again in a second epoch — violate nothing.
func TestBoundedLostPromise(t *testing.T) {
	cfg := lostPromiseSpace()
	cfg.StatesMax = 100_000
	r := run(t, "lost promise", cfg)
	if r.PromisesRecovered == 0 || r.MaxEpoch < 2 || r.Committed < 2 {
		t.Fatalf("expected a recovered promise, a second epoch and a committed value: %+v", r)
	}
	t.Logf("reached: %d states entered by a recovered promise", r.PromisesRecovered)
}

// TestBoundedDamagedTail: the first 100k states of damagedTailSpace —
// candidates counting uncertain grants among others — violate nothing.
func TestBoundedDamagedTail(t *testing.T) {
	cfg := damagedTailSpace()
	cfg.StatesMax = 100_000
	r := run(t, "damaged tail", cfg)
	if r.UncertainGrants == 0 || r.MaxEpoch < 2 || r.Committed < 2 {
		t.Fatalf("expected uncertain grants, a second epoch and a committed value: %+v", r)
	}
	t.Logf("reached: %d states entered by an uncertain grant", r.UncertainGrants)
}

// TestSendBeforePersistHasACounterexample proves the shared executor's
// ordering rule load-bearing: with every message of a Ready sent before its
// writes are durable, a follower's FLUSHED counts toward a commit while its
// entry can still be lost.
func TestSendBeforePersistHasACounterexample(t *testing.T) {
	cfg := Config{Replicas: 3, EarlyAppends: true, SendBeforePersist: true, Proposals: 1, Campaigns: 1,
		NetworkMax: 6, DepthMax: 20, StatesMax: 200_000}
	r := Check(cfg)
	if !strings.HasPrefix(r.Violation, "VisibleImpliesQuorumFlushed") {
		t.Fatalf("violation %q after %d states (complete=%v), want VisibleImpliesQuorumFlushed", r.Violation, r.States, r.Complete)
	}
	t.Logf("%s after %d states, trace of %d actions", r.Violation, r.States, len(r.Trace))
	cfg.SendBeforePersist = false
	if r := Check(cfg); r.Violation != "" || !r.Complete {
		t.Fatalf("without the mutation: violation %q, complete %v after %d states", r.Violation, r.Complete, r.States)
	}
}

// transferSpace: one election, one proposal and one leadership transfer,
// with a crash, a lost message and an ack timeout (which also abandons a
// transfer, so the leader takes proposals again while its TIMEOUT_NOW
// may still arrive): hand-offs interleaved with crashes, drops and the
// target's campaign racing everything else. A second election is too
// many states to finish here (a complete exploration without the crash,
// the drop and the proposal takes 473k states); paths are bounded at 20
// actions, enough for a hand-off with a fault or two around it.
func transferSpace() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 1, Transfers: 1, Crashes: 1, Drops: 1, AckTimeouts: 1,
		NetworkMax: 6, DepthMax: 20, StatesMax: 200_000}
}

// TestBoundedTransfer: the first 200k states of transferSpace — hand-offs
// completing (the target takes office in the epoch it campaigned for on
// TIMEOUT_NOW) and abandoned — keep OneLeaderPerEpoch,
// InstallNeedsQuorumPromise, CommittedPrefixAgreement, VisibleMonotonic,
// VisibleImpliesQuorumFlushed and TransferRefusesWrites.
func TestBoundedTransfer(t *testing.T) {
	r := run(t, "transfer", transferSpace())
	if r.TransferCampaigns == 0 || r.TransferLeaders == 0 || r.TransfersAbandoned == 0 || r.MaxEpoch < 2 || r.Committed < 2 {
		t.Fatalf("expected hand-offs completed and abandoned, a second epoch and a committed value: %+v", r)
	}
	t.Logf("reached: %d states entered by a campaign on TIMEOUT_NOW, %d by a hand-off completing, %d by one abandoned",
		r.TransferCampaigns, r.TransferLeaders, r.TransfersAbandoned)
}
