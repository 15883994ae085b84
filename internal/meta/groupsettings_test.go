package meta

import (
	"encoding/json"
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

func groupUpdate(name string, set uint8, ackWaitMs, maxDeliver uint32) wire.GroupUpdate {
	return wire.GroupUpdate{GroupRef: wire.GroupRef{Group: name}, Set: set, AckWaitMs: ackWaitMs, MaxDeliver: maxDeliver}
}

// GroupSettingsOnEveryNode: a group update reaches every node through its
// committed entry, for a group the metadata knows no member of too (one
// consumed without membership); it changes only what it sets, an update
// to the settings the group has is no change, and the settings survive
// the state's save and load.
func TestGroupUpdateSetsTheSettingsOnEveryNode(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	if _, ok := n.leader().SettingsOf("billing"); ok {
		t.Fatal("settings of a group never updated")
	}
	cmd, updated, changed, err := n.leader().DecideGroupUpdate(groupUpdate("billing", wire.SetAckWaitMs, 45_000, 0))
	if err != nil || !changed {
		t.Fatalf("decide: changed=%v %v", changed, err)
	}
	if want := (GroupSettings{Group: "billing", Incarnation: 1, AckWaitMs: 45_000}); updated != want {
		t.Fatalf("decided %+v, want %+v", updated, want)
	}
	n.commit(cmd)
	cmd, _, _, err = n.leader().DecideGroupUpdate(groupUpdate("billing", wire.SetMaxDeliver, 0, 3))
	if err != nil {
		t.Fatal(err)
	}
	n.commit(cmd)
	want := GroupSettings{Group: "billing", Incarnation: 1, AckWaitMs: 45_000, MaxDeliver: 3}
	for i, s := range n.all {
		if got, ok := s.SettingsOf("billing"); !ok || got != want {
			t.Fatalf("node %d: %+v (%v), want %+v", i, got, ok, want)
		}
	}
	n.same()
	if _, _, changed, err := n.leader().DecideGroupUpdate(groupUpdate("billing", wire.SetMaxDeliver, 0, 3)); err != nil || changed {
		t.Fatalf("the same max deliveries again: changed=%v %v, want no change", changed, err)
	}
	b, _ := json.Marshal(n.leader())
	var loaded State
	if err := json.Unmarshal(b, &loaded); err != nil {
		t.Fatal(err)
	}
	if got, ok := loaded.SettingsOf("billing"); !ok || got != want {
		t.Fatalf("after a save and load: %+v (%v)", got, ok)
	}
	if got, ok := n.leader().Clone().SettingsOf("billing"); !ok || got != want {
		t.Fatalf("a clone: %+v (%v)", got, ok)
	}
	for _, tc := range []struct {
		what string
		u    wire.GroupUpdate
		code wire.Code
	}{
		{"another incarnation", wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "billing", Incarnation: 2}, Set: wire.SetMaxDeliver, MaxDeliver: 1}, wire.CodeNotFound},
		{"a bad name", groupUpdate("a b", wire.SetMaxDeliver, 0, 1), wire.CodeInvalidArgument},
		{"sets nothing", groupUpdate("billing", 0, 1, 1), wire.CodeInvalidArgument},
		{"a zero ack wait", groupUpdate("billing", wire.SetAckWaitMs, 0, 0), wire.CodeInvalidArgument},
	} {
		_, _, _, err := n.leader().DecideGroupUpdate(tc.u)
		wantCode(t, tc.what, err, tc.code)
	}
}

// UpdateSetsOnlyItsSettings for groups: two updates decided against the
// same state, one of each setting, both take effect.
func TestGroupUpdatesOfOneSettingEachBothTakeEffect(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	a, _, _, err := n.leader().DecideGroupUpdate(groupUpdate("g", wire.SetAckWaitMs, 5_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, _, _, err := n.leader().DecideGroupUpdate(groupUpdate("g", wire.SetMaxDeliver, 0, 9))
	if err != nil {
		t.Fatal(err)
	}
	n.commit(a)
	n.commit(b)
	if got, _ := n.leader().SettingsOf("g"); got.AckWaitMs != 5_000 || got.MaxDeliver != 9 {
		t.Fatalf("after both: %+v", got)
	}
}

// SettingsBelongToTheirIncarnation: a group's delete drops its settings
// (the name's next incarnation starts with the defaults), and an update
// decided before the delete but committed after it changes nothing — it
// would give the new incarnation the old one's settings.
func TestGroupSettingsBelongToTheirIncarnation(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	set, _, _, err := n.leader().DecideGroupUpdate(groupUpdate("g", wire.SetMaxDeliver, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	n.commit(set)
	late, _, _, err := n.leader().DecideGroupUpdate(groupUpdate("g", wire.SetAckWaitMs, 7_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	del, err := n.leader().DecideGroupDelete("g", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(del)
	for i, s := range n.all {
		if got, ok := s.SettingsOf("g"); ok || got.Incarnation != 2 {
			t.Fatalf("node %d after the delete: %+v (%v), want none at incarnation 2", i, got, ok)
		}
	}
	n.commit(late)
	for i, s := range n.all {
		if got, ok := s.SettingsOf("g"); ok {
			t.Fatalf("node %d: the update decided against incarnation 1 gave incarnation 2 %+v", i, got)
		}
	}
	cmd, updated, _, err := n.leader().DecideGroupUpdate(groupUpdate("g", wire.SetAckWaitMs, 7_000, 0))
	if err != nil || updated != (GroupSettings{Group: "g", Incarnation: 2, AckWaitMs: 7_000}) {
		t.Fatalf("an update of incarnation 2: %+v %v", updated, err)
	}
	n.commit(cmd)
	n.same()
}
