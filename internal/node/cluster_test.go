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
	var created bool
	eventually(tc.t, "DECLARE via "+via+" answered", func() bool {
		declare := tc.nodes[via].Declare
		if strings.HasPrefix(cfg.Name, "dlq.") {
			declare = tc.nodes[via].declare // as the group machinery does
		}
		var err error
		created, err = declare(cfg)
		var we *wire.Error
		if err != nil && (!errors.As(err, &we) || we.Code != wire.CodeUnavailable) {
			tc.t.Fatalf("declare via %s: %v", via, err)
		}
		return err == nil
	})
	tc.waitKnown(cfg.Name)
	return created
}

// waitKnown waits until every running node has applied the topic (DECLARE
// returns once the answering node has).
func (tc *testCluster) waitKnown(topic string) {
	tc.t.Helper()
	for id, n := range tc.nodes {
		eventually(tc.t, id+" learns topic "+topic, func() bool { return len(n.Metadata([]string{topic})) > 0 })
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

// publishAnywhere offers pub to every running node until one (the
// partition's leader) takes it.
func (tc *testCluster) publishAnywhere(pub *wire.Pub) (string, wire.PubOK) {
	tc.t.Helper()
	var at string
	var ok wire.PubOK
	eventually(tc.t, "a node takes the publish", func() bool {
		for id, n := range tc.nodes {
			var err *wire.Error
			if ok, err = publishOn(tc.t, n, pub); err == nil {
				at = id
				return true
			}
		}
		return false
	})
	return at, ok
}

// readAll waits until node id's commit of the partition reaches upTo and
// returns its log's records (control records skipped) as "seq:value".
func (tc *testCluster) readAll(id, topic string, partition uint32, upTo uint64) []string {
	tc.t.Helper()
	var out []string
	done := false
	defer func() { // eventually failed: show every replica's state
		if !done {
			for nid, nn := range tc.nodes {
				p := nn.topics[topic].partitions[partition]
				st := p.replica().repl.Status()
				tc.t.Logf("%s: %v epoch %d leader %d last %d durable %d commit %d applied %d peers %+v",
					nid, st.Role, st.Hard.Promised, st.Leader, st.Last, st.Durable, st.CommitSeq, p.commitSeq.Load(), st.Peers)
			}
		}
	}()
	eventually(tc.t, fmt.Sprintf("%s reaches commit %d", id, upTo), func() bool {
		out = nil
		n := tc.nodes[id]
		for from := n.Metadata([]string{topic})[0].Partitions[partition].StartSeq; ; {
			es, err := n.Read(topic, partition, from, 1000)
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
		return n.Metadata([]string{topic})[0].Partitions[partition].CommitSeq >= upTo
	})
	done = true
	return out
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

// TestClusterReplicationMetrics: a replicated publish is measured on its
// leader from the proposal to its commit (nereus_replication_seconds),
// and every replica's log fsyncs count as kind "replica".
func TestClusterReplicationMetrics(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "m", Partitions: 1, Replicas: 3})
	var leader string
	for i := range 5 {
		leader, _ = tc.publishAnywhere(&wire.Pub{Topic: "m", Value: []byte(fmt.Sprint(i))})
	}
	if _, count, sum := sample(t, tc.nodes[leader].metrics, "nereus_replication_seconds", nil); count < 5 || sum <= 0 {
		t.Fatalf("leader %s: nereus_replication_seconds count %d sum %g, want at least the 5 publishes", leader, count, sum)
	}
	// The leader counts what it acknowledged: five records of one value
	// byte each (publishAnywhere may have offered some to followers first;
	// they refused them).
	topic := map[string]string{"topic": "m"}
	records, _, _ := sample(t, tc.nodes[leader].metrics, "nereus_publish_records_total", topic)
	bytes, _, _ := sample(t, tc.nodes[leader].metrics, "nereus_publish_bytes_total", topic)
	if records != 5 || bytes != 5 {
		t.Fatalf("leader %s: nereus_publish_records_total %g, nereus_publish_bytes_total %g, want 5 and 5", leader, records, bytes)
	}
	for id, n := range tc.nodes {
		eventually(t, id+" counts its replica fsyncs", func() bool {
			_, count, _ := sample(t, n.metrics, "nereus_fsync_seconds", map[string]string{"kind": "replica"})
			return count > 0
		})
	}
}
