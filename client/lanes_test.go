package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// publishTo publishes n messages to partition part, valued "<tag>-<i>".
func publishTo(ctx context.Context, t *testing.T, p *Producer, part, n int, tag string) {
	t.Helper()
	for i := range n {
		if _, err := p.Publish(ctx, Message{Value: fmt.Appendf(nil, "%s-%d", tag, i), TargetPartition: PartitionOf(part)}); err != nil {
			t.Fatal(err)
		}
	}
}

// consumeAcked takes n messages with Next and acks each synchronously; any
// failure fails the test. It returns the messages by record.
func consumeAcked(ctx context.Context, t *testing.T, co *Consumer, n int) map[fakeRef]*Message {
	t.Helper()
	got := map[fakeRef]*Message{}
	for len(got) < n {
		m, err := co.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d of %d: %v", len(got), n, err)
		}
		if err := m.AckSync(ctx); err != nil {
			t.Fatalf("AckSync %d/%d: %v", m.Partition, m.Seq, err)
		}
		got[fakeRef{uint32(m.Partition), m.Seq}] = m
	}
	return got
}

// laneFixture is a fake cluster of nodes where each node delivers the
// partitions it leads (creditLimit > 0: a subscription's unused credit
// above it is a violation), a client dialled at the seed node, and a producer of topic
// "t" with two partitions (p0 at n0, p1 at n1).
func laneFixture(t *testing.T, nodes, seed, creditLimit int) (*fakeServer, *Client, context.Context, *Producer) {
	t.Helper()
	fs := newFakeCluster(t, testToken, nodes)
	fs.perPartition = true
	fs.creditLimit = creditLimit
	c := dialSeeds(t, fs, seed)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return fs, c, ctx, p
}

// subsOf returns the subscriptions of key by node (perPartition fake:
// one per node at most for one client).
func (fs *fakeServer) subsOf(key subKey) map[int]*fakeSub {
	out := map[int]*fakeSub{}
	for s := range fs.sessions {
		if sub := s.subs[key]; sub != nil {
			out[s.node.idx] = sub
		}
	}
	return out
}

