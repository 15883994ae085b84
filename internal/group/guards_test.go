package group

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// ack applies member's CONTROL_ACK of its one pending notice of kind.
func (a *applier) ack(member string, kind NoticeKind) *Notice {
	a.t.Helper()
	n := a.pending(member, kind)
	a.apply(Command{Op: OpControlAck, Group: "g", Member: member, Notice: n.ID})
	return n
}

// TestNoticeKindsAreTheProtocolNumbers pins NoticeAssign = 1 and
// NoticeRevoke = 2: NOTICE carries the kind as a u8 (PROTOCOL.md, 22).
func TestNoticeKindsAreTheProtocolNumbers(t *testing.T) {
	if NoticeAssign != 1 || NoticeRevoke != 2 {
		t.Fatalf("ASSIGN %d, REVOKE %d: PROTOCOL.md says 1 and 2", NoticeAssign, NoticeRevoke)
	}
}

// TestCloneSharesNothingWithTheOriginal pins Clone's copies of the
// members (and their topics), owners, target, notices and the notices'
// partitions: the model checker branches on clones.
func TestCloneSharesNothingWithTheOriginal(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2)) // a REVOKE of three partitions is pending
	want := a.g.Clone()
	c := a.g.Clone()
	c.Members["x"] = &Member{}
	c.Members["a"].Topics[0] = "changed"
	c.Owners[Partition{Topic: "x"}] = &Owner{Member: "x"}
	c.Target[Partition{Topic: "x"}] = "x"
	for _, n := range c.Notices {
		n.Partitions[0].Epoch = 99
	}
	c.Notices[99] = &Notice{ID: 99}
	for _, g := range []*State{a.g, want} {
		if g.Members["x"] != nil || g.Members["a"].Topics[0] != "t" {
			t.Fatalf("the original's members changed with the clone's: %+v", g.Members)
		}
		if g.Owners[Partition{Topic: "x"}] != nil || g.Target[Partition{Topic: "x"}] != "" {
			t.Fatal("the original's owners or target changed with the clone's")
		}
		if g.Notices[99] != nil || len(g.Notices) != 1 {
			t.Fatalf("the original's notices changed with the clone's: %+v", g.Notices)
		}
		for _, n := range g.Notices {
			if n.Partitions[0].Epoch != 1 {
				t.Fatalf("the original's notice partitions changed with the clone's: %+v", n)
			}
		}
	}
}

// TestLeaveAndFenceAreMembershipChanges pins Apply's
// MembershipEpoch++ for LEAVE and fence (and not for one ignored).
func TestLeaveAndFenceAreMembershipChanges(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.apply(join("b", 2))
	if out := a.apply(Command{Op: OpLeave, Group: "g", Member: "c"}); out != Ignored || a.g.MembershipEpoch != 2 {
		t.Fatalf("leave of no member: %v, membership epoch %d, want Ignored at 2", out, a.g.MembershipEpoch)
	}
	a.apply(Command{Op: OpLeave, Group: "g", Member: "b"})
	if a.g.MembershipEpoch != 3 {
		t.Fatalf("membership epoch %d after a leave, want 3", a.g.MembershipEpoch)
	}
	a.apply(Command{Op: OpFence, Group: "g", Member: "a", Incarnation: a.g.Members["a"].Incarnation})
	if a.g.MembershipEpoch != 4 || len(a.g.Members) != 0 {
		t.Fatalf("membership epoch %d after a fence (members %v), want 4", a.g.MembershipEpoch, a.g.Members)
	}
}

// TestControlAckOfAnotherMembersNoticeChangesNothing pins Apply's
// n.Member != c.Member: a CONTROL_ACK names its member's own notice.
func TestControlAckOfAnotherMembersNoticeChangesNothing(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	rv := a.pending("a", NoticeRevoke)
	if out := a.apply(Command{Op: OpControlAck, Group: "g", Member: "b", Notice: rv.ID}); out != Duplicate {
		t.Fatalf("b's CONTROL_ACK of a's REVOKE: %v, want Duplicate", out)
	}
	if a.g.Notices[rv.ID] == nil || len(a.g.Assigned("a")) != 6 {
		t.Fatalf("b's CONTROL_ACK released a's partitions: notices %v, a holds %v", a.g.Notices, a.g.Assigned("a"))
	}
	a.noNotice("b")
}

