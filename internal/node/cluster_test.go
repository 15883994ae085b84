package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// testCluster runs three clustered nodes in-process over loopback TCP, on
// one in-memory file system (separate data dirs).
type testCluster struct {
	t       *testing.T
	fs      *vfs.MemFS
	members []Member
	nodes   map[string]*Node
	tune    func(*Config) // adjusts every node's config (nil: defaults)
	// listeners hold each node's peer port until its first start, so no
	// other process (tests run packages in parallel) can take it meanwhile.
	listeners map[string]net.Listener
}

func newTestCluster(t *testing.T, n int) *testCluster { return newTestClusterWith(t, n, nil) }

func newTestClusterWith(t *testing.T, n int, tune func(*Config)) *testCluster {
	tc := &testCluster{t: t, fs: vfs.NewMem(), nodes: map[string]*Node{}, tune: tune, listeners: map[string]net.Listener{}}
	for i := 1; i <= n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("n%d", i)
		tc.listeners[id] = l
		tc.members = append(tc.members, Member{ID: id, PeerAddr: l.Addr().String()})
	}
	for _, m := range tc.members {
		tc.start(m.ID)
	}
	t.Cleanup(func() {
		for id := range tc.nodes {
			tc.stop(id)
		}
		for _, l := range tc.listeners {
			l.Close()
		}
	})
	return tc
}

// start opens (or reopens) a node: ticks of 5 ms, elections after 30–60.
func (tc *testCluster) start(id string) {
	tc.t.Helper()
	cfg := Config{NodeID: id, DataDir: "/" + id, Env: env.Env{FS: tc.fs}, ClientAddr: "client-of-" + id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &ClusterConfig{Members: tc.members, Secret: []byte("test-cluster-secret-0123456789"),
			Tick: 5 * time.Millisecond, ElectionTicks: 30}}
	if l := tc.listeners[id]; l != nil {
		cfg.Cluster.PeerListener = l
		delete(tc.listeners, id)
	}
	if tc.tune != nil {
		tc.tune(&cfg)
	}
	n, err := Open(cfg)
	if err != nil {
		tc.t.Fatalf("open %s: %v", id, err)
	}
	tc.nodes[id] = n
}

func (tc *testCluster) stop(id string) {
	if n := tc.nodes[id]; n != nil {
		n.Close()
		delete(tc.nodes, id)
	}
}

