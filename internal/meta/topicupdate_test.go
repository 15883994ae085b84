package meta

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

func retentionUpdate(name string, set uint8, ms, bytes int64) wire.TopicUpdate {
	return wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: name}, Set: set, RetentionMs: ms, RetentionBytes: bytes}
}

// A topic update reaches every node through its committed entry and
// changes the retention alone; an update to the settings the topic has
// is decided as no change (nothing to propose), and the refusals are the
// delete's: NOT_FOUND for a name that is not declared or another
// incarnation, INVALID_ARGUMENT for internal topics and for an update no
// topic can take.
func TestTopicUpdateChangesTheRetentionOnEveryNode(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	declared := n.declare("orders", 2)
	cmd, updated, changed, err := n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionMs|wire.SetRetentionBytes, 60_000, 1<<20))
	if err != nil || !changed {
		t.Fatalf("decide: changed=%v %v", changed, err)
	}
	want := declared.Config
	want.RetentionMs, want.RetentionBytes = 60_000, 1<<20
	if updated.Config != want || updated.Incarnation != declared.Incarnation {
		t.Fatalf("decided %+v, want %+v at incarnation %d", updated, want, declared.Incarnation)
	}
	n.commit(cmd)
	for i, s := range n.all {
		if got := s.Topics["orders"]; got.Config != want || got.Incarnation != declared.Incarnation || len(got.Placement) != 2 {
			t.Fatalf("node %d after the update: %+v", i, got)
		}
	}
	if _, _, changed, err := n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionMs, 60_000, 0)); err != nil || changed {
		t.Fatalf("the same retention again: changed=%v %v, want no change", changed, err)
	}
	for _, tc := range []struct {
		what string
		u    wire.TopicUpdate
		code wire.Code
	}{
		{"never declared", retentionUpdate("nope", wire.SetRetentionMs, 1, 0), wire.CodeNotFound},
		{"another incarnation", wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "orders", Incarnation: 9}, Set: wire.SetRetentionMs, RetentionMs: 1}, wire.CodeNotFound},
		{"internal", retentionUpdate(wire.SchedTopic, wire.SetRetentionMs, 1, 0), wire.CodeInvalidArgument},
		{"sets nothing", retentionUpdate("orders", 0, 1, 0), wire.CodeInvalidArgument},
		{"unknown setting", retentionUpdate("orders", 1<<5, 1, 0), wire.CodeInvalidArgument},
		{"negative", retentionUpdate("orders", wire.SetRetentionBytes, 0, -1), wire.CodeInvalidArgument},
	} {
		_, _, _, err := n.leader().DecideTopicUpdate(tc.u)
		wantCode(t, tc.what, err, tc.code)
	}
	n.deleteTopic("orders")
	_, _, _, err = n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionMs, 1, 0))
	wantCode(t, "deleted", err, wire.CodeNotFound)
}

// UpdateSetsOnlyItsSettings: two updates decided against the same state,
// one of the age and one of the bytes, both take effect whichever commits
// first — the entry carries only what its update sets.
func TestTopicUpdateSetsOnlyItsSettings(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	n.declare("orders", 1)
	age, _, _, err := n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionMs, 5_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	size, _, _, err := n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionBytes, 0, 4096))
	if err != nil {
		t.Fatal(err)
	}
	n.commit(size)
	n.commit(age)
	if c := n.leader().Topics["orders"].Config; c.RetentionMs != 5_000 || c.RetentionBytes != 4096 {
		t.Fatalf("after both updates: retention_ms=%d retention_bytes=%d, want 5000 and 4096", c.RetentionMs, c.RetentionBytes)
	}
}

// UpdateNamesItsIncarnation: an update decided against one incarnation
// and committed after the name was deleted and declared again changes
// nothing of the new incarnation.
func TestTopicUpdateNamesItsIncarnation(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	n.declare("orders", 1)
	late, _, _, err := n.leader().DecideTopicUpdate(retentionUpdate("orders", wire.SetRetentionMs, 5_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	n.deleteTopic("orders")
	again := n.declare("orders", 1)
	n.seq++
	ch, err := n.leader().Apply(n.seq, mustJSON(t, late))
	if err != nil || ch.Updated != nil {
		t.Fatalf("a late update of incarnation 1: %+v, %v; want no change", ch, err)
	}
	if got := n.leader().Topics["orders"]; got.Config != again.Config {
		t.Fatalf("incarnation %d changed by an update of incarnation 1: %+v", again.Incarnation, got.Config)
	}
}
