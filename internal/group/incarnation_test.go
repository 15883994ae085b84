package group

import (
	"slices"
	"testing"
)

// Group incarnations. A group without members can be deleted and joined
// again: the metadata drops its State and a JOIN makes a new one
// (meta.State.applyGroup: delete(s.Groups, name), then NewState), so the
// new incarnation numbers its notices from 1 again — the ids its deleted
// predecessor used. The member incarnations (the metadata seq of each
// JOIN) are never reused. These tests drive the kernel across a delete
// that falls between two coordinator ticks.

// deleteGroup is the metadata's group delete: refused with members
// (meta.State.DecideGroupDelete and applyGroup), it drops the State; the
// next JOIN starts a new one. The metadata seq goes on.
func (a *applier) deleteGroup() {
	a.t.Helper()
	if len(a.g.Members) > 0 {
		a.t.Fatalf("delete of a group with members: %v", a.g.Members)
	}
	a.seq++
	a.g = NewState(a.g.Name, a.g.Mode)
}

func sentNotices(eff Effects) []uint64 {
	var ids []uint64
	for _, s := range eff.Send {
		ids = append(ids, s.Notice.ID)
	}
	return ids
}

// TestCoordinatorSendsANewIncarnationsFirstNoticeAtOnce: the coordinator
// sent notice #1 of group g; g is deleted and joined again before its
// next tick, and the new incarnation's ASSIGN is #1 too. It is a notice
// never sent — sent at that next tick and resent RetransmitMs after it,
// not taken for the old #1 and held back until the old one's resend.
func TestCoordinatorSendsANewIncarnationsFirstNoticeAtOnce(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	old := a.pending("a", NoticeAssign)
	c := NewCoordinator(100)
	if got := sentNotices(c.Tick(0, []*State{a.g})); !slices.Equal(got, []uint64{old.ID}) {
		t.Fatalf("first tick sent %v, want [%d]", got, old.ID)
	}

	a.apply(Command{Op: OpLeave, Group: "g", Member: "a"})
	a.deleteGroup()
	a.apply(join("a", 2)) // the same member id: only its incarnation tells the notices apart
	n := a.pending("a", NoticeAssign)
	if n.ID != old.ID || n.Incarnation == old.Incarnation {
		t.Fatalf("the new incarnation's ASSIGN is #%d, not #%d: the test no longer reuses an id", n.ID, old.ID)
	}

	var sentAt []int64
	for _, now := range []int64{10, 60, 100, 110} {
		eff := c.Tick(now, []*State{a.g})
		for _, s := range eff.Send {
			if s.Notice.Incarnation != n.Incarnation {
				t.Fatalf("at %d ms sent %+v, want the new incarnation's", now, s.Notice)
			}
			sentAt = append(sentAt, now)
		}
	}
	if !slices.Equal(sentAt, []int64{10, 110}) {
		t.Fatalf("the new incarnation's ASSIGN #%d sent at %v ms, want [10 110] (first at the tick after the JOIN, again RetransmitMs later)", n.ID, sentAt)
	}
}

