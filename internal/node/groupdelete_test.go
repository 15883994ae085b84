package node

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// singleTopicWith opens a Manual single node with topic t (one
// partition) holding n messages.
func singleTopicWith(t *testing.T, n int) *memberHarness {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	for range n {
		h.n.Publish(&wire.Pub{Topic: "t", Value: []byte("m")}, func(_ wire.PubOK, err *wire.Error) {
			if err != nil {
				t.Errorf("publish: %v", err)
			}
		})
	}
	h.n.Step()
	return h
}

// memberSub joins member to group g of topic t on a single node and
// subscribes it with credit; the assignment is acknowledged.
func (h *memberHarness) memberSub(member string, joinID uint64) (*Subscription, *sink) {
	h.t.Helper()
	box := &noticeBox{}
	ok := h.join(member, joinID, box)
	ref := wire.MemberRef{Group: "g", Member: member, Incarnation: ok.Incarnation}
	if err := h.request(&wire.ControlAck{MemberRef: ref, NoticeID: one(h.t, box, wire.NoticeAssign, 1).NoticeID}); err != nil {
		h.t.Fatal(err)
	}
	s := newSink()
	sub, err := h.n.Subscribe("t", "g", GroupOptions{Member: member, Incarnation: ok.Incarnation, AckWaitMs: 60_000}, s)
	if err != nil {
		h.t.Fatal(err)
	}
	sub.AddCredit(100)
	h.n.Step()
	return sub, s
}

// competing subscribes a consumer without a member to group g with
// credit, and steps the node.
func (h *memberHarness) competing() (*Subscription, *sink) {
	h.t.Helper()
	s := newSink()
	sub, err := h.n.Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s)
	if err != nil {
		h.t.Fatal(err)
	}
	sub.AddCredit(100)
	h.n.Step()
	return sub, s
}

// leaveAndDelete makes member leave group g, then deletes it.
func (h *memberHarness) leaveAndDelete(sub *Subscription, member string) {
	h.t.Helper()
	sub.Close()
	h.n.Step()
	if err := h.request(&wire.Leave{MemberRef: wire.MemberRef{Group: "g", Member: member, Incarnation: sub.incarnation}}); err != nil {
		h.t.Fatal(err)
	}
	var delErr error
	h.n.DeleteGroup("g", false, 0, func(err error) { delErr = err })
	if delErr != nil {
		h.t.Fatalf("delete: %v", delErr)
	}
}

