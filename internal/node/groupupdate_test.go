package node

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/wire"
)

// updateGroup runs n.UpdateGroup and waits for its answer.
func updateGroup(t *testing.T, n *Node, u wire.GroupUpdate) (wire.GroupUpdateOK, error) {
	t.Helper()
	type res struct {
		ok  wire.GroupUpdateOK
		err error
	}
	ch := make(chan res, 1)
	n.UpdateGroup(u, func(ok wire.GroupUpdateOK, err error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		t.Fatal("group update: no answer")
		return wire.GroupUpdateOK{}, nil
	}
}

// settingsOn returns the settings in force on n for group on topic
// (GroupSettings), ok false when no runner of it runs there.
func settingsOn(n *Node, group, topic string) (GroupSettingsInfo, bool) {
	for _, s := range n.GroupSettings() {
		if s.Group == group && s.Topic == topic {
			return s, true
		}
	}
	return GroupSettingsInfo{}, false
}

func bothSettings(ackWaitMs, maxDeliver uint32) wire.GroupUpdate {
	return wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "g"}, Set: wire.SetAckWaitMs | wire.SetMaxDeliver, AckWaitMs: ackWaitMs, MaxDeliver: maxDeliver}
}

// GroupSettingsOnEveryNode, on a single node: a group update reaches the
// runner already delivering (a message in flight keeps its deadline; its
// redelivery waits the new ack wait, and the lowered max deliveries sends
// it to the dead letters), a runner the group starts later on another
// topic starts with the update's settings whatever its first PULL asks,
// and both keep them across a restart. A delete of the group drops them:
// its next incarnation starts with what its first PULL asks. With
// GroupSettingsPerNode the later runner takes its PULL's settings.
func TestGroupUpdateHoldsForEveryRunnerOfTheGroup(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("per node=%v", mutation), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) { c.Mutations.GroupSettingsPerNode = mutation }
			h.restart()
			h.declare("a", 1)
			h.declare("b", 1)
			h.mustPublish(&wire.Pub{Topic: "a", Partition: 0, Value: []byte("poison")})
			s := newSink()
			sub, err := h.node.Subscribe("a", "g", GroupOptions{AckWaitMs: 60_000, MaxDeliver: 5}, s)
			if err != nil {
				t.Fatal(err)
			}
			sub.AddCredit(10)
			s.waitFor(t, 1)

			ok, err := updateGroup(t, h.node, bothSettings(1_000, 2))
			if err != nil || ok != (wire.GroupUpdateOK{GroupRef: wire.GroupRef{Group: "g", Incarnation: 1}, AckWaitMs: 1_000, MaxDeliver: 2}) {
				t.Fatalf("update: %+v %v", ok, err)
			}
			h.sync("a", "g")
			if got, _ := settingsOn(h.node, "g", "a"); got.AckWaitMs != 1_000 || got.MaxDeliver != 2 {
				t.Fatalf("the running runner's settings: %+v", got)
			}
			h.nowMs.Add(59_000)
			h.sync("a", "g")
			if n := s.count(); n != 1 {
				t.Fatalf("%d deliveries before the first one's 60 s deadline", n)
			}
			h.nowMs.Add(1_001)
			h.sync("a", "g")
			if m := s.waitFor(t, 2)[1]; m.DeliveryCount != 2 {
				t.Fatalf("redelivery %+v", m)
			}
			h.nowMs.Add(1_001) // the new ack wait: its second and last delivery ends
			dlq := dlqTopicName("g", "a")
			eventually(t, "the message is dead-lettered", func() bool {
				h.sync("a", "g")
				md := h.node.Metadata([]string{dlq})
				return len(md) == 1 && md[0].Partitions[0].CommitSeq == 1
			})
			if n := s.count(); n != 2 {
				t.Fatalf("%d deliveries under a max of 2", n)
			}

			want := GroupSettingsInfo{Group: "g", Topic: "b", AckWaitMs: 1_000, MaxDeliver: 2}
			if mutation {
				want.AckWaitMs, want.MaxDeliver = 30_000, 7
			}
			if _, err := h.node.Subscribe("b", "g", GroupOptions{AckWaitMs: 30_000, MaxDeliver: 7}, newSink()); err != nil {
				t.Fatal(err)
			}
			if got, _ := settingsOn(h.node, "g", "b"); got != want {
				t.Fatalf("a runner started after the update: %+v, want %+v", got, want)
			}
			if mutation {
				return
			}
			h.restart()
			for _, topic := range []string{"a", "b"} {
				if _, err := h.node.Subscribe(topic, "g", GroupOptions{AckWaitMs: 45_000, MaxDeliver: 9}, newSink()); err != nil {
					t.Fatal(err)
				}
				if got, _ := settingsOn(h.node, "g", topic); got.AckWaitMs != 1_000 || got.MaxDeliver != 2 {
					t.Fatalf("after a restart, topic %s: %+v", topic, got)
				}
			}
			// An update that changes nothing is answered with the settings.
			if ok, err := updateGroup(t, h.node, wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "g"}, Set: wire.SetMaxDeliver, MaxDeliver: 2}); err != nil || ok.AckWaitMs != 1_000 {
				t.Fatalf("the same max deliveries again: %+v %v", ok, err)
			}

			h.restart() // no subscription left: the group can go
			done := make(chan error, 1)
			h.node.DeleteGroup("g", true, 0, func(err error) { done <- err })
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, err := h.node.Subscribe("a", "g", GroupOptions{AckWaitMs: 45_000, MaxDeliver: 9}, newSink()); err != nil {
				t.Fatal(err)
			}
			if got, _ := settingsOn(h.node, "g", "a"); got.AckWaitMs != 45_000 || got.MaxDeliver != 9 {
				t.Fatalf("the group's next incarnation: %+v, want its first PULL's", got)
			}
			// An update giving one setting: the other is the default, not
			// what the first PULL asked.
			ok, err = updateGroup(t, h.node, wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "g"}, Set: wire.SetMaxDeliver, MaxDeliver: 4})
			if err != nil || ok != (wire.GroupUpdateOK{GroupRef: wire.GroupRef{Group: "g", Incarnation: 2}, AckWaitMs: 30_000, MaxDeliver: 4}) {
				t.Fatalf("an update of the max deliveries alone: %+v %v", ok, err)
			}
			h.sync("a", "g")
			if got, _ := settingsOn(h.node, "g", "a"); got.AckWaitMs != 30_000 || got.MaxDeliver != 4 {
				t.Fatalf("after an update of the max deliveries alone: %+v, want the default ack wait and 4", got)
			}
		})
	}
}

