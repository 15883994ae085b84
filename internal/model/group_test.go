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
	t.Logf("%s: %d states, %d pruned, complete=%v, %v; deliveries %d, redeliveries %d, refused %d, revokes %d, zombies fenced %d, deletes %d, rejoins %d, stale acks %d",
		name, r.States, r.Pruned, r.Complete, time.Since(start).Round(time.Millisecond), r.Deliveries, r.Redeliveries, r.Refused, r.Revokes, r.ZombieFenced,
		r.Deletes, r.Rejoins, r.StaleAcks)
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
		{"unmoved partitions assigned again", GroupConfig{Members: 2, Partitions: 3, Joins: 2, Mutations: group.Mutations{ReassignUnmoved: true}}, invariant.MinimalRebalance},
		{"a stale member's ack accepted", GroupConfig{Members: 2, Partitions: 1, Joins: 2, Fences: 1, Mutations: group.Mutations{StaleAckAccepted: true}}, invariant.AckFromCurrentOwner},
		{"an ack of a deleted incarnation's notice accepted", revokeAnswerAcrossADelete(group.Mutations{AckIgnoresIncarnation: true}), invariant.ExclusiveDelivery},
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

// revokeAnswerAcrossADelete starts from m1's answer to a REVOKE on its way
// to the metadata log when m1 is fenced (its rebalance timeout ran out as
// it answered), m2 is fenced too and the group, empty, is deleted; then it
// explores both members joining the group's next incarnation, which
// numbers its notices from 1 again — m1's REVOKE #2 of the new
// incarnation is the old answer's notice id.
func revokeAnswerAcrossADelete(mut group.Mutations) GroupConfig {
	return GroupConfig{Members: 2, Partitions: 2, Messages: 1, Nodes: 1, Joins: 4, Fences: 2, Deletes: 1, Mutations: mut,
		Prefix: []string{"m1 joins", "coordinator sends ASSIGN #1 to m1", "deliver ASSIGN #1 to m1", "deliver CONTROL_ACK #1 from m1 (incarnation 1)",
			"m2 joins", "coordinator sends REVOKE #2 to m1", "deliver REVOKE #2 to m1", "m1 finishes releasing #2",
			"coordinator fences m1", "coordinator fences m2", "the group is deleted"}}
}

// TestGroupDeletesAndRejoins explores group deletes: a group left without
// members (fenced) is deleted and joined again, its next
// incarnation numbering notices and epochs from the start, while notices,
// CONTROL_ACKs and members of the deleted incarnation are still about and
// partition leaders apply the delete at their own pace. A CONTROL_ACK of
// the deleted incarnation's notice meets the new incarnation's notice of
// the same id and member (State.Apply ignores it: the ack names its
// incarnation). With AckIgnoresIncarnation the same exploration breaks
// ExclusiveDelivery, and its counterexample, replayed on the kernel as it
// is, goes nowhere.
func TestGroupDeletesAndRejoins(t *testing.T) {
	r := runGroup(t, "deleted and joined again", GroupConfig{Members: 2, Partitions: 2, Messages: 1, Nodes: 1, Joins: 2, Fences: 1, Deletes: 1})
	if r.Deletes == 0 || r.Rejoins == 0 || r.StaleAcks == 0 || r.Refused == 0 || r.Revokes == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}

	cfg := revokeAnswerAcrossADelete(group.Mutations{})
	r = runGroup(t, "a REVOKE's answer across a delete", cfg)
	if r.Rejoins == 0 || r.StaleAcks == 0 || r.Revokes == 0 || r.Deliveries == 0 || r.Refused == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}
	dups := cfg
	dups.Dups, dups.StatesMax = 1, 1_000_000 // the stale answer, a notice or a new answer twice
	if r := runGroup(t, "a REVOKE's answer across a delete, duplicated messages", dups); r.StaleAcks == 0 {
		t.Fatalf("the exploration missed a dimension: %+v", r)
	}

	mutated := cfg
	mutated.Mutations.AckIgnoresIncarnation = true
	m := CheckGroup(mutated)
	if !strings.HasPrefix(m.Violation, invariant.ExclusiveDelivery) {
		t.Fatalf("AckIgnoresIncarnation: want an ExclusiveDelivery counterexample, got %q after %d states", m.Violation, m.States)
	}
	t.Logf("AckIgnoresIncarnation: %s after %d states\ntrace:\n  %s", m.Violation, m.States, strings.Join(m.Trace, "\n  "))
	taken, v := ReplayGroup(cfg, m.Trace)
	if v != "" || taken == len(m.Trace) {
		t.Fatalf("the counterexample replayed without the mutation: %d of %d actions taken, violation %q", taken, len(m.Trace), v)
	}
	t.Logf("without the mutation the counterexample stops after %d of %d actions, before %q", taken, len(m.Trace), m.Trace[taken])
}