// TestRebalanceKeepsWhatStays pins Rebalance's use of the previous target
// (prev = g.Target unless mut.NonSticky): when c joins a and b, each
// gives up one partition and keeps the rest.
func TestRebalanceKeepsWhatStays(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	a.ack("a", NoticeRevoke)
	a.ack("b", NoticeAssign)
	heldA, heldB := a.g.Assigned("a"), a.g.Assigned("b")
	a.apply(join("c", 3))
	for _, m := range []struct {
		id   string
		held []Held
	}{{"a", heldA}, {"b", heldB}} {
		rv := a.pending(m.id, NoticeRevoke)
		if len(rv.Partitions) != 1 {
			t.Fatalf("%s asked to give up %+v, want one partition", m.id, rv.Partitions)
		}
		if got := a.g.Assigned(m.id); !slices.Equal(got, m.held) {
			t.Fatalf("%s holds %+v, held %+v", m.id, got, m.held)
		}
	}
}

// TestSharedGroupHasNoOwnersOrNotices pins Rebalance's
// g.Mode == Shared return: every member may fetch every partition.
func TestSharedGroupHasNoOwnersOrNotices(t *testing.T) {
	a := newApplier(t, Shared)
	a.apply(join("a", 1))
	a.apply(join("b", 2))
	if len(a.g.Owners) != 0 || len(a.g.Notices) != 0 || a.g.AssignmentEpoch != 0 {
		t.Fatalf("shared group: owners %v notices %v assignment epoch %d", a.g.Owners, a.g.Notices, a.g.AssignmentEpoch)
	}
}

// TestSharedGroupAcksOnlyFromMembers pins CheckAck's shared branch: a
// member's ack counts at any epoch, a non-member's is refused.
func TestSharedGroupAcksOnlyFromMembers(t *testing.T) {
	a := newApplier(t, Shared)
	a.apply(join("a", 1))
	p := Partition{Topic: "t", Index: 0}
	if err := a.g.CheckAck(p, "a", 0, 0, Mutations{}); err != nil {
		t.Fatalf("a member's ack in a shared group: %v", err)
	}
	if err := a.g.CheckAck(p, "c", 0, 0, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("a non-member's ack in a shared group: %v", err)
	}
}

// TestARevokingPartitionIsNotRevokedAgain pins Rebalance's
// o.Revoking == 0: a partition whose REVOKE is in flight is not put in
// a second one when the target changes again.
func TestARevokingPartitionIsNotRevokedAgain(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	first := a.pending("a", NoticeRevoke)
	a.apply(join("c", 3)) // a's target share drops from 3 to 2
	var second *Notice
	for _, n := range a.g.PendingNotices() {
		if n.Member == "a" && n.ID != first.ID {
			second = n
		}
	}
	if second == nil || len(second.Partitions) != 1 {
		t.Fatalf("a's second REVOKE: %+v, want one more partition", second)
	}
	for _, h := range second.Partitions {
		if slices.Contains(first.Partitions, h) {
			t.Fatalf("%v revoked twice (#%d and #%d)", h, first.ID, second.ID)
		}
	}
	for _, h := range first.Partitions {
		if o := a.g.Owners[h.Partition]; o.Revoking != first.ID {
			t.Fatalf("%v now revoking by #%d, not #%d", h.Partition, o.Revoking, first.ID)
		}
	}
}

