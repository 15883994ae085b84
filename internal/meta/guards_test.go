package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// TestJoinBoundsAreTheDocumentedOnes pins DecideGroup's JOIN bounds at
// the values PROTOCOL.md and OPERATIONS.md give: member ids of 1-200
// bytes, 1-64 topics, timeouts of 1 s - 10 min, defaults 10 s and 30 s
// (each bound, its comparison and the constants).
func TestJoinBoundsAreTheDocumentedOnes(t *testing.T) {
	s := New()
	ok := group.Command{Op: group.OpJoin, Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1}
	cmd, err := s.DecideGroup(ok)
	if err != nil {
		t.Fatal(err)
	}
	if c := cmd.Group; c.SessionTimeoutMs != 10_000 || c.RebalanceTimeoutMs != 30_000 {
		t.Fatalf("defaults: session %d ms, rebalance %d ms; want 10 s and 30 s", c.SessionTimeoutMs, c.RebalanceTimeoutMs)
	}
	topics := func(n int) []string {
		var ts []string
		for i := range n {
			ts = append(ts, fmt.Sprintf("t%d", i))
		}
		return ts
	}
	for _, c := range []struct {
		name string
		edit func(*group.Command)
		ok   bool
	}{
		{"member id of 200 bytes", func(c *group.Command) { c.Member = strings.Repeat("m", 200) }, true},
		{"member id of 201 bytes", func(c *group.Command) { c.Member = strings.Repeat("m", 201) }, false},
		{"64 topics", func(c *group.Command) { c.Topics = topics(64) }, true},
		{"65 topics", func(c *group.Command) { c.Topics = topics(65) }, false},
		{"session 1 s", func(c *group.Command) { c.SessionTimeoutMs = 1_000 }, true},
		{"session 999 ms", func(c *group.Command) { c.SessionTimeoutMs = 999 }, false},
		{"session 10 min", func(c *group.Command) { c.SessionTimeoutMs = 600_000 }, true},
		{"session 10 min + 1 ms", func(c *group.Command) { c.SessionTimeoutMs = 600_001 }, false},
		{"rebalance 1 s", func(c *group.Command) { c.RebalanceTimeoutMs = 1_000 }, true},
		{"rebalance 999 ms", func(c *group.Command) { c.RebalanceTimeoutMs = 999 }, false},
		{"rebalance 10 min", func(c *group.Command) { c.RebalanceTimeoutMs = 600_000 }, true},
		{"rebalance 10 min + 1 ms", func(c *group.Command) { c.RebalanceTimeoutMs = 600_001 }, false},
	} {
		j := ok
		c.edit(&j)
		_, err := s.DecideGroup(j)
		if c.ok && err != nil {
			t.Errorf("%s refused: %v", c.name, err)
		}
		if !c.ok {
			wantCodeE(t, c.name, err, wire.CodeInvalidArgument)
		}
	}
}

func wantCodeE(t *testing.T, what string, err error, code wire.Code) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Errorf("%s: %v, want %s", what, err, code)
	}
}

// TestSharedJoinOfANewGroupIsDecided pins DecideGroup's
// c.Mode > group.Shared (not >=): Shared is a known mode.
func TestSharedJoinOfANewGroupIsDecided(t *testing.T) {
	s := New()
	if _, err := s.DecideGroup(group.Command{Op: group.OpJoin, Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1, Mode: group.Shared}); err != nil {
		t.Fatalf("a shared JOIN: %v", err)
	}
}

// TestEmptyGroupIsJoinedInTheOtherMode pins DecideGroup's
// len(g.Members) > 0 and applyGroup's mode switch: a group whose members
// all left is joined in the other mode, and takes it.
func TestEmptyGroupIsJoinedInTheOtherMode(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders"}, JoinID: 1})
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "b", Topics: []string{"orders"}, JoinID: 2, Mode: group.Shared})
	if g := n.leader().Groups["g"]; g.Mode != group.Shared || g.Members["b"] == nil {
		t.Fatalf("group after a shared JOIN of the empty exclusive group: mode %v, members %v", g.Mode, g.Members)
	}
	n.same()
}

