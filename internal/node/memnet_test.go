package node

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// memNet is an in-process env.PeerNetwork: frames cross it encoded (so
// nothing is shared between nodes), FIFO per receiver, delivered by one
// goroutine per member; cut makes every link lose what is sent, and so
// does drop for the frames it returns true for.
type memNet struct {
	mu      sync.Mutex
	members map[uint32]*memMember
	cut     bool
	drop    func(wire.Frame) bool
}

type memMember struct {
	net   *memNet
	ep    env.PeerEndpoint
	inbox chan memFrame
	done  chan struct{}
	wg    sync.WaitGroup
}

type memFrame struct {
	from uint32
	b    []byte
}

func newMemNet() *memNet { return &memNet{members: map[uint32]*memMember{}} }

func (n *memNet) Join(e env.PeerEndpoint) (env.PeerLink, error) {
	m := &memMember{net: n, ep: e, inbox: make(chan memFrame, 4096), done: make(chan struct{})}
	n.mu.Lock()
	n.members[e.ID] = m
	n.mu.Unlock()
	m.wg.Add(1)
	go m.deliver()
	return m, nil
}

func (n *memNet) setCut(cut bool) {
	n.mu.Lock()
	n.cut = cut
	n.mu.Unlock()
}

func (n *memNet) setDrop(drop func(wire.Frame) bool) {
	n.mu.Lock()
	n.drop = drop
	n.mu.Unlock()
}

func (m *memMember) deliver() {
	defer m.wg.Done()
	for {
		select {
		case <-m.done:
			return
		case fr := <-m.inbox:
			_, f, err := wire.ReadFrame(bytes.NewReader(fr.b), wire.DefaultFrameBytesMax)
			if err != nil {
				panic("memNet: undecodable frame: " + err.Error())
			}
			m.ep.Handler(fr.from, f)
		}
	}
}

func (m *memMember) Send(to uint32, f wire.Frame) bool {
	m.net.mu.Lock()
	dst, cut := m.net.members[to], m.net.cut || m.net.drop != nil && m.net.drop(f)
	m.net.mu.Unlock()
	if dst == nil {
		return false
	}
	if cut {
		return true // lost in flight
	}
	select {
	case dst.inbox <- memFrame{from: m.ep.ID, b: wire.AppendFrame(nil, 0, f)}:
		return true
	default:
		return false
	}
}

func (m *memMember) ClientAddr(id uint32) string {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	if o := m.net.members[id]; o != nil {
		return o.ep.ClientAddr
	}
	return ""
}

func (m *memMember) Close() error {
	close(m.done)
	m.wg.Wait()
	m.net.mu.Lock()
	if m.net.members[m.ep.ID] == m {
		delete(m.net.members, m.ep.ID)
	}
	m.net.mu.Unlock()
	return nil
}

// newVirtualCluster starts three nodes over a memNet on one virtual
// clock, with an election timeout (5,000 s) no test reaches: every leader
// comes from a group's first campaign, and a lease lasts 2,500 s.
func newVirtualCluster(t *testing.T) (*testCluster, *recordingClock, *memNet) {
	clock := &recordingClock{Virtual: env.NewVirtual(1_000_000)}
	peers := newMemNet()
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.Cluster.PeerListener.Close() // the TCP network is not used
		c.Cluster.PeerListener = nil
		c.Env.Clock, c.Env.Peers = clock, peers
		c.ScrubBytesPerSecond = -1
		c.Cluster.ElectionTicks = 1_000_000
		c.Cluster.DeclareTimeout = 1000 * time.Hour
	})
	return tc, clock, peers
}