// TestPartitionLogAheadOfTheAssignmentWaits pins holds' fence >
// g.AssignmentEpoch: a node that has applied less of the metadata log
// than the partition's log has recorded answers UNAVAILABLE, not by its
// stale view.
func TestPartitionLogAheadOfTheAssignmentWaits(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	p := a.pending("a", NoticeAssign).Partitions[0].Partition
	if _, err := a.g.CheckPull(p, "a", 1, 2, Mutations{}); !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("pull under a fence from the future: %v", err)
	}
	if err := a.g.CheckAck(p, "a", 1, 2, Mutations{}); !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("ack under a fence from the future: %v", err)
	}
}

// TestPullOfAPartitionWithoutOwnerIsRefused pins holds' o == nil.
func TestPullOfAPartitionWithoutOwnerIsRefused(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	p := Partition{Topic: "t", Index: 9}
	if _, err := a.g.CheckPull(p, "a", 1, 0, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("pull of a partition nobody owns: %v", err)
	}
}

func assignOf(id uint64, epoch uint64, idx ...uint32) *Notice {
	n := &Notice{ID: id, Kind: NoticeAssign, Member: "m"}
	for _, i := range idx {
		n.Partitions = append(n.Partitions, Held{Partition: Partition{Topic: "t", Index: i}, Epoch: epoch})
	}
	return n
}

func revokeOf(id uint64, epoch uint64, idx ...uint32) *Notice {
	n := assignOf(id, epoch, idx...)
	n.Kind = NoticeRevoke
	return n
}

// TestViewAppliesEachAssignOnce pins View.Notice's h.Epoch > v.seen[p]
// for ASSIGN: a resent ASSIGN starts nothing again, one at a newer epoch
// does.
func TestViewAppliesEachAssignOnce(t *testing.T) {
	v := NewView()
	if as, _ := v.Notice(assignOf(1, 1, 0, 1)); len(as) != 2 || v.Epoch(Partition{Topic: "t", Index: 0}) != 1 {
		t.Fatalf("first ASSIGN started %+v", as)
	}
	if as, _ := v.Notice(assignOf(1, 1, 0, 1)); len(as) != 0 {
		t.Fatalf("a resent ASSIGN started %+v again", as)
	}
	if as, _ := v.Notice(assignOf(2, 3, 0)); len(as) != 1 || v.Epoch(Partition{Topic: "t", Index: 0}) != 3 {
		t.Fatalf("an ASSIGN at a newer epoch started %+v (epoch %d)", as, v.Epoch(Partition{Topic: "t", Index: 0}))
	}
}

// TestViewRevokesWhatItHolds pins View.Notice's REVOKE branch: h.Epoch >=
// v.seen[p] (a REVOKE at the held epoch applies), e == h.Epoch (one at
// another epoch releases nothing) and the delete from held.
func TestViewRevokesWhatItHolds(t *testing.T) {
	v := NewView()
	p0, p1 := Partition{Topic: "t", Index: 0}, Partition{Topic: "t", Index: 1}
	v.Notice(assignOf(1, 1, 0, 1))
	if _, rv := v.Notice(revokeOf(2, 2, 1)); len(rv) != 0 || v.Epoch(p1) != 1 {
		t.Fatalf("a REVOKE at epoch 2 of p1 held at 1 released %+v (held at %d)", rv, v.Epoch(p1))
	}
	_, rv := v.Notice(revokeOf(3, 1, 0))
	if len(rv) != 1 || rv[0].Partition != p0 || v.Epoch(p0) != 0 {
		t.Fatalf("REVOKE of p0 at its epoch released %+v, p0 held at %d", rv, v.Epoch(p0))
	}
	if held := v.Held(); len(held) != 1 || held[0].Partition != p1 {
		t.Fatalf("held after the REVOKE: %+v", held)
	}
}

