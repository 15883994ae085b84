package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/peer"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// ClusterConfig makes a node a member of a cluster: its partitions become
// replica groups and its topics come from the `__meta` log.
type ClusterConfig struct {
	// Members is the initial cluster, this node (Config.NodeID) included,
	// by peer address. Every member must be given the same list.
	Members []Member
	// Secret authenticates peers (at least 16 bytes) on the TCP peer
	// network, the one a node uses when its Config.Env.Peers is nil.
	Secret []byte
	// PeerListener, when set, is used by the TCP peer network instead of
	// listening on this node's peer address (tests pick free ports first).
	PeerListener net.Listener
	// Tick is the replication kernel's tick (default 10 ms); a leader is
	// suspected after ElectionTicks ticks without news (0: the replication
	// kernel's default, replica.Config).
	Tick          time.Duration
	ElectionTicks int
	// DeclareTimeout bounds a DECLARE through the metadata log (default 10 s).
	DeclareTimeout time.Duration
	// Reservation is how long a partition leader keeps the log a silent
	// follower still needs before retention may delete it (default 30 s);
	// a follower away longer rebuilds from the leader's snapshot point.
	Reservation time.Duration
}

// Member is one node of the initial cluster.
type Member struct {
	ID       string
	PeerAddr string
}

// groupID names a replica group on the peer transport.
type groupID struct {
	topic     string
	partition uint32
}

// cluster is a node's membership: the peer transport, the metadata log and
// the replica groups of the partitions it hosts.
type cluster struct {
	n       *Node
	cfg     ClusterConfig
	names   []string // node number i+1 is names[i] (sorted ids)
	self    replica.NodeID
	tr      env.PeerLink // this node on the peer network (Config.Env.Peers)
	metaLog *replog.Log

	mu     sync.RWMutex
	groups map[groupID]*replog.Log

	// Metadata state, applied by the applier goroutine (metaMu guards it
	// for readers); appliedCh is closed and replaced after every apply.
	metaMu    sync.Mutex
	state     *meta.State
	appliedCh chan struct{}
	metaWake  chan struct{}

	ready     chan struct{} // closed once the members are open: peer frames wait for it
	declareMu sync.Mutex    // serializes DECLAREs on the metadata leader
	reqID     atomic.Uint64
	fwdMu     sync.Mutex
	forwards  map[uint64]chan *wire.PeerDeclareOK
	// pubForwards are the publishes forwarded to partition leaders
	// (forward.go).
	pubForwards forwardedPubs

	done chan struct{}
	wg   sync.WaitGroup
}

const metaStateFile = "meta.json"

func (c *ClusterConfig) setDefaults() {
	if c.Tick == 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.DeclareTimeout == 0 {
		c.DeclareTimeout = 10 * time.Second
	}
}