// GroupIncarnationStartsEmpty on a single node: a group deleted and
// joined again delivers the topic from its start, every message for the
// first time, though the deleted group had acked most of it, and a late
// ACK of the deleted group's delivery completes none of the new one's
// (DeliveryIDsOutliveTheirGroup); the deleted incarnation's directory is
// gone; a restart keeps the new incarnation's
// acks and brings back none of the old one's. A competing consumer of
// the deleted group is told so.
func TestGroupDeleteStartsItsNameAfresh(t *testing.T) {
	h := singleTopicWith(t, 5)
	sub, s := h.memberSub("a", 1)
	if s.count() != 5 {
		t.Fatalf("first incarnation got %d messages, want 5", s.count())
	}
	ackAllManual(h, s.all()[:4])
	h.leaveAndDelete(sub, "a")
	if files := filesUnder(h.fs, "/data/groups/g"); len(files) > 0 {
		t.Fatalf("the deleted incarnation's files are left: %v", files)
	}

	sub2, s2 := h.memberSub("a", 2)
	got := s2.all()
	if len(got) != 5 {
		t.Fatalf("the group joined again got %d messages, want all 5 (the deleted group's acks are not its)", len(got))
	}
	for _, m := range got {
		if m.DeliveryCount != 1 {
			t.Fatalf("seq %d delivered with count %d in a new incarnation", m.Seq, m.DeliveryCount)
		}
	}
	// DeliveryIDsOutliveTheirGroup: a late ACK of the deleted group's
	// delivery of seq 5 does not complete the new one's delivery of it.
	old := s.all()[4]
	var res []wire.Code
	h.n.Ack("t", "g", []wire.AckEntry{{Partition: old.Partition, Seq: old.Seq, DeliveryID: old.DeliveryID}}, func(r []wire.Code, _ *wire.Error) { res = r })
	h.n.Step()
	if len(res) != 1 || res[0] == wire.CodeOK {
		t.Fatalf("the deleted incarnation's delivery %d of seq %d acked the new incarnation's: %v", old.DeliveryID, old.Seq, res)
	}
	ackAllManual(h, got[:2])
	if len(filesUnder(h.fs, "/data/groups/g@2")) == 0 || len(filesUnder(h.fs, "/data/groups/g")) > 0 {
		t.Fatalf("groups/ holds %v, want the second incarnation's g@2 only", filesUnder(h.fs, "/data/groups"))
	}

	// A restart: the second incarnation resumes from its own acks.
	sub2.Close()
	h.n.Step()
	h.n.Close()
	h.open()
	s3 := newSink()
	sub3, err := h.n.Subscribe("t", "g", GroupOptions{Member: "a", Incarnation: sub2.incarnation, AckWaitMs: 60_000}, s3)
	if err != nil {
		t.Fatal(err)
	}
	sub3.AddCredit(100)
	h.n.Step()
	if seqs := seqsOf(s3.all()); !slices.Equal(seqs, seqsOf(got[2:])) {
		t.Fatalf("after a restart the second incarnation delivered %v, want %v", seqs, seqsOf(got[2:]))
	}
	h.leaveAndDelete(sub3, "a")

	// A competing consumer (no member) of the group's name is the third
	// incarnation's: everything again.
	_, s4 := h.competing()
	if s4.count() != 5 {
		t.Fatalf("a competing consumer of the third incarnation got %d messages, want 5", s4.count())
	}
	// A member joins (the group is in the metadata again: the competing
	// consumer is ended), leaves, and a delete with a member is refused.
	subB, _ := h.memberSub("b", 3)
	var delErr error
	h.n.DeleteGroup("g", false, 0, func(err error) { delErr = err })
	if !errors.Is(delErr, wire.ErrInvalidArgument) {
		t.Fatalf("delete of a group with a member: %v", delErr)
	}
	subB.Close()
	h.n.Step()
	if err := h.request(&wire.Leave{MemberRef: wire.MemberRef{Group: "g", Member: "b", Incarnation: subB.incarnation}}); err != nil {
		t.Fatal(err)
	}
	// Competing consumers attached when the group is deleted are told:
	// one served, one whose subscribe the group has not run yet.
	sub5, s5 := h.competing()
	s6 := newSink()
	sub6, err := h.n.Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s6)
	if err != nil {
		t.Fatal(err)
	}
	h.n.DeleteGroup("g", false, 0, func(err error) { delErr = err })
	if delErr != nil {
		t.Fatalf("delete: %v", delErr)
	}
	for i, sub := range []*Subscription{sub5, sub6} {
		if s := []*sink{s5, s6}[i]; !sub.Ended() || !errors.Is(s.ended, wire.ErrNotFound) {
			t.Fatalf("competing consumer %d of the deleted group: ended %v, %v", i+1, sub.Ended(), s.ended)
		}
	}
}

// A group consumed only without membership is not in the metadata: a
// delete answers NOT_FOUND and changes nothing; with force it deletes the
// group's progress as a member group's delete does — its consumer is
// ended, its files go, and the name starts afresh, also after a restart.
func TestGroupDeleteForceForgetsAGroupWithoutMembers(t *testing.T) {
	h := singleTopicWith(t, 5)
	sub, s := h.competing()
	if s.count() != 5 {
		t.Fatalf("first incarnation got %d messages, want 5", s.count())
	}
	ackAllManual(h, s.all()[:4])
	var delErr error
	h.n.DeleteGroup("g", false, 0, func(err error) { delErr = err })
	if !errors.Is(delErr, wire.ErrNotFound) || sub.Ended() || len(filesUnder(h.fs, "/data/groups/g")) == 0 {
		t.Fatalf("delete without force of a group without members: %v, consumer ended %v, files %v", delErr, sub.Ended(), filesUnder(h.fs, "/data/groups"))
	}
	h.n.DeleteGroup("g", true, 0, func(err error) { delErr = err })
	if delErr != nil {
		t.Fatalf("forced delete: %v", delErr)
	}
	if !sub.Ended() || !errors.Is(s.ended, wire.ErrNotFound) {
		t.Fatalf("the deleted group's consumer: ended %v, %v", sub.Ended(), s.ended)
	}
	if files := filesUnder(h.fs, "/data/groups/g"); len(files) > 0 {
		t.Fatalf("the deleted incarnation's files are left: %v", files)
	}
	sub2, s2 := h.competing()
	if s2.count() != 5 {
		t.Fatalf("the group's next incarnation got %d messages, want all 5", s2.count())
	}
	for _, m := range s2.all() {
		if m.DeliveryCount != 1 {
			t.Fatalf("seq %d delivered with count %d in a new incarnation", m.Seq, m.DeliveryCount)
		}
	}
	ackAllManual(h, s2.all()[:1])
	sub2.Close()
	h.n.Step()
	h.n.Close()
	h.open()
	_, s3 := h.competing()
	if seqs := seqsOf(s3.all()); !slices.Equal(seqs, seqsOf(s2.all()[1:])) {
		t.Fatalf("after a restart the next incarnation delivered %v, want %v", seqs, seqsOf(s2.all()[1:]))
	}
}