// TestRacedJoinInAnotherModeIsIgnored pins applyGroup's
// c.Op == group.OpJoin && g.Mode != c.Mode with len(g.Members) > 0: two
// JOINs decided against the same empty state in different modes — the
// first committed wins, the second changes nothing.
func TestRacedJoinInAnotherModeIsIgnored(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	ex, err := n.leader().DecideGroup(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders"}, JoinID: 1})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := n.leader().DecideGroup(group.Command{Op: group.OpJoin, Group: "g", Member: "b", Topics: []string{"orders"}, JoinID: 2, Mode: group.Shared})
	if err != nil {
		t.Fatal(err)
	}
	n.commit(ex)
	n.commit(sh)
	g := n.leader().Groups["g"]
	if g.Mode != group.Exclusive || g.Members["b"] != nil || g.Members["a"] == nil {
		t.Fatalf("after the raced JOINs: mode %v, members %v; want exclusive with a only", g.Mode, g.Members)
	}
	// A LEAVE in between is no mode change: it is applied.
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	if len(n.leader().Groups["g"].Members) != 0 {
		t.Fatal("LEAVE not applied")
	}
	n.same()
}

// TestUnknownGroupOperationIsRefused pins DecideGroup's last answer and
// applyGroup's error from the group kernel: an operation the metadata
// does not know is refused when decided and an error when applied.
func TestUnknownGroupOperationIsRefused(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	_, err := n.leader().DecideGroup(group.Command{Op: "drop", Group: "g", Member: "m"})
	wantCode(t, "decide an unknown group op", err, wire.CodeInvalidArgument)
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1})
	data := mustJSON(t, Command{Op: OpGroup, Group: &group.Command{Op: "drop", Group: "g", Member: "m"}})
	if _, err := n.leader().Apply(n.seq+1, data); err == nil {
		t.Fatal("an entry with an unknown group op applied without error")
	}
}

// TestGroupEntryWithABadNameIsAnError pins applyGroup's ValidateName: an
// entry naming an invalid group (decided before names were checked)
// creates nothing.
func TestGroupEntryWithABadNameIsAnError(t *testing.T) {
	s := New()
	data := mustJSON(t, Command{Op: OpGroup, Group: &group.Command{Op: group.OpJoin, Group: "__g", Member: "m", Topics: []string{"t"}, JoinID: 1}})
	if _, err := s.Apply(1, data); err == nil || len(s.Groups) != 0 {
		t.Fatalf("an entry for group __g: %v, groups %v", err, s.Groups)
	}
}