// openCluster joins the cluster: restores the applied metadata, starts the
// topics it names, the metadata member and the peer transport.
func (n *Node) openCluster() error {
	cc := *n.cfg.Cluster
	cc.setDefaults()
	c := &cluster{n: n, cfg: cc, groups: map[groupID]*replog.Log{}, appliedCh: make(chan struct{}), ready: make(chan struct{}),
		metaWake: make(chan struct{}, 1), forwards: map[uint64]chan *wire.PeerDeclareOK{}, done: make(chan struct{})}
	peers := map[uint32]string{}
	for _, m := range cc.Members {
		c.names = append(c.names, m.ID)
	}
	slices.Sort(c.names)
	if len(c.names) == 0 || len(slices.Compact(slices.Clone(c.names))) != len(c.names) {
		return errors.New("node: cluster members must be non-empty with unique ids")
	}
	if len(c.names) > meta.MembersMax {
		return fmt.Errorf("node: clusters of more than %d nodes are not supported yet (got %d)", meta.MembersMax, len(c.names))
	}
	for _, m := range cc.Members {
		peers[c.number(m.ID)] = m.PeerAddr
	}
	c.self = replica.NodeID(c.number(n.cfg.NodeID))
	if c.self == 0 {
		return fmt.Errorf("node: %q is not among the cluster members %v", n.cfg.NodeID, c.names)
	}
	n.cluster = c
	st, err := c.loadState()
	if err != nil {
		return err
	}
	c.state = st
	// The peer network first (members send through it), but peer frames
	// wait until every member is open.
	network := n.cfg.Env.Peers
	if network == nil {
		network = tcpPeers{secret: cc.Secret, listener: cc.PeerListener, logger: n.log}
	}
	link, err := network.Join(env.PeerEndpoint{ID: uint32(c.self), Addrs: peers, ClientAddr: n.cfg.ClientAddr, Handler: c.handle})
	if err != nil {
		return err // c.tr stays nil: a failed Join may return a typed nil link
	}
	c.tr = link
	for _, t := range st.Sorted() {
		if err := wire.ValidateName("topic", t.Config.Name); err != nil {
			// Applied before names were checked: `__meta` would speak for
			// the metadata log on the peer transport.
			n.log.Error("topic not started: its name is reserved or invalid", "topic", t.Config.Name, "err", err)
			continue
		}
		if _, err := n.startTopic(t.Config, t.Placement); err != nil {
			return err
		}
	}
	c.metaLog, err = c.openGroup(meta.MetaTopic, 0, c.allMembers(), replica.SyncQuorum, c.wakeMeta, groupStorage{})
	if err != nil {
		return err
	}
	c.campaignIfNew(c.metaLog, 1)
	close(c.ready)
	c.wg.Add(1)
	go c.applyMeta()
	return nil
}

// campaignIfNew starts the first election of a brand-new group on its
// first member a few ticks after it opened (time for the other members to
// apply the same metadata and open theirs), instead of after an election
// timeout: a new topic is usable soon after it is declared. Any member may
// still win; a lost PREPARE just leaves it to the election timeout.
func (c *cluster) campaignIfNew(l *replog.Log, first replica.NodeID) {
	if st := l.Status(); first == c.self && st.Hard.Promised == 0 && st.Last == 0 {
		c.n.cfg.Env.Clock.AfterFunc(5*c.cfg.Tick, l.Campaign)
	}
}

// tcpPeers is the production peer network: authenticated TCP
// (internal/peer), configured by the ClusterConfig.
type tcpPeers struct {
	secret   []byte
	listener net.Listener
	logger   *slog.Logger
}

func (t tcpPeers) Join(e env.PeerEndpoint) (env.PeerLink, error) {
	return peer.Listen(peer.Config{ID: e.ID, Listen: e.Addrs[e.ID], Listener: t.listener, Peers: e.Addrs,
		Secret: t.secret, ClientAddr: e.ClientAddr, Handler: e.Handler, Logger: t.logger})
}

// number is a member's 1-based position among the sorted ids (0 = none).
func (c *cluster) number(id string) uint32 {
	i, ok := slices.BinarySearch(c.names, id)
	if !ok {
		return 0
	}
	return uint32(i + 1)
}

func (c *cluster) name(id replica.NodeID) string {
	if id == 0 || int(id) > len(c.names) {
		return ""
	}
	return c.names[id-1]
}

func (c *cluster) allMembers() []replica.NodeID {
	out := make([]replica.NodeID, len(c.names))
	for i := range out {
		out[i] = replica.NodeID(i + 1)
	}
	return out
}

// clientAddr is where a member serves clients ("" = not known yet).
func (c *cluster) clientAddr(id replica.NodeID) string {
	if id == c.self {
		return c.n.cfg.ClientAddr
	}
	if id == 0 {
		return ""
	}
	return c.tr.ClientAddr(uint32(id))
}

// groupStorage is a replica group's retention: nothing for __meta; the
// topic's retention for a partition, compacted no further than limit.
type groupStorage struct {
	retentionMs, retentionBytes int64
	limit                       func() uint64
}