// TestCoordinatorTimesANewIncarnationsRevokeFromItsOwnFirstSend: the old
// incarnation's REVOKE #2 went unanswered for 900 ms of a 1000 ms
// rebalance timeout when its members left; the group is deleted and
// joined again before the next tick, and the new incarnation's REVOKE is
// #2 too. Its member gets its own rebalance timeout, counted from this
// REVOKE's first send: it is not fenced at once for the old one's wait.
func TestCoordinatorTimesANewIncarnationsRevokeFromItsOwnFirstSend(t *testing.T) {
	a := newApplier(t, Exclusive) // rebalance timeout 1000 ms
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	old := a.pending("a", NoticeRevoke)
	c := NewCoordinator(100)
	for now := int64(0); now <= 900; now += 100 {
		for _, id := range []string{"a", "b"} {
			c.Heard("g", id, a.g.Members[id].Incarnation, now)
		}
		if eff := c.Tick(now, []*State{a.g}); len(eff.Propose) != 0 {
			t.Fatalf("old incarnation: fenced at %d ms: %+v", now, eff.Propose)
		}
	}

	a.apply(Command{Op: OpLeave, Group: "g", Member: "a"})
	a.apply(Command{Op: OpLeave, Group: "g", Member: "b"})
	a.deleteGroup()
	a.apply(join("a", 3)) // the same member ids: only incarnations tell the notices apart
	a.ack("a", NoticeAssign)
	a.apply(join("b", 4))
	n := a.pending("a", NoticeRevoke)
	if n.ID != old.ID || n.Incarnation == old.Incarnation {
		t.Fatalf("the new incarnation's REVOKE is #%d, not #%d: the test no longer reuses an id", n.ID, old.ID)
	}

	first := int64(950)
	var fencedAt int64 = -1
	for now := first; now <= 2500 && fencedAt < 0; now += 100 {
		for _, id := range []string{"a", "b"} {
			c.Heard("g", id, a.g.Members[id].Incarnation, now)
		}
		eff := c.Tick(now, []*State{a.g})
		if now == first && !slices.Equal(sentNotices(eff), []uint64{n.ID}) {
			t.Errorf("the tick after the JOINs sent %v, want the new REVOKE [%d]", sentNotices(eff), n.ID)
		}
		for _, p := range eff.Propose {
			if p.Member != "a" || p.Incarnation != n.Incarnation {
				t.Fatalf("at %d ms proposed %+v", now, p)
			}
			fencedAt = now
		}
	}
	if fencedAt != 2050 {
		t.Fatalf("the new incarnation's slow revoker fenced at %d ms, want 2050 (its REVOKE first sent at 950, rebalance timeout 1000)", fencedAt)
	}
}

// TestStaleControlAckOfAnEarlierGroupIncarnationIsIgnored: a CONTROL_ACK
// of member a's REVOKE #2, decided while a's first incarnation was in the
// group, applies after a was fenced, the group deleted, and a joined
// again — whose new incarnation has a REVOKE #2 of its own. The ack names
// the incarnation that sent it (the node shell fills it in, GroupRequest):
// it acknowledges nothing of the new incarnation, whose partitions stay
// a's, revoking, until a's new incarnation answers.
func TestStaleControlAckOfAnEarlierGroupIncarnationIsIgnored(t *testing.T) {
	a := newApplier(t, Exclusive)
	a.apply(join("a", 1))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 2))
	old := a.pending("a", NoticeRevoke)
	oldInc := a.g.Members["a"].Incarnation
	stale := Command{Op: OpControlAck, Group: "g", Member: "a", Incarnation: oldInc, Notice: old.ID}

	a.apply(Command{Op: OpFence, Group: "g", Member: "a", Incarnation: oldInc})
	a.apply(Command{Op: OpLeave, Group: "g", Member: "b"})
	a.deleteGroup()
	a.apply(join("a", 3))
	a.ack("a", NoticeAssign)
	a.apply(join("b", 4))
	n := a.pending("a", NoticeRevoke)
	if n.ID != old.ID || n.Incarnation == oldInc {
		t.Fatalf("the new incarnation's REVOKE is #%d of incarnation %d: the test no longer reuses id #%d", n.ID, n.Incarnation, old.ID)
	}
	owners := map[Partition]Owner{}
	for p, o := range a.g.Owners {
		owners[p] = *o
	}

	if out := a.apply(stale); out != Ignored {
		t.Fatalf("a CONTROL_ACK of incarnation %d's notice #%d, applied to incarnation %d's: outcome %d, want Ignored (%d)", oldInc, old.ID, n.Incarnation, out, Ignored)
	}
	a.pending("a", NoticeRevoke)
	a.noNotice("b")
	for p, o := range a.g.Owners {
		if owners[p] != *o {
			t.Fatalf("the stale ack moved %v: %+v, was %+v", p, *o, owners[p])
		}
	}
	if len(a.g.Owners) != len(owners) {
		t.Fatalf("the stale ack changed the owners: %d, were %d", len(a.g.Owners), len(owners))
	}

	// The new incarnation's own answer (as the shell proposes it, naming
	// the incarnation) is the one that counts.
	if out := a.apply(Command{Op: OpControlAck, Group: "g", Member: "a", Incarnation: n.Incarnation, Notice: n.ID}); out != Applied {
		t.Fatalf("the new incarnation's CONTROL_ACK: %v", out)
	}
	a.pending("b", NoticeAssign)
}
