package node

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
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
	// for readers).
	metaMu   sync.Mutex
	state    *meta.State
	metaWake chan struct{}
	toStart  map[string]*meta.Topic // applied but not started yet (startTopics retries)

	ready chan struct{} // closed once the members are open: peer frames wait for it
	reqID atomic.Uint64
	// DECLAREs in progress (declare.go): declMu guards the list, the
	// forwarded ones by request id and the outcomes callbacks set;
	// deciding is the one the metadata leader is deciding (stepper-owned).
	declMu       sync.Mutex
	declares     []*declareJob
	declForwards map[uint64]*declareJob
	declClosed   bool
	deciding     *declareJob
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
	c := &cluster{n: n, cfg: cc, groups: map[groupID]*replog.Log{}, ready: make(chan struct{}),
		metaWake: make(chan struct{}, 1), declForwards: map[uint64]*declareJob{}, done: make(chan struct{}), toStart: map[string]*meta.Topic{}}
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
	if n.cfg.Manual {
		return nil // Step applies the metadata and advances DECLAREs
	}
	c.wg.Add(1)
	go c.applyMeta()
	return nil
}

func metaFirst(id groupID) int {
	if id.topic == meta.MetaTopic {
		return 0
	}
	return 1
}

// step is the cluster's share of a Manual node's Step: it pumps every
// replica group this node hosts (the metadata log first, then the
// partitions in (topic, partition) order), applies committed metadata and
// advances DECLAREs. It reports whether anything ran.
func (c *cluster) step() bool {
	c.mu.RLock()
	ids := make([]groupID, 0, len(c.groups))
	for id := range c.groups {
		ids = append(ids, id)
	}
	c.mu.RUnlock()
	slices.SortFunc(ids, func(a, b groupID) int {
		return cmp.Or(cmp.Compare(metaFirst(a), metaFirst(b)), cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	progress := false
	for _, id := range ids {
		c.mu.RLock()
		l := c.groups[id]
		c.mu.RUnlock()
		if l == nil {
			continue
		}
		// A member that cannot persist stops (replog logs why); its
		// partition then answers from its last status, as in production.
		ran, _ := l.Pump()
		progress = progress || ran
	}
	before := c.applied()
	c.applyCommittedMeta()
	progress = c.startTopics() || progress || c.applied() != before
	return c.stepDeclares() || progress
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
	l, err := replog.Open(replog.Config{ID: c.self, Members: members, Policy: policy, Dir: dir, FS: c.n.cfg.Env.FS, Manual: c.n.cfg.Manual,
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
		c.declareAsync(f.Topic, true, func(created bool, err error) {
			reply := &wire.PeerDeclareOK{ReqID: f.ReqID, Created: created}
			if err != nil {
				we := asWire(err)
				reply.Code, reply.Message = we.Code, we.Message
			}
			c.tr.Send(from, reply)
		})
	case *wire.PeerDeclareOK:
		c.declareAnswered(f)
	case *wire.PeerPublish:
		c.servePublish(from, f)
	case *wire.PeerPublishOK:
		c.publishAnswered(f)
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
		c.startTopics()
		c.stepDeclares()
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
		for _, t := range created {
			c.toStart[t.Config.Name] = t
		}
		b, err := json.Marshal(c.state)
		c.metaMu.Unlock()
		c.startTopics()
		if err == nil {
			err = storage.WriteFileAtomic(c.n.cfg.Env.FS, path.Join(c.n.cfg.DataDir, metaStateFile), b)
		}
		if err != nil {
			c.n.log.Error("persist metadata state failed", "err", err)
		}
	}
}

// startTopics starts the topics applied metadata created here. One whose
// start fails (a disk error opening its replicas) is retried on the next
// apply pass; meanwhile the node answers UNAVAILABLE for it, not
// NOT_FOUND.
func (c *cluster) startTopics() (started bool) {
	c.metaMu.Lock()
	names := slices.Sorted(maps.Keys(c.toStart))
	c.metaMu.Unlock()
	for _, name := range names {
		c.metaMu.Lock()
		t := c.toStart[name]
		c.metaMu.Unlock()
		c.n.mu.Lock()
		_, running := c.n.topics[name]
		var err error
		if !running {
			_, err = c.n.startTopic(t.Config, t.Placement)
		}
		c.n.mu.Unlock()
		if err != nil {
			c.n.logRepeatedError("topic/"+name, "start topic failed; will retry", "topic", name, "err", err)
			continue
		}
		if !running {
			c.n.log.Info("topic declared", "topic", name, "partitions", t.Config.Partitions, "replicas", t.Config.Replicas)
		}
		c.metaMu.Lock()
		delete(c.toStart, name)
		c.metaMu.Unlock()
		started = true
	}
	return started
}

// starting reports whether topic name is declared but not started here.
func (c *cluster) starting(name string) bool {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	_, ok := c.toStart[name]
	return ok
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
	c.failDeclares()
	c.failForwardedPublishes()
	if c.metaLog != nil {
		c.metaLog.Close()
	}
}