// openGroup starts this node's member of a replica group and registers it
// for peer traffic.
func (c *cluster) openGroup(topic string, partition uint32, members []replica.NodeID, policy replica.AckPolicy, notify func(), gs groupStorage) (*replog.Log, error) {
	dir := path.Join(c.n.cfg.DataDir, "meta")
	if topic != meta.MetaTopic {
		dir = path.Join(c.n.cfg.DataDir, "topics", topic, fmt.Sprint(partition))
	}
	gid := groupID{topic, partition}
	l, err := replog.Open(replog.Config{ID: c.self, Members: members, Policy: policy, Dir: dir, FS: c.n.cfg.Env.FS,
		Logger: c.n.log, Tick: c.cfg.Tick, ElectionTicks: c.cfg.ElectionTicks, Seed: uint64(c.self)<<32 ^ uint64(partition),
		Storage: storage.Options{SegmentBytesMax: c.n.cfg.SegmentBytesMax, RecordBytesMax: c.n.cfg.RecordBytesMax + 64<<10,
			RetentionAgeMs: gs.retentionMs, RetentionBytes: gs.retentionBytes},
		CompactEvery: time.Duration(c.n.cfg.RetentionCheckMs) * time.Millisecond, CompactLimit: gs.limit,
		Clock: c.n.cfg.Env.Clock, Reservation: c.cfg.Reservation,
		Notify: notify,
		Send:   func(m replica.Message) { c.tr.Send(uint32(m.To), replog.ToWire(topic, partition, m)) }})
	if err != nil {
		return nil, fmt.Errorf("node: open replica %s/%d: %w", topic, partition, err)
	}
	c.mu.Lock()
	c.groups[gid] = l
	c.mu.Unlock()
	return l, nil
}

func (c *cluster) closeGroup(topic string, partition uint32) {
	c.mu.Lock()
	delete(c.groups, groupID{topic, partition})
	c.mu.Unlock()
}

// handle receives a frame from an authenticated peer (on its reader
// goroutine: nothing here blocks).
func (c *cluster) handle(from uint32, f wire.Frame) {
	select {
	case <-c.ready:
	case <-c.done:
		return
	}
	switch f := f.(type) {
	case *wire.Replicate:
		m := replog.FromWire(f)
		if uint32(m.From) != from {
			return // only the authenticated sender counts
		}
		c.mu.RLock()
		l := c.groups[groupID{f.Topic, f.Partition}]
		c.mu.RUnlock()
		if l != nil {
			l.Step(m) // a group this node does not host yet: dropped, resent
		}
	case *wire.PeerDeclare:
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			reply := &wire.PeerDeclareOK{ReqID: f.ReqID}
			created, err := c.declareAsLeader(f.Topic)
			if err != nil {
				we := asWire(err)
				reply.Code, reply.Message = we.Code, we.Message
			}
			reply.Created = created
			c.tr.Send(from, reply)
		}()
	case *wire.PeerDeclareOK:
		c.fwdMu.Lock()
		ch := c.forwards[f.ReqID]
		delete(c.forwards, f.ReqID)
		c.fwdMu.Unlock()
		if ch != nil {
			ch <- f
		}
	case *wire.PeerPublish:
		c.servePublish(from, f)
	case *wire.PeerPublishOK:
		c.publishAnswered(f)
	}
}

// declare creates a topic through the metadata log: directly on its
// leader, forwarded to it elsewhere. It returns once this node has applied
// the topic.
func (c *cluster) declare(tc wire.TopicConfig) (bool, error) {
	tc, err := meta.Normalize(tc, len(c.names))
	if err != nil {
		return false, err
	}
	st, err := c.metaLeader()
	if err != nil {
		return false, err
	}
	var created bool
	if st.Role == replica.Leader {
		created, err = c.declareAsLeader(tc)
	} else {
		created, err = c.forward(st.Leader, tc)
	}
	if err != nil {
		return false, err
	}
	return created, c.waitTopic(tc.Name)
}