func (tc *testCluster) declare(via string, cfg wire.TopicConfig) bool {
	tc.t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		declare := tc.nodes[via].Declare
		if strings.HasPrefix(cfg.Name, "dlq.") {
			declare = tc.nodes[via].declare // as the group machinery does
		}
		created, err := declare(cfg)
		if err == nil {
			tc.waitKnown(cfg.Name)
			return created
		}
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeUnavailable || time.Now().After(deadline) {
			tc.t.Fatalf("declare via %s: %v", via, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitKnown waits until every running node has applied the topic (DECLARE
// returns once the answering node has).
func (tc *testCluster) waitKnown(topic string) {
	tc.t.Helper()
	deadline := time.Now().Add(waitMax)
	for id, n := range tc.nodes {
		for len(n.Metadata([]string{topic})) == 0 {
			if time.Now().After(deadline) {
				tc.t.Fatalf("%s never learned topic %s", id, topic)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

func publishOn(t *testing.T, n *Node, pub *wire.Pub) (wire.PubOK, *wire.Error) {
	t.Helper()
	type res struct {
		ok  wire.PubOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	n.Publish(pub, func(ok wire.PubOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		t.Fatal("publish: no reply")
		return wire.PubOK{}, nil
	}
}

// leaderOf waits until some running node leads partition p of topic and
// accepts a probe publish from a producer identity nobody else uses.
func (tc *testCluster) publishAnywhere(pub *wire.Pub) (string, wire.PubOK) {
	tc.t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		var last *wire.Error
		for id, n := range tc.nodes {
			ok, err := publishOn(tc.t, n, pub)
			if err == nil {
				return id, ok
			}
			last = err
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("no node took the publish: %v", last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (tc *testCluster) readAll(id, topic string, partition uint32, upTo uint64) []string {
	tc.t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		var out []string
		n := tc.nodes[id]
		for from := n.Metadata([]string{topic})[0].Partitions[partition].StartSeq; ; {
			es, err := n.Read(topic, partition, from, 1000)
			if errors.Is(err, storage.ErrOutOfRange) {
				out = nil // retention moved the start under us: read again
				from = n.Metadata([]string{topic})[0].Partitions[partition].StartSeq
				continue
			}
			if err != nil {
				tc.t.Fatalf("read on %s: %v", id, err)
			}
			if len(es) == 0 {
				break
			}
			for _, e := range es {
				if len(e.Record.Headers) == 0 { // skip control records
					out = append(out, fmt.Sprintf("%d:%s", e.Seq, e.Record.Value))
				}
			}
			from = es[len(es)-1].Seq + 1
		}
		if n.Metadata([]string{topic})[0].Partitions[partition].CommitSeq >= upTo {
			return out
		}
		if time.Now().After(deadline) {
			for nid, nn := range tc.nodes {
				p := nn.topics[topic].partitions[partition]
				st := p.repl.Status()
				tc.t.Logf("%s: %v epoch %d leader %d last %d durable %d commit %d applied %d peers %+v",
					nid, st.Role, st.Hard.Promised, st.Leader, st.Last, st.Durable, st.CommitSeq, p.commitSeq.Load(), st.Peers)
			}
			tc.t.Fatalf("%s never reached commit %d", id, upTo)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A topic declared through any node reaches every node; publishes are
// taken only by the partition leader, replicate to every replica, and a
// producer's retry after a leader failover gets its original PUB_OK.
func TestClusterReplicatesAndFailsOverWithoutDuplicates(t *testing.T) {
	tc := newTestCluster(t, 3)
	cfg := wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3}
	if !tc.declare("n2", cfg) {
		t.Fatal("first declare did not create the topic")
	}
	if tc.declare("n3", cfg) {
		t.Fatal("second identical declare created the topic again")
	}
	conflicting := cfg
	conflicting.Partitions = 2
	_, err := tc.nodes["n1"].Declare(conflicting)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeTopicConflict {
		t.Fatalf("conflicting declare: %v", err)
	}

	var leader string
	acked := map[uint64]uint64{} // producer_seq -> seq
	for i := uint64(1); i <= 20; i++ {
		var ok wire.PubOK
		leader, ok = tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: []byte(fmt.Sprint("m", i))})
		acked[i] = ok.Seq
	}
	for id, n := range tc.nodes {
		if id == leader {
			continue
		}
		if _, err := publishOn(t, n, &wire.Pub{Topic: "orders", Partition: 0, Value: []byte("x")}); err == nil || err.Code != wire.CodeNotLeader {
			t.Fatalf("follower %s answered a publish with %v, want NOT_LEADER", id, err)
		}
	}
	want := tc.readAll(leader, "orders", 0, acked[20])
	for id := range tc.nodes {
		if got := tc.readAll(id, "orders", 0, acked[20]); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("replica %s holds %v, leader %v", id, got, want)
		}
	}

	tc.stop(leader)
	// Retries of acknowledged publishes, at whichever node leads now, get
	// the original (partition, seq) and never append again.
	for _, i := range []uint64{1, 20} {
		_, ok := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: []byte(fmt.Sprint("m", i))})
		if !ok.Duplicate || ok.Seq != acked[i] {
			t.Fatalf("retry of producer_seq %d after failover: %+v, want duplicate at seq %d", i, ok, acked[i])
		}
	}
	newLeader, ok := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 21, Value: []byte("m21")})
	got := tc.readAll(newLeader, "orders", 0, ok.Seq)
	if len(got) != 21 || fmt.Sprint(got[:20]) != fmt.Sprint(want) {
		t.Fatalf("after failover the log is %v", got)
	}

	// The old leader comes back as a follower and catches up.
	tc.start(leader)
	if got2 := tc.readAll(leader, "orders", 0, ok.Seq); fmt.Sprint(got2) != fmt.Sprint(got) {
		t.Fatalf("restarted %s holds %v, want %v", leader, got2, got)
	}
}

// subscribeOn subscribes to group on a node, retrying while the node is
// not (yet) the coordinator.
func subscribeOn(t *testing.T, n *Node, topic, group string, credit uint32) (*Subscription, *sink) {
	t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		s := newSink()
		sub, err := n.Subscribe(topic, group, GroupOptions{}, s)
		if err == nil {
			sub.AddCredit(credit)
			return sub, s
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscribe: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ackOn(t *testing.T, n *Node, topic, group string, msgs []*wire.Msg) {
	t.Helper()
	var entries []wire.AckEntry
	for _, m := range msgs {
		entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	done := make(chan *wire.Error, 1)
	n.Ack(topic, group, entries, func(results []wire.Code, err *wire.Error) {
		for _, r := range results {
			if err == nil && r != wire.CodeOK {
				err = wire.Errorf(r, "ack result")
			}
		}
		done <- err
	})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ack: %v", err)
		}
	case <-time.After(waitMax):
		t.Fatal("ack: no reply")
	}
}

// A group's acks live in partition 0's log, so retention compacts partition
// 0 no further than the oldest record a group still needs: its first ack
// while it has no checkpoint, later its latest checkpoint. Either way a new
// coordinator finds the acks of messages that other partitions keep, and
// does not redeliver them.
func TestClusterGroupAcksOutliveRetention(t *testing.T) {
	for _, checkpoints := range []bool{false, true} {
		t.Run(fmt.Sprint("checkpoints=", checkpoints), func(t *testing.T) { testGroupAcksOutliveRetention(t, checkpoints) })
	}
}

func testGroupAcksOutliveRetention(t *testing.T, checkpoints bool) {
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.SegmentBytesMax = 2048
		c.RetentionCheckMs = 10
		c.LedgerCompactBytes = -1
		if checkpoints {
			c.LedgerCompactBytes = 100 // a checkpoint after every ack record or two
		}
	})
	tc.declare("n1", wire.TopicConfig{Name: "q", Partitions: 2, Replicas: 3, RetentionBytes: 8192})
	fill := func(from, to int) {
		for i := from; i < to; i++ {
			tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 0, Value: []byte(fmt.Sprint("p0-", i))})
		}
	}
	fill(0, 300)
	for i := range 20 {
		tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 1, Value: []byte(fmt.Sprint("p1-", i))})
	}
	coordinator, _ := tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 0, Value: []byte("probe")})
	_, s := subscribeOn(t, tc.nodes[coordinator], "q", "g", 5000)
	p1 := partitionMsgs(t, s, 1, 20)
	ackOn(t, tc.nodes[coordinator], "q", "g", p1[:12])
	p0 := tc.nodes[coordinator].topics["q"].partitions[0]
	ackAt := p0.repl.CommitSeq() // the first ack record is at or below it
	fill(300, 600)
	if checkpoints {
		// More acks (of recent messages: older ones are compacted away,
		// so done), and the group checkpoints far past its first ack.
		var recent []*wire.Msg
		for deadline := time.Now().Add(waitMax); len(recent) == 0 || string(recent[len(recent)-1].Value) != "p0-599"; {
			if time.Now().After(deadline) {
				t.Fatal("p0-599 never delivered")
			}
			recent = partitionMsgs(t, s, 0, len(recent)+1)
		}
		ackOn(t, tc.nodes[coordinator], "q", "g", recent[len(recent)-50:])
	}
	fill(600, 900)
	deadline := time.Now().Add(waitMax)
	for p0.repl.Status().SnapSeq == 0 || checkpoints && p0.repl.Status().SnapSeq < ackAt {
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 compacted only through %d (first ack record at or below %d)", p0.repl.Status().SnapSeq, ackAt)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !checkpoints {
		time.Sleep(100 * time.Millisecond) // ten more retention passes
		if snap := p0.repl.Status().SnapSeq; snap >= ackAt {
			t.Fatalf("partition 0 compacted through %d, past its only ack record (at or below %d)", snap, ackAt)
		}
	}

	tc.stop(coordinator)
	newCoordinator, _ := tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 0, Value: []byte("after")})
	_, s2 := subscribeOn(t, tc.nodes[newCoordinator], "q", "g", 5000)
	// The cursor delivers a partition in seq order: once the 8 unacked
	// messages are back, a redelivered acked one would be among them.
	for _, m := range partitionMsgs(t, s2, 1, 8) {
		for _, a := range p1[:12] {
			if a.Seq == m.Seq {
				t.Fatalf("acked seq %d of partition 1 redelivered by the new coordinator", m.Seq)
			}
		}
	}
}

// partitionMsgs waits until the sink holds at least n messages of the
// partition and returns them all.
func partitionMsgs(t *testing.T, s *sink, partition uint32, n int) []*wire.Msg {
	t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		var out []*wire.Msg
		s.mu.Lock()
		for _, m := range s.msgs {
			if m.Partition == partition {
				out = append(out, m)
			}
		}
		s.mu.Unlock()
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d messages of partition %d", len(out), n, partition)
		}
		select {
		case <-s.ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
}
