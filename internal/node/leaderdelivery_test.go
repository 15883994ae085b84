package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// ackOn acks entries at node n and returns the answer.
func ackOn(t *testing.T, n *Node, topic, group string, entries ...wire.AckEntry) ([]wire.Code, *wire.Error) {
	t.Helper()
	type res struct {
		codes []wire.Code
		err   *wire.Error
	}
	ch := make(chan res, 1)
	n.Ack(topic, group, entries, func(codes []wire.Code, err *wire.Error) { ch <- res{codes, err} })
	select {
	case r := <-ch:
		return r.codes, r.err
	case <-time.After(waitMax):
		t.Fatal("ack: no reply")
		return nil, nil
	}
}

// leaderOf returns the id of the node that leads partition p of topic and
// took office (eventually: an election may be running).
func (tc *testCluster) leaderOf(topic string, p int) string {
	tc.t.Helper()
	var at string
	eventually(tc.t, fmt.Sprintf("%s/%d has a leader in office", topic, p), func() bool {
		at = tc.inOffice(topic, p)
		return at != ""
	})
	return at
}

// inOffice returns the id of a node that leads partition p of topic and
// took office, or "" (none yet, or a node does not know the topic yet).
func (tc *testCluster) inOffice(topic string, p int) string {
	for id, n := range tc.nodes {
		if t, err := n.topic(topic); err == nil {
			if r := t.partitions[p].replica(); r != nil {
				if _, ok := r.tookOffice(); ok {
					return id
				}
			}
		}
	}
	return ""
}

// groupRecords counts group g's ack-log records in node id's copy of
// partition p's log.
func (tc *testCluster) groupRecords(id, topic string, p int, g string) int {
	tc.t.Helper()
	n := tc.nodes[id]
	count := 0
	for from := uint64(1); ; {
		es, err := n.topics[topic].partitions[p].read(from, 1000, 1<<20)
		if err != nil {
			tc.t.Fatalf("read %s/%d on %s: %v", topic, p, id, err)
		}
		if len(es) == 0 {
			return count
		}
		for _, e := range es {
			if kind, name, ok := groupRecordOf(&e.Record); ok && name == g && kind == acklog.KindAck {
				count++
			}
		}
		from = es[len(es)-1].Seq + 1
	}
}

// TestClusterGroupDeliversAtEachPartitionsLeader: a topic whose partitions
// each live on one node (R=1) is consumed as a group by subscribing at
// every node. Each node delivers only the partitions it leads, acks are
// answered by the node that delivered, kept in each partition's own log,
// and survive that node's restart; an ack at a node that does not lead
// the partition is stale; a node holding none of the topic refuses.
func TestClusterGroupDeliversAtEachPartitionsLeader(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "spread", Partitions: 3, Replicas: 1})
	leaders := make([]string, 3)
	for p := range leaders {
		leaders[p] = tc.leaderOf("spread", p)
	}
	if distinct := slices.Compact(slices.Sorted(slices.Values(leaders))); len(distinct) != 3 {
		t.Fatalf("placement puts the R=1 partitions on %v, want three nodes", leaders)
	}
	const perPartition = 10
	for i := 0; i < 3*perPartition; i++ {
		tc.publishAnywhere(&wire.Pub{Topic: "spread", Partition: int32(i % 3), Value: []byte(fmt.Sprint(i))})
	}
	sinks := map[string]*sink{}
	for id, n := range tc.nodes {
		s := newSink()
		sub, err := n.Subscribe("spread", "g", GroupOptions{AckWaitMs: 60_000}, s)
		if err != nil {
			t.Fatalf("subscribe at %s: %v", id, err)
		}
		sub.AddCredit(100)
		sinks[id] = s
	}
	for p, id := range leaders {
		msgs := sinks[id].waitFor(t, perPartition)
		for _, m := range msgs {
			if m.Partition != uint32(p) {
				t.Fatalf("%s delivered partition %d; it leads only %d", id, m.Partition, p)
			}
		}
		// Acked at another node: that node does not deliver the
		// partition, so the delivery is not its to complete, nor can it
		// tell whether the ack is durable: NOT_LEADER for that entry.
		other := leaders[(p+1)%3]
		codes, werr := ackOn(t, tc.nodes[other], "spread", "g", wire.AckEntry{Partition: msgs[0].Partition, Seq: msgs[0].Seq, DeliveryID: msgs[0].DeliveryID})
		if werr != nil || len(codes) != 1 || codes[0] != wire.CodeNotLeader {
			t.Fatalf("ack of %d/%d at %s (not its leader): %v %v, want NOT_LEADER for the entry", msgs[0].Partition, msgs[0].Seq, other, codes, werr)
		}
		// Acked where delivered: durable in the partition's own log.
		entries := make([]wire.AckEntry, 0, len(msgs)-1)
		for _, m := range msgs[:len(msgs)-1] {
			entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
		}
		codes, werr = ackOn(t, tc.nodes[id], "spread", "g", entries...)
		if werr != nil || len(codes) != len(entries) || slices.ContainsFunc(codes, func(c wire.Code) bool { return c != wire.CodeOK }) {
			t.Fatalf("ack at %s: %v %v", id, codes, werr)
		}
		// (The ACK_OK follows the record's commit; reads see it once the
		// partition applied it.)
		eventually(t, fmt.Sprintf("partition %d's log on %s holds the group's ack record", p, id), func() bool {
			return tc.groupRecords(id, "spread", p, "g") > 0
		})
	}
	for id, s := range sinks {
		if got := s.count(); got != perPartition {
			t.Fatalf("%s delivered %d messages, want %d (its partition's only, once)", id, got, perPartition)
		}
	}

	// A node restarts: it rebuilds the group's cursor of its partition
	// from that partition's log — only the unacked message comes again.
	restarted := leaders[0]
	tc.stop(restarted)
	tc.start(restarted)
	tc.leaderOf("spread", 0)
	s := newSink()
	sub, err := tc.nodes[restarted].Subscribe("spread", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatalf("subscribe at %s after its restart: %v", restarted, err)
	}
	sub.AddCredit(100)
	s.waitFor(t, 1)
	time.Sleep(100 * time.Millisecond) // room for a wrong redelivery to show
	unacked := sinks[restarted].all()[perPartition-1].Seq
	if msgs := s.all(); len(msgs) != 1 || msgs[0].Seq != unacked {
		t.Fatalf("after the restart %s delivered %v, want only the unacked %d", restarted, seqsOf(msgs), unacked)
	}

	// A node that holds no partition of a topic does not serve its groups.
	tc.declare("n1", wire.TopicConfig{Name: "single", Partitions: 1, Replicas: 1})
	holder := tc.leaderOf("single", 0)
	for id, n := range tc.nodes {
		_, err := n.Subscribe("single", "g", GroupOptions{}, newSink())
		if id == holder && err != nil {
			t.Fatalf("subscribe at the holder %s: %v", id, err)
		}
		if we := (*wire.Error)(nil); id != holder && (!errors.As(err, &we) || we.Code != wire.CodeNotLeader) {
			t.Fatalf("subscribe at %s, which holds no partition: %v, want NOT_LEADER", id, err)
		}
	}
}