// metaLeader waits (bounded by DeclareTimeout) until the metadata group
// has a leader: right after a cluster starts, or during an election.
func (c *cluster) metaLeader() (replica.Status, error) {
	deadline, stop := c.n.after(c.cfg.DeclareTimeout)
	defer stop()
	poll := c.n.cfg.Env.Clock.NewTicker(c.cfg.Tick)
	defer poll.Stop()
	for {
		st := c.metaLog.Status()
		if st.Role == replica.Leader || st.Leader != 0 {
			return st, nil
		}
		select {
		case <-poll.C():
		case <-deadline:
			return st, wire.Errorf(wire.CodeUnavailable, "no metadata leader within %v (a quorum of nodes is down?); retry", c.cfg.DeclareTimeout)
		case <-c.done:
			return st, wire.Errorf(wire.CodeUnavailable, "node is shutting down")
		}
	}
}

func (c *cluster) forward(leader replica.NodeID, tc wire.TopicConfig) (bool, error) {
	id := c.reqID.Add(1)
	ch := make(chan *wire.PeerDeclareOK, 1)
	c.fwdMu.Lock()
	c.forwards[id] = ch
	c.fwdMu.Unlock()
	defer func() {
		c.fwdMu.Lock()
		delete(c.forwards, id)
		c.fwdMu.Unlock()
	}()
	if !c.tr.Send(uint32(leader), &wire.PeerDeclare{ReqID: id, Topic: tc}) {
		return false, wire.Errorf(wire.CodeUnavailable, "metadata leader %s unreachable; retry", c.name(leader))
	}
	timeout, stop := c.n.after(c.cfg.DeclareTimeout)
	defer stop()
	select {
	case r := <-ch:
		if r.Code != wire.CodeOK {
			return false, wire.Errorf(r.Code, "%s", r.Message)
		}
		return r.Created, nil
	case <-timeout:
		return false, wire.Errorf(wire.CodeUnavailable, "metadata leader %s did not answer in %v; retry", c.name(leader), c.cfg.DeclareTimeout)
	case <-c.done:
		return false, wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	}
}

// declareAsLeader decides and commits a DECLARE on the metadata leader.
// DECLAREs are serialized so that a decision sees every earlier one.
func (c *cluster) declareAsLeader(tc wire.TopicConfig) (bool, error) {
	tc, err := meta.Normalize(tc, len(c.names))
	if err != nil {
		return false, err
	}
	c.declareMu.Lock()
	defer c.declareMu.Unlock()
	if c.metaLog.Status().Role != replica.Leader {
		return false, wire.Errorf(wire.CodeUnavailable, "metadata leadership moved; retry")
	}
	// Everything committed before must be applied before deciding.
	if err := c.waitApplied(c.metaLog.CommitSeq()); err != nil {
		return false, err
	}
	c.metaMu.Lock()
	cmd, exists, err := c.state.Decide(tc, len(c.names))
	c.metaMu.Unlock()
	if err != nil || exists {
		return false, err
	}
	data, err := json.Marshal(cmd)
	if err != nil {
		return false, err
	}
	p := c.metaLog.Propose(storage.Record{Value: data})
	timeout, stop := c.n.after(c.cfg.DeclareTimeout)
	defer stop()
	select {
	case <-p.Done:
	case <-timeout:
		return false, wire.Errorf(wire.CodeUnavailable, "the metadata log did not commit in %v; retry", c.cfg.DeclareTimeout)
	}
	switch {
	case errors.Is(p.Err, replica.ErrQuorumLost):
		return false, wire.Errorf(wire.CodeQuorumLost, "metadata log: %v", p.Err)
	case p.Err != nil:
		return false, wire.Errorf(wire.CodeUnavailable, "metadata log: %v; retry", p.Err)
	}
	return true, c.waitApplied(p.Seq)
}

