package model

import (
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

// TestMutationsHaveCounterexamples proves each kernel guard load-bearing:
// with it removed the checker finds a violating trace.
func TestMutationsHaveCounterexamples(t *testing.T) {
	cases := []struct {
		name string
		m    replica.Mutations
		want string
	}{
		{"commit on the leader's own fsync alone", replica.Mutations{CommitOnLeaderFlushAlone: true}, "VisibleImpliesQuorumFlushed"},
		{"install without a promise majority", replica.Mutations{InstallWithoutQuorum: true}, "InstallNeedsQuorumPromise"},
		{"accept a stale-epoch APPEND", replica.Mutations{AcceptStaleAppend: true}, "KernelAssertion"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := small()
			cfg.Mutations = c.m
			r := Check(cfg)
			if r.Violation == "" {
				t.Fatalf("no counterexample in %d states (complete=%v)", r.States, r.Complete)
			}
			if !strings.HasPrefix(r.Violation, c.want) {
				t.Fatalf("violation %q, want %s", r.Violation, c.want)
			}
			t.Logf("%s after %d states, trace of %d actions", r.Violation, r.States, len(r.Trace))
		})
	}
}