// TestViewLateAssignAfterItsRevokeChangesNothing pins View.Notice's
// v.seen[p] = h.Epoch for REVOKE: the ASSIGN a REVOKE overtook, arriving
// late, starts nothing.
func TestViewLateAssignAfterItsRevokeChangesNothing(t *testing.T) {
	v := NewView()
	p := Partition{Topic: "t", Index: 0}
	if _, rv := v.Notice(revokeOf(2, 1, 0)); len(rv) != 0 {
		t.Fatalf("a REVOKE of what is not held released %+v", rv)
	}
	if as, _ := v.Notice(assignOf(1, 1, 0)); len(as) != 0 || v.Epoch(p) != 0 {
		t.Fatalf("the late ASSIGN started %+v (held at %d)", as, v.Epoch(p))
	}
	// An older REVOKE after a newer ASSIGN releases nothing either.
	v.Notice(assignOf(3, 2, 0))
	if _, rv := v.Notice(revokeOf(2, 1, 0)); len(rv) != 0 || v.Epoch(p) != 2 {
		t.Fatalf("an old REVOKE released %+v (held at %d)", rv, v.Epoch(p))
	}
	// ... nor lowers the newest epoch heard of: the newer ASSIGN, resent,
	// starts nothing again (v.seen[p] is only raised: h.Epoch >= v.seen[p]).
	if as, _ := v.Notice(assignOf(3, 2, 0)); len(as) != 0 {
		t.Fatalf("the resent ASSIGN after an old REVOKE started %+v again", as)
	}
}

// TestViewDropForgetsThePartition pins Drop's delete.
func TestViewDropForgetsThePartition(t *testing.T) {
	v := NewView()
	p := Partition{Topic: "t", Index: 0}
	v.Notice(assignOf(1, 1, 0))
	v.Drop(p)
	if v.Epoch(p) != 0 || len(v.Held()) != 0 {
		t.Fatalf("after Drop: held %+v", v.Held())
	}
	if as, _ := v.Notice(assignOf(1, 1, 0)); len(as) != 0 {
		t.Fatalf("a resent ASSIGN of a dropped partition started %+v", as)
	}
}

// TestPartitionOfAOneLetterTopicParses pins UnmarshalText's i <= 0: only
// an empty topic is refused.
func TestPartitionOfAOneLetterTopicParses(t *testing.T) {
	var p Partition
	if err := p.UnmarshalText([]byte("a/3")); err != nil || p != (Partition{Topic: "a", Index: 3}) {
		t.Fatalf("a/3: %+v, %v", p, err)
	}
	if err := p.UnmarshalText([]byte("/3")); err == nil {
		t.Fatal("/3 parsed")
	}
}

// TestAssignGivesAnOrphanToTheLowestIDOnATie pins Assign's
// len(owned[i]) < len(owned[best]) (not <=): every node computes the
// target itself, so the answer is part of the replicated state.
func TestAssignGivesAnOrphanToTheLowestIDOnATie(t *testing.T) {
	subs := []Subscriber{{ID: "b", Topics: []string{"t"}}, {ID: "a", Topics: []string{"t"}}}
	got := Assign(subs, parts("t", 1), nil)
	if got[Partition{Topic: "t"}] != "a" {
		t.Fatalf("one partition, two idle members: given to %q, want a", got[Partition{Topic: "t"}])
	}
}

// TestAssignEvensOutFromTheMostLoaded pins the even-out loop's
// from >= 0 (a move found for the most loaded member, index 0, is taken)
// and its break at the first eligible partition from the end (the last
// one moves).
func TestAssignEvensOutFromTheMostLoaded(t *testing.T) {
	ps := parts("t", 7)
	prev := map[Partition]string{}
	for i, p := range ps {
		prev[p] = "a"
		if i >= 4 {
			prev[p] = "b"
		}
	}
	subs := []Subscriber{{ID: "a", Topics: []string{"t"}}, {ID: "b", Topics: []string{"t"}}, {ID: "c", Topics: []string{"t"}}}
	got := Assign(subs, ps, prev)
	want := map[Partition]string{ps[0]: "a", ps[1]: "a", ps[2]: "c", ps[3]: "c", ps[4]: "b", ps[5]: "b", ps[6]: "b"}
	if !maps.Equal(got, want) {
		t.Fatalf("a holding 4, b 3, c joining: %v, want %v", got, want)
	}
}