// waitApplied waits until the applier has applied seq.
func (c *cluster) waitApplied(seq uint64) error {
	return c.waitMeta(func(s *meta.State) bool { return s.Applied >= seq })
}

func (c *cluster) waitTopic(name string) error {
	return c.waitMeta(func(s *meta.State) bool { _, ok := s.Topics[name]; return ok })
}

func (c *cluster) waitMeta(cond func(*meta.State) bool) error {
	deadline, stop := c.n.after(c.cfg.DeclareTimeout)
	defer stop()
	for {
		c.metaMu.Lock()
		ok, ch := cond(c.state), c.appliedCh
		c.metaMu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-deadline:
			return wire.Errorf(wire.CodeUnavailable, "metadata not applied in %v; retry", c.cfg.DeclareTimeout)
		case <-c.done:
			return wire.Errorf(wire.CodeUnavailable, "node is shutting down")
		}
	}
}

func (c *cluster) wakeMeta() {
	select {
	case c.metaWake <- struct{}{}:
	default:
	}
}

// applyMeta applies committed metadata entries in order, starts the topics
// they create and persists the applied state.
func (c *cluster) applyMeta() {
	defer c.wg.Done()
	tick := c.n.cfg.Env.Clock.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-c.metaWake:
		case <-tick.C():
		}
		c.applyCommittedMeta()
	}
}

func (c *cluster) applyCommittedMeta() {
	for {
		c.metaMu.Lock()
		from := c.state.Applied + 1
		c.metaMu.Unlock()
		entries, err := c.metaLog.Read(from, 256)
		if err != nil {
			c.n.logRepeatedError("__meta", "read metadata log failed; will retry", "from", from, "err", err)
			return
		}
		if len(entries) == 0 {
			return
		}
		c.metaMu.Lock()
		var created []*meta.Topic
		for _, e := range entries {
			if replog.IsControl(&e.Record) {
				c.state.Applied = e.Seq
				continue
			}
			t, err := c.state.Apply(e.Seq, e.Record.Value)
			if err != nil {
				c.n.log.Error("metadata entry refused", "seq", e.Seq, "err", err)
			}
			if t != nil {
				created = append(created, t)
			}
		}
		b, err := json.Marshal(c.state)
		c.metaMu.Unlock()
		for _, t := range created {
			c.n.mu.Lock()
			if _, ok := c.n.topics[t.Config.Name]; !ok {
				if _, err := c.n.startTopic(t.Config, t.Placement); err != nil {
					c.n.log.Error("start topic failed", "topic", t.Config.Name, "err", err)
				} else {
					c.n.log.Info("topic declared", "topic", t.Config.Name, "partitions", t.Config.Partitions, "replicas", t.Config.Replicas)
				}
			}
			c.n.mu.Unlock()
		}
		if err == nil {
			err = storage.WriteFileAtomic(c.n.cfg.Env.FS, path.Join(c.n.cfg.DataDir, metaStateFile), b)
		}
		if err != nil {
			c.n.log.Error("persist metadata state failed", "err", err)
		}
		c.metaMu.Lock()
		close(c.appliedCh)
		c.appliedCh = make(chan struct{})
		c.metaMu.Unlock()
	}
}

func (c *cluster) loadState() (*meta.State, error) {
	b, err := storage.ReadFileAtomic(c.n.cfg.Env.FS, path.Join(c.n.cfg.DataDir, metaStateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return meta.New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: read metadata state: %w", err)
	}
	st := meta.New()
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("node: decode metadata state: %w", err)
	}
	return st, nil
}

// close stops the transport, the applier and the metadata member; the
// partitions' members stop with their partitions.
func (c *cluster) close() {
	close(c.done)
	if c.tr != nil {
		c.tr.Close()
	}
	c.wg.Wait()
	c.failForwardedPublishes()
	if c.metaLog != nil {
		c.metaLog.Close()
	}
}