// With delivery at each partition's leader, the consumer subscribes at the
// two nodes that lead its topic's partitions (not at its seed, which leads
// none), each delivers its own partitions, each ack goes to the node that
// delivered the message (elsewhere it would be STALE_DELIVERY), and each
// node's credit comes back to it: neither ever holds more than Credit
// unused, and both deliver far more than Credit. MessagesMax bounds the
// credit granted over both nodes together.
func TestConsumerLanesAtEachLeader(t *testing.T) {
	fs, c, ctx, p := laneFixture(t, 3, 2, 4) // n2 leads nothing: p0 at n0, p1 at n1
	// Unequal shares: a lane given the other's credit back would run dry
	// or exceed its window.
	sizes := [2]int{40, 10}
	publishTo(ctx, t, p, 0, sizes[0], "a")
	publishTo(ctx, t, p, 1, sizes[1], "b")

	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := consumeAcked(ctx, t, co, sizes[0]+sizes[1])
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
	key := subKey{"t", "g"}
	fs.mu.Lock()
	for ref := range got {
		if at, want := fs.ackedAt[ref], int(ref.partition); at != want {
			fs.mu.Unlock()
			t.Fatalf("record %v acked at n%d, want n%d, its leader and deliverer", ref, at, want)
		}
	}
	subs := fs.subsOf(key)
	pullsAtSeed := fs.pullsAt[2]
	fs.mu.Unlock()
	for node := range 2 {
		sub := subs[node]
		if sub == nil || sub.sent != sizes[node] {
			t.Fatalf("subscription at n%d = %+v, want one that delivered its %d messages", node, sub, sizes[node])
		}
	}
	if pullsAtSeed != 0 {
		t.Fatalf("%d PULLs at the seed n2, which leads no partition", pullsAtSeed)
	}
	if st := co.Stats(); st.Acked != 50 || st.StaleAcks != 0 || st.FailedAcks != 0 || st.Delivered != 50 {
		t.Fatalf("stats = %+v", st)
	}
	fs.checkViolations()

	// MessagesMax over both lanes: 6 credits in all, not 6 per node.
	co2, err := c.Subscribe(ctx, "t", "h", ConsumerOptions{Credit: 10, MessagesMax: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer co2.Close()
	for range 6 {
		if _, err := co2.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	co2.mu.Lock()
	granted, lanes := co2.grantedLocked(), len(co2.lanes)
	co2.mu.Unlock()
	if granted != 6 || lanes != 2 {
		t.Fatalf("consumer granted %d credits over %d lanes for 6 messages", granted, lanes)
	}
	time.Sleep(100 * time.Millisecond) // time for a stray PULL to arrive
	fs.mu.Lock()
	total := 0
	for _, sub := range fs.subsOf(subKey{"t", "h"}) {
		total += sub.granted
	}
	fs.mu.Unlock()
	if total != 6 {
		t.Fatalf("the nodes were granted %d credits in all, want MessagesMax 6", total)
	}
}

// Today's broker: only the coordinator (partition 0's leader) accepts the
// PULL. The lane at the other leader is refused with NOT_LEADER; it asks
// again every few hundred milliseconds, without failing the consumer,
// which consumes from its coordinator lane. When the coordinator moves to
// that node, the lane's next PULL is accepted and consuming goes on.
func TestConsumerLaneRefusedRetries(t *testing.T) {
	fs := newFakeCluster(t, testToken, 2)
	c := dialSeeds(t, fs, 1)
	ctx := testCtx(t)
	declare(t, c, "t", 2) // p0 at n0 (the coordinator), p1 at n1
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publishRange(ctx, t, p, 0, 20)
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	consumeAcked(ctx, t, co, 20)
	fs.waitFor(5*time.Second, "the lane at n1 refused 3 times", func() bool { return fs.refusedAt[1] >= 3 })
	fs.mu.Lock()
	before := fs.refusedAt[1]
	fs.mu.Unlock()
	time.Sleep(time.Second)
	fs.mu.Lock()
	during := fs.refusedAt[1] - before
	fs.mu.Unlock()
	if during < 1 || during > 6 {
		t.Fatalf("the refused lane asked %d times in a second, want a retry every 200-500 ms", during)
	}

	fs.setLeader("t", 0, 1) // the coordinator moves to n1
	publishRange(ctx, t, p, 20, 40)
	consumeAcked(ctx, t, co, 20)
	key := subKey{"t", "g"}
	fs.waitFor(5*time.Second, "subscription at n1 only", func() bool {
		subs := fs.subsOf(key)
		return len(subs) == 1 && subs[1] != nil
	})
	if st := co.Stats(); st.Acked != 40 || st.FailedAcks != 0 || st.StaleAcks != 0 {
		t.Fatalf("stats = %+v", st)
	}
	fs.checkViolations()
}

// With delivery at each partition's leader: when a node's connections die
// (its partition moved to the other node first), the other lane keeps
// delivering, partitions of the lost node included, and no lane is opened
// at the lost node while no partition names it. Once the metadata names it
// a leader again, the consumer opens a lane there and it delivers.
func TestConsumerLaneLostThenReopened(t *testing.T) {
	fs, c, ctx, p := laneFixture(t, 3, 2, 0) // p0 at n0, p1 at n1
	publishTo(ctx, t, p, 0, 10, "a")
	publishTo(ctx, t, p, 1, 10, "b")
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	consumeAcked(ctx, t, co, 20)

	fs.mu.Lock()
	fs.setLeaderLocked("t", 1, 0)
	fs.dropNodeLocked(1)
	fs.mu.Unlock()
	publishTo(ctx, t, p, 0, 10, "c")
	publishTo(ctx, t, p, 1, 10, "d")
	got := consumeAcked(ctx, t, co, 20)
	fs.mu.Lock()
	for ref := range got {
		if at := fs.ackedAt[ref]; at != 0 {
			fs.mu.Unlock()
			t.Fatalf("record %v acked at n%d while n0 leads both partitions", ref, at)
		}
	}
	fs.mu.Unlock()
	time.Sleep(1500 * time.Millisecond) // a periodic reconcile or more
	co.mu.Lock()
	_, atN1 := co.lanes["n1"]
	co.mu.Unlock()
	fs.mu.Lock()
	subAtN1 := fs.subsOf(subKey{"t", "g"})[1]
	fs.mu.Unlock()
	if atN1 || subAtN1 != nil {
		t.Fatalf("a lane at n1 (%v) or a subscription there (%+v), though n1 leads nothing", atN1, subAtN1)
	}

	fs.setLeader("t", 1, 1)
	publishTo(ctx, t, p, 1, 10, "e")
	got = consumeAcked(ctx, t, co, 10)
	fs.mu.Lock()
	for ref := range got {
		if at := fs.ackedAt[ref]; ref.partition != 1 || at != 1 {
			fs.mu.Unlock()
			t.Fatalf("record %v acked at n%d, want partition 1 at n1", ref, at)
		}
	}
	fs.mu.Unlock()
	if st := co.Stats(); st.Resubscribe == 0 || st.FailedAcks != 0 || st.StaleAcks != 0 {
		t.Fatalf("stats = %+v, want a lane opened again and no failed ack", st)
	}
	fs.checkViolations()
}

// A new member incarnation (setIncarnation, as after a JOIN_OK naming
// one) makes every lane subscribe again under it, and consuming goes on
// at both nodes.
func TestConsumerNewIncarnationResubscribesEveryLane(t *testing.T) {
	fs, c, ctx, p := laneFixture(t, 2, 0, 0)
	publishTo(ctx, t, p, 0, 10, "a")
	publishTo(ctx, t, p, 1, 10, "b")
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	consumeAcked(ctx, t, co, 4)
	key := subKey{"t", "g"}
	// Lanes open on their own: the four may all have come from one node
	// before the other's subscription was made.
	var before map[int]*fakeSub
	fs.waitFor(5*time.Second, "a subscription at each node", func() bool {
		before = fs.subsOf(key)
		return before[0] != nil && before[1] != nil
	})
	co.setIncarnation("m", 7)
	// Buffered messages of the old subscriptions were released by the
	// broker: their acks are stale, and they come again.
	cctx, cancel := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		for {
			m, err := co.Next(cctx)
			if err != nil {
				consumed <- err
				return
			}
			if err := m.AckSync(cctx); err != nil && !errors.Is(err, ErrStaleDelivery) {
				consumed <- err
				return
			}
		}
	}()
	// A new subscription (a new corr) at each node: not the old one's
	// corr reused by a credit return, which would leave the old
	// subscription's credit counted as outstanding.
	fs.waitFor(5*time.Second, "both nodes subscribed anew as incarnation 7", func() bool {
		subs := fs.subsOf(key)
		for node := range 2 {
			if s := subs[node]; s == nil || s.inc != 7 || s.corr == before[node].corr {
				return false
			}
		}
		return true
	})
	publishTo(ctx, t, p, 0, 5, "c")
	publishTo(ctx, t, p, 1, 5, "d")
	fs.waitFor(10*time.Second, "every record acked", func() bool {
		return len(fs.groups[key].acked) == 30
	})
	cancel()
	if err := <-consumed; !errors.Is(err, context.Canceled) {
		t.Fatalf("consuming: %v", err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for ref, at := range fs.ackedAt {
		if at != int(ref.partition) {
			t.Fatalf("record %v acked at n%d", ref, at)
		}
	}
}

// consumeOneOfPartition0 publishes n messages to partition 0 (led by n0)
// of a laneFixture's topic and takes the first from a consumer of group
// "g" with a credit of 1.
func consumeOneOfPartition0(t *testing.T, n int) (*fakeServer, context.Context, *Consumer, *Message) {
	t.Helper()
	fs, c, ctx, p := laneFixture(t, 3, 2, 0)
	co, m := publishAndTakeOne(ctx, t, c, p, 0, n, 1)
	return fs, ctx, co, m
}

// AckFollowsItsPartition: a leader makes an ack durable and loses office
// (or its connection) before it answers. The consumer asks the
// partition's leader again, which answers OK: AckSync succeeds and the
// message does not come again. Before, AckSync failed with NOT_LEADER (or
// the disconnection), documented as "the message is redelivered", and it
// never was: the ack was durable.
func TestAckDurableBeforeItsAnswerWasLostSucceedsAtTheLeader(t *testing.T) {
	for name, fault := range map[string]fakeAction{"NOT_LEADER": fakeAppendThenStepDown, "connection lost": fakeAppendThenCrash} {
		t.Run(name, func(t *testing.T) {
			fs, ctx, co, m := consumeOneOfPartition0(t, 2)
			fs.mu.Lock()
			fs.onAckApplied = func(n int) fakeAction {
				if n == 1 {
					return fault // p0 moves to n1
				}
				return fakeNormal
			}
			fs.mu.Unlock()
			if err := m.AckSync(ctx); err != nil {
				t.Fatalf("AckSync of an ack made durable before its answer was lost: %v", err)
			}
			// The consumer goes on at the new leader: the next message
			// (perhaps first a copy the old leader sent before it moved,
			// now stale), and never the acked one again.
			for {
				next, err := co.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if next.Seq == m.Seq {
					t.Fatalf("seq %d delivered again after its ack was durable", m.Seq)
				}
				err = next.AckSync(ctx)
				if err == nil {
					break
				}
				if !errors.Is(err, ErrStaleDelivery) && !errors.Is(err, ErrDisconnected) {
					t.Fatal(err) // a stale copy's ack, at its leader or on its lost lane
				}
			}
			fs.mu.Lock()
			acks := slices.Clone(fs.acksAt)
			fs.mu.Unlock()
			if acks[0] < 1 || acks[1] < 2 {
				t.Fatalf("ACK frames by node = %v, want one at n0 and two at n1 at least (the first asked again there)", acks)
			}
			if st := co.Stats(); st.Acked != 2 {
				t.Fatalf("stats = %+v, want 2 acked", st)
			}
			fs.checkViolations()
		})
	}
}

// AckFollowsItsPartition, entry by entry: an ACK reaching a node that no
// longer delivers its partition is answered NOT_LEADER for that entry —
// the node cannot tell whether the ack is durable — and the consumer asks
// the partition's leader, whose answer is final: OK when the group has the
// seq done (here a record the old leader committed), STALE_DELIVERY when
// it delivers the message again. Before, that node answered
// STALE_DELIVERY, "redelivered", for an ack that may have been durable.
func TestAckAtANodeNoLongerDeliveringItsPartitionIsAskedAtTheLeader(t *testing.T) {
	for _, done := range []bool{true, false} {
		t.Run(fmt.Sprintf("done=%v", done), func(t *testing.T) {
			fs, ctx, _, m := consumeOneOfPartition0(t, 1)
			fs.mu.Lock()
			if done {
				fs.groups[subKey{"t", "g"}].acked[fakeRef{0, m.Seq}] = true
			}
			fs.setLeaderLocked("t", 0, 1) // n0's lane stays; it no longer delivers p0
			fs.mu.Unlock()
			err := m.AckSync(ctx)
			switch {
			case done && err != nil:
				t.Fatalf("AckSync of a seq its leader has done: %v", err)
			case !done && !errors.Is(err, ErrStaleDelivery):
				t.Fatalf("AckSync of a seq its leader delivers again: %v, want STALE_DELIVERY", err)
			}
			fs.wantAckFrames("one at n0 (NOT_LEADER) and one at n1, the leader", 1, 1, 0)
			fs.checkViolations()
		})
	}
}

// AckFollowsItsPartition through an election: the leader makes an ack
// durable and loses its lease before it answers (NOT_LEADER), and for a
// while the metadata names no leader, or still names it. The ack is asked
// only once another leader is named — any other node, not delivering the
// partition, would answer NOT_LEADER again — and the winner answers OK.
func TestAckDurableBeforeAnElectionSucceedsAtItsWinner(t *testing.T) {
	for name, fault := range map[string]fakeAction{"no leader named": fakeAppendThenElection, "the old leader still named": fakeAppendThenStaleMeta} {
		t.Run(name, func(t *testing.T) {
			fs, ctx, _, m := consumeOneOfPartition0(t, 1)
			fs.mu.Lock()
			fs.onAckApplied = func(n int) fakeAction {
				if n == 1 {
					time.AfterFunc(300*time.Millisecond, func() { // n1 wins, and every node knows
						fs.mu.Lock()
						delete(fs.staleMeta, fakePart{"t", 0})
						fs.mu.Unlock()
						fs.setLeader("t", 0, 1)
					})
					return fault
				}
				return fakeNormal
			}
			fs.mu.Unlock()
			if err := m.AckSync(ctx); err != nil {
				t.Fatalf("AckSync of an ack made durable before an election: %v", err)
			}
			fs.wantAckFrames("one at n0 and one at n1, the winner, none elsewhere", 1, 1, 0)
			fs.checkViolations()
		})
	}
}
