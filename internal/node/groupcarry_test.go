package node

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// groupRecordsOf returns group g's records of kind in node id's copy of
// partition 0 of topic, from its log's start.
func (tc *testCluster) groupRecordsOf(id, topic, g string, kind acklog.Kind) []storage.Entry {
	tc.t.Helper()
	n := tc.nodes[id]
	p := n.topics[topic].partitions[0]
	var out []storage.Entry
	for from := p.startSeq.Load(); ; {
		es, err := p.read(from, 1000, 1<<20)
		if err != nil {
			tc.t.Fatalf("read %s/0 on %s: %v", topic, id, err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			if k, name, ok := groupRecordOf(&e.Record); ok && name == g && k == kind {
				out = append(out, e)
			}
		}
		from = es[len(es)-1].Seq + 1
	}
}

// startSeqOf is where node id's copy of topic's partition 0 starts.
func (tc *testCluster) startSeqOf(id, topic string) uint64 {
	return tc.nodes[id].Metadata([]string{topic})[0].Partitions[0].StartSeq
}

// groupCarries sums nereus_group_carries_total over the running nodes.
func (tc *testCluster) groupCarries(topic string) float64 {
	tc.t.Helper()
	var total float64
	for _, n := range tc.nodes {
		v, err := n.Metrics().PartitionValue("nereus_group_carries_total", topic, 0)
		if err != nil {
			tc.t.Fatal(err)
		}
		total += max(v, 0)
	}
	return total
}

// carryTopic starts three nodes with 4 KiB segments, whose groups
// checkpoint again once 16 KiB of log follows, and declares topic "t":
// one partition, R3, records kept retentionMs (0: for good).
func carryTopic(t *testing.T, retentionMs int64) *testCluster {
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.RetentionCheckMs = 20
		c.GroupCheckpointSpanBytes = 16 << 10
	})
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3, RetentionMs: retentionMs})
	return tc
}

// publishN publishes n records of about 100 bytes to t and returns their
// seqs.
func (tc *testCluster) publishN(n int) []uint64 {
	var seqs []uint64
	for i := range n {
		_, ok := tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "%04d-%s", i, strings.Repeat("x", 100))})
		seqs = append(seqs, ok.Seq)
	}
	return seqs
}

// ackAll acks msgs at node id and fails unless every one is OK.
func ackAll(t *testing.T, n *Node, msgs []*wire.Msg) {
	t.Helper()
	entries := make([]wire.AckEntry, 0, len(msgs))
	for _, m := range msgs {
		entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	codes, werr := ackOn(t, n, "t", "g", entries...)
	if werr != nil || len(codes) != len(entries) || slices.ContainsFunc(codes, func(c wire.Code) bool { return c != wire.CodeOK }) {
		t.Fatalf("ack: %v %v", codes, werr)
	}
}

// ackedAndCheckpointed publishes n records to t, subscribes group g at
// node id (the partition's leader) with credit for all, acks them, and
// waits for the group's quiet checkpoint: it returns the subscription,
// the records' seqs and the checkpoint's.
func (tc *testCluster) ackedAndCheckpointed(id string, n int) (*sink, *Subscription, []uint64, uint64) {
	t := tc.t
	t.Helper()
	seqs := tc.publishN(n)
	s := newSink()
	sub, err := tc.nodes[id].Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(1000)
	ackAll(t, tc.nodes[id], s.waitFor(t, n))
	var cp uint64
	eventually(t, "the group's quiet checkpoint", func() bool {
		if cps := tc.groupRecordsOf(id, "t", "g", acklog.KindCheckpoint); len(cps) > 0 {
			cp = cps[0].Seq
		}
		return cp > 0
	})
	return s, sub, seqs, cp
}

// A group whose runner stays on the partition's leader but acks nothing
// more: its checkpoint is deep in a log whose records expire after 2 s.
// While retention would compact past it, the runner checkpoints at the
// tail (acklog.Input.Pinned), and the log is compacted past the old one on
// every replica — with no group carry, the runner being there. Without
// the pinned checkpoint the log never passes it.
func TestClusterIdleGroupCheckpointsWhenItPinsRetention(t *testing.T) {
	tc := carryTopic(t, 2000)
	leader := tc.leaderOf("t", 0)
	_, _, _, first := tc.ackedAndCheckpointed(leader, 100)
	tc.publishN(100) // delivered, never acked
	for id := range tc.nodes {
		eventually(t, id+" compacts past the group's first checkpoint", func() bool { return tc.startSeqOf(id, "t") > first })
	}
	if c := tc.groupCarries("t"); c != 0 {
		t.Fatalf("%v group carries: the group's runner is on the leader", c)
	}
}

// steppedWall is the real clock with its wall reading (NowMs) moved by
// *stepMs: a step of it, as NTP makes one.
type steppedWall struct {
	env.Wall
	stepMs *atomic.Int64
}

func (c steppedWall) NowMs() int64 { return c.Wall.NowMs() + c.stepMs.Load() }

// TestClusterCarryChecksRunOnTheMonotonicClock guards
// CarryChecksAreMonotonic: a leader's carry checks (where retention would
// compact to, whether a group's checkpoint pins it) are scheduled on the
// monotonic clock. Every node's wall clock steps an hour back once the
// checks ran; an idle group's runner must still checkpoint at the tail
// when retention (by bytes) calls for it, and every replica compact past
// its first checkpoint. On the wall clock the checks stopped for the hour
// and the log stayed pinned.
func TestClusterCarryChecksRunOnTheMonotonicClock(t *testing.T) {
	var step atomic.Int64
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.RetentionCheckMs = 20
		c.GroupCheckpointSpanBytes = 1 << 30
		c.Env.Clock = steppedWall{stepMs: &step}
	})
	// 50 records (about 7 KiB) fit well within the retention (24 KiB),
	// so the group receives them all before any is compacted.
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3, RetentionBytes: 24 << 10})
	leader := tc.leaderOf("t", 0)
	time.Sleep(200 * time.Millisecond) // the leader's carry checks run
	step.Store(-time.Hour.Milliseconds())
	_, _, _, first := tc.ackedAndCheckpointed(leader, 50)
	tc.publishN(300) // delivered, never acked
	for id := range tc.nodes {
		eventually(t, id+" compacts past the group's first checkpoint", func() bool { return tc.startSeqOf(id, "t") > first })
	}
}

