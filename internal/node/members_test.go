package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

type noticeBox struct {
	mu      sync.Mutex
	notices []*wire.Notice
}

func (b *noticeBox) SendNotice(n *wire.Notice) {
	b.mu.Lock()
	b.notices = append(b.notices, n)
	b.mu.Unlock()
}

func (b *noticeBox) take() []*wire.Notice {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.notices
	b.notices = nil
	return out
}

type memberHarness struct {
	t    *testing.T
	fs   *vfs.MemFS
	now  atomic.Int64
	step atomic.Int64 // the wall clock's step (testClock.wallStepMs)
	n    *Node
}

func newMemberHarness(t *testing.T) *memberHarness {
	h := &memberHarness{t: t, fs: vfs.NewMem()}
	h.now.Store(1_000_000)
	h.open()
	t.Cleanup(func() { h.n.Close() })
	return h
}

func (h *memberHarness) open() {
	n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.now, wallStepMs: &h.step}}, Manual: true,
		ScrubBytesPerSecond: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		h.t.Fatal(err)
	}
	h.n = n
}

// advance moves the clock and steps the node.
func (h *memberHarness) advance(ms int64) {
	h.now.Add(ms)
	h.n.Step()
}

func (h *memberHarness) join(member string, joinID uint64, sink NoticeSink) *wire.JoinOK {
	h.t.Helper()
	var ok *wire.JoinOK
	var err error
	h.n.JoinGroup(&wire.Join{Group: "g", Member: member, Topics: []string{"t"}, SessionTimeoutMs: 3000, RebalanceTimeoutMs: 2000, JoinID: joinID},
		sink, func(o *wire.JoinOK, e error) { ok, err = o, e })
	if err != nil || ok == nil {
		h.t.Fatalf("join %s: %v", member, err)
	}
	return ok
}

func (h *memberHarness) request(f wire.Frame) error {
	var err error
	called := false
	h.n.GroupRequest(f, func(_ uint64, e error) { err, called = e, true })
	if !called {
		h.t.Fatalf("%s not answered", f.Type())
	}
	return err
}

// one returns the single notice in b.
func one(t *testing.T, b *noticeBox, kind uint8, parts int) *wire.Notice {
	t.Helper()
	ns := b.take()
	if len(ns) != 1 || ns[0].Kind != kind || len(ns[0].Partitions) != parts {
		t.Fatalf("notices %+v, want one of kind %d with %d partitions", ns, kind, parts)
	}
	return ns[0]
}