// TestCoordinatorFencesOnlyPastTheSessionTimeout pins Tick's
// now-last > m.SessionTimeoutMs (not >=) and fence's now-at <
// c.RetransmitMs (a fence is proposed again exactly RetransmitMs later).
func TestCoordinatorFencesOnlyPastTheSessionTimeout(t *testing.T) {
	a := newApplier(t, Exclusive) // session timeout 1000 ms
	a.apply(join("a", 1))
	c := NewCoordinator(100)
	c.Heard("g", "a", a.g.Members["a"].Incarnation, 0)
	if eff := c.Tick(1000, []*State{a.g}); len(eff.Propose) != 0 {
		t.Fatalf("fenced at exactly the session timeout: %+v", eff.Propose)
	}
	if eff := c.Tick(1001, []*State{a.g}); len(eff.Propose) != 1 {
		t.Fatalf("not fenced past the session timeout: %+v", eff.Propose)
	}
	if eff := c.Tick(1101, []*State{a.g}); len(eff.Propose) != 1 {
		t.Fatalf("fence not proposed again after RetransmitMs: %+v", eff.Propose)
	}
}

// TestCoordinatorDoesNotFenceASlowAssignAnswer pins Tick's
// n.Kind == NoticeRevoke: only a REVOKE has a rebalance timeout; a
// member that keeps heartbeating but never acks an ASSIGN is resent it.
func TestCoordinatorDoesNotFenceASlowAssignAnswer(t *testing.T) {
	a := newApplier(t, Exclusive) // rebalance timeout 1000 ms
	a.apply(join("a", 1))
	inc := a.g.Members["a"].Incarnation
	c := NewCoordinator(100)
	for now := int64(0); now <= 3000; now += 100 {
		c.Heard("g", "a", inc, now)
		if eff := c.Tick(now, []*State{a.g}); len(eff.Propose) != 0 {
			t.Fatalf("fenced at %d ms for not acking an ASSIGN: %+v", now, eff.Propose)
		}
	}
}

// TestCoordinatorCountsTheRebalanceTimeoutFromTheFirstSend pins Tick's
// now-s.first: a coordinator whose clock does not start at 0 fences a
// slow revoker one rebalance timeout after the REVOKE's first send, not
// before.
func TestCoordinatorCountsTheRebalanceTimeoutFromTheFirstSend(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	c := NewCoordinator(100)
	var fencedAt int64 = -1
	for now := int64(50_000); now <= 51_500 && fencedAt < 0; now += 100 {
		for _, id := range []string{"a", "b"} {
			c.Heard("g", id, a.g.Members[id].Incarnation, now)
		}
		if eff := c.Tick(now, []*State{a.g}); len(eff.Propose) != 0 {
			fencedAt = now
		}
	}
	if fencedAt != 51_100 {
		t.Fatalf("slow revoker fenced at %d ms, want 51100 (REVOKE first sent at 50000, timeout 1000)", fencedAt)
	}
}

// TestCoordinatorResendsOncePerRetransmit pins Tick's s.last = now: after
// a resend the next one waits RetransmitMs again.
func TestCoordinatorResendsOncePerRetransmit(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	c := NewCoordinator(100)
	var sentAt []int64
	for now := int64(0); now <= 250; now += 10 {
		c.Heard("g", "a", a.g.Members["a"].Incarnation, now)
		if eff := c.Tick(now, []*State{a.g}); len(eff.Send) != 0 {
			sentAt = append(sentAt, now)
		}
	}
	if !slices.Equal(sentAt, []int64{0, 100, 200}) {
		t.Fatalf("ASSIGN sent at %v ms, want 0, 100, 200", sentAt)
	}
}