// declareAdvancing declares cfg at n, advancing clock a tick at a time
// until it is answered.
func declareAdvancing(t *testing.T, n *Node, clock *recordingClock, cfg wire.TopicConfig) {
	t.Helper()
	declared := make(chan error, 1)
	go func() {
		_, err := n.Declare(cfg)
		declared <- err
	}()
	var err error
	advanceUntil(t, clock, 5*time.Millisecond, "DECLARE answered", func() bool {
		select {
		case err = <-declared:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatalf("DECLARE %s: %v", cfg.Name, err)
	}
}

// virtualHeartbeat is a partition's heartbeat interval in a
// newVirtualCluster (a tenth of its election timeout): an idle leader's
// heartbeat, and a candidate's re-sent PREPAREs.
const virtualHeartbeat = 500 * time.Second

// advanceCampaigns advances clock 5 ms at a time until cond holds, and a
// heartbeat interval every 100th step: a group's first campaign whose
// PREPAREs were lost (a member had not opened the group yet, or the
// network dropped them) PREPAREs again only then.
func advanceCampaigns(t *testing.T, clock *recordingClock, what string, cond func() bool) {
	t.Helper()
	steps := 0
	advanceUntil(t, clock, 5*time.Millisecond, what, func() bool {
		if steps++; steps%100 == 0 {
			clock.Advance(virtualHeartbeat)
		}
		return cond()
	})
}

// A new topic's first campaign whose PREPAREs are lost does not leave the
// partition without a leader until an election timeout: the candidate
// PREPAREs again a heartbeat interval on (replica.resendPrepares).
func TestClusterFirstCampaignSurvivesLostPrepares(t *testing.T) {
	tc, clock, peers := newVirtualCluster(t)
	var prepares atomic.Int32
	peers.setDrop(func(f wire.Frame) bool {
		r, ok := f.(*wire.Replicate)
		return ok && r.Topic == "t" && replica.MsgType(r.Kind) == replica.MsgPrepare && prepares.Add(1) <= 2
	})
	declareAdvancing(t, tc.nodes["n2"], clock, wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	var id string
	advanceCampaigns(t, clock, "t/0 has a leader in office", func() bool {
		id = tc.inOffice("t", 0)
		return id != ""
	})
	if n := prepares.Load(); n <= 2 {
		t.Fatalf("%d PREPAREs sent for t/0, want the first campaign's two lost and more", n)
	}
	// An election timeout would have campaigned for a new epoch.
	if st, _ := partitionStatus(tc.nodes[id], "t", 0); st.Hard.Promised != 1 {
		t.Fatalf("%s leads t/0 in epoch %d, want the first campaign's (1)", id, st.Hard.Promised)
	}
}

// partitionStatus is partition p of topic on n, if n knows the topic yet.
func partitionStatus(n *Node, topic string, p int) (replica.Status, bool) {
	t, err := n.topic(topic)
	if err != nil || t.partitions[p].replica() == nil {
		return replica.Status{}, false
	}
	return t.partitions[p].replica().repl.Status(), true
}

// A whole cluster runs over a peer network that is not TCP, and its
// protocol timers run on a virtual clock: with no election timeout in the
// test's lifetime, every leader comes from a group's first campaign, which
// fires (and PREPAREs again) only as the test advances time; DECLARE, replication and a
// forwarded publish cross the in-memory network; and the forwarded
// publish gives up when virtual time passes its deadline.
func TestClusterRunsOverAnInMemoryPeerNetworkOnTheEnvClock(t *testing.T) {
	tc, clock, peers := newVirtualCluster(t)
	declareAdvancing(t, tc.nodes["n2"], clock, wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})

	var leader, follower string
	advanceCampaigns(t, clock, "partition 0 has a leader that took office and that its followers know", func() bool {
		leader, follower = "", ""
		var leaderNumber replica.NodeID
		for id, n := range tc.nodes {
			tp, _ := n.topic("t")
			// It takes publishes once its install entry is applied.
			if st, ok := partitionStatus(n, "t", 0); ok && st.Role == replica.Leader && tp != nil {
				if _, took := tp.partitions[0].replica().tookOffice(); took {
					leader, leaderNumber = id, n.cluster.Self()
				}
			}
		}
		for id, n := range tc.nodes {
			if st, ok := partitionStatus(n, "t", 0); ok && id != leader && st.Leader == leaderNumber && leaderNumber != 0 {
				follower = id
			}
		}
		return leader != "" && follower != ""
	})
	if ok, perr := publishOn(t, tc.nodes[leader], &wire.Pub{Topic: "t", Partition: 0, Value: []byte("m1")}); perr != nil || ok.Seq == 0 {
		t.Fatalf("publish on leader %s: %+v %v", leader, ok, perr)
	}

	peers.setCut(true)
	answered := make(chan *wire.Error, 1)
	tc.nodes[follower].publishToLeader(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("m2")}, 0, 0,
		func(_ wire.PubOK, err *wire.Error) { answered <- err })
	clock.Advance(1000 * time.Hour)
	select {
	case ferr := <-answered:
		if ferr == nil || ferr.Code != wire.CodeUnavailable || !strings.Contains(ferr.Message, "did not answer") {
			t.Fatalf("forwarded publish: %v, want UNAVAILABLE after its deadline", ferr)
		}
	case <-time.After(waitMax):
		t.Fatal("the forwarded publish never gave up")
	}

	// DECLAREs give up at their deadlines too: one forwarded by a follower
	// of `__meta` (no answer comes back) and one on its leader (cut off,
	// its lease has run out: it decides nothing, CoordinatorHoldsLease).
	// n1, the first member, won the only `__meta` campaign.
	if v, _ := tc.nodes["n1"].Replica(meta.MetaTopic, 0); v.Status.Role != replica.Leader {
		t.Fatalf("n1 is %v of __meta, want leader", v.Status.Role)
	}
	declared := make(chan error, 1)
	var err error
	for via, want := range map[string]string{"n2": "did not answer", "n1": "was not in office"} {
		go func() {
			_, err := tc.nodes[via].Declare(wire.TopicConfig{Name: "u-" + via, Partitions: 1})
			declared <- err
		}()
		advanceUntil(t, clock, 1000*time.Hour, "DECLARE via "+via+" gave up", func() bool {
			select {
			case err = <-declared:
				return true
			default:
				return false
			}
		})
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeUnavailable || !strings.Contains(we.Message, want) {
			t.Fatalf("DECLARE via %s: %v, want UNAVAILABLE: %s", via, err, want)
		}
	}
}