// TestGroupMembershipOnASingleNode: JOIN, ASSIGN, a second member and the
// incremental REVOKE-then-ASSIGN, a lost notice resent, heartbeats, a
// silent member fenced after its session timeout, and the state surviving
// a restart (groups.json).
func TestGroupMembershipOnASingleNode(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	a, b := &noticeBox{}, &noticeBox{}
	okA := h.join("a", 1, a)
	assignA := one(t, a, wire.NoticeAssign, 4)
	if err := h.request(&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: "a", Incarnation: okA.Incarnation}, NoticeID: assignA.NoticeID}); err != nil {
		t.Fatal(err)
	}
	// A retried JOIN answers with the same incarnation.
	if again := h.join("a", 1, a); again.Incarnation != okA.Incarnation {
		t.Fatalf("retried JOIN: incarnation %d, was %d", again.Incarnation, okA.Incarnation)
	}
	okB := h.join("b", 2, b)
	revoke := one(t, a, wire.NoticeRevoke, 2)
	if got := b.take(); len(got) != 0 {
		t.Fatalf("b heard %+v before a released its partitions", got)
	}
	// The REVOKE was "lost": it comes again after the retransmit time.
	h.advance(noticeRetransmit.Milliseconds())
	if again := one(t, a, wire.NoticeRevoke, 2); again.NoticeID != revoke.NoticeID {
		t.Fatalf("resent notice %d, want %d", again.NoticeID, revoke.NoticeID)
	}
	refA := wire.MemberRef{Group: "g", Member: "a", Incarnation: okA.Incarnation}
	refB := wire.MemberRef{Group: "g", Member: "b", Incarnation: okB.Incarnation}
	// An answer that names no incarnation is refused, and answers nothing
	// (NoticesOfAnIncarnation: notice ids start again in a group's next life).
	if err := h.request(&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: "a"}, NoticeID: revoke.NoticeID}); !errors.Is(err, wire.ErrInvalidArgument) {
		t.Fatalf("a CONTROL_ACK of incarnation 0: %v, want INVALID_ARGUMENT", err)
	}
	if got := b.take(); len(got) != 0 {
		t.Fatalf("b heard %+v after a CONTROL_ACK of incarnation 0", got)
	}
	if err := h.request(&wire.ControlAck{MemberRef: refA, NoticeID: revoke.NoticeID}); err != nil {
		t.Fatal(err)
	}
	assignB := one(t, b, wire.NoticeAssign, 2)
	if err := h.request(&wire.ControlAck{MemberRef: refB, NoticeID: assignB.NoticeID}); err != nil {
		t.Fatal(err)
	}
	// The state survives a restart.
	h.n.Close()
	h.open()
	gs := h.n.GroupStates()
	if len(gs) != 1 || len(gs[0].Assigned("a")) != 2 || len(gs[0].Assigned("b")) != 2 || len(gs[0].Notices) != 0 {
		t.Fatalf("after restart: %+v", gs)
	}
	// a keeps heartbeating, b is silent: b is fenced after its session
	// timeout and a gets b's partitions back.
	a.take()
	for range 40 {
		if err := h.request(&wire.Heartbeat{MemberRef: refA}); err != nil {
			t.Fatal(err)
		}
		h.advance(100)
	}
	gs = h.n.GroupStates()
	if len(gs[0].Members) != 1 || len(gs[0].Assigned("a")) != 4 {
		t.Fatalf("after b's session timeout: members %v, a holds %v", gs[0].Members, gs[0].Assigned("a"))
	}
	// (a's sink was dropped by the restart: it hears nothing until it
	// joins again; its heartbeats still count.)
	if err := h.request(&wire.Heartbeat{MemberRef: refB}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("a fenced member's heartbeat: %v", err)
	}
	if err := h.request(&wire.Leave{MemberRef: refA}); err != nil {
		t.Fatal(err)
	}
	if err := h.request(&wire.Leave{MemberRef: refA}); err != nil {
		t.Fatalf("a retried LEAVE: %v", err)
	}
	var delErr error
	h.n.DeleteGroup("g", false, 0, func(err error) { delErr = err })
	if delErr != nil || len(h.n.GroupStates()) != 0 {
		t.Fatalf("delete: %v, groups %v", delErr, h.n.GroupStates())
	}
}

// TestMemberSessionsRunOnTheMonotonicClock guards SessionsAreMonotonic:
// the coordinator measures members' sessions on the monotonic clock. A
// step of the wall clock an hour forward fenced every member at the next
// tick (their last heartbeats an hour old); one back kept a silent member
// for the hour. Neither moves a session now: the heartbeating member
// stays, the silent one is fenced after its session timeout.
func TestMemberSessionsRunOnTheMonotonicClock(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	a, b := &noticeBox{}, &noticeBox{}
	refA := wire.MemberRef{Group: "g", Member: "a", Incarnation: h.join("a", 1, a).Incarnation}
	if err := h.request(&wire.ControlAck{MemberRef: refA, NoticeID: one(t, a, wire.NoticeAssign, 2).NoticeID}); err != nil {
		t.Fatal(err)
	}
	h.join("b", 2, b) // silent from now on
	if err := h.request(&wire.ControlAck{MemberRef: refA, NoticeID: one(t, a, wire.NoticeRevoke, 1).NoticeID}); err != nil {
		t.Fatal(err)
	}
	h.step.Store(time.Hour.Milliseconds())
	h.advance(10)
	if err := h.request(&wire.Heartbeat{MemberRef: refA}); err != nil {
		t.Fatalf("a's heartbeat right after a wall-clock step forward: %v; want it still a member", err)
	}
	h.step.Store(-time.Hour.Milliseconds())
	for range 40 { // 4 s: past b's session timeout (3 s)
		if err := h.request(&wire.Heartbeat{MemberRef: refA}); err != nil {
			t.Fatalf("a's heartbeat: %v", err)
		}
		h.advance(100)
	}
	if gs := h.n.GroupStates(); len(gs) != 1 || len(gs[0].Members) != 1 || gs[0].Members["a"] == nil {
		t.Fatalf("members after b's session timeout, the wall clock stepped back: %+v; want a alone", gs[0].Members)
	}
}