// A cursor a runner built before a group update — a new partition
// leader's, whose rebuild from the log started before the update — is
// installed with the update's settings (setCursor). Manual mode: the
// test's goroutine owns the runner.
func TestCursorBuiltBeforeAnUpdateTakesItsSettings(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000)
	n := openManual(t, &now)
	if _, err := n.Declare(wire.TopicConfig{Name: "a", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Subscribe("a", "g", GroupOptions{AckWaitMs: 60_000, MaxDeliver: 5}, newSink()); err != nil {
		t.Fatal(err)
	}
	for n.Step() {
	}
	built, err := delivery.NewCursor(delivery.Config{AckWaitMs: 60_000, MaxDeliver: 5, InflightMax: 1}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := updateGroup(t, n, bothSettings(1_000, 2)); err != nil {
		t.Fatal(err)
	}
	for n.Step() {
	}
	groupOf(n, "g", "a").setCursor(0, built)
	if ackWait, maxDeliver := built.Limits(); ackWait != 1_000 || maxDeliver != 2 {
		t.Fatalf("the installed cursor's limits %d ms, %d; want the update's 1000 ms, 2", ackWait, maxDeliver)
	}
}

// GroupSettingsOnEveryNode, in a cluster: a group update, decided by the
// coordinator (NOT_LEADER elsewhere), reaches the runners of the group on
// every node through the metadata log; a runner started after it — on
// another topic, on each node — and a node restarted after it start with
// its settings, whatever their PULLs ask. With GroupSettingsPerNode the
// later runners take their PULL's.
func TestClusterGroupUpdateHoldsOnEveryNode(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("per node=%v", mutation), func(t *testing.T) {
			tc := newTestClusterWith(t, 3, func(c *Config) { c.Mutations.GroupSettingsPerNode = mutation })
			tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 3, Replicas: 3})
			subscribeEverywhere := func(topic string, opts GroupOptions) {
				for id, n := range tc.nodes {
					eventually(t, "subscribe at "+id, func() bool {
						_, err := n.Subscribe(topic, "g", opts, newSink())
						return err == nil
					})
				}
			}
			subscribeEverywhere("t", GroupOptions{AckWaitMs: 60_000, MaxDeliver: 5})
			coordID, coord := tc.coordinatorOf()
			for id, n := range tc.nodes {
				if id == coordID {
					continue
				}
				_, err := updateGroup(t, n, bothSettings(1_000, 2))
				var we *wire.Error
				if !errors.As(err, &we) || we.Code != wire.CodeNotLeader {
					t.Fatalf("update at %s, not the coordinator: %v, want NOT_LEADER", id, err)
				}
			}
			eventually(t, "the coordinator takes the update", func() bool {
				ok, err := updateGroup(t, coord, bothSettings(1_000, 2))
				return err == nil && ok.AckWaitMs == 1_000 && ok.MaxDeliver == 2
			})
			want := func(topic string, ackWaitMs int64, maxDeliver uint32) {
				t.Helper()
				for id, n := range tc.nodes {
					eventually(t, fmt.Sprintf("%s runs group g on %s with %d ms, %d", id, topic, ackWaitMs, maxDeliver), func() bool {
						got, ok := settingsOn(n, "g", topic)
						return ok && got.AckWaitMs == ackWaitMs && got.MaxDeliver == maxDeliver
					})
				}
			}
			want("t", 1_000, 2)
			tc.declare("n1", wire.TopicConfig{Name: "u", Partitions: 1, Replicas: 3})
			subscribeEverywhere("u", GroupOptions{AckWaitMs: 30_000, MaxDeliver: 7})
			if mutation {
				want("u", 30_000, 7)
				return
			}
			want("u", 1_000, 2)
			other := "n1"
			if coordID == other {
				other = "n2"
			}
			tc.stop(other)
			tc.start(other)
			tc.waitKnown("t")
			eventually(t, "subscribe at "+other+" after its restart", func() bool {
				_, err := tc.nodes[other].Subscribe("t", "g", GroupOptions{AckWaitMs: 45_000, MaxDeliver: 9}, newSink())
				return err == nil
			})
			want("t", 1_000, 2)
		})
	}
}