// TestLeaveOfAGroupDeletedMeanwhileCreatesNothing pins applyGroup's
// c.Op != group.OpJoin for a group the state does not hold: only a JOIN
// creates a group.
func TestLeaveOfAGroupDeletedMeanwhileCreatesNothing(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders"}, JoinID: 1})
	leave, err := n.leader().DecideGroup(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	if err != nil {
		t.Fatal(err)
	}
	n.commit(leave)
	del, err := n.leader().DecideGroupDelete("g", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(del)
	n.commit(leave) // a retried LEAVE committed after the delete
	if g := n.leader().Groups["g"]; g != nil {
		t.Fatalf("a LEAVE after the delete created the group: %+v", g)
	}
	n.same()
}

// TestOldGroupDeleteEntryDeletesAKnownGroup pins applyGroup's
// incarnation != 0 && (an entry of before incarnations applies to the
// current one) and g == nil && incarnation == 0 (it deletes a group the
// metadata knows).
func TestOldGroupDeleteEntryDeletesAKnownGroup(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders"}, JoinID: 1})
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	n.commit(Command{Op: OpGroupDelete, Group: &group.Command{Group: "g"}}) // no incarnation
	if g, k := n.leader().Groups["g"], n.leader().GroupKey("g"); g != nil || k != "g@2" {
		t.Fatalf("an entry without incarnation of a known empty group: group %+v, key %q", g, k)
	}
	n.same()
}

// TestGroupDeletesOfTwoNamesAreBothRemembered pins applyGroup's
// s.GroupsDeleted == nil: the map is made once, not per delete.
func TestGroupDeletesOfTwoNamesAreBothRemembered(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	for _, name := range []string{"g", "h"} {
		del, err := n.leader().DecideGroupDelete(name, true, 0)
		if err != nil {
			t.Fatal(err)
		}
		n.commit(del)
	}
	if d := n.leader().GroupsDeleted; d["g"] != 1 || d["h"] != 1 {
		t.Fatalf("deleted groups remembered: %v, want g and h at 1", d)
	}
}

// TestCloneSharesNoPlacement pins Clone's t.Placement = slices.Clone(...).
func TestCloneSharesNoPlacement(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	n.declare("orders", 2)
	c := n.leader().Clone()
	c.Topics["orders"].Placement[0] = []uint32{9}
	if got := n.leader().Topics["orders"].Placement[0]; len(got) != 1 || got[0] == 9 {
		t.Fatalf("the original's placement changed with the clone's: %v", got)
	}
}

// TestTopicDeleteNamingItsCurrentIncarnation pins DecideTopicDelete's
// incarnation != 0 && ...: a delete naming the current incarnation is
// decided.
func TestTopicDeleteNamingItsCurrentIncarnation(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	n.declare("orders", 1)
	n.deleteTopic("orders")
	n.declare("orders", 1)
	cmd, err := n.leader().DecideTopicDelete("orders", 2)
	if err != nil || cmd.Incarnation != 2 {
		t.Fatalf("delete of orders naming incarnation 2: %+v, %v", cmd, err)
	}
}

// TestNotFoundSaysWhetherTheTopicWasDeleted pins NotFound's inc != 0.
func TestNotFoundSaysWhetherTheTopicWasDeleted(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	if err := n.leader().NotFound("orders"); !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a name never declared: %v", err)
	}
	n.declare("orders", 1)
	n.deleteTopic("orders")
	if err := n.leader().NotFound("orders"); !strings.Contains(err.Error(), "was deleted (incarnation 1)") {
		t.Fatalf("a deleted name: %v", err)
	}
}

// TestTopicDeletesOfTwoNamesAreBothRemembered pins applyTopicDelete's
// s.Deleted == nil: the map is made once, not per delete.
func TestTopicDeletesOfTwoNamesAreBothRemembered(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	for _, name := range []string{"orders", "audit"} {
		n.declare(name, 1)
		n.deleteTopic(name)
	}
	for _, name := range []string{"orders", "audit"} {
		if _, del := n.leader().Incarnation(name); del != 1 {
			t.Fatalf("%s: last deleted incarnation %d, want 1 (deleted %v)", name, del, n.leader().Deleted)
		}
	}
}

// TestTopicDeleteRebalancesWhatIsLeft pins RemoveTopicFromGroups'
// rebalanceGroups: when a deleted topic leaves one member with nothing,
// the partitions of the topics left are evened out.
func TestTopicDeleteRebalancesWhatIsLeft(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.declare("x", 2)
	n.declare("y", 2)
	ack := func(member string) {
		t.Helper()
		for _, nt := range n.leader().Groups["g"].PendingNotices() {
			if nt.Member == member {
				n.group(group.Command{Op: group.OpControlAck, Group: "g", Member: member, Notice: nt.ID})
			}
		}
	}
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"x", "y"}, JoinID: 1})
	ack("a")
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "b", Topics: []string{"x", "y"}, JoinID: 2})
	ack("a")
	ack("b")
	g := n.leader().Groups["g"]
	if len(g.Notices) != 0 || len(g.Assigned("b")) != 2 || g.Assigned("b")[0].Partition.Topic != "y" {
		t.Fatalf("before the delete: a holds %v, b %v, notices %v; want b on y", g.Assigned("a"), g.Assigned("b"), g.Notices)
	}
	n.deleteTopic("x")
	for _, s := range n.all {
		g := s.Groups["g"]
		if got := counts(g.Target); got["a"] != 1 || got["b"] != 1 {
			t.Fatalf("targets after x was deleted: %v, want one y partition each", g.Target)
		}
	}
	n.same()
}

