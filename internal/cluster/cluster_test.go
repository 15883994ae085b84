package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// These tests run Manual clusters of fake hosts on one goroutine: one
// virtual clock, a queue of encoded peer frames, and every member stepped
// until nothing moves before time advances by a millisecond. What a
// cluster decides (the metadata leader, DECLAREs, forwarded publishes) is
// then exact and repeatable, without a node behind it.

const testTick = 10 * time.Millisecond

type testFrame struct {
	from, to uint32
	b        []byte
}

// testNet is an env.PeerNetwork whose frames wait in one FIFO until the
// harness delivers them; cut members neither send nor receive (their
// frames are lost), held members' frames wait until they are released.
type testNet struct {
	members map[uint32]*testLink
	queue   []testFrame
	cut     map[uint32]bool
	hold    map[uint32]bool
	// drop, when set, loses every frame it returns true for.
	drop func(from, to uint32, f wire.Frame) bool
}

type testLink struct {
	net    *testNet
	ep     env.PeerEndpoint
	closed bool
}

func (n *testNet) Join(e env.PeerEndpoint) (env.PeerLink, error) {
	l := &testLink{net: n, ep: e}
	n.members[e.ID] = l
	return l, nil
}

func (l *testLink) Send(to uint32, f wire.Frame) bool {
	if l.closed {
		return false
	}
	l.net.queue = append(l.net.queue, testFrame{from: l.ep.ID, to: to, b: wire.AppendFrame(nil, 0, f)})
	return true
}

func (l *testLink) ClientAddr(id uint32) string {
	if m := l.net.members[id]; m != nil {
		return m.ep.ClientAddr
	}
	return ""
}

func (l *testLink) Close() error { l.closed = true; return nil }

// deliver hands every queued frame to its member (frames sent meanwhile
// wait for the next call); it reports whether it delivered any.
func (n *testNet) deliver(t *testing.T) bool {
	q := n.queue
	n.queue = nil
	delivered := false
	for _, fr := range q {
		if n.hold[fr.from] || n.hold[fr.to] {
			n.queue = append(n.queue, fr)
			continue
		}
		dst := n.members[fr.to]
		if dst == nil || dst.closed || n.cut[fr.from] || n.cut[fr.to] {
			continue
		}
		_, f, err := wire.ReadFrame(bytes.NewReader(fr.b), wire.DefaultFrameBytesMax)
		if err != nil {
			t.Fatalf("a member sent an undecodable frame: %v", err)
		}
		if n.drop != nil && n.drop(fr.from, fr.to, f) {
			continue
		}
		dst.ep.Handler(fr.from, f)
		delivered = true
	}
	return delivered
}

// fakeHost is a node reduced to what the cluster asks of it: it opens the
// replica groups a started topic places here and answers forwarded
// publishes with a fixed seq.
type fakeHost struct {
	t       *testing.T
	c       *Cluster
	started map[string][][]uint32 // topic → placement
	pubs    []wire.Pub            // forwarded to it
	// pubIncarnations: the incarnation each of pubs was bound to.
	pubIncarnations []uint64
	// startFailures fails that many StartTopic calls (a disk error while
	// opening a topic's replicas).
	startFailures int
	// corruptTopic: StartTopic of this topic finds damage
	// (storage.ErrCorrupt).
	corruptTopic string
	startCalls   int
	stopped      []stoppedTopic              // StopTopic calls, in order
	updated      []meta.Topic                // TopicUpdated calls, in order
	configs      map[string]wire.TopicConfig // the configuration each topic started with
}

func (h *fakeHost) StartTopic(t meta.Topic) (bool, error) {
	tc, placement := t.Config, t.Placement
	h.startCalls++
	if tc.Name == h.corruptTopic {
		return false, fmt.Errorf("open %s: %w", tc.Name, storage.ErrCorrupt)
	}
	if h.startFailures > 0 {
		h.startFailures--
		return false, fmt.Errorf("open %s: injected disk error", tc.Name)
	}
	if _, ok := h.started[tc.Name]; ok {
		return false, nil
	}
	for p, group := range placement {
		if !slices.Contains(group, uint32(h.c.Self())) {
			continue
		}
		members := make([]replica.NodeID, len(group))
		for i, id := range group {
			members[i] = replica.NodeID(id)
		}
		l, err := h.c.OpenGroup(meta.TopicKey(tc.Name, t.Incarnation), uint32(p), members, replica.SyncQuorum, func() {}, GroupOptions{})
		if err != nil {
			return false, err
		}
		h.c.CampaignIfNew(l, members[0])
	}
	h.started[tc.Name] = placement
	if h.configs == nil {
		h.configs = map[string]wire.TopicConfig{}
	}
	h.configs[tc.Name] = tc
	return true, nil
}

func (h *fakeHost) PublishLocal(pub *wire.Pub, incarnation uint64, reply func(wire.PubOK, *wire.Error)) {
	h.pubs = append(h.pubs, *pub)
	h.pubIncarnations = append(h.pubIncarnations, incarnation)
	reply(wire.PubOK{Partition: uint32(pub.Partition), Seq: 42, Epoch: 7}, nil)
}

func (h *fakeHost) MetadataApplied() {}

func (h *fakeHost) TopicUpdated(t meta.Topic)               { h.updated = append(h.updated, t) }
func (h *fakeHost) GroupSettingsUpdated(meta.GroupSettings) {}

// StopTopic closes the deleted topic's replica groups here.
func (h *fakeHost) GroupDeleted(string, uint64, bool) {}

func (h *fakeHost) StopTopic(name string, incarnation uint64, removeData bool) {
	for p := range h.started[name] {
		h.c.CloseGroup(meta.TopicKey(name, incarnation), uint32(p))
	}
	delete(h.started, name)
	h.stopped = append(h.stopped, stoppedTopic{name, incarnation, removeData})
}