// A group whose members acked and left, and whose partition's leader
// then restarted: the new leader has no runner of the group, nor has the
// restarted node, and nothing writes the group's records. Once retention
// would compact past the group's checkpoint, the leader folds the
// checkpoint and the acks after it into a carry at the tail, which holds
// every ack and no other; every replica compacts past the old checkpoint,
// and a member that joins the group later is delivered the unacked
// messages still kept, and only those. Without the carry the log never
// passes the checkpoint.
func TestClusterGroupCarryUnpinsAGroupWithoutARunner(t *testing.T) {
	tc := carryTopic(t, 3000)
	leader := tc.leaderOf("t", 0)
	s, sub, early, first := tc.ackedAndCheckpointed(leader, 100)
	// Filler (delivered, not acked) closes the checkpoint's segment, and
	// the later records come 1.5 s after it: retention passes the
	// checkpoint 1.5 s before it deletes any later record.
	filler := tc.publishN(40)
	time.Sleep(1500 * time.Millisecond)
	late := tc.publishN(20)
	msgs := s.waitFor(t, len(early)+len(filler)+len(late))[len(early)+len(filler):]
	var odd []*wire.Msg // acked; the even ones are not
	for i, m := range msgs {
		if i%2 == 1 {
			odd = append(odd, m)
		}
	}
	ackAll(t, tc.nodes[leader], odd) // ACK_OK: the ack records committed
	sub.Close()
	tc.stop(leader) // before its quiet checkpoint (a second after the acks)
	tc.leaderOf("t", 0)
	// Back without the group's runner: the preferred leader, it takes the
	// partition back by a transfer (before or after the carry), and the
	// leader keeps no reservation for it.
	tc.start(leader)
	eventually(t, leader+" leads again", func() bool { return tc.inOffice("t", 0) == leader })
	for id := range tc.nodes {
		eventually(t, id+" compacts past the group's first checkpoint", func() bool { return tc.startSeqOf(id, "t") > first })
	}
	if c := tc.groupCarries("t"); c < 1 {
		t.Fatalf("compacted past the group's checkpoint with %v group carries", c)
	}
	start := tc.startSeqOf(leader, "t")

	carries := tc.groupRecordsOf(leader, "t", "g", acklog.KindCarry)
	if len(carries) == 0 {
		t.Fatal("no carry in the leader's log")
	}
	base, value, _ := acklog.CarryOf(carries[0].Record.Value)
	cp, err := decodeCheckpoint(value)
	if err != nil || len(cp.States) != 1 {
		t.Fatalf("carry at %d: %+v, %v", carries[0].Seq, cp, err)
	}
	for i, seq := range slices.Concat(early, filler, late) {
		acked := i < len(early) || i >= len(early)+len(filler) && (i-len(early)-len(filler))%2 == 1
		if done := isDoneIn(cp.States[0], seq); done != acked || base < seq {
			t.Fatalf("carry at %d (base %d): seq %d done %v, acked %v", carries[0].Seq, base, seq, done, acked)
		}
	}

	var want []string // the unacked still kept: filler, and the even later ones
	for i, seq := range slices.Concat(filler, late) {
		if seq >= start && (i < len(filler) || (i-len(filler))%2 == 0) {
			want = append(want, fmt.Sprintf("0/%d", seq))
		}
	}
	if !slices.Contains(want, fmt.Sprintf("0/%d", late[0])) {
		t.Fatalf("the log starts at %d, after the first later record %d: retention passed the checkpoint too late", start, late[0])
	}
	// Subscribed at every node: a node delivers the partitions it leads,
	// and a loaded machine may move the leadership meanwhile (the next
	// leader delivers again what was not acked: compared as a set).
	s2 := newSink()
	for id, n := range tc.nodes {
		sub2, err := n.Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s2)
		if err != nil {
			t.Fatalf("subscribe at %s: %v", id, err)
		}
		sub2.AddCredit(1000)
	}
	delivered := func() []string { // partition 0's, each once, by seq
		var seqs []uint64
		for _, m := range s2.all() {
			seqs = append(seqs, m.Seq)
		}
		slices.Sort(seqs)
		return seqsOfInts(slices.Compact(seqs))
	}
	deadline := time.Now().Add(waitMax)
	for len(delivered()) < len(want) {
		if time.Now().After(deadline) {
			t.Fatalf("after the carry the group delivered %d of the %d unacked (%v); partition 0 led by %q now", len(delivered()), len(want), delivered(), tc.inOffice("t", 0))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // room for a wrong redelivery to show
	if got := delivered(); !slices.Equal(got, want) {
		t.Fatalf("after the carry the group delivered %v, want the unacked %v (from the log's start %d)", got, want, start)
	}
}

// isDoneIn reports whether a done state holds seq.
func isDoneIn(s delivery.DoneState, seq uint64) bool {
	return seq < s.Floor || slices.ContainsFunc(s.Ranges, func(r delivery.SeqRange) bool { return r.First <= seq && seq <= r.Last })
}

// A group whose runner stays on the leader and acks nothing more, on a
// topic that keeps everything: once more than 16 KiB of log follows its
// checkpoint (Config.GroupCheckpointSpanBytes), it checkpoints again, so
// a new leader's rebuild of the group reads about that much, not the
// whole log since its last ack. Without the span only its first
// checkpoint is there.
func TestClusterGroupCheckpointsAsTheLogGrows(t *testing.T) {
	tc := carryTopic(t, 0)
	leader := tc.leaderOf("t", 0)
	_, _, _, first := tc.ackedAndCheckpointed(leader, 10)
	var later []uint64 // about 40 KiB, delivered, never acked
	for range 6 {
		later = append(later, tc.publishN(50)...)
		// The leader looks at its log at most every 50 ms, and only while
		// it commits.
		time.Sleep(60 * time.Millisecond)
	}
	later = append(later, tc.publishN(1)...)
	var last uint64
	eventually(t, "a checkpoint with at most 16 KiB and two segments of log after it", func() bool {
		cps := tc.groupRecordsOf(leader, "t", "g", acklog.KindCheckpoint)
		last = cps[len(cps)-1].Seq
		// 16 KiB plus two 4 KiB segments is at most ~190 records of ~130
		// bytes.
		return last > first && later[len(later)-1]-last < 190
	})
}

// An idle group reports no lag: after its last ack its subscription goes
// (no credit out), and its quiet checkpoint — a record of its own, no
// message — lands at the tail; the floor still reaches the commit point
// (GROUP_LIST's and nereus_consumer_lag_records' lag 0), though no
// subscription reads the checkpoint. Before, the floor stayed below it.
func TestClusterIdleGroupReportsNoLag(t *testing.T) {
	tc := carryTopic(t, 0)
	leader := tc.leaderOf("t", 0)
	tc.publishN(20)
	s := newSink()
	sub, err := tc.nodes[leader].Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(20)
	ackAll(t, tc.nodes[leader], s.waitFor(t, 20))
	sub.Close()
	var cp uint64
	eventually(t, "the group's quiet checkpoint", func() bool {
		if cps := tc.groupRecordsOf(leader, "t", "g", acklog.KindCheckpoint); len(cps) > 0 {
			cp = cps[len(cps)-1].Seq
		}
		return cp > 0
	})
	n := tc.nodes[leader]
	p := n.topics["t"].partitions[0]
	eventually(t, "the floor passes the checkpoint", func() bool {
		return groupOf(n, "g", "t").floors[0].Load() == p.commitSeq.Load()+1
	})
	if floor := groupOf(n, "g", "t").floors[0].Load(); floor <= cp {
		t.Fatalf("floor %d with the checkpoint at %d", floor, cp)
	}
}