func TestGroupJoinRefusesBadInput(t *testing.T) {
	h := newMemberHarness(t)
	for _, j := range []*wire.Join{
		{Group: "__x", Member: "m", Topics: []string{"t"}, JoinID: 1},
		{Group: "g", Member: "", Topics: []string{"t"}, JoinID: 1},
		{Group: "g", Member: "m", JoinID: 1},
		{Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1, SessionTimeoutMs: 5},
		{Group: "g", Member: "m", Topics: []string{"t"}, JoinID: 1, Mode: 9},
	} {
		var err error
		h.n.JoinGroup(j, &noticeBox{}, func(_ *wire.JoinOK, e error) { err = e })
		if !errors.Is(err, wire.ErrInvalidArgument) {
			t.Errorf("%+v: %v", j, err)
		}
	}
	if gs := h.n.GroupStates(); len(gs) != 0 {
		t.Fatalf("refused JOINs created %v", gs)
	}
}

func (s *sink) all() []*wire.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*wire.Msg(nil), s.msgs...)
}

// TestGroupDeliversOnlyWhatAMemberHolds: with JOINed members, each
// subscription gets only its member's partitions; a REVOKEd partition
// gets no new deliveries; once it moves, what its old owner left unacked
// goes to the new owner and the old owner's late ack is stale; a PULL
// without a JOIN is refused while the group has members.
func TestGroupDeliversOnlyWhatAMemberHolds(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	publish := func(round int) {
		for p := range 4 {
			h.n.Publish(&wire.Pub{Topic: "t", Partition: int32(p), Value: fmt.Appendf(nil, "%d/%d", round, p)}, func(_ wire.PubOK, err *wire.Error) {
				if err != nil {
					t.Errorf("publish: %v", err)
				}
			})
		}
		h.n.Step()
	}
	publish(0)
	// A competing consumer of the group from before it had members.
	legacy := newSink()
	legacySub, err := h.n.Subscribe("t", "g", GroupOptions{}, legacy)
	if err != nil {
		t.Fatal(err)
	}
	boxA, boxB := &noticeBox{}, &noticeBox{}
	okA := h.join("a", 1, boxA)
	legacySub.AddCredit(10)
	refA := wire.MemberRef{Group: "g", Member: "a", Incarnation: okA.Incarnation}
	h.request(&wire.ControlAck{MemberRef: refA, NoticeID: one(t, boxA, wire.NoticeAssign, 4).NoticeID})
	if _, err := h.n.Subscribe("t", "g", GroupOptions{}, newSink()); !errors.Is(err, wire.ErrInvalidArgument) {
		t.Fatalf("a PULL without JOIN: %v", err)
	}
	if _, err := h.n.Declare(wire.TopicConfig{Name: "u", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.n.Subscribe("u", "g", GroupOptions{Member: "a", Incarnation: okA.Incarnation}, newSink()); !errors.Is(err, wire.ErrInvalidArgument) {
		t.Fatalf("a member's PULL of a topic it did not join for: %v", err)
	}
	sa := newSink()
	subA, err := h.n.Subscribe("t", "g", GroupOptions{Member: "a", Incarnation: okA.Incarnation}, sa)
	if err != nil {
		t.Fatal(err)
	}
	subA.AddCredit(100)
	h.n.Step()
	if got := sa.count(); got != 4 {
		t.Fatalf("a got %d messages, want 4", got)
	}
	legacy.mu.Lock()
	ended := legacy.ended
	legacy.mu.Unlock()
	if !legacySub.Ended() || ended == nil || ended.Code != wire.CodeInvalidArgument || legacy.count() != 0 {
		t.Fatalf("the competing consumer of before: ended %v (%v), got %d messages", legacySub.Ended(), ended, legacy.count())
	}
	// b joins: a's REVOKE of two partitions; a (unacked) gets nothing new
	// on them.
	okB := h.join("b", 2, boxB)
	refB := wire.MemberRef{Group: "g", Member: "b", Incarnation: okB.Incarnation}
	revoke := one(t, boxA, wire.NoticeRevoke, 2)
	moving := map[uint32]bool{}
	for _, p := range revoke.Partitions {
		moving[p.Partition] = true
	}
	sb := newSink()
	subB, err := h.n.Subscribe("t", "g", GroupOptions{Member: "b", Incarnation: okB.Incarnation}, sb)
	if err != nil {
		t.Fatal(err)
	}
	subB.AddCredit(100)
	publish(1)
	for _, m := range sa.all()[4:] {
		if moving[m.Partition] {
			t.Fatalf("a was delivered %v of a partition being revoked", m)
		}
	}
	if sb.count() != 0 {
		t.Fatalf("b was delivered %d messages before a released its partitions", sb.count())
	}
	// a acks one moving partition's message, not the other's, and answers.
	var kept *wire.Msg
	acked := false
	for _, m := range sa.all()[:4] {
		if !moving[m.Partition] {
			continue
		}
		if !acked {
			h.n.Ack("t", "g", []wire.AckEntry{{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID}}, func([]wire.Code, *wire.Error) {})
			acked = true
		} else {
			kept = m
		}
	}
	h.n.Step()
	h.request(&wire.ControlAck{MemberRef: refA, NoticeID: revoke.NoticeID})
	assignB := one(t, boxB, wire.NoticeAssign, 2)
	h.n.Step()
	if sb.count() != 0 {
		t.Fatalf("b was delivered %d messages before it acknowledged its ASSIGN", sb.count())
	}
	h.request(&wire.ControlAck{MemberRef: refB, NoticeID: assignB.NoticeID})
	h.n.Step()
	got := map[string]bool{}
	for _, m := range sb.all() {
		if !moving[m.Partition] {
			t.Fatalf("b was delivered %v of a partition it does not hold", m)
		}
		got[string(m.Value)] = true
	}
	// b gets a's unacked message of the moved partition and the new ones
	// on its two partitions; not the one a acked.
	if len(got) != 3 || !got[string(kept.Value)] {
		t.Fatalf("b got %v, want a's unacked %s and round 1 of its partitions", got, kept.Value)
	}
	var codes []wire.Code
	h.n.Ack("t", "g", []wire.AckEntry{{Partition: kept.Partition, Seq: kept.Seq, DeliveryID: kept.DeliveryID}}, func(c []wire.Code, _ *wire.Error) { codes = c })
	h.n.Step()
	if len(codes) != 1 || codes[0] != wire.CodeStaleDelivery {
		t.Fatalf("a's late ack of a moved partition: %v", codes)
	}
}

// TestClusterGroupMembershipFollowsTheMetadataLeader: on three nodes, JOIN
// is answered only by the coordinator (the metadata leader; the others
// say NOT_LEADER naming it), every node applies the same assignment, and
// when the coordinator stops, a new one takes over and a member that stays
// silent is fenced by it.
func TestClusterGroupMembershipFollowsTheMetadataLeader(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 4, Replicas: 3})
	coordinator := func() string {
		for id, n := range tc.nodes {
			if here, _ := n.cluster.Coordinator(); here {
				return id
			}
		}
		return ""
	}
	var coord string
	eventually(t, "a coordinator", func() bool { coord = coordinator(); return coord != "" })
	for id, n := range tc.nodes {
		if id == coord {
			continue
		}
		var err error
		n.JoinGroup(&wire.Join{Group: "g", Member: "x", Topics: []string{"t"}, JoinID: 9}, &noticeBox{}, func(_ *wire.JoinOK, e error) { err = e })
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeNotLeader || !strings.Contains(err.Error(), "client-of-"+coord) {
			t.Fatalf("JOIN at %s (not the coordinator %s): %v", id, coord, err)
		}
	}
	join := func(id, member string, joinID uint64, box *noticeBox) *wire.JoinOK {
		t.Helper()
		ch := make(chan error, 1)
		var ok *wire.JoinOK
		tc.nodes[id].JoinGroup(&wire.Join{Group: "g", Member: member, Topics: []string{"t"}, SessionTimeoutMs: 1000, JoinID: joinID}, box,
			func(o *wire.JoinOK, err error) { ok = o; ch <- err })
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("join %s at %s: %v", member, id, err)
			}
		case <-time.After(waitMax):
			t.Fatalf("join %s at %s: no answer", member, id)
		}
		return ok
	}
	boxA, boxB := &noticeBox{}, &noticeBox{}
	okA := join(coord, "a", 1, boxA)
	join(coord, "b", 2, boxB)
	// An incarnation this node has not applied yet (its JOIN committed
	// elsewhere first) is early, not fenced: retry, not STALE_ASSIGNMENT.
	future := wire.MemberRef{Group: "g", Member: "a", Incarnation: okA.Incarnation + 1_000_000}
	var hbErr error
	tc.nodes[coord].GroupRequest(&wire.Heartbeat{MemberRef: future}, func(_ uint64, err error) { hbErr = err })
	if !errors.Is(hbErr, wire.ErrUnavailable) {
		t.Fatalf("a heartbeat from an incarnation not applied yet: %v", hbErr)
	}
	tc.declare(coord, wire.TopicConfig{Name: "t", Partitions: 4, Replicas: 3})
	for id, n := range tc.nodes {
		if err := n.members.mayConsume("g", "t", "a", future.Incarnation); !errors.Is(err, wire.ErrUnavailable) {
			t.Fatalf("%s: a PULL of an incarnation not applied yet: %v", id, err)
		}
	}
	// Every node applies the same assignment: a (which acknowledged
	// nothing) holds all four, a REVOKE pending.
	for id, n := range tc.nodes {
		eventually(t, id+" applies both JOINs", func() bool {
			gs := n.GroupStates()
			return len(gs) == 1 && len(gs[0].Members) == 2 && len(gs[0].Assigned("a")) == 4 && len(gs[0].Notices) == 2 // a's ASSIGN, its REVOKE
		})
	}
	eventually(t, "a hears its REVOKE", func() bool {
		for _, n := range boxA.take() {
			if n.Kind == wire.NoticeRevoke {
				return true
			}
		}
		return false
	})
	// The coordinator stops; a and b never heartbeat the new one: after a
	// session timeout both are fenced there, and the group empties.
	tc.stop(coord)
	var next string
	eventually(t, "a new coordinator", func() bool { next = coordinator(); return next != "" })
	eventually(t, "the new coordinator "+next+" fences the silent members", func() bool {
		gs := tc.nodes[next].GroupStates()
		return len(gs) == 1 && len(gs[0].Members) == 0 && len(gs[0].Owners) == 0
	})
}