func counts(target map[group.Partition]string) map[string]int {
	c := map[string]int{}
	for _, m := range target {
		c[m]++
	}
	return c
}

// TestTopicIncarnationSurvivesJSON pins Topic.UnmarshalJSON: only an
// incarnation of 0 (a topic saved before incarnations) reads as 1, and a
// malformed topic is an error.
func TestTopicIncarnationSurvivesJSON(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	n.declare("orders", 1)
	n.deleteTopic("orders")
	n.declare("orders", 1)
	b, err := json.Marshal(n.leader())
	if err != nil {
		t.Fatal(err)
	}
	back := New()
	if err := json.Unmarshal(b, back); err != nil || back.Topics["orders"].Incarnation != 2 {
		t.Fatalf("orders@2 after its JSON form: %+v, %v", back.Topics["orders"], err)
	}
	var tp Topic
	if err := json.Unmarshal([]byte(`{"config":{"name":"x"},"incarnation":"two"}`), &tp); err == nil {
		t.Fatalf("a topic with a malformed incarnation read as %+v", tp)
	}
}

// TestNormalizeEdges pins Normalize's nodes < 3 (two nodes default to
// one replica), the 5 of its accepted replica counts, and its
// tc.Ack > wire.AckAll.
func TestNormalizeEdges(t *testing.T) {
	if tc, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1}, 2); err != nil || tc.Replicas != 1 {
		t.Fatalf("2 nodes: replicas %d, %v; want 1", tc.Replicas, err)
	}
	if tc, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1, Replicas: 5}, 5); err != nil || tc.Replicas != 5 {
		t.Fatalf("5 replicas on 5 nodes: %d, %v", tc.Replicas, err)
	}
	for _, r := range []uint8{4, 6} {
		_, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1, Replicas: r}, 9)
		wantCodeE(t, fmt.Sprintf("%d replicas", r), err, wire.CodeInvalidArgument)
	}
	if _, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1, Ack: wire.AckAll}, 3); err != nil {
		t.Fatalf("ack all: %v", err)
	}
	_, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1, Ack: wire.AckAll + 1}, 3)
	wantCodeE(t, "an unknown ack policy", err, wire.CodeInvalidArgument)
}

