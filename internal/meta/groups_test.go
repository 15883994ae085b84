package meta

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// nodes applies the same entries to several states, as the nodes of a
// cluster do, deciding on the first.
type nodes struct {
	t   *testing.T
	all []*State
	seq uint64
}

func (n *nodes) leader() *State { return n.all[0] }

func (n *nodes) commit(c Command) {
	n.t.Helper()
	n.seq++
	data := mustJSON(n.t, c)
	for _, s := range n.all {
		if _, err := s.Apply(n.seq, data); err != nil {
			n.t.Fatalf("apply %s: %v", data, err)
		}
	}
}

func (n *nodes) group(c group.Command) {
	n.t.Helper()
	cmd, err := n.leader().DecideGroup(c)
	if err != nil {
		n.t.Fatalf("decide %+v: %v", c, err)
	}
	n.commit(cmd)
}

func (n *nodes) same() {
	n.t.Helper()
	a, _ := json.Marshal(n.all[0])
	for _, s := range n.all[1:] {
		if b, _ := json.Marshal(s); string(a) != string(b) {
			n.t.Fatalf("nodes diverged:\n%s\n%s", a, b)
		}
	}
}

func TestGroupsThroughTheMetadataLog(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	join := group.Command{Op: group.OpJoin, Group: "billing", Member: "a", Topics: []string{"orders"}, JoinID: 1}
	n.group(join)
	g := n.leader().Groups["billing"]
	if m := g.Members["a"]; m == nil || m.SessionTimeoutMs != SessionTimeoutMsDefault || m.RebalanceTimeoutMs != RebalanceTimeoutMsDefault {
		t.Fatalf("member after JOIN: %+v", m)
	}
	if len(g.Owners) != 0 {
		t.Fatalf("partitions of an undeclared topic assigned: %v", g.Owners)
	}
	// Declaring the topic assigns its partitions to the waiting member.
	cmd, _, err := n.leader().Decide(wire.TopicConfig{Name: "orders", Partitions: 4, Replicas: 1}, 3)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(cmd)
	if got := len(n.leader().Groups["billing"].Assigned("a")); got != 4 {
		t.Fatalf("a holds %d partitions after the declare, want 4", got)
	}
	n.group(join) // a retried JOIN
	if n.leader().Groups["billing"].MembershipEpoch != 1 {
		t.Fatal("a retried JOIN was applied again")
	}
	n.group(group.Command{Op: group.OpJoin, Group: "billing", Member: "b", Topics: []string{"orders"}, JoinID: 2})
	if _, err := n.leader().DecideGroupDelete("billing", false, 0); err == nil {
		t.Fatal("a group with members was deleted")
	}
	n.same()

	// The state survives its JSON form (meta.json) and the nodes agree.
	b, _ := json.Marshal(n.leader())
	back := New()
	if err := json.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	n.all = append(n.all, back)
	n.group(group.Command{Op: group.OpLeave, Group: "billing", Member: "a"})
	n.group(group.Command{Op: group.OpLeave, Group: "billing", Member: "b"})
	n.same()
	del, err := n.leader().DecideGroupDelete("billing", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(del)
	if len(n.leader().Groups) != 0 {
		t.Fatalf("groups after delete: %v", n.leader().Groups)
	}
	n.same()
}

func TestGroupCommandsAreValidated(t *testing.T) {
	s := New()
	ok := group.Command{Op: group.OpJoin, Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1}
	for name, c := range map[string]func(*group.Command){
		"reserved group":    func(c *group.Command) { c.Group = "__g" },
		"empty member":      func(c *group.Command) { c.Member = "" },
		"no topics":         func(c *group.Command) { c.Topics = nil },
		"bad topic":         func(c *group.Command) { c.Topics = []string{".."} },
		"join id 0":         func(c *group.Command) { c.JoinID = 0 },
		"short session":     func(c *group.Command) { c.SessionTimeoutMs = 10 },
		"endless rebalance": func(c *group.Command) { c.RebalanceTimeoutMs = TimeoutMsMax + 1 },
		"unknown mode":      func(c *group.Command) { c.Mode = 7 },
	} {
		bad := ok
		c(&bad)
		var we *wire.Error
		if _, err := s.DecideGroup(bad); !errors.As(err, &we) || we.Code != wire.CodeInvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	cmd, err := s.DecideGroup(ok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(1, mustJSON(t, cmd)); err != nil {
		t.Fatal(err)
	}
	shared := ok
	shared.Member, shared.Mode = "n", group.Shared
	if _, err := s.DecideGroup(shared); err == nil {
		t.Fatal("a shared JOIN of an exclusive group was accepted")
	}
	if _, err := s.DecideGroup(group.Command{Op: group.OpLeave, Group: "other", Member: "m"}); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("leave of a missing group: %v", err)
	}
}

// A meta.json written before groups existed loads and takes group entries.
func TestStateWithoutGroupsLoads(t *testing.T) {
	s := New()
	if err := json.Unmarshal([]byte(`{"applied":3,"topics":{}}`), s); err != nil {
		t.Fatal(err)
	}
	s.Groups = nil
	cmd, err := New().DecideGroup(group.Command{Op: group.OpJoin, Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(4, mustJSON(t, cmd)); err != nil || s.Groups["g"] == nil {
		t.Fatalf("group entry on an old state: %v %v", err, s.Groups)
	}
}

// GroupIncarnationStartsEmpty (the metadata's part): a delete records the
// incarnation it removed, the name's next life has the next key, a delete
// decided while the group was empty but committed after a member joined
// again changes nothing, and the nodes agree through the JSON form.
func TestGroupDeleteNumbersIncarnations(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	join := func(member string, id uint64) {
		n.group(group.Command{Op: group.OpJoin, Group: "g", Member: member, Topics: []string{"orders"}, JoinID: id})
	}
	if k := n.leader().GroupKey("g"); k != "g" {
		t.Fatalf("key of a group never deleted: %q", k)
	}
	join("a", 1)
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	del, err := n.leader().DecideGroupDelete("g", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(del)
	if k, inc := n.leader().GroupKey("g"), n.leader().GroupsDeleted["g"]; k != "g@2" || inc != 1 {
		t.Fatalf("after the first delete: key %q, last deleted %d", k, inc)
	}
	if !DeletedGroupKey("g", n.leader().GroupsDeleted) || DeletedGroupKey("g@2", n.leader().GroupsDeleted) || DeletedGroupKey("h", n.leader().GroupsDeleted) {
		t.Fatal("DeletedGroupKey does not tell the deleted incarnation from the others")
	}
	// Decided while g@2 is empty, committed after a JOIN: refused at apply.
	join("b", 2)
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "b"})
	late, err := n.leader().DecideGroupDelete("g", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	join("c", 3)
	n.commit(late)
	if g := n.leader().Groups["g"]; g == nil || g.Members["c"] == nil || n.leader().GroupKey("g") != "g@2" {
		t.Fatalf("a delete committed after a JOIN removed the group: %+v, key %q", g, n.leader().GroupKey("g"))
	}
	b, _ := json.Marshal(n.leader())
	back := New()
	if err := json.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	if back.GroupKey("g") != "g@2" {
		t.Fatalf("the JSON form lost the deleted incarnations: %s", b)
	}
	if c := n.leader().Clone(); c.GroupKey("g") != "g@2" {
		t.Fatal("Clone lost the deleted incarnations")
	}
	n.same()
}

// A group the metadata does not know — consumed only without membership —
// is deleted only with force; a forced delete names the incarnation it was
// decided against, so a second one decided at the same time (a retried
// request) deletes nothing more (GroupDeleteNamesItsIncarnation); an entry
// written before forced deletes (no incarnation) deletes only a group the
// metadata knows.
func TestGroupDeleteForce(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	_, err := n.leader().DecideGroupDelete("w", false, 0)
	wantCode(t, "delete of an unknown group without force", err, wire.CodeNotFound)
	first, err := n.leader().DecideGroupDelete("w", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	again, err := n.leader().DecideGroupDelete("w", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.Incarnation != 1 || again.Incarnation != 1 {
		t.Fatalf("forced deletes decided against incarnations %d and %d, want 1", first.Incarnation, again.Incarnation)
	}
	n.commit(first)
	n.commit(again)
	if k, inc := n.leader().GroupKey("w"), n.leader().GroupsDeleted["w"]; k != "w@2" || inc != 1 {
		t.Fatalf("after two forced deletes decided together: key %q, last deleted %d; want w@2, 1", k, inc)
	}
	n.same()
	// An entry of before forced deletes: no incarnation, unknown group.
	n.commit(Command{Op: OpGroupDelete, Group: &group.Command{Group: "v"}})
	if _, ok := n.leader().GroupsDeleted["v"]; ok {
		t.Fatal("an entry without incarnation deleted a group the metadata never knew")
	}
	// Members: refused with force as without.
	n.group(group.Command{Op: group.OpJoin, Group: "w", Member: "a", Topics: []string{"orders"}, JoinID: 1})
	_, err = n.leader().DecideGroupDelete("w", true, 0)
	wantCode(t, "forced delete of a group with members", err, wire.CodeInvalidArgument)
	n.group(group.Command{Op: group.OpLeave, Group: "w", Member: "a"})
	del, err := n.leader().DecideGroupDelete("w", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	n.commit(del)
	if k := n.leader().GroupKey("w"); k != "w@3" || n.leader().Groups["w"] != nil {
		t.Fatalf("forced delete of a known group: key %q, group %+v", k, n.leader().Groups["w"])
	}
	n.same()
}

// GroupDeleteRetryDeletesOnce: a delete that names the incarnation it
// means, asked again after its answer was lost — once the first applied
// and the name's next incarnation is in use — is answered as done and
// proposes nothing, forced or not, with members in the next incarnation
// or without; an incarnation above the current is NOT_FOUND; a delete
// naming none (a client of before) still deletes whichever is current.
// With the mutation DeleteRetryIgnoresIncarnation (the guard removed) the
// retry deletes the next incarnation.
func TestGroupDeleteRetryDeletesOnce(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	deleteOnce := func(name string, force bool, inc uint64) {
		t.Helper()
		del, err := n.leader().DecideGroupDelete(name, force, inc)
		if err != nil {
			t.Fatal(err)
		}
		n.commit(del)
	}
	retry := func(name string, force bool, inc uint64) {
		t.Helper()
		cmd, err := n.leader().DecideGroupDelete(name, force, inc)
		if !errors.Is(err, ErrGroupAlreadyDeleted) {
			t.Fatalf("retry of the delete of %s incarnation %d (force %v): %+v, %v; want ErrGroupAlreadyDeleted", name, inc, force, cmd, err)
		}
	}
	// Forced, consumers without membership: the metadata never knows w.
	deleteOnce("w", true, 1)
	retry("w", true, 1)
	if got := n.leader().GroupsDeleted["w"]; got != 1 {
		t.Fatalf("w: last deleted %d after a retried forced delete, want 1", got)
	}
	_, err := n.leader().DecideGroupDelete("w", true, 3)
	wantCode(t, "delete of an incarnation not yet created", err, wire.CodeNotFound)
	if old, err := n.leader().DecideGroupDelete("w", true, 0); err != nil || old.Incarnation != 2 {
		t.Fatalf("a forced delete naming no incarnation: %+v, %v; want today's current incarnation 2", old, err)
	}

	// Not forced: g's next incarnation known to the metadata, empty, then
	// with a member.
	join := func(member string, id uint64) {
		n.group(group.Command{Op: group.OpJoin, Group: "g", Member: member, Topics: []string{"orders"}, JoinID: id})
	}
	join("a", 1)
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "a"})
	deleteOnce("g", false, 1)
	join("b", 2)
	retry("g", false, 1) // not "has members": there is nothing to delete
	n.group(group.Command{Op: group.OpLeave, Group: "g", Member: "b"})
	retry("g", false, 1)
	if g, k := n.leader().Groups["g"], n.leader().GroupKey("g"); g == nil || k != "g@2" {
		t.Fatalf("g after retried deletes: group %+v, key %q; want incarnation 2 kept", g, k)
	}
	n.same()

	// The guard removed: the retry is decided against incarnation 2.
	for _, s := range n.all {
		s.GroupMutations.DeleteRetryIgnoresIncarnation = true
	}
	deleteOnce("g", false, 1)
	if k := n.leader().GroupKey("g"); k != "g@3" {
		t.Fatalf("with DeleteRetryIgnoresIncarnation a retry did not delete the next incarnation: key %q", k)
	}
}