type stoppedTopic struct {
	name        string
	incarnation uint64
	removeData  bool
}

func (h *fakeHost) LogRepeatedError(subject, msg string, args ...any) {
	h.t.Logf("%s: %s %v", subject, msg, args)
}

type testCluster struct {
	t      *testing.T
	clock  *env.Virtual
	net    *testNet
	fs     []*vfs.MemFS
	hosts  []*fakeHost
	nodes  []*Cluster // nil: down
	config Config
	// corrupt: members whose host finds damage in the topic named.
	corrupt map[int]string
	// skewMs: each member's wall clock (NowMs) minus the virtual time; its
	// monotonic clock (NowNanos) is the virtual time.
	skewMs []int64
}

// skewedClock is a member's clock: the virtual one, its wall clock moved
// by *skewMs (a clock step, as NTP makes one).
type skewedClock struct {
	*env.Virtual
	skewMs *int64
}

func (c skewedClock) NowMs() int64 { return c.Virtual.NowMs() + *c.skewMs }

func newTestCluster(t *testing.T, n int) *testCluster {
	tc := &testCluster{t: t, clock: env.NewVirtual(1_700_000_000_000),
		net: &testNet{members: map[uint32]*testLink{}, cut: map[uint32]bool{}, hold: map[uint32]bool{}}}
	tc.config = Config{Tick: testTick, DeclareTimeout: 2 * time.Second}
	for i := 1; i <= n; i++ {
		tc.config.Members = append(tc.config.Members, Member{ID: fmt.Sprintf("n%d", i), PeerAddr: fmt.Sprintf("peer-%d", i)})
	}
	tc.fs = make([]*vfs.MemFS, n)
	tc.hosts = make([]*fakeHost, n)
	tc.nodes = make([]*Cluster, n)
	tc.skewMs = make([]int64, n)
	for i := range n {
		tc.fs[i] = vfs.NewMem()
		tc.start(i)
	}
	return tc
}

// start opens member i (0-based) over its file system.
func (tc *testCluster) start(i int) {
	tc.t.Helper()
	h := &fakeHost{t: tc.t, started: map[string][][]uint32{}, corruptTopic: tc.corrupt[i]}
	seed := uint64(i + 1)
	c, err := New(h, tc.config, Options{
		NodeID: fmt.Sprintf("n%d", i+1), DataDir: "/data", ClientAddr: fmt.Sprintf("127.0.0.1:%d", 4850+i),
		Env: env.Env{FS: tc.fs[i], Clock: skewedClock{tc.clock, &tc.skewMs[i]}, Rand: func() uint64 { seed = seed*6364136223846793005 + 1; return seed },
			Peers: tc.net},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Manual: true,
		SegmentBytesMax: 1 << 20, RecordBytesMax: 1 << 20, RetentionCheckMs: 1000,
	})
	if err != nil {
		tc.t.Fatalf("n%d: %v", i+1, err)
	}
	h.c = c
	if err := c.Start(); err != nil {
		tc.t.Fatalf("n%d: start: %v", i+1, err)
	}
	tc.hosts[i], tc.nodes[i] = h, c
}

func (tc *testCluster) stop(i int) {
	tc.nodes[i].Close()
	for _, l := range tc.nodes[i].groups {
		l.Close()
	}
	tc.nodes[i] = nil
}