// GroupDeleteRetryDeletesOnce on a single node: a forced delete of a
// group consumed without membership, naming the incarnation
// GROUP_INCARNATION told, is asked again once the next incarnation is in
// use and has acked (the first answer was lost): the retry is OK, the
// next incarnation's consumer is not ended, and its acks stand — a
// consumer of it again is delivered only what was not acked. A retry
// naming no incarnation (an old client's) deletes the next incarnation,
// as it always did.
func TestGroupDeleteRetryDeletesOnce(t *testing.T) {
	h := singleTopicWith(t, 5)
	sub, _ := h.competing()
	inc, err := h.n.CoordinatorGroupIncarnation("g")
	if err != nil || inc != 1 {
		t.Fatalf("GROUP_INCARNATION: %d, %v; want 1", inc, err)
	}
	var delErr error
	deleteAs := func(inc uint64) error {
		h.n.DeleteGroup("g", true, inc, func(err error) { delErr = err })
		return delErr
	}
	if err := deleteAs(inc); err != nil || !sub.Ended() {
		t.Fatalf("forced delete: %v, consumer ended %v", err, sub.Ended())
	}
	sub2, s2 := h.competing()
	ackAllManual(h, s2.all()[:2])
	if err := deleteAs(inc); err != nil {
		t.Fatalf("the forced delete asked again: %v", err)
	}
	if sub2.Ended() || h.n.GroupIncarnation("g") != 2 {
		t.Fatalf("the retried delete: next incarnation's consumer ended %v (%v), incarnation %d; want 2 in use", sub2.Ended(), s2.ended, h.n.GroupIncarnation("g"))
	}
	sub2.Close()
	h.n.Step()
	sub3, s3 := h.competing()
	if seqs := seqsOf(s3.all()); !slices.Equal(seqs, seqsOf(s2.all()[2:])) {
		t.Fatalf("after the retried delete the next incarnation delivered %v, want only the unacked %v", seqs, seqsOf(s2.all()[2:]))
	}
	if err := deleteAs(3); !errors.Is(err, wire.ErrNotFound) || sub3.Ended() {
		t.Fatalf("delete of an incarnation not yet created: %v, consumer ended %v; want NOT_FOUND", err, sub3.Ended())
	}
	if err := deleteAs(0); err != nil || !sub3.Ended() || h.n.GroupIncarnation("g") != 3 {
		t.Fatalf("a delete naming no incarnation: %v, consumer ended %v, incarnation %d; want incarnation 2 deleted", err, sub3.Ended(), h.n.GroupIncarnation("g"))
	}
}