// TestSharedGroupMembersCompete: in shared mode members are not assigned
// partitions; they compete — both are delivered messages of the one
// partition — and a PULL of a non-member is still refused.
func TestSharedGroupMembersCompete(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		h.n.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "%d", i)}, func(wire.PubOK, *wire.Error) {})
	}
	h.n.Step()
	var sinks []*sink
	for i, id := range []string{"a", "b"} {
		var ok *wire.JoinOK
		h.n.JoinGroup(&wire.Join{Group: "g", Member: id, Topics: []string{"t"}, Mode: wire.GroupShared, JoinID: uint64(i + 1)}, &noticeBox{},
			func(o *wire.JoinOK, err error) {
				if err != nil {
					t.Fatal(err)
				}
				ok = o
			})
		s := newSink()
		sub, err := h.n.Subscribe("t", "g", GroupOptions{Member: id, Incarnation: ok.Incarnation}, s)
		if err != nil {
			t.Fatal(err)
		}
		sub.AddCredit(6)
		sinks = append(sinks, s)
	}
	h.n.Step()
	for i, s := range sinks {
		if s.count() != 6 {
			t.Fatalf("member %d got %d messages of the one partition, want 6", i, s.count())
		}
	}
	if _, err := h.n.Subscribe("t", "g", GroupOptions{Member: "c", Incarnation: 99}, newSink()); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("a non-member's PULL: %v", err)
	}
	var exclusive error
	h.n.JoinGroup(&wire.Join{Group: "g", Member: "c", Topics: []string{"t"}, JoinID: 3}, &noticeBox{}, func(_ *wire.JoinOK, err error) { exclusive = err })
	if !errors.Is(exclusive, wire.ErrInvalidArgument) {
		t.Fatalf("an exclusive JOIN of a shared group: %v", exclusive)
	}
}