// TestCoordinatorDueTouchesOnlyItsGroup pins Due's k.group == group.
func TestCoordinatorDueTouchesOnlyItsGroup(t *testing.T) {
	g := newApplier(t, Exclusive)
	g.apply(join("a", 1))
	h := newApplier(t, Exclusive)
	h.g.Name = "h"
	h.apply(join("a", 1))
	c := NewCoordinator(100)
	if eff := c.Tick(0, []*State{g.g, h.g}); len(eff.Send) != 2 {
		t.Fatalf("first tick sent %+v", eff.Send)
	}
	c.Due("g")
	eff := c.Tick(10, []*State{g.g, h.g})
	if len(eff.Send) != 1 || eff.Send[0].Group != "g" {
		t.Fatalf("after Due(g): sent %+v, want g's notice only", eff.Send)
	}
}

// TestCoordinatorForgetsWhatIsGone pins Tick's three maps.DeleteFunc: the
// soft state of members and notices no longer in any group is dropped (it
// stays bounded), and a group of the same name again — its notice ids
// start over — has its first notice sent at once, its REVOKE timed from
// its own first send.
func TestCoordinatorForgetsWhatIsGone(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	c := NewCoordinator(100)
	c.Tick(0, []*State{a.g})
	c.Tick(1001, []*State{a.g}) // a silent: a fence is proposed
	if len(c.heard) != 1 || len(c.fencedAt) != 1 || len(c.sent) != 1 {
		t.Fatalf("soft state while a is a member: heard %v fenced %v sent %v", c.heard, c.fencedAt, c.sent)
	}
	a.apply(Command{Op: OpFence, Group: "g", Member: "a", Incarnation: a.g.Members["a"].Incarnation})
	c.Tick(1002, []*State{a.g})
	if len(c.heard) != 0 || len(c.fencedAt) != 0 || len(c.sent) != 0 {
		t.Fatalf("soft state after a was fenced: heard %v fenced %v sent %v", c.heard, c.fencedAt, c.sent)
	}
	// The group deleted and joined again: notice #1 again.
	b := newApplier(t, Exclusive)
	b.apply(join("b", 1))
	if b.pending("b", NoticeAssign).ID != 1 {
		t.Fatal("the new group's first notice is not #1: the test proves nothing")
	}
	if eff := c.Tick(1003, []*State{b.g}); len(eff.Send) != 1 {
		t.Fatalf("the new group's notice #1 not sent at once: %+v", eff.Send)
	}
}

// revoking is a group of a (holding all six partitions at epoch 1) and
// b, with a's REVOKE of three of them pending: a valid state to break.
func revoking(t *testing.T) *State {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	return a.g
}

