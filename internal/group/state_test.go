package group

import (
	"errors"
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// applier applies commands at increasing metadata seqs and checks the
// state's invariants after each.
type applier struct {
	t      *testing.T
	g      *State
	seq    uint64
	topics map[string]int
}

func newApplier(t *testing.T, mode Mode) *applier {
	return &applier{t: t, g: NewState("g", mode), topics: map[string]int{"t": 6}}
}

func (a *applier) count(topic string) int { return a.topics[topic] }

func (a *applier) apply(c Command) Outcome {
	a.t.Helper()
	a.seq++
	before := a.g.Clone()
	out, err := a.g.Apply(a.seq, c, a.count, Mutations{})
	if err != nil {
		a.t.Fatalf("apply %+v: %v", c, err)
	}
	if v := a.g.Check(a.count); v != nil {
		a.t.Fatalf("after %+v: %v", c, v)
	}
	if v := a.g.CheckRebalance(before, a.count); v != nil {
		a.t.Fatalf("after %+v: %v", c, v)
	}
	return out
}

func join(member string, id uint64) Command {
	return Command{Op: OpJoin, Group: "g", Member: member, Topics: []string{"t"}, SessionTimeoutMs: 1000, RebalanceTimeoutMs: 1000, JoinID: id}
}

// pending returns the one pending notice of member (fails otherwise).
func (a *applier) pending(member string, kind NoticeKind) *Notice {
	a.t.Helper()
	var got []*Notice
	for _, n := range a.g.PendingNotices() {
		if n.Member == member {
			got = append(got, n)
		}
	}
	if len(got) != 1 || got[0].Kind != kind {
		a.t.Fatalf("%s's pending notices: %+v, want one %v", member, got, kind)
	}
	return got[0]
}

func (a *applier) noNotice(member string) {
	a.t.Helper()
	for _, n := range a.g.PendingNotices() {
		if n.Member == member {
			a.t.Fatalf("%s got notice %+v", member, n)
		}
	}
}

func TestIncrementalRebalance(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	n := a.pending("a", NoticeAssign)
	if len(n.Partitions) != 6 || a.g.AssignmentEpoch != 1 || a.g.MembershipEpoch != 1 {
		t.Fatalf("first member: %+v epochs %d/%d", n, a.g.MembershipEpoch, a.g.AssignmentEpoch)
	}
	if out := a.apply(join("a", 1)); out != Duplicate {
		t.Fatalf("a retried JOIN was %v", out)
	}
	a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: n.ID})
	if out := a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: n.ID}); out != Duplicate {
		t.Fatalf("a repeated CONTROL_ACK was %v", out)
	}

	// b joins: a is asked to give up three partitions, and b gets nothing
	// until a answers.
	a.apply(join("b", 2))
	rv := a.pending("a", NoticeRevoke)
	a.noNotice("b")
	if len(rv.Partitions) != 3 || a.g.MembershipEpoch != 2 || a.g.AssignmentEpoch != 1 {
		t.Fatalf("revoke %+v epochs %d/%d", rv, a.g.MembershipEpoch, a.g.AssignmentEpoch)
	}
	moving := rv.Partitions[0]
	if p, err := a.g.CheckPull(moving.Partition, "a", moving.Epoch, 1, Mutations{}); p != PullWait || err != nil {
		t.Fatalf("pull of a revoking partition: %v %v", p, err)
	}
	if err := a.g.CheckAck(moving.Partition, "a", moving.Epoch, 1, Mutations{}); err != nil {
		t.Fatalf("ack while revoking: %v", err)
	}
	a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: rv.ID})
	as := a.pending("b", NoticeAssign)
	a.noNotice("a")
	if len(as.Partitions) != 3 || as.Partitions[0].Epoch != 2 || a.g.AssignmentEpoch != 2 {
		t.Fatalf("assign %+v at epoch %d", as, a.g.AssignmentEpoch)
	}
	if len(a.g.Assigned("a")) != 3 || a.g.Assigned("a")[0].Epoch != 1 {
		t.Fatalf("a kept %+v, want 3 at epoch 1", a.g.Assigned("a"))
	}
	// The old owner is refused, by ownership and, at a leader that has
	// applied less, by the partition's fence.
	_, err := a.g.CheckPull(moving.Partition, "a", moving.Epoch, 2, Mutations{})
	if !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("old owner's pull: %v", err)
	}
	if err := a.g.CheckAck(moving.Partition, "a", moving.Epoch, 2, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("old owner's ack: %v", err)
	}
	if p, err := a.g.CheckPull(moving.Partition, "b", 2, 1, Mutations{}); p != PullOK || err != nil {
		t.Fatalf("new owner's pull: %v %v", p, err)
	}
	// An epoch this node has not applied yet is a retry, not a refusal.
	if _, err := a.g.CheckPull(moving.Partition, "b", 3, 1, Mutations{}); !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("pull from the future: %v", err)
	}

	// A stale fence (earlier incarnation) changes nothing; b restarting
	// with a new join id is a new incarnation and gets its partitions back
	// at a new epoch.
	inc := a.g.Members["b"].Incarnation
	if out := a.apply(Command{Op: OpFence, Group: "g", Member: "b", Incarnation: inc - 1}); out != Ignored {
		t.Fatalf("stale fence: %v", out)
	}
	a.apply(join("b", 3))
	if a.g.Members["b"].Incarnation == inc || len(a.g.Assigned("b")) != 3 || a.g.Assigned("b")[0].Epoch != 3 {
		t.Fatalf("restarted b: %+v %+v", a.g.Members["b"], a.g.Assigned("b"))
	}
	a.noNotice("a")
	// b's old process, still running under the same member id, holds
	// the partition at epoch 2: its pulls and acks are refused.
	if _, err := a.g.CheckPull(moving.Partition, "b", 2, 2, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("the old incarnation's pull: %v", err)
	}
	if err := a.g.CheckAck(moving.Partition, "b", 2, 2, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("the old incarnation's ack: %v", err)
	}
	// A member that claims another's partition at that member's epoch
	// (a client bug) is refused too.
	if _, err := a.g.CheckPull(moving.Partition, "a", 3, 2, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("a pull of b's partition at b's epoch: %v", err)
	}

	// b is fenced: a takes everything back at once (nothing to revoke).
	a.apply(Command{Op: OpFence, Group: "g", Member: "b", Incarnation: a.g.Members["b"].Incarnation})
	if len(a.g.Assigned("a")) != 6 || len(a.g.Members) != 1 {
		t.Fatalf("after fencing b: %+v", a.g.Assigned("a"))
	}
	// a leaves: nothing is owned.
	a.apply(Command{Op: OpLeave, Group: "g", Member: "a"})
	if len(a.g.Owners) != 0 || len(a.g.Notices) != 0 {
		t.Fatalf("empty group: owners %v notices %v", a.g.Owners, a.g.Notices)
	}
}