// ackAllManual acks msgs on a Manual single node and steps it until the
// acks are durable.
func ackAllManual(h *memberHarness, msgs []*wire.Msg) {
	h.t.Helper()
	var entries []wire.AckEntry
	for _, m := range msgs {
		entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	var res []wire.Code
	var werr *wire.Error
	h.n.Ack("t", "g", entries, func(r []wire.Code, err *wire.Error) { res, werr = r, err })
	h.n.Step()
	if werr != nil || len(res) != len(entries) {
		h.t.Fatalf("ack: %v %v", res, werr)
	}
	for i, c := range res {
		if c != wire.CodeOK {
			h.t.Fatalf("ack of seq %d: %v", entries[i].Seq, c)
		}
	}
}

// joinAt makes member join group g (topic t) at the metadata leader and
// acknowledge its ASSIGN; it returns the member's incarnation.
func (tc *testCluster) joinAt(member string, joinID uint64) uint64 {
	t := tc.t
	t.Helper()
	_, coord := tc.coordinatorOf()
	box := &noticeBox{}
	ch := make(chan error, 1)
	var ok *wire.JoinOK
	coord.JoinGroup(&wire.Join{Group: "g", Member: member, Topics: []string{"t"}, SessionTimeoutMs: 60_000, JoinID: joinID}, box,
		func(o *wire.JoinOK, err error) { ok = o; ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("join %s: %v", member, err)
	}
	var assign *wire.Notice
	eventually(t, member+" hears its ASSIGN", func() bool {
		for _, n := range box.take() {
			if n.Kind == wire.NoticeAssign {
				assign = n
			}
		}
		return assign != nil
	})
	coord.GroupRequest(&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: member, Incarnation: ok.Incarnation}, NoticeID: assign.NoticeID},
		func(_ uint64, err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("CONTROL_ACK: %v", err)
	}
	return ok.Incarnation
}

// subscribeMember subscribes member (incarnation inc) of group g at node
// id, with credit, once that node applied its JOIN.
func (tc *testCluster) subscribeMember(id, member string, inc uint64) (*Subscription, *sink) {
	tc.t.Helper()
	s := newSink()
	var sub *Subscription
	eventually(tc.t, member+" subscribes at "+id, func() bool {
		var err error
		sub, err = tc.nodes[id].Subscribe("t", "g", GroupOptions{Member: member, Incarnation: inc, AckWaitMs: 60_000}, s)
		return err == nil
	})
	sub.AddCredit(1000)
	return sub, s
}

// leaveAndDeleteAt makes member leave group g and deletes the group at
// the metadata leader; every node applies the delete.
func (tc *testCluster) leaveAndDeleteAt(sub *Subscription, member string, inc uint64) {
	t := tc.t
	t.Helper()
	sub.Close()
	_, coord := tc.coordinatorOf()
	ch := make(chan error, 1)
	coord.GroupRequest(&wire.Leave{MemberRef: wire.MemberRef{Group: "g", Member: member, Incarnation: inc}}, func(_ uint64, err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("leave: %v", err)
	}
	coord.DeleteGroup("g", false, 0, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("delete: %v", err)
	}
	for id, n := range tc.nodes {
		eventually(t, id+" applies the delete", func() bool { return n.groupKey("g") == "g@2" })
	}
}

// GroupIncarnationStartsEmpty in a cluster: a group deleted and joined
// again is delivered every message from the partition's start, each for
// the first time, though the deleted group acked half of them; a late
// ACK of the deleted group's delivery completes none of the new one's
// (DeliveryIDsOutliveTheirGroup); its records are its own (g@2), and a new leader of the partition rebuilds
// the new incarnation from them, not the old one's.
func TestClusterGroupDeleteStartsItsNameAfresh(t *testing.T) {
	tc := carryTopic(t, 0)
	leader := tc.leaderOf("t", 0)
	seqs := tc.publishN(20)
	incA := tc.joinAt("a", 1)
	subA, sa := tc.subscribeMember(leader, "a", incA)
	ackAll(t, tc.nodes[leader], sa.waitFor(t, 20)[:10])
	settings := "/" + leader + "/groups/g/t/settings.json"
	if len(readAll(t, tc.fs, settings)) == 0 {
		t.Fatalf("no %s before the delete (the test is off)", settings)
	}
	tc.leaveAndDeleteAt(subA, "a", incA)
	for id := range tc.nodes {
		eventually(t, id+" removes the deleted incarnation's files", func() bool { return len(filesUnder(tc.fs, "/"+id+"/groups/g")) == 0 })
	}

	incB := tc.joinAt("b", 2)
	subB, sb := tc.subscribeMember(leader, "b", incB)
	got := sb.waitFor(t, 20)
	if !slices.Equal(seqsOf(got), seqsOfInts(seqs)) {
		t.Fatalf("the group joined again got %v, want every message %v", seqsOf(got), seqs)
	}
	for _, m := range got {
		if m.DeliveryCount != 1 {
			t.Fatalf("seq %d delivered with count %d in a new incarnation", m.Seq, m.DeliveryCount)
		}
	}
	old := sa.all()[15] // not acked by the deleted incarnation
	if codes, _ := ackOn(t, tc.nodes[leader], "t", "g", wire.AckEntry{Partition: 0, Seq: old.Seq, DeliveryID: old.DeliveryID}); len(codes) != 1 || codes[0] == wire.CodeOK {
		t.Fatalf("the deleted incarnation's delivery %d of seq %d acked the new incarnation's: %v", old.DeliveryID, old.Seq, codes)
	}
	tc.secondIncarnationFailsOver(leader, subB, got, seqs, "b", incB)
	// The old leader comes back with the deleted incarnation's files put
	// back on disk (as if it stopped before removing them): its start
	// removes them.
	writeFile(t, tc.fs, settings, []byte("stale"))
	tc.start(leader)
	if files := filesUnder(tc.fs, "/"+leader+"/groups/g"); len(files) > 0 {
		t.Fatalf("%s did not remove the deleted incarnation's files at start: %v", leader, files)
	}
}

// A forced delete in a cluster of a group consumed without membership:
// the coordinator never heard of the group, yet every node carries the
// delete out — the consumer at the leader is ended, every node removes
// the group's files — and the name's next incarnation gets every message
// again, also from a new leader after a failover.
func TestClusterGroupDeleteForce(t *testing.T) {
	tc := carryTopic(t, 0)
	leader := tc.leaderOf("t", 0)
	seqs := tc.publishN(20)
	subA, sa := tc.subscribeMember(leader, "", 0)
	ackAll(t, tc.nodes[leader], sa.waitFor(t, 20)[:10])
	eventually(t, "the group's ack record", func() bool { return len(tc.groupRecordsOf(leader, "t", "g", acklog.KindAck)) > 0 })
	_, coord := tc.coordinatorOf()
	ch := make(chan error, 1)
	coord.DeleteGroup("g", false, 0, func(err error) { ch <- err })
	if err := <-ch; !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("delete without force of a group without members: %v, want NOT_FOUND", err)
	}
	inc, err := coord.CoordinatorGroupIncarnation("g")
	if err != nil || inc != 1 {
		t.Fatalf("GROUP_INCARNATION at the coordinator: %d, %v; want 1", inc, err)
	}
	forcedDelete := func() error {
		coord.DeleteGroup("g", true, inc, func(err error) { ch <- err })
		return <-ch
	}
	if err := forcedDelete(); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	for id, n := range tc.nodes {
		eventually(t, id+" applies the delete and removes the group's files", func() bool {
			return n.groupKey("g") == "g@2" && len(filesUnder(tc.fs, "/"+id+"/groups/g")) == 0
		})
	}
	eventually(t, "the deleted group's consumer is ended", subA.Ended)
	if !errors.Is(sa.ended, wire.ErrNotFound) {
		t.Fatalf("the deleted group's consumer ended with %v, want NOT_FOUND", sa.ended)
	}
	subB, sb := tc.subscribeMember(leader, "", 0)
	got := sb.waitFor(t, 20)
	if !slices.Equal(seqsOf(got), seqsOfInts(seqs)) {
		t.Fatalf("the next incarnation got %v, want every message %v", seqsOf(got), seqs)
	}
	// GroupDeleteRetryDeletesOnce: the same delete asked again (its
	// answer lost) is OK and leaves the next incarnation in use alone.
	if err := forcedDelete(); err != nil {
		t.Fatalf("the forced delete asked again: %v", err)
	}
	for id, n := range tc.nodes {
		if k := n.groupKey("g"); k != "g@2" {
			t.Fatalf("%s: after the retried delete group g is %s, want g@2", id, k)
		}
	}
	tc.secondIncarnationFailsOver(leader, subB, got, seqs, "", 0)
}

// secondIncarnationFailsOver acks the first 5 of got (the 20 messages
// seqs, delivered to group g@2 by leader on sub), stops leader, and
// checks that the partition's new leader rebuilds g@2 from its own
// records: member (incarnation inc; "" for none) is delivered the 15 it
// did not ack, and nothing else.
func (tc *testCluster) secondIncarnationFailsOver(leader string, sub *Subscription, got []*wire.Msg, seqs []uint64, member string, inc uint64) {
	t := tc.t
	t.Helper()
	ackAll(t, tc.nodes[leader], got[:5])
	// (ACK_OK follows the record's commit; this node's reads see it once
	// its partition loop applied it.)
	eventually(t, "the second incarnation's ack record of its own key", func() bool {
		return len(tc.groupRecordsOf(leader, "t", "g@2", acklog.KindAck)) > 0
	})
	sub.Close()
	tc.stop(leader)
	next := tc.leaderOf("t", 0)
	_, sc := tc.subscribeMember(next, member, inc)
	sc.waitFor(t, 15)
	time.Sleep(100 * time.Millisecond) // room for a wrong redelivery to show
	if got := seqsOf(sc.all()); !slices.Equal(got, seqsOfInts(seqs[5:])) {
		t.Fatalf("after a failover the second incarnation delivered %v, want %v", got, seqs[5:])
	}
}

// seqsOfInts names seqs of partition 0 as seqsOf does.
func seqsOfInts(seqs []uint64) []string {
	out := make([]string, len(seqs))
	for i, seq := range seqs {
		out[i] = fmt.Sprintf("0/%d", seq)
	}
	return out
}

// DeletedGroupPinsNothing: a group that acked, checkpointed and was
// deleted leaves its records in the log, but no replica keeps the log
// for them — retention compacts past its checkpoint on every node, one
// restarted after the delete too, with no carry of it — and no replica's
// needs name it.
func TestClusterDeletedGroupPinsNothing(t *testing.T) {
	tc := carryTopic(t, 2000)
	leader := tc.leaderOf("t", 0)
	tc.publishN(50)
	inc := tc.joinAt("a", 1)
	sub, s := tc.subscribeMember(leader, "a", inc)
	ackAll(t, tc.nodes[leader], s.waitFor(t, 50))
	var cp uint64
	eventually(t, "the group's quiet checkpoint", func() bool {
		if cps := tc.groupRecordsOf(leader, "t", "g", acklog.KindCheckpoint); len(cps) > 0 {
			cp = cps[0].Seq
		}
		return cp > 0
	})
	tc.leaveAndDeleteAt(sub, "a", inc)
	// A follower restarted after the delete re-applies its log (or a
	// dedup snapshot) holding the group's records: it knows them gone.
	for id := range tc.nodes {
		if id != leader {
			tc.stop(id)
			tc.start(id)
			break
		}
	}
	tc.publishN(100)
	for id, n := range tc.nodes {
		eventually(t, id+" compacts past the deleted group's checkpoint", func() bool { return tc.startSeqOf(id, "t") > cp })
		if from := n.topics["t"].partitions[0].replica().groupsFrom.Load(); from != nil {
			if _, ok := from.from["g"]; ok {
				t.Fatalf("%s: the deleted group still needs the log from %d", id, from.from["g"])
			}
		}
	}
	if c := tc.groupCarries("t"); c != 0 {
		t.Fatalf("%v carries of a deleted group", c)
	}
}

// A node whose metadata applied a group's delete before it carried it out
// (the cluster applies, then tells the node; or a crash in between): a
// subscription of the next incarnation gets a runner of its own, not the
// deleted one's, and the next start removes the deleted incarnation's
// files.
func TestGroupDeleteAppliedNotCarriedOut(t *testing.T) {
	h := singleTopicWith(t, 3)
	sub, s := h.memberSub("a", 1)
	ackAllManual(h, s.all())
	sub.Close()
	h.n.Step()
	if err := h.request(&wire.Leave{MemberRef: wire.MemberRef{Group: "g", Member: "a", Incarnation: sub.incarnation}}); err != nil {
		t.Fatal(err)
	}
	// Only the metadata: what DeleteGroup does before groupDeleted.
	if err := h.n.members.proposeLocal(cluster.DecideGroupDelete("g", false, 0)); err != nil {
		t.Fatal(err)
	}
	_, s2 := h.memberSub("b", 2)
	if s2.count() != 3 {
		t.Fatalf("the next incarnation got %d messages, want all 3", s2.count())
	}
	if len(filesUnder(h.fs, "/data/groups/g")) == 0 {
		t.Fatal("the deleted incarnation's files went without a restart (the test is off)")
	}
	h.n.Close()
	h.open()
	if files := filesUnder(h.fs, "/data/groups/g"); len(files) > 0 {
		t.Fatalf("a start left the deleted incarnation's files: %v", files)
	}
	if len(filesUnder(h.fs, "/data/groups/g@2")) == 0 {
		t.Fatal("a start removed the live incarnation's files")
	}
}

// A group's dead-letter identity is its incarnation's: the next
// incarnation dead-letters a message the deleted one dead-lettered too,
// instead of the copy being taken for a duplicate of the old one's and
// dropped while the group counts it done.
func TestGroupDeleteDeadLettersAnew(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	h.n.Publish(&wire.Pub{Topic: "t", Value: []byte("poison")}, func(_ wire.PubOK, err *wire.Error) {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	dlq := dlqTopicName("g", "t")
	for i, member := range []string{"a", "b"} {
		box := &noticeBox{}
		ok := h.join(member, uint64(i+1), box)
		ref := wire.MemberRef{Group: "g", Member: member, Incarnation: ok.Incarnation}
		if err := h.request(&wire.ControlAck{MemberRef: ref, NoticeID: one(t, box, wire.NoticeAssign, 1).NoticeID}); err != nil {
			t.Fatal(err)
		}
		s := newSink()
		sub, err := h.n.Subscribe("t", "g", GroupOptions{Member: member, Incarnation: ok.Incarnation, AckWaitMs: 1000, MaxDeliver: 1}, s)
		if err != nil {
			t.Fatal(err)
		}
		sub.AddCredit(10)
		h.n.Step()
		if s.count() != 1 {
			t.Fatalf("incarnation %d: %d deliveries, want 1", i+1, s.count())
		}
		for range 3 {
			h.advance(1001) // the ack wait passes: dead, copied
		}
		if got := len(deadLetters(t, h.n, dlq, 1)); got != i+1 {
			t.Fatalf("incarnation %d: %d dead letters of seq 1, want %d", i+1, got, i+1)
		}
		h.leaveAndDelete(sub, member)
	}
}

// A groups.json removed by a repair takes the deleted incarnations with
// it; the next start learns them from the group directories: the
// group's live incarnation (g@2) keeps its acks, and the name does not
// fall back to incarnation 1's key.
func TestGroupIncarnationSurvivesAGroupsReset(t *testing.T) {
	h := singleTopicWith(t, 4)
	sub, _ := h.memberSub("a", 1)
	h.leaveAndDelete(sub, "a")
	sub2, s2 := h.memberSub("b", 2)
	ackAllManual(h, s2.all()[:3])
	sub2.Close()
	h.n.Step()
	h.n.Close()
	for _, f := range []string{groupsFile, groupsFile + storage.CopySuffix} {
		if err := h.fs.Remove("/data/" + f); err != nil {
			t.Fatal(err)
		}
	}
	h.open()
	if k := h.n.groupKey("g"); k != "g@2" {
		t.Fatalf("after groups.json was reset the group's key is %q, want g@2", k)
	}
	_, s3 := h.competing()
	if got := seqsOf(s3.all()); !slices.Equal(got, seqsOf(s2.all()[3:])) {
		t.Fatalf("after groups.json was reset the group delivered %v, want the unacked %v", got, seqsOf(s2.all()[3:]))
	}
}

// GroupDeleteAnswersWhatApplied: a delete decided while a JOIN of the
// group was on its way to the log (decided against a group without
// members) applies as nothing — the member joined first — and must not
// be answered OK: the group lives on at its incarnation, with a member.
func TestClusterGroupDeleteRacingAJoinIsRefused(t *testing.T) {
	tc := carryTopic(t, 0)
	_, coord := tc.coordinatorOf()
	joined := make(chan error, 1)
	deleted := make(chan error, 1)
	coord.JoinGroup(&wire.Join{Group: "g", Member: "a", Topics: []string{"t"}, SessionTimeoutMs: 60_000, JoinID: 1}, &noticeBox{},
		func(_ *wire.JoinOK, err error) { joined <- err })
	coord.DeleteGroup("g", true, 0, func(err error) { deleted <- err })
	if err := <-joined; err != nil {
		t.Fatalf("join: %v", err)
	}
	err := <-deleted
	var inc uint64
	var members int
	coord.members.read(func(st *meta.State) {
		inc = st.GroupIncarnation("g")
		if g := st.Groups["g"]; g != nil {
			members = len(g.Members)
		}
	})
	if members != 1 || inc != 1 {
		t.Fatalf("after the JOIN and the delete: incarnation %d with %d member(s); want the JOIN first (1, 1) — the test is off", inc, members)
	}
	if !errors.Is(err, wire.ErrInvalidArgument) {
		t.Fatalf("the delete that applied as nothing was answered %v; want INVALID_ARGUMENT (the group has a member)", err)
	}
}