// TestCheckReportsEachBrokenInvariant pins Check's guards: each
// corruption of a valid state is reported, under its invariant.
func TestCheckReportsEachBrokenInvariant(t *testing.T) {
	topics := func(string) int { return 6 }
	var rv *Notice
	for _, n := range revoking(t).PendingNotices() {
		rv = n
	}
	moving := rv.Partitions[0].Partition // revoking from a, target b
	staying := Partition{Topic: "t"}     // a's, target a
	if slices.ContainsFunc(rv.Partitions, func(h Held) bool { return h.Partition == staying }) {
		t.Fatal("t/0 is revoked: the test's choice of partitions is wrong")
	}
	for _, c := range []struct {
		name    string
		breakIt func(g *State)
		want    string
	}{
		{"an owned partition without owner", func(g *State) { delete(g.Owners, staying) }, invariant.EventuallyOwned},
		{"owned by a non-member", func(g *State) { g.Owners[staying].Member = "c"; g.Target[staying] = "c" }, invariant.ExclusiveDelivery},
		{"owned by a member not subscribed", func(g *State) { g.Members["a"].Topics = []string{"u"} }, invariant.ExclusiveDelivery},
		{"held at epoch 0", func(g *State) { g.Owners[staying].Epoch = 0 }, invariant.ExclusiveDelivery},
		{"held at an epoch not reached", func(g *State) { g.Owners[staying].Epoch = g.AssignmentEpoch + 1 }, invariant.ExclusiveDelivery},
		{"held off target without a REVOKE", func(g *State) { g.Target[staying] = "b" }, invariant.EventuallyOwned},
		{"held off target under an ASSIGN", func(g *State) {
			g.Target[staying] = "b"
			g.Owners[staying].Revoking = 99
			g.Notices[99] = &Notice{ID: 99, Kind: NoticeAssign, Member: "a", Incarnation: g.Members["a"].Incarnation}
		}, invariant.EventuallyOwned},
		{"held off target under another member's REVOKE", func(g *State) {
			g.Target[staying] = "b"
			g.Owners[staying].Revoking = 99
			g.Notices[99] = &Notice{ID: 99, Kind: NoticeRevoke, Member: "b", Incarnation: g.Members["b"].Incarnation}
		}, invariant.EventuallyOwned},
		{"a notice for a member gone", func(g *State) {
			g.Notices[99] = &Notice{ID: 99, Kind: NoticeAssign, Member: "c", Incarnation: 1}
		}, invariant.EventuallyOwned},
		{"a notice for an earlier incarnation", func(g *State) { g.Notices[rv.ID].Incarnation-- }, invariant.EventuallyOwned},
		{"a REVOKE of a partition without owner", func(g *State) { delete(g.Owners, moving); delete(g.Target, moving) }, invariant.ExclusiveDelivery},
		{"a REVOKE of another member's partition", func(g *State) {
			g.Notices[rv.ID].Partitions = append(g.Notices[rv.ID].Partitions, Held{Partition: staying, Epoch: 1})
			g.Owners[staying].Revoking = rv.ID
			g.Owners[staying].Member, g.Target[staying] = "b", "b"
		}, invariant.ExclusiveDelivery},
		{"a REVOKE of a partition not revoking by it", func(g *State) {
			g.Notices[rv.ID].Partitions = append(g.Notices[rv.ID].Partitions, Held{Partition: staying, Epoch: 1})
		}, invariant.ExclusiveDelivery},
		{"a REVOKE at another epoch", func(g *State) { g.Notices[rv.ID].Partitions[0].Epoch = 7 }, invariant.ExclusiveDelivery},
	} {
		g := revoking(t)
		if v := g.Check(topics); v != nil {
			t.Fatalf("the valid state: %v", v)
		}
		c.breakIt(g)
		if v := g.Check(topics); v == nil || v.Invariant != c.want {
			t.Errorf("%s: Check = %v, want a %s violation", c.name, v, c.want)
		}
	}
}

// TestCheckRebalanceReportsNeedlessMoves pins CheckRebalance's guards:
// with identical subscriptions (two members or more: topicsOf != nil &&
// !slices.Equal) a target that moves more than MinimalMoves is reported;
// with mixed subscriptions, or no member, nothing is.
func TestCheckRebalanceReportsNeedlessMoves(t *testing.T) {
	topics := func(string) int { return 2 }
	p0, p1 := Partition{Topic: "t", Index: 0}, Partition{Topic: "t", Index: 1}
	state := func(sub map[string]string, target map[Partition]string) *State {
		g := NewState("g", Exclusive)
		for id, topic := range sub {
			g.Members[id] = &Member{Topics: []string{topic}, Incarnation: 1}
		}
		g.Target = target
		return g
	}
	same := map[string]string{"a": "t", "b": "t"}
	before := state(same, map[Partition]string{p0: "a", p1: "b"})
	swapped := state(same, map[Partition]string{p0: "b", p1: "a"})
	if v := swapped.CheckRebalance(before, topics); v == nil || v.Invariant != invariant.MinimalRebalance {
		t.Fatalf("a swap of two balanced members: %v, want a MinimalRebalance violation", v)
	}
	if v := before.Clone().CheckRebalance(before, topics); v != nil {
		t.Fatalf("no move: %v", v)
	}
	// Mixed subscriptions: a swap is not judged by MinimalMoves.
	mixed := map[string]string{"a": "t", "b": "u"}
	if v := state(mixed, map[Partition]string{p0: "b", p1: "a"}).CheckRebalance(state(mixed, map[Partition]string{p0: "a", p1: "b"}), topics); v != nil {
		t.Fatalf("mixed subscriptions: %v", v)
	}
}

