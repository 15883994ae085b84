package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestMemberGivesUpWhatAFencedIncarnationHeld: a JOIN_OK naming a new
// incarnation (the old one was fenced while the member was away) makes the
// member give up every partition the old one held — OnRevoked, and the
// buffered messages of those partitions are not handed out — while a
// JOIN_OK of the same incarnation (a retried JOIN) changes nothing.
func TestMemberGivesUpWhatAFencedIncarnationHeld(t *testing.T) {
	var revoked [][]int
	co := newConsumer(&Client{opts: Options{RequestTimeout: 1}}, subKey{"t", "g"},
		ConsumerOptions{Credit: 4, OnRevoked: func(ps []int) { revoked = append(revoked, ps) }})
	close(co.closed) // no pump: release does not wait for one
	m := newGroupMember(co, ConsumerOptions{Member: "a"})
	co.member = m
	m.joined(nil, &wire.JoinOK{Incarnation: 7, HeartbeatMs: 1000})
	m.view.Notice(&group.Notice{ID: 1, Kind: group.NoticeAssign, Incarnation: 7,
		Partitions: []group.Held{{Partition: group.Partition{Topic: "t", Index: 0}, Epoch: 1}, {Partition: group.Partition{Topic: "t", Index: 2}, Epoch: 1}}})
	co.queue = []*Message{{Partition: 0, Seq: 1}, {Partition: 1, Seq: 1}, {Partition: 2, Seq: 4}}

	m.joined(nil, &wire.JoinOK{Incarnation: 7, HeartbeatMs: 1000}) // a retried JOIN
	m.releaseLost()
	if len(revoked) != 0 || !m.holds(0) || len(co.queue) != 3 {
		t.Fatalf("a retried JOIN gave up %v; holds 0: %v; queue %d", revoked, m.holds(0), len(co.queue))
	}
	m.joined(nil, &wire.JoinOK{Incarnation: 9, HeartbeatMs: 1000}) // fenced meanwhile
	m.releaseLost()
	if len(revoked) != 1 || !slices.Equal(revoked[0], []int{0, 2}) {
		t.Fatalf("OnRevoked got %v, want [[0 2]]", revoked)
	}
	if m.holds(0) || m.holds(2) || co.pull.Incarnation != 9 {
		t.Fatalf("after the new incarnation: holds 0 %v, 2 %v, pull incarnation %d", m.holds(0), m.holds(2), co.pull.Incarnation)
	}
	if len(co.queue) != 1 || co.queue[0].Partition != 1 {
		t.Fatalf("buffered messages of the given-up partitions kept: %+v", co.queue)
	}
}

// TestRevokeWaitsForHandle: a member holds partitions 3 and 4; a Handle
// callback has a message of partition 3 when a REVOKE of partition 3 is
// applied. The revoke waits for the callback, so the callback's ack is
// among the acks the revoke sends before the CONTROL_ACK (the broker does
// not redeliver the message to the partition's next holder), and OnRevoked
// comes after it. Partition 3's next message, queued before the revoke, is
// not handed to a callback and does not count as delivered; partition 4's
// is. Without the wait the revoke runs while the callback holds the
// message, sends no ack, and the callback's ack comes after the CONTROL_ACK.
func TestRevokeWaitsForHandle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	co := newConsumer(&Client{opts: Options{RequestTimeout: time.Minute}}, subKey{"t", "g"},
		ConsumerOptions{Credit: 4, OnRevoked: func(ps []int) { record(fmt.Sprintf("revoked %v", ps)) }})
	m := newGroupMember(co, ConsumerOptions{Member: "a"})
	co.member = m
	m.joined(nil, &wire.JoinOK{Incarnation: 7, HeartbeatMs: 1000})
	notice := func(id uint64, kind group.NoticeKind, parts ...uint32) *wire.Notice {
		n := &wire.Notice{Group: "g", NoticeID: id, Kind: uint8(kind), Incarnation: 7}
		for _, p := range parts {
			n.Partitions = append(n.Partitions, wire.HeldPartition{Topic: "t", Partition: p, Epoch: 1})
		}
		return n
	}
	if _, ok := m.apply(notice(1, group.NoticeAssign, 3, 4)); !ok || !m.holds(3) || !m.holds(4) {
		t.Fatalf("the ASSIGN of 3 and 4 was not applied")
	}

	// One lane; the test plays its pump's part in a revoke: the acks it
	// has taken in are sent (recorded here), then the revoke goes on.
	l := &lane{co: co, node: "n1", acks: make(chan ackRequest, 4), kick: make(chan struct{}, 1),
		flushReq: make(chan chan struct{}, 1), stopping: make(chan struct{}), done: make(chan struct{})}
	co.lanes[l.node] = l
	go func() {
		for {
			select {
			case done := <-l.flushReq:
				for _, a := range l.takeQueuedAcks(nil) {
					record(fmt.Sprintf("ack sent %d/%d", a.entry.Partition, a.entry.Seq))
				}
				close(done)
			case <-ctx.Done():
				return
			}
		}
	}()
	co.queue = []*Message{
		{Partition: 3, Seq: 1, DeliveryID: 31, consumer: co, lane: l},
		{Partition: 3, Seq: 2, DeliveryID: 32, consumer: co, lane: l},
		{Partition: 4, Seq: 1, DeliveryID: 41, consumer: co, lane: l},
	}
	l.queued = len(co.queue)

	waiting := make(chan struct{})
	var once sync.Once
	co.revokeWaitsForHandler = func() { once.Do(func() { close(waiting) }) }
	revoked := make(chan struct{})
	err := co.Handle(ctx, func(msg *Message) error {
		if msg.Partition != 3 || msg.Seq != 1 {
			t.Fatalf("first handled %d/%d, want 3/1", msg.Partition, msg.Seq)
		}
		go func() {
			if _, ok := m.apply(notice(2, group.NoticeRevoke, 3)); !ok {
				t.Error("the REVOKE of 3 was not applied")
			}
			record("control ack")
			close(revoked)
		}()
		select {
		case <-waiting: // the revoke waits for this callback
		case <-revoked: // the revoke went ahead: the ack below is late
		}
		record("handled 3/1")
		return msg.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	<-revoked
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	want := []string{"handled 3/1", "revoked [3]", "ack sent 3/1", "control ack"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}

	err = co.Handle(ctx, func(msg *Message) error {
		if msg.Partition != 4 {
			t.Errorf("handled %d/%d after partition 3 was revoked, want 4/1", msg.Partition, msg.Seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := co.Stats().Delivered; d != 2 {
		t.Fatalf("%d messages delivered, want 2 (3/1 and 4/1)", d)
	}
}
