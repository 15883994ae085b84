package model

import (
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
)

func runGroup(t *testing.T, name string, cfg GroupConfig) GroupResult {
	t.Helper()
	start := time.Now()
	r := CheckGroup(cfg)
	t.Logf("%s: %d states, %d pruned, complete=%v, %v; deliveries %d, redeliveries %d, refused %d, revokes %d, zombies fenced %d",
		name, r.States, r.Pruned, r.Complete, time.Since(start).Round(time.Millisecond), r.Deliveries, r.Redeliveries, r.Refused, r.Revokes, r.ZombieFenced)
	if r.Violation != "" {
		t.Fatalf("%s: %s\ntrace:\n  %s", name, r.Violation, strings.Join(r.Trace, "\n  "))
	}
	if !r.Complete {
		t.Fatalf("%s: exploration incomplete at %d states", name, r.States)
	}
	return r
}

// TestGroupRebalanceAndFencing explores to the end two members joining a
// two-partition topic — revokes, assigns, a member fenced while it still
// pulls and acks, partition leaders on two nodes applying the metadata
// log at their own pace — and checks CB1–CB3 and the ack fence in every
// state.
func TestGroupRebalanceAndFencing(t *testing.T) {
	r := runGroup(t, "two members, two partitions, a fence", GroupConfig{Members: 2, Partitions: 2, Messages: 1, Nodes: 2, Joins: 2, Fences: 1, StatesMax: 1_000_000})
	if r.Revokes == 0 || r.ZombieFenced == 0 || r.Refused == 0 || r.Redeliveries == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
}

// TestGroupLeadershipMovesAndCrashes explores a member crashing, leaving
// and being fenced while its partition's leadership moves to a node that
// applied less of the metadata log: the partition's fence keeps the new
// leader from serving the replaced owner.
func TestGroupLeadershipMovesAndCrashes(t *testing.T) {
	r := runGroup(t, "moves, leave, crash", GroupConfig{Members: 2, Partitions: 1, Messages: 1, Nodes: 2, Joins: 2, Fences: 1, Moves: 1, Leaves: 1, Crashes: 1})
	if r.Refused == 0 || r.Redeliveries == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
}

// TestGroupLostAndDuplicatedNotices explores lost, duplicated and resent
// notices and CONTROL_ACKs.
func TestGroupLostAndDuplicatedNotices(t *testing.T) {
	runGroup(t, "drops, dups, resends", GroupConfig{Members: 2, Partitions: 1, Messages: 1, Nodes: 1, Joins: 2, Fences: 1, Drops: 1, Dups: 1, Resends: 1})
	runGroup(t, "a reordered revoke", GroupConfig{Members: 2, Partitions: 2, Messages: 1, Nodes: 1, Joins: 2, Resends: 1, Dups: 1, DepthMax: 30})
}

// TestGroupMutationsHaveCounterexamples: each deliberate bug of the group
// kernel must break a named invariant.
func TestGroupMutationsHaveCounterexamples(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  GroupConfig
		want string
	}{
		{"assign before revoke is acknowledged", GroupConfig{Members: 2, Partitions: 2, Joins: 2, Mutations: group.Mutations{AssignBeforeRevoke: true}}, invariant.ExclusiveDelivery},
		{"no epoch fencing", GroupConfig{Members: 2, Partitions: 1, Joins: 2, Fences: 1, Mutations: group.Mutations{NoEpochFencing: true}}, ""},
		{"non-sticky assignment", GroupConfig{Members: 2, Partitions: 3, Joins: 2, Mutations: group.Mutations{NonSticky: true}}, invariant.MinimalRebalance},
		{"a stale member's ack accepted", GroupConfig{Members: 2, Partitions: 1, Joins: 2, Fences: 1, Mutations: group.Mutations{StaleAckAccepted: true}}, invariant.AckFromCurrentOwner},
	} {
		c.cfg.Nodes = 1
		r := CheckGroup(c.cfg)
		if r.Violation == "" || !strings.HasPrefix(r.Violation, c.want) {
			t.Errorf("%s: want a %s counterexample, got %q after %d states", c.name, c.want, r.Violation, r.States)
			continue
		}
		t.Logf("%s: %s after %d states (%d actions)", c.name, r.Violation, r.States, len(r.Trace))
	}
}

// TestGroupMemberAnsweringACopyEarlyHasACounterexample: a member that
// answers a resent copy of a REVOKE while it is still releasing frees the
// partitions it holds (the simulator's member once did, seed 3062).
func TestGroupMemberAnsweringACopyEarlyHasACounterexample(t *testing.T) {
	cfg := GroupConfig{Members: 2, Partitions: 2, Nodes: 1, Joins: 2, Resends: 1, StatesMax: 1_000_000}
	runGroup(t, "copies answered by the release", cfg)
	cfg.AnswerCopyEarly = true
	r := CheckGroup(cfg)
	if !strings.HasPrefix(r.Violation, invariant.ExclusiveDelivery) {
		t.Fatalf("answering a copy early: want an ExclusiveDelivery counterexample, got %q after %d states", r.Violation, r.States)
	}
	t.Logf("answering a copy early: %s after %d states (%d actions)", r.Violation, r.States, len(r.Trace))
}