// TestClusterGroupAcksFailOverWithTheirPartition: R=3; subscriptions at
// every node; the leader delivers, some messages are acked, then the
// leader stops. The new leader rebuilds the group's cursor from the
// partition's log and redelivers exactly the unacked messages.
func TestClusterGroupAcksFailOverWithTheirPartition(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "r3", Partitions: 1, Replicas: 3})
	for i := 0; i < 10; i++ {
		tc.publishAnywhere(&wire.Pub{Topic: "r3", Partition: 0, Value: []byte(fmt.Sprint(i))})
	}
	leader := tc.leaderOf("r3", 0)
	sinks := map[string]*sink{}
	for id, n := range tc.nodes {
		s := newSink()
		sub, err := n.Subscribe("r3", "g", GroupOptions{AckWaitMs: 60_000}, s)
		if err != nil {
			t.Fatalf("subscribe at %s: %v", id, err)
		}
		sub.AddCredit(100)
		sinks[id] = s
	}
	msgs := sinks[leader].waitFor(t, 10)
	acked := map[uint64]bool{}
	var entries []wire.AckEntry
	for _, m := range msgs[:6] {
		entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
		acked[m.Seq] = true
	}
	if codes, werr := ackOn(t, tc.nodes[leader], "r3", "g", entries...); werr != nil || slices.ContainsFunc(codes, func(c wire.Code) bool { return c != wire.CodeOK }) {
		t.Fatalf("ack at the leader: %v %v", codes, werr)
	}
	for id, s := range sinks {
		if id != leader && s.count() != 0 {
			t.Fatalf("follower %s delivered %d messages", id, s.count())
		}
	}
	tc.stop(leader)
	next := tc.leaderOf("r3", 0)
	got := sinks[next].waitFor(t, 4)
	time.Sleep(100 * time.Millisecond)
	got = sinks[next].all()
	var seqs []uint64
	for _, m := range got {
		if acked[m.Seq] {
			t.Fatalf("new leader %s redelivered acked seq %d", next, m.Seq)
		}
		seqs = append(seqs, m.Seq)
	}
	if slices.Sort(seqs); len(slices.Compact(seqs)) != 4 {
		t.Fatalf("new leader %s delivered %v, want the 4 unacked", next, seqs)
	}
	if st, ok := partitionStatus(tc.nodes[next], "r3", 0); !ok || st.Role != replica.Leader {
		t.Fatalf("%s is not the leader", next)
	}
}

func seqsOf(ms []*wire.Msg) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprintf("%d/%d", m.Partition, m.Seq)
	}
	return out
}