// settle delivers frames and steps every member until nothing moves.
func (tc *testCluster) settle() {
	for range 10_000 {
		moved := tc.net.deliver(tc.t)
		for _, c := range tc.nodes {
			if c != nil && c.Step() {
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	tc.t.Fatal("the cluster never settled")
}

// runUntil advances virtual time a millisecond at a time, settling after
// each, until cond holds; it fails the test after limit.
func (tc *testCluster) runUntil(limit time.Duration, what string, cond func() bool) {
	tc.t.Helper()
	for end := tc.clock.NowNanos() + int64(limit); ; {
		tc.settle()
		if cond() {
			return
		}
		if tc.clock.NowNanos() >= end {
			tc.t.Fatalf("not within %v of virtual time: %s", limit, what)
		}
		tc.clock.Advance(time.Millisecond)
	}
}

// runFor advances virtual time by d, settling every millisecond.
func (tc *testCluster) runFor(d time.Duration) {
	for end := tc.clock.NowNanos() + int64(d); tc.clock.NowNanos() < end; {
		tc.settle()
		tc.clock.Advance(time.Millisecond)
	}
	tc.settle()
}

// metaLeader is the index of the member leading `__meta`, or -1.
func (tc *testCluster) metaLeader() int {
	for i, c := range tc.nodes {
		if c != nil && !tc.net.cut[uint32(i+1)] && c.metaLog.Status().Role == replica.Leader {
			return i
		}
	}
	return -1
}

type declareResult struct {
	answered bool
	created  bool
	err      error
	atNanos  int64
}

func (tc *testCluster) declare(i int, cfg wire.TopicConfig) *declareResult {
	r := &declareResult{}
	tc.nodes[i].DeclareAsync(cfg, func(created bool, err error) {
		if r.answered {
			tc.t.Errorf("DECLARE %s on n%d answered twice", cfg.Name, i+1)
		}
		r.answered, r.created, r.err, r.atNanos = true, created, err, tc.clock.NowNanos()
	})
	return r
}

func codeOf(err error) wire.Code {
	if we, ok := err.(*wire.Error); ok {
		return we.Code
	}
	return wire.CodeOK
}

// TestDeclareOnAFollowerReachesEveryMember: a DECLARE on a node that does
// not lead `__meta` is forwarded, decided once, committed and applied on
// every member, which all start the topic with the same placement; the
// same DECLARE again is answered as existing, a different one as a
// conflict, and a bad replication factor is refused before any of it.
func TestDeclareOnAFollowerReachesEveryMember(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	follower := (tc.metaLeader() + 1) % 3
	orders := wire.TopicConfig{Name: "orders", Partitions: 4, Replicas: 3}
	r := tc.declare(follower, orders)
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if r.err != nil || !r.created {
		t.Fatalf("DECLARE on follower n%d: created %v, err %v", follower+1, r.created, r.err)
	}
	tc.runUntil(time.Second, "every member started orders", func() bool {
		for _, h := range tc.hosts {
			if _, ok := h.started["orders"]; !ok {
				return false
			}
		}
		return true
	})
	placement := tc.hosts[0].started["orders"]
	if len(placement) != 4 {
		t.Fatalf("placement %v: want 4 partitions", placement)
	}
	leads := map[uint32]int{}
	for p, group := range placement {
		if len(group) != 3 || len(slices.Compact(slices.Sorted(slices.Values(group)))) != 3 {
			t.Fatalf("partition %d placed on %v: want 3 distinct nodes", p, group)
		}
		leads[group[0]]++
	}
	if len(leads) != 3 {
		t.Fatalf("the first replicas (preferred leaders) of 4 partitions fall on %v: want every node", leads)
	}
	for i, h := range tc.hosts {
		if !slices.EqualFunc(h.started["orders"], placement, slices.Equal) {
			t.Fatalf("n%d started orders with placement %v, n1 with %v", i+1, h.started["orders"], placement)
		}
		st, err := tc.nodes[i].loadState() // what a restart would read
		if _, ok := st.Topics["orders"]; err != nil || !ok {
			t.Fatalf("n%d: persisted metadata lacks orders (err %v)", i+1, err)
		}
	}
	// Every partition's replica group elects its first replica, which
	// campaigns first: the leaders spread over the nodes.
	tc.runUntil(5*time.Second, "each partition led by its first replica", func() bool {
		for p, group := range placement {
			if v, ok := tc.nodes[group[0]-1].Replica("orders", uint32(p)); !ok || v.Status.Role != replica.Leader {
				return false
			}
		}
		return true
	})

	again := tc.declare((follower+1)%3, orders)
	tc.runUntil(3*time.Second, "the repeated DECLARE answered", func() bool { return again.answered })
	if again.err != nil || again.created {
		t.Fatalf("an identical DECLARE: created %v, err %v; want existing, no error", again.created, again.err)
	}
	other := orders
	other.Partitions = 8
	conflict := tc.declare(follower, other)
	tc.runUntil(3*time.Second, "the conflicting DECLARE answered", func() bool { return conflict.answered })
	if codeOf(conflict.err) != wire.CodeTopicConflict || !strings.Contains(conflict.err.Error(), "partitions=4") {
		t.Fatalf("a conflicting DECLARE: %v; want TOPIC_CONFLICT naming the existing partitions=4", conflict.err)
	}
	bad := tc.declare(follower, wire.TopicConfig{Name: "two", Partitions: 1, Replicas: 2})
	if !bad.answered || codeOf(bad.err) != wire.CodeInvalidArgument {
		t.Fatalf("replicas=2: answered %v, err %v; want INVALID_ARGUMENT at once", bad.answered, bad.err)
	}
	for i, h := range tc.hosts {
		if !slices.EqualFunc(h.started["orders"], placement, slices.Equal) || h.started["two"] != nil {
			t.Fatalf("n%d's topics changed after refused DECLAREs: %v", i+1, h.started)
		}
	}
}

// TestDeclareWithoutAQuorumIsAnsweredInTime: a DECLARE that cannot commit
// (the metadata leader is alone) is answered with a retryable error once
// its deadline passes, and nothing is started anywhere; a member that
// never heard of a leader says so.
func TestDeclareWithoutAQuorumIsAnsweredInTime(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	leader := tc.metaLeader()
	for i := range 3 {
		if i != leader {
			tc.net.cut[uint32(i+1)] = true
		}
	}
	start := tc.clock.NowNanos()
	r := tc.declare(leader, wire.TopicConfig{Name: "lonely", Partitions: 1, Replicas: 3})
	tc.runUntil(5*time.Second, "the DECLARE answered", func() bool { return r.answered })
	took := time.Duration(r.atNanos - start)
	if c := codeOf(r.err); (c != wire.CodeUnavailable && c != wire.CodeQuorumLost) || !c.Retryable() {
		t.Fatalf("DECLARE on a leader without quorum: %v; want a retryable UNAVAILABLE or QUORUM_LOST", r.err)
	}
	if took > tc.config.DeclareTimeout+100*time.Millisecond {
		t.Fatalf("answered after %v; the deadline is %v", took, tc.config.DeclareTimeout)
	}
	for i, h := range tc.hosts {
		if h.started["lonely"] != nil {
			t.Fatalf("n%d started a topic that never committed", i+1)
		}
	}

	// A fresh cluster whose members cannot reach each other has no
	// metadata leader at all.
	alone := newTestCluster(t, 3)
	alone.net.cut[2], alone.net.cut[3] = true, true
	r = alone.declare(0, wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 1})
	alone.runUntil(5*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if codeOf(r.err) != wire.CodeUnavailable || !strings.Contains(r.err.Error(), "no metadata leader") {
		t.Fatalf("DECLARE with no metadata leader: %v; want UNAVAILABLE saying there is none", r.err)
	}
}

// TestAppliedMetadataSurvivesARestart: a member restarted over its disk
// starts the topics its persisted metadata names before it hears from any
// peer, and it does not start them twice when the log is applied again.
func TestAppliedMetadataSurvivesARestart(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	r := tc.declare(tc.metaLeader(), wire.TopicConfig{Name: "kept", Partitions: 2, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered && tc.hosts[2].started["kept"] != nil })
	if r.err != nil {
		t.Fatal(r.err)
	}
	placement := tc.hosts[2].started["kept"]
	tc.stop(2)
	tc.net.cut[3] = true
	tc.start(2)
	if got := tc.hosts[2].started["kept"]; !slices.EqualFunc(got, placement, slices.Equal) {
		t.Fatalf("restarted n3 started kept with %v before any peer frame; want %v", got, placement)
	}
	for p := range placement {
		if _, ok := tc.nodes[2].Replica("kept", uint32(p)); !ok {
			t.Fatalf("restarted n3 does not host partition %d it is placed on", p)
		}
	}
	tc.net.cut[3] = false
	tc.runUntil(3*time.Second, "n3 applies the metadata log again", func() bool { return tc.nodes[2].applied() >= tc.nodes[0].applied() })
	if n := len(tc.hosts[2].started); n != 1 {
		t.Fatalf("restarted n3 started %d topics: %v", n, tc.hosts[2].started)
	}
}

// TestForwardedDeclareFollowsANewMetadataLeader: a DECLARE forwarded to
// the metadata leader, which is then cut off, is asked again of the
// leader the others elect as soon as the asking node hears of it — not
// answered UNAVAILABLE at its deadline (the cluster simulator's S20 script
// lost most of a cut that way).
func TestForwardedDeclareFollowsANewMetadataLeader(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	old := tc.metaLeader()
	asker := (old + 1) % 3
	start := tc.clock.NowNanos()
	tc.net.hold[uint32(old+1)] = true // what it is sent waits; it answers nothing
	r := tc.declare(asker, wire.TopicConfig{Name: "moved", Partitions: 1, Replicas: 3})
	tc.runFor(50 * time.Millisecond)
	tc.net.hold[uint32(old+1)] = false
	tc.net.cut[uint32(old+1)] = true
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if r.err != nil || !r.created {
		t.Fatalf("DECLARE via n%d after n%d was cut off: created %v, %v; want created by the new metadata leader", asker+1, old+1, r.created, r.err)
	}
	if took := time.Duration(r.atNanos - start); took >= tc.config.DeclareTimeout {
		t.Fatalf("answered after %v, not before the deadline (%v)", took, tc.config.DeclareTimeout)
	}
}

// TestForwardedDeclareAsksAgain guards ForwardedDeclareAsksAgain: a
// DECLARE whose forward to the metadata leader was lost (a peer
// connection that broke with it) is asked again of the same leader and
// answered well before its deadline, with the cluster healthy; and a
// forward whose answer was lost too.
func TestForwardedDeclareAsksAgain(t *testing.T) {
	for _, lose := range []wire.FrameType{wire.TypePeerDeclare, wire.TypePeerDeclareOK} {
		t.Run(lose.String(), func(t *testing.T) {
			tc := newTestCluster(t, 3)
			tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
			leader := tc.metaLeader()
			asker := (leader + 1) % 3
			lost := 0
			tc.net.drop = func(_, _ uint32, f wire.Frame) bool {
				if f.Type() == lose && lost == 0 {
					lost++
					return true
				}
				return false
			}
			start := tc.clock.NowNanos()
			r := tc.declare(asker, wire.TopicConfig{Name: "asked", Partitions: 1, Replicas: 3})
			tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
			if lost != 1 || tc.metaLeader() != leader {
				t.Fatalf("lost %d %v frame(s), metadata leader n%d (was n%d); want one lost, the same leader", lost, lose, tc.metaLeader()+1, leader+1)
			}
			if r.err != nil {
				t.Fatalf("DECLARE via n%d after its forward's %v was lost: %v; want it created", asker+1, lose, r.err)
			}
			if took := time.Duration(r.atNanos - start); took >= tc.config.DeclareTimeout*3/4 {
				t.Fatalf("answered after %v; the deadline is %v, asking again takes %d ms", took, tc.config.DeclareTimeout, declareAskAgainMs)
			}
		})
	}
}

// TestDeclareWaitsOnTheMonotonicClock guards DeclareWaitsAreMonotonic: a
// DECLARE's waits are measured on the monotonic clock, so a step of the
// asker's wall clock (an hour back, right after its forward was lost)
// neither holds it past asking again nor past its deadline.
func TestDeclareWaitsOnTheMonotonicClock(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	asker := (tc.metaLeader() + 1) % 3
	lost := false
	tc.net.drop = func(_, _ uint32, f wire.Frame) bool {
		if f.Type() == wire.TypePeerDeclare && !lost {
			lost = true
			tc.skewMs[asker] = -time.Hour.Milliseconds()
			return true
		}
		return false
	}
	start := tc.clock.NowNanos()
	r := tc.declare(asker, wire.TopicConfig{Name: "stepped", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if !lost || r.err != nil {
		t.Fatalf("DECLARE via n%d, its forward lost (%v) and its wall clock stepped an hour back: %v; want it created", asker+1, lost, r.err)
	}
	if took := time.Duration(r.atNanos - start); took >= tc.config.DeclareTimeout*3/4 {
		t.Fatalf("answered after %v; the deadline is %v, asking again takes %d ms", took, tc.config.DeclareTimeout, declareAskAgainMs)
	}

	// A group command's deadline, too: the coordinator alone (no quorum),
	// its wall clock stepped back, answers in time.
	leader := tc.metaLeader()
	for i := range 3 {
		if i != leader {
			tc.net.cut[uint32(i+1)] = true
		}
	}
	start = tc.clock.NowNanos()
	var answered bool
	var gerr error
	tc.nodes[leader].ProposeMeta(DecideGroupDelete("g", true, 0), func(err error) { answered, gerr = true, err })
	tc.skewMs[leader] = -time.Hour.Milliseconds()
	tc.runUntil(5*time.Second, "the group command answered", func() bool { return answered })
	if codeOf(gerr) != wire.CodeUnavailable && codeOf(gerr) != wire.CodeQuorumLost {
		t.Fatalf("group command without a quorum: %v; want UNAVAILABLE or QUORUM_LOST", gerr)
	}
	if took := time.Duration(tc.clock.NowNanos() - start); took > tc.config.DeclareTimeout+100*time.Millisecond {
		t.Fatalf("group command answered after %v; the deadline is %v", took, tc.config.DeclareTimeout)
	}
}

// TestForwardedPublishIsAnsweredExactlyOnce: a publish forwarded to
// another member gets that member's answer; one to an unreachable member
// gets UNAVAILABLE at its deadline and nothing more when the link heals;
// one still waiting when the node closes gets "shutting down".
func TestForwardedPublishIsAnsweredExactlyOnce(t *testing.T) {
	tc := newTestCluster(t, 3)
	type answer struct {
		ok  wire.PubOK
		err *wire.Error
	}
	var got []answer
	record := func(ok wire.PubOK, err *wire.Error) { got = append(got, answer{ok, err}) }
	pub := &wire.Pub{Topic: "orders", Partition: 1, ProducerID: 9, ProducerSeq: 3, Value: []byte("v")}

	tc.nodes[0].ForwardPublish(2, pub, 5, record)
	tc.runUntil(time.Second, "the forwarded publish answered", func() bool { return len(got) > 0 })
	if len(got) != 1 || got[0].err != nil || got[0].ok.Seq != 42 || got[0].ok.Partition != 1 {
		t.Fatalf("forwarded publish: %+v; want one PubOK with n2's seq 42", got)
	}
	if h := tc.hosts[1]; len(h.pubs) != 1 || h.pubs[0].ProducerSeq != 3 || string(h.pubs[0].Value) != "v" || h.pubIncarnations[0] != 5 {
		t.Fatalf("n2 published %+v into incarnation %v; want the forwarded PUB once, identity and incarnation 5 kept", h.pubs, h.pubIncarnations)
	}

	got = nil
	tc.net.hold[3] = true
	tc.nodes[0].ForwardPublish(3, pub, 0, record)
	tc.runUntil(3*time.Second, "the unanswered publish timed out", func() bool { return len(got) > 0 })
	if got[0].err == nil || got[0].err.Code != wire.CodeUnavailable || !strings.Contains(got[0].err.Message, "did not answer") {
		t.Fatalf("forward to a silent member: %+v; want UNAVAILABLE at the deadline", got[0])
	}
	tc.net.hold[3] = false // the PUB arrives late, and so does its answer
	tc.runFor(500 * time.Millisecond)
	if len(tc.hosts[2].pubs) != 1 {
		t.Fatalf("n3 published %d forwarded PUBs after the heal; want the late one", len(tc.hosts[2].pubs))
	}
	if len(got) != 1 {
		t.Fatalf("forwarded publish answered %d times: %+v", len(got), got)
	}

	got = nil
	tc.net.cut[2] = true
	tc.nodes[0].ForwardPublish(2, pub, 0, record)
	tc.stop(0)
	if len(got) != 1 || got[0].err == nil || !strings.Contains(got[0].err.Message, "shutting down") {
		t.Fatalf("forward pending at close: %+v; want one UNAVAILABLE saying the node is shutting down", got)
	}
}

// TestReplicateFromAnImpostorIsDropped: a REPLICATE frame naming another
// sender than the authenticated peer never reaches the replica group.
func TestReplicateFromAnImpostorIsDropped(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	leader := tc.metaLeader()
	victim := (leader + 1) % 3
	impostor := (leader + 2) % 3
	before := tc.nodes[victim].metaLog.Status()
	// A PREPARE of a far later epoch, claiming to come from the leader but
	// sent by another member: taken at face value it would make the
	// victim promise that epoch and leave its leader. Forced (as a
	// transfer's target campaigns): the victim still hears its leader and
	// promises nothing else (PrepareRespectsLease).
	m := replica.Message{Type: replica.MsgPrepare, From: replica.NodeID(leader + 1), To: replica.NodeID(victim + 1),
		Epoch: before.Hard.Promised + 10, Forced: true}
	tc.nodes[impostor].tr.Send(uint32(victim+1), replog.ToWire("__meta", 0, m))
	tc.settle()
	after := tc.nodes[victim].metaLog.Status()
	if after.Hard.Promised != before.Hard.Promised {
		t.Fatalf("n%d promised epoch %d on a frame n%d forged in n%d's name (was %d)", victim+1, after.Hard.Promised, impostor+1, leader+1, before.Hard.Promised)
	}
	// The same frame from its real sender is taken.
	tc.nodes[leader].tr.Send(uint32(victim+1), replog.ToWire("__meta", 0, m))
	tc.settle()
	if got := tc.nodes[victim].metaLog.Status().Hard.Promised; got != m.Epoch {
		t.Fatalf("n%d promised %d on the genuine PREPARE of epoch %d", victim+1, got, m.Epoch)
	}
}

// TestADamagedTopicIsNotStartedNorRetried (DamageStaysLocal): a topic
// whose start finds damage its replicas cannot drop and rebuild leaves
// the member running without it — its other topics and the metadata
// member run — reported by Damaged and Starting, and its start is not
// retried (damage does not go away by itself).
func TestADamagedTopicIsNotStartedNorRetried(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	r := tc.declare(tc.metaLeader(), wire.TopicConfig{Name: "hurt", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	sick := (tc.metaLeader() + 1) % 3
	tc.runUntil(time.Second, "the topic started", func() bool { return tc.hosts[sick].started["hurt"] != nil })
	tc.stop(sick)
	tc.corrupt = map[int]string{sick: "hurt"}
	tc.start(sick)
	tc.runFor(200 * time.Millisecond)
	starting, damage := tc.nodes[sick].Starting("hurt")
	if !starting || !errors.Is(damage, storage.ErrCorrupt) || tc.nodes[sick].Damaged()["hurt"] == nil {
		t.Fatalf("n%d: starting %v, damage %v, Damaged %v", sick+1, starting, damage, tc.nodes[sick].Damaged())
	}
	if calls := tc.hosts[sick].startCalls; calls != 1 {
		t.Fatalf("the damaged topic's start was tried %d times", calls)
	}
	r = tc.declare(sick, wire.TopicConfig{Name: "later", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "a topic declared through the damaged member starts there", func() bool {
		return r.answered && tc.hosts[sick].started["later"] != nil
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Damage found by a start while the member runs: the same answer.
	tc.hosts[sick].corruptTopic = "hurt-later"
	calls := tc.hosts[sick].startCalls
	r = tc.declare(sick, wire.TopicConfig{Name: "hurt-later", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	tc.runFor(200 * time.Millisecond)
	starting, damage = tc.nodes[sick].Starting("hurt-later")
	if !starting || !errors.Is(damage, storage.ErrCorrupt) {
		t.Fatalf("a damaged start while running: starting %v, damage %v", starting, damage)
	}
	if n := tc.hosts[sick].startCalls - calls; n != 1 {
		t.Fatalf("the damaged topic's start was tried %d times while running", n)
	}
}

// TestAFailedTopicStartIsRetried: a member whose start of a declared topic
// fails (a disk error opening its replicas) says the topic is starting —
// the node answers UNAVAILABLE for it, not NOT_FOUND — and starts it on a
// later pass; the DECLARE itself is answered by the other members.
func TestAFailedTopicStartIsRetried(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	sick := (tc.metaLeader() + 1) % 3
	tc.hosts[sick].startFailures = 1 << 30 // until the disk recovers
	r := tc.declare(tc.metaLeader(), wire.TopicConfig{Name: "retried", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if r.err != nil {
		t.Fatal(r.err)
	}
	tc.runFor(100 * time.Millisecond)
	calls := tc.hosts[sick].startCalls
	starting, damage := tc.nodes[sick].Starting("retried")
	if !starting || damage != nil || tc.hosts[sick].started["retried"] != nil || calls < 2 {
		t.Fatalf("while its starts fail n%d says starting=%v (damage %v), started %v, after %d calls; want starting, retried",
			sick+1, starting, damage, tc.hosts[sick].started, calls)
	}
	tc.hosts[sick].startFailures = 0
	tc.runUntil(time.Second, "the start retried once the disk recovers", func() bool { return tc.hosts[sick].started["retried"] != nil })
	if starting, _ := tc.nodes[sick].Starting("retried"); starting {
		t.Fatalf("n%d still says starting once started", sick+1)
	}
	if starting, _ := tc.nodes[(sick+1)%3].Starting("retried"); starting {
		t.Fatal("a healthy member reports the topic as still starting")
	}
}

// TestDamagedMetaStateIsRebuiltFromTheLog (N25): meta.json is derived
// from the metadata log, which is never compacted. A member whose copy
// went bad used to refuse to start; it now starts from an empty state,
// replays the log as a member with an empty disk would, starts the
// topics that exist — not the one deleted — and writes meta.json again,
// equal to another member's.
func TestDamagedMetaStateIsRebuiltFromTheLog(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	for _, name := range []string{"kept", "gone"} {
		r := tc.declare(tc.metaLeader(), wire.TopicConfig{Name: name, Partitions: 2, Replicas: 3})
		tc.runUntil(3*time.Second, "the DECLARE of "+name, func() bool { return r.answered })
	}
	deleted := false
	leader := tc.metaLeader()
	tc.nodes[leader].ProposeMeta(func(st *meta.State) (meta.Command, error) { return st.DecideTopicDelete("gone", 0) },
		func(err error) {
			if err != nil {
				t.Errorf("delete gone: %v", err)
			}
			deleted = true
		})
	sick := (leader + 1) % 3
	tc.runUntil(3*time.Second, "gone deleted on every member", func() bool {
		return deleted && tc.hosts[sick].started["gone"] == nil && tc.hosts[sick].started["kept"] != nil
	})
	tc.stop(sick)
	file := path.Join("/data", MetaStateFile)
	if err := tc.fs[sick].FlipBit(file, 20, 4); err != nil {
		t.Fatal(err)
	}
	tc.start(sick)
	tc.runUntil(3*time.Second, "kept started again", func() bool { return tc.hosts[sick].started["kept"] != nil })
	ref, err := tc.nodes[leader].loadState()
	if err != nil {
		t.Fatal(err)
	}
	tc.runUntil(3*time.Second, "meta.json written again", func() bool {
		st, err := tc.nodes[sick].loadState()
		return err == nil && st.Applied == ref.Applied
	})
	got, _ := tc.nodes[sick].loadState()
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(ref)
	if string(a) != string(b) {
		t.Fatalf("rebuilt state\n%s\nthe leader's\n%s", a, b)
	}
	if tc.hosts[sick].started["gone"] != nil {
		t.Fatal("the deleted topic is started again")
	}
}

// heirOfAnUnappliedEntry runs setup (when not nil) and then first on the
// metadata leader, each answered OK, then stops it: the member that took first's entry — and no APPEND after it, which
// would carry its commit — leads next (its log is the longer), but the
// third member's FLUSHED answers to it are lost until the test sets
// tc.net.drop again, so its install entry does not commit: it leads with
// an entry committed under the old leader sitting unapplied in its log.
func heirOfAnUnappliedEntry(t *testing.T, setup, first func(c *Cluster, done func(error))) (tc *testCluster, heir, other int) {
	tc = newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	old := tc.metaLeader()
	run := func(what string, f func(c *Cluster, done func(error))) {
		var answered bool
		var err error
		f(tc.nodes[old], func(e error) { answered, err = true, e })
		tc.runUntil(2*time.Second, what+" answered", func() bool { return answered })
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	if setup != nil {
		run("the setup", setup)
		tc.settle()
	}
	heir, other = (old+1)%3, (old+2)%3
	oldID, heirID, otherID := uint32(old+1), uint32(heir+1), uint32(other+1)
	metaMsg := func(from, to uint32, f wire.Frame, kind replica.MsgType) (*wire.Replicate, bool) {
		r, ok := f.(*wire.Replicate)
		return r, ok && r.Topic == meta.MetaTopic && r.From == from && r.To == to && replica.MsgType(r.Kind) == kind
	}
	took := false
	tc.net.drop = func(from, to uint32, f wire.Frame) bool {
		if from == oldID && to == otherID {
			return true
		}
		r, ok := metaMsg(oldID, heirID, f, replica.MsgAppend)
		if !ok {
			return false
		}
		if took {
			return true
		}
		took = len(r.Entries) > 0
		return false
	}
	run("the first command", first)
	if tc.nodes[heir].applied() >= tc.nodes[old].applied() {
		t.Fatalf("applied at the old leader %d, at the heir %d; want the first command applied at the old leader alone",
			tc.nodes[old].applied(), tc.nodes[heir].applied())
	}
	tc.stop(old)
	tc.net.drop = func(from, to uint32, f wire.Frame) bool {
		_, ok := metaMsg(otherID, heirID, f, replica.MsgAppendAck)
		return ok
	}
	tc.runUntil(5*time.Second, "the heir leads", func() bool { return tc.metaLeader() == heir })
	return tc, heir, other
}

// TestCoordinatorDecidesOnceItTookOffice: a new metadata leader whose log
// holds a committed group delete it has not applied decides no group
// command until it applied its own install entry (CoordinatorTookOffice).
// A forced delete asked of it meanwhile then deletes the incarnation after
// the deleted one; decided at once, against the state of before, it named
// the deleted incarnation again, changed nothing when it applied, and was
// answered OK.
func TestCoordinatorDecidesOnceItTookOffice(t *testing.T) {
	tc, heir, other := heirOfAnUnappliedEntry(t, nil, func(c *Cluster, done func(error)) {
		c.ProposeMeta(DecideGroupDelete("g", true, 0), done)
	})
	deleted := func(i int) uint64 {
		var inc uint64
		tc.nodes[i].ReadGroups(func(st *meta.State) { inc = st.GroupsDeleted["g"] })
		return inc
	}
	readIncarnation := func() (inc uint64, err error) {
		err = tc.nodes[heir].ReadCoordinated(func(st *meta.State) { inc = st.GroupIncarnation("g") })
		return inc, err
	}
	var answered bool
	var err error
	tc.nodes[heir].ProposeMeta(DecideGroupDelete("g", true, 0), func(e error) { answered, err = true, e })
	tc.runFor(100 * time.Millisecond)
	if deleted(heir) != 0 || answered {
		t.Fatalf("before its install entry committed the heir applied incarnation %d's delete (want none) or answered the second (%v, %v)", deleted(heir), answered, err)
	}
	if inc, err := readIncarnation(); codeOf(err) != wire.CodeUnavailable {
		t.Fatalf("the heir, not in office, read the group's incarnation: %d, %v; want UNAVAILABLE", inc, err)
	}
	tc.net.drop = nil
	tc.runUntil(3*time.Second, "the second delete answered", func() bool { return answered })
	tc.runFor(100 * time.Millisecond)
	if err != nil || deleted(heir) != 2 || deleted(other) != 2 {
		t.Fatalf("second delete, asked of the heir before it took office: %v; incarnation deleted at the heir %d, at the other %d; want 2 (the one after the deleted one)",
			err, deleted(heir), deleted(other))
	}
	if inc, err := readIncarnation(); inc != 3 || err != nil {
		t.Fatalf("the heir in office read the group's incarnation: %d, %v; want 3", inc, err)
	}
}

// TestCoordinatorDeclaresOnceItTookOffice: the same for a DECLARE of a
// topic whose delete sits unapplied in the new leader's log: decided at
// once it found the topic existing and answered so, and the delete then
// applied — the topic the client was told exists did not. Now it waits,
// and creates the topic's next incarnation.
func TestCoordinatorDeclaresOnceItTookOffice(t *testing.T) {
	cfg := wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3}
	tc, heir, _ := heirOfAnUnappliedEntry(t, func(c *Cluster, done func(error)) {
		c.DeclareAsync(cfg, func(_ bool, err error) { done(err) })
	}, func(c *Cluster, done func(error)) {
		c.ProposeMeta(func(st *meta.State) (meta.Command, error) { return st.DecideTopicDelete(cfg.Name, 0) }, done)
	})
	r := tc.declare(heir, cfg)
	tc.runFor(100 * time.Millisecond)
	if r.answered {
		t.Fatalf("the heir answered a DECLARE before its install entry committed: created %v, %v", r.created, r.err)
	}
	tc.net.drop = nil
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	var topic meta.Topic
	var exists bool
	tc.nodes[heir].ReadGroups(func(st *meta.State) { topic, exists = st.Topics[cfg.Name] })
	if r.err != nil || !r.created || !exists || topic.Incarnation != 2 {
		t.Fatalf("DECLARE asked of the heir before it took office: created %v, %v; topic %+v; want incarnation 2 created", r.created, r.err, topic)
	}
}

// TestDeposedCoordinatorAnswersNothing: a metadata leader cut off from
// the others goes on leading its epoch as far as it knows, while the
// others elect a newer leader, which deletes a group. The deposed one
// has taken office long ago, but its applied state lacks the delete: it
// must neither read the group's incarnation nor decide a command against
// it once its lease ran out (CoordinatorHoldsLease). Without the lease
// it read the deleted incarnation 1 and refused a delete of the current
// one, 2, as NOT_FOUND.
func TestDeposedCoordinatorAnswersNothing(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		t.Run(fmt.Sprintf("without-lease=%v", mutated), func(t *testing.T) {
			tc := newTestCluster(t, 3)
			if mutated {
				for i := range tc.nodes {
					tc.nodes[i].opts.AnswerWithoutLease = true
				}
			}
			tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
			old := tc.metaLeader()
			tc.net.cut[uint32(old+1)] = true
			tc.runUntil(10*time.Second, "a newer metadata leader", func() bool { return tc.metaLeader() >= 0 })
			heir := tc.metaLeader()
			var answered bool
			var err error
			tc.nodes[heir].ProposeMeta(DecideGroupDelete("g", true, 0), func(e error) { answered, err = true, e })
			tc.runUntil(2*time.Second, "the delete answered", func() bool { return answered })
			if err != nil {
				t.Fatal(err)
			}
			deposed := tc.nodes[old]
			if deposed.metaLog.Status().Role != replica.Leader {
				t.Fatalf("the cut-off leader n%d no longer leads: the test needs it deposed but unaware", old+1)
			}
			var inc uint64
			rerr := deposed.ReadCoordinated(func(st *meta.State) { inc = st.GroupIncarnation("g") })
			answered, err = false, nil
			deposed.ProposeMeta(DecideGroupDelete("g", true, 2), func(e error) { answered, err = true, e })
			tc.runUntil(3*time.Second, "the deposed leader's answer", func() bool { return answered })
			if mutated {
				if rerr != nil || inc != 1 || codeOf(err) != wire.CodeNotFound {
					t.Fatalf("without the lease guard: read %d, %v; delete of incarnation 2: %v; want the stale 1 and NOT_FOUND", inc, rerr, err)
				}
				return
			}
			if codeOf(rerr) != wire.CodeUnavailable || codeOf(err) != wire.CodeUnavailable {
				t.Fatalf("the deposed leader read incarnation %d (%v) and answered the delete of incarnation 2 with %v; want UNAVAILABLE for both", inc, rerr, err)
			}
		})
	}
}

// updateTopic proposes a retention update of topic name at member i and
// returns its answer once it came.
func (tc *testCluster) updateTopic(i int, u wire.TopicUpdate) error {
	tc.t.Helper()
	var answered bool
	var err error
	tc.nodes[i].ProposeMeta(func(st *meta.State) (meta.Command, error) {
		cmd, _, _, err := st.DecideTopicUpdate(u)
		return cmd, err
	}, func(e error) { answered, err = true, e })
	tc.runUntil(3*time.Second, "the update answered", func() bool { return answered })
	return err
}

// A topic update reaches every member through the metadata log: a member
// running the topic hears it (Host.TopicUpdated); one whose start of the
// topic keeps failing starts it, once its disk recovers, with the updated
// settings, not those of the declare. An update that changes nothing is
// answered without an entry in the metadata log.
func TestTopicUpdateReachesEveryMember(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.runUntil(5*time.Second, "a metadata leader", func() bool { return tc.metaLeader() >= 0 })
	leader := tc.metaLeader()
	sick := (leader + 1) % 3
	tc.hosts[sick].startFailures = 1 << 30
	r := tc.declare(leader, wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	tc.runUntil(3*time.Second, "the DECLARE answered", func() bool { return r.answered })
	if r.err != nil {
		t.Fatal(r.err)
	}
	u := wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "t"}, Set: wire.SetRetentionMs, RetentionMs: 5000}
	if err := tc.updateTopic(leader, u); err != nil {
		t.Fatal(err)
	}
	tc.runFor(100 * time.Millisecond)
	for i, h := range tc.hosts {
		var cfg wire.TopicConfig
		tc.nodes[i].ReadGroups(func(st *meta.State) { cfg = st.Topics["t"].Config })
		if cfg.RetentionMs != 5000 {
			t.Fatalf("n%d applied retention %d ms, want 5000", i+1, cfg.RetentionMs)
		}
		heard := len(h.updated) == 1 && h.updated[0].Config == cfg && h.updated[0].Incarnation == 1
		if i != sick && !heard {
			t.Fatalf("n%d's host heard %+v, want the update", i+1, h.updated)
		}
	}
	tc.hosts[sick].startFailures = 0
	tc.runUntil(time.Second, "the sick member starts the topic", func() bool { return tc.hosts[sick].started["t"] != nil })
	if got := tc.hosts[sick].configs["t"]; got.RetentionMs != 5000 {
		t.Fatalf("n%d started the topic with retention %d ms, want the updated 5000", sick+1, got.RetentionMs)
	}

	applied := tc.nodes[leader].applied()
	if err := tc.updateTopic(leader, u); err != nil {
		t.Fatalf("the same update again: %v", err)
	}
	tc.runFor(100 * time.Millisecond)
	if got := tc.nodes[leader].applied(); got != applied {
		t.Fatalf("an update that changes nothing went through the metadata log: applied %d, then %d", applied, got)
	}
}
