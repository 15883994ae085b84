package client

import (
	"slices"
	"testing"

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