// TestClusterGroupPartitionFence: before a partition's leader first
// delivers it to an owner, it records the owner's assignment epoch in the
// partition's log (DeliveryBehindFence); a leader that rebuilds from a log
// whose fence is above its view of the group delivers nothing until its
// view catches up. The same run with Mutations.DeliverBehindFence
// delivers behind the fence: the test would catch the guard's removal.
func TestClusterGroupPartitionFence(t *testing.T) {
	var behindFence atomic.Bool
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Mutations.DeliverBehindFence = behindFence.Load() })
	tc.declare("n1", wire.TopicConfig{Name: "f", Partitions: 1, Replicas: 1})
	holder := tc.leaderOf("f", 0)
	var coord string
	eventually(t, "a coordinator", func() bool {
		for id, n := range tc.nodes {
			if here, _ := n.cluster.Coordinator(); here {
				coord = id
				return true
			}
		}
		return false
	})
	box := &noticeBox{}
	ch := make(chan error, 1)
	var ok *wire.JoinOK
	tc.nodes[coord].JoinGroup(&wire.Join{Group: "g", Member: "a", Topics: []string{"f"}, SessionTimeoutMs: 60_000, JoinID: 1}, box,
		func(o *wire.JoinOK, err error) { ok = o; ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("join: %v", err)
	}
	var assign *wire.Notice
	eventually(t, "a hears its ASSIGN", func() bool {
		for _, n := range box.take() {
			if n.Kind == wire.NoticeAssign {
				assign = n
			}
		}
		return assign != nil
	})
	tc.nodes[coord].GroupRequest(&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: "a", Incarnation: ok.Incarnation}, NoticeID: assign.NoticeID},
		func(_ uint64, err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("CONTROL_ACK: %v", err)
	}
	epoch := assign.Partitions[0].Epoch
	subscribe := func() *sink {
		t.Helper()
		s := newSink()
		var sub *Subscription
		eventually(t, "subscribe at "+holder, func() bool {
			var err error
			sub, err = tc.nodes[holder].Subscribe("f", "g", GroupOptions{Member: "a", Incarnation: ok.Incarnation, AckWaitMs: 60_000}, s)
			return err == nil
		})
		sub.AddCredit(100)
		return s
	}
	s := subscribe()
	tc.publishAnywhere(&wire.Pub{Topic: "f", Partition: 0, Value: []byte("first")})
	s.waitFor(t, 1)
	fences := func() []uint64 {
		var out []uint64
		es, err := tc.nodes[holder].topics["f"].partitions[0].read(1, 1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if kind, name, ok := groupRecordOf(&e.Record); ok && name == "g" && kind == acklog.KindFence {
				out = append(out, binary.BigEndian.Uint64(e.Record.Value))
			}
		}
		return out
	}
	eventually(t, fmt.Sprintf("one fence record, of epoch %d", epoch), func() bool { return slices.Equal(fences(), []uint64{epoch}) })

	// An earlier leader recorded a delivery under an epoch this node's
	// view has not reached: after its restart it must wait.
	store := tc.nodes[holder].topics["f"].partitions[0].replica()
	ch2 := make(chan error, 1)
	store.repl.ProposeFunc(groupRecord(acklog.KindFence, "g", acklog.FenceRecord(epoch+1000)), func(_, _ uint64, err error) { ch2 <- err })
	if err := <-ch2; err != nil {
		t.Fatalf("propose a fence: %v", err)
	}
	for _, mutated := range []bool{false, true} {
		behindFence.Store(mutated)
		tc.stop(holder)
		tc.start(holder)
		tc.leaderOf("f", 0)
		s = subscribe()
		tc.publishAnywhere(&wire.Pub{Topic: "f", Partition: 0, Value: []byte("behind the fence")})
		time.Sleep(300 * time.Millisecond)
		if got := s.count(); !mutated && got != 0 {
			t.Fatalf("a leader whose view (epoch %d) is behind the log's fence (%d) delivered %d messages", epoch, epoch+1000, got)
		} else if mutated && got == 0 {
			t.Fatal("DeliverBehindFence: still nothing delivered — the test does not exercise the fence")
		}
	}
}

// TestJoinRepliesAnswersOnceAfterEveryLog: an ACK naming partitions led
// here waits for the ack log of each: answered once, after the last, with
// the first failure if any.
func TestJoinRepliesAnswersOnceAfterEveryLog(t *testing.T) {
	var got []*wire.Error
	answered := 0
	join := joinReplies(3, func(failed *wire.Error) { answered++; got = append(got, failed) })
	join(nil)
	failed := wire.Errorf(wire.CodeNotLeader, "partition moved")
	join(failed)
	if answered != 0 {
		t.Fatalf("answered after 2 of 3 logs")
	}
	join(wire.Errorf(wire.CodeQuorumLost, "later failure"))
	if answered != 1 || got[0] != failed {
		t.Fatalf("answered %d times with %v, want once with the first failure", answered, got)
	}
	ok := 0
	join = joinReplies(2, func(failed *wire.Error) {
		if failed == nil {
			ok++
		}
	})
	join(nil)
	join(nil)
	if ok != 1 {
		t.Fatalf("two durable logs answered %d times as durable", ok)
	}
}