// A due redelivery of a partition whose owner has no credit waits for a
// credit of that owner (or an ownership change), both of which wake the
// group: another member's credit, which cannot take it, does not make the
// group wake every millisecond. The owner's credit brings it at once.
func TestGroupRetryWaitsForItsOwnersCredit(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	boxA, boxB := &noticeBox{}, &noticeBox{}
	okA := h.join("a", 1, boxA)
	refA := wire.MemberRef{Group: "g", Member: "a", Incarnation: okA.Incarnation}
	h.request(&wire.ControlAck{MemberRef: refA, NoticeID: one(t, boxA, wire.NoticeAssign, 2).NoticeID})
	okB := h.join("b", 2, boxB)
	refB := wire.MemberRef{Group: "g", Member: "b", Incarnation: okB.Incarnation}
	revoke := one(t, boxA, wire.NoticeRevoke, 1)
	h.request(&wire.ControlAck{MemberRef: refA, NoticeID: revoke.NoticeID})
	h.request(&wire.ControlAck{MemberRef: refB, NoticeID: one(t, boxB, wire.NoticeAssign, 1).NoticeID})
	kept := 1 - revoke.Partitions[0].Partition // a's partition
	h.n.Publish(&wire.Pub{Topic: "t", Partition: int32(kept), Value: []byte("m")}, func(_ wire.PubOK, err *wire.Error) {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	sa, sb := newSink(), newSink()
	subA, err := h.n.Subscribe("t", "g", GroupOptions{Member: "a", Incarnation: okA.Incarnation, AckWaitMs: 500}, sa)
	if err != nil {
		t.Fatal(err)
	}
	subB, err := h.n.Subscribe("t", "g", GroupOptions{Member: "b", Incarnation: okB.Incarnation, AckWaitMs: 500}, sb)
	if err != nil {
		t.Fatal(err)
	}
	subA.AddCredit(1)
	subB.AddCredit(100)
	h.n.Step()
	if sa.count() != 1 || sb.count() != 0 {
		t.Fatalf("a got %d messages, b %d; want 1 and 0", sa.count(), sb.count())
	}
	h.advance(500) // a's delivery expires: its retry is due, a has no credit, b has
	g := h.n.groups[groupKey{group: "g", topic: "t"}]
	if wait := g.nextWakeMs - h.now.Load(); wait <= 1 {
		t.Fatalf("the group sleeps %d ms with a retry only a's credit can take", wait)
	}
	subA.AddCredit(1)
	h.n.Step()
	if sa.count() != 2 || sb.count() != 0 {
		t.Fatalf("after a's credit: a got %d messages, b %d; want 2 and 0", sa.count(), sb.count())
	}
}