// TestPlacementStartsAtTheFirstNode pins place's base := 0: the first
// topic's partition p starts at node p+1, the next topic's after the
// partitions of the first.
func TestPlacementStartsAtTheFirstNode(t *testing.T) {
	n := &nodes{t: t, all: []*State{New()}}
	cmd, _, err := n.leader().Decide(wire.TopicConfig{Name: "a", Partitions: 2, Replicas: 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]uint32{{1, 2, 3}, {2, 3, 1}}; fmt.Sprint(cmd.Placement) != fmt.Sprint(want) {
		t.Fatalf("first topic placed %v, want %v", cmd.Placement, want)
	}
	n.commit(cmd)
	cmd, _, err = n.leader().Decide(wire.TopicConfig{Name: "b", Partitions: 1, Replicas: 1}, 3)
	if err != nil || fmt.Sprint(cmd.Placement) != "[[3]]" {
		t.Fatalf("second topic placed %v (%v), want [[3]]", cmd.Placement, err)
	}
}

// TestApplyRejectsAMistypedEntry pins Apply's json.Unmarshal error: an
// entry whose fields do not decode creates nothing, even where what did
// decode would make a topic.
func TestApplyRejectsAMistypedEntry(t *testing.T) {
	s := New()
	if _, err := s.Apply(1, []byte(`{"op":"declare","topic":{"name":"x","partitions":"two"}}`)); err == nil || len(s.Topics) != 0 {
		t.Fatalf("a mistyped declare: %v, topics %v", err, s.Topics)
	}
}

// TestGroupEntryWithoutItsCommandIsAnError pins Apply's cmd.Group == nil.
func TestGroupEntryWithoutItsCommandIsAnError(t *testing.T) {
	for i, op := range []string{OpGroup, OpGroupDelete} {
		s := New()
		if _, err := s.Apply(uint64(i+1), []byte(`{"op":"`+op+`"}`)); err == nil {
			t.Fatalf("a %s entry without its group command applied", op)
		}
	}
}

// TestAddTopicNumbersOnlyAnUnnumberedTopic pins AddTopic's
// t.Incarnation == 0: a single node's topic of incarnation 0 gets the
// next one, a numbered topic keeps its number.
func TestAddTopicNumbersOnlyAnUnnumberedTopic(t *testing.T) {
	s := New()
	s.Deleted = map[string]uint64{"orders": 4}
	s.AddTopic(Topic{Config: wire.TopicConfig{Name: "orders", Partitions: 1}})
	if got := s.Topics["orders"].Incarnation; got != 5 {
		t.Fatalf("an unnumbered topic after incarnation 4 was deleted: %d, want 5", got)
	}
	s.AddTopic(Topic{Config: wire.TopicConfig{Name: "audit", Partitions: 1}, Incarnation: 7})
	if got := s.Topics["audit"].Incarnation; got != 7 {
		t.Fatalf("a topic of incarnation 7 added as %d", got)
	}
}

// TestSortedIsByName pins Sorted's comparison.
func TestSortedIsByName(t *testing.T) {
	s := New()
	for _, name := range []string{"c", "a", "d", "b"} {
		s.AddTopic(Topic{Config: wire.TopicConfig{Name: name, Partitions: 1}})
	}
	var got []string
	for _, tp := range s.Sorted() {
		got = append(got, tp.Config.Name)
	}
	if fmt.Sprint(got) != "[a b c d]" {
		t.Fatalf("Sorted: %v", got)
	}
}

// TestSharedGroupMemberLeaves pins applyGroup's c.Op == group.OpJoin in
// the mode check: a LEAVE (whose command carries no mode) of a shared
// group's member is applied.
func TestSharedGroupMemberLeaves(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders"}, JoinID: 1, Mode: group.Shared})
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "b", Topics: []string{"orders"}, JoinID: 2, Mode: group.Shared})
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	if g := n.leader().Groups["g"]; g.Mode != group.Shared || g.Members["a"] != nil || g.Members["b"] == nil {
		t.Fatalf("after a left the shared group: mode %v, members %v", g.Mode, g.Members)
	}
	n.same()
}

// TestDeleteIgnoresIncarnationMutationDeletesTheNext pins applyGroup's
// !s.GroupMutations.DeleteIgnoresIncarnation: the simulator's
// group-delete-ignores-incarnation mutation (GroupDeleteNamesItsIncarnation)
// applies a delete decided against incarnation 1 to incarnation 2; without
// the mutation it changes nothing.
func TestDeleteIgnoresIncarnationMutationDeletesTheNext(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		n := &nodes{t: t, all: []*State{New()}}
		n.leader().GroupMutations.DeleteIgnoresIncarnation = mutated
		first, err := n.leader().DecideGroupDelete("w", true, 0)
		if err != nil {
			t.Fatal(err)
		}
		n.commit(first)
		n.commit(first) // decided against incarnation 1, committed again
		want := "w@2"
		if mutated {
			want = "w@3"
		}
		if k := n.leader().GroupKey("w"); k != want {
			t.Fatalf("DeleteIgnoresIncarnation %v: key %q after the delete of incarnation 1 applied twice, want %q", mutated, k, want)
		}
	}
}

// TestMembersMaxIsTheDocumentedClusterBound pins MembersMax: clusters of
// 1-5 nodes (OPERATIONS.md), internal/cluster refuses more.
func TestMembersMaxIsTheDocumentedClusterBound(t *testing.T) {
	if MembersMax != 5 {
		t.Fatalf("MembersMax %d, OPERATIONS.md says clusters of at most 5 nodes", MembersMax)
	}
}