// TestDropTopicForgetsOnlyThatTopic pins DropTopic's p.Topic == topic
// (owners and targets of other topics stay, at their epochs) and its
// len(n.Partitions) == 0 (a notice left empty is dropped, one with
// partitions left stays).
func TestDropTopicForgetsOnlyThatTopic(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.topics = map[string]int{"x": 2, "y": 2}
	xy := func(member string, id uint64) Command {
		c := join(member, id)
		c.Topics = []string{"x", "y"}
		return c
	}
	a.apply(xy("a", 1)) // ASSIGN of x0 x1 y0 y1, not acked
	as := a.pending("a", NoticeAssign)
	a.apply(xy("b", 2)) // a's REVOKE of y0 y1
	var rv *Notice
	for _, n := range a.g.PendingNotices() {
		if n.Kind == NoticeRevoke {
			rv = n
		}
	}
	if rv == nil || len(rv.Partitions) != 2 || rv.Partitions[0].Partition.Topic != "y" {
		t.Fatalf("a's REVOKE: %+v, want y0 and y1", rv)
	}
	x0, x1 := Partition{Topic: "x", Index: 0}, Partition{Topic: "x", Index: 1}
	a.g.DropTopic("y")
	for p := range a.g.Target {
		if p.Topic == "y" {
			t.Fatalf("%v still a target", p)
		}
	}
	for _, p := range []Partition{x0, x1} {
		if o := a.g.Owners[p]; o == nil || o.Member != "a" || o.Epoch != 1 || a.g.Target[p] != "a" {
			t.Fatalf("%v after y was dropped: owner %+v, target %q; want a at epoch 1", p, o, a.g.Target[p])
		}
	}
	if len(a.g.Owners) != 2 {
		t.Fatalf("owners after y was dropped: %v", a.g.Owners)
	}
	if a.g.Notices[rv.ID] != nil {
		t.Fatalf("the REVOKE left empty is still pending: %+v", a.g.Notices[rv.ID])
	}
	if n := a.g.Notices[as.ID]; n == nil || len(n.Partitions) != 2 || n.Partitions[0].Partition != x0 || n.Partitions[1].Partition != x1 {
		t.Fatalf("the ASSIGN after y was dropped: %+v, want x0 and x1", n)
	}
}

// TestEpochFencingMutationsTurnTheChecksOff pins the mutation hooks of
// CheckPull (mut.NoEpochFencing) and CheckAck (mut.NoEpochFencing ||
// mut.StaleAckAccepted): each lets a replaced owner through where the
// real check refuses it. The model checker's counterexample for "no
// epoch fencing" is found through either check, so it cannot tell.
func TestEpochFencingMutationsTurnTheChecksOff(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	rv := a.ack("a", NoticeRevoke)
	p := rv.Partitions[0].Partition // now b's, at epoch 2
	if _, err := a.g.CheckPull(p, "a", 1, 2, Mutations{}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("the replaced owner's pull: %v", err)
	}
	if r, err := a.g.CheckPull(p, "a", 1, 2, Mutations{NoEpochFencing: true}); r != PullOK || err != nil {
		t.Fatalf("NoEpochFencing: the replaced owner's pull is %v, %v", r, err)
	}
	for _, mut := range []Mutations{{NoEpochFencing: true}, {StaleAckAccepted: true}} {
		if err := a.g.CheckAck(p, "a", 1, 2, mut); err != nil {
			t.Fatalf("%+v: the replaced owner's ack is refused: %v", mut, err)
		}
	}
}
