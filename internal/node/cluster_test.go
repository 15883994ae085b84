package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

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
}

func newTestCluster(t *testing.T, n int) *testCluster {
	tc := &testCluster{t: t, fs: vfs.NewMem(), nodes: map[string]*Node{}}
	for i := 1; i <= n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // the node listens on it again; loopback ports are not reused at once
		tc.members = append(tc.members, Member{ID: fmt.Sprintf("n%d", i), PeerAddr: addr})
	}
	for _, m := range tc.members {
		tc.start(m.ID)
	}
	t.Cleanup(func() {
		for id := range tc.nodes {
			tc.stop(id)
		}
	})
	return tc
}

func (tc *testCluster) start(id string) {
	tc.t.Helper()
	n, err := Open(Config{NodeID: id, DataDir: "/" + id, FS: tc.fs, ClientAddr: "client-of-" + id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &ClusterConfig{Members: tc.members, Secret: []byte("test-cluster-secret-0123456789"),
			Tick: 2 * time.Millisecond, ElectionTicks: 20}})
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
		created, err := tc.nodes[via].Declare(cfg)
		if err == nil {
			return created
		}
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeUnavailable || time.Now().After(deadline) {
			tc.t.Fatalf("declare via %s: %v", via, err)
		}
		time.Sleep(10 * time.Millisecond)
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
		for from := uint64(1); ; {
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
		if n.Metadata([]string{topic})[0].Partitions[partition].CommitSeq >= upTo {
			return out
		}
		if time.Now().After(deadline) {
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

// With two of three nodes down the survivor refuses writes with
// QUORUM_LOST (once it notices) and still serves the visible prefix.
func TestClusterQuorumLossIsReadOnly(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	leader, ok := tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("before")})
	for id := range tc.nodes {
		if id != leader {
			tc.stop(id)
		}
	}
	deadline := time.Now().Add(waitMax)
	for {
		_, err := publishOn(t, tc.nodes[leader], &wire.Pub{Topic: "t", Partition: 0, Value: []byte("after")})
		if err != nil && err.Code == wire.CodeQuorumLost {
			break
		}
		if err == nil {
			t.Fatal("a publish was acknowledged with two of three replicas down")
		}
		if time.Now().After(deadline) {
			t.Fatalf("never QUORUM_LOST: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	info := tc.nodes[leader].Metadata([]string{"t"})[0].Partitions[0]
	if !info.ReadOnly {
		t.Fatalf("metadata does not show the degraded mode: %+v", info)
	}
	if got := tc.readAll(leader, "t", 0, ok.Seq); len(got) != 1 || got[0] != fmt.Sprintf("%d:before", ok.Seq) {
		t.Fatalf("visible prefix in degraded mode: %v", got)
	}
}
