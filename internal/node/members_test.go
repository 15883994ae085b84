package node

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

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
	t   *testing.T
	fs  *vfs.MemFS
	now atomic.Int64
	n   *Node
}

func newMemberHarness(t *testing.T) *memberHarness {
	h := &memberHarness{t: t, fs: vfs.NewMem()}
	h.now.Store(1_000_000)
	h.open()
	t.Cleanup(func() { h.n.Close() })
	return h
}

func (h *memberHarness) open() {
	n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.now}}, Manual: true,
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
	h.n.DeleteGroup("g", func(err error) { delErr = err })
	if delErr != nil || len(h.n.GroupStates()) != 0 {
		t.Fatalf("delete: %v, groups %v", delErr, h.n.GroupStates())
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