// TestRevokeThenMoveBack: a partition on its way from a to b goes back to
// a when b leaves first; it is still revoked and re-assigned, at a new
// epoch, so a's old deliveries cannot be acked under the old one.
func TestRevokeThenMoveBack(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: a.pending("a", NoticeAssign).ID})
	a.apply(join("b", 2))
	rv := a.pending("a", NoticeRevoke)
	a.apply(Command{Op: OpLeave, Group: "g", Member: "b"})
	a.pending("a", NoticeRevoke) // still in flight
	a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: rv.ID})
	as := a.pending("a", NoticeAssign)
	if len(as.Partitions) != 3 || as.Partitions[0].Epoch != 2 {
		t.Fatalf("re-assign: %+v", as)
	}
}

// TestTopicDeclaredLater: a member subscribed to a topic not yet declared
// gets its partitions when it is.
func TestTopicDeclaredLater(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.topics = map[string]int{}
	a.apply(join("a", 1))
	if len(a.g.Notices) != 0 {
		t.Fatalf("notices for a missing topic: %v", a.g.Notices)
	}
	a.topics["t"] = 2
	a.g.Rebalance(a.count, Mutations{})
	if len(a.pending("a", NoticeAssign).Partitions) != 2 {
		t.Fatal("no assignment after the topic appeared")
	}
}

func TestSharedMode(t *testing.T) {
	a := newApplier(t, Shared)
	a.apply(join("a", 1))
	a.apply(join("b", 2))
	p := Partition{Topic: "t", Index: 0}
	for _, m := range []string{"a", "b"} {
		if r, err := a.g.CheckPull(p, m, 0, 0, Mutations{}); r != PullOK || err != nil {
			t.Fatalf("shared pull by %s: %v %v", m, r, err)
		}
	}
	if _, err := a.g.CheckPull(p, "c", 0, 0, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("non-member's pull: %v", err)
	}
}

func TestCoordinatorFencesAndResends(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	c := NewCoordinator(100)
	eff := c.Tick(0, []*State{a.g})
	if len(eff.Send) != 1 || len(eff.Propose) != 0 {
		t.Fatalf("first tick: %+v", eff)
	}
	if eff := c.Tick(50, []*State{a.g}); len(eff.Send) != 0 {
		t.Fatalf("resent early: %+v", eff)
	}
	if eff := c.Tick(100, []*State{a.g}); len(eff.Send) != 1 {
		t.Fatalf("not resent: %+v", eff)
	}
	// A member that just joined here: its notices are due at once.
	c.Due("g")
	if eff := c.Tick(101, []*State{a.g}); len(eff.Send) != 1 {
		t.Fatalf("not sent again after Due: %+v", eff)
	}
	inc := a.g.Members["a"].Incarnation
	c.Heard("g", "a", inc, 900)
	if eff := c.Tick(1500, []*State{a.g}); len(eff.Propose) != 0 {
		t.Fatalf("fenced a member heard 600 ms ago: %+v", eff.Propose)
	}
	eff = c.Tick(1901, []*State{a.g})
	if len(eff.Propose) != 1 || eff.Propose[0].Op != OpFence || eff.Propose[0].Incarnation != inc {
		t.Fatalf("silent member not fenced: %+v", eff.Propose)
	}
	if eff := c.Tick(1950, []*State{a.g}); len(eff.Propose) != 0 {
		t.Fatalf("fence proposed twice within the retransmit time: %+v", eff.Propose)
	}

	// A member that answers heartbeats but not its REVOKE is fenced after
	// its rebalance timeout.
	a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Notice: a.pending("a", NoticeAssign).ID})
	a.apply(join("b", 2))
	c = NewCoordinator(100)
	var fenced []Command
	var at int64
	for now := int64(0); now <= 1100 && len(fenced) == 0; now += 100 {
		c.Heard("g", "a", inc, now)
		c.Heard("g", "b", a.g.Members["b"].Incarnation, now)
		fenced, at = c.Tick(now, []*State{a.g}).Propose, now
	}
	if len(fenced) != 1 || fenced[0].Member != "a" || at != 1100 {
		t.Fatalf("slow revoker: %+v at %d ms", fenced, at)
	}
}
