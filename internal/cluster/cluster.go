// Package cluster is a node's membership of a static cluster: the peer
// network (env.PeerNetwork; TCP in production), the metadata log `__meta`
// and its applier, DECLAREs through it (declare.go), publishes forwarded
// to partition leaders (forward.go), and the registry of the replica
// groups (replog members) this node hosts, to which it dispatches peer
// frames. The node (internal/node) owns topics and partitions and is its
// Host.
package cluster

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nereus-broker/nereus/internal/group"
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

// Config makes a node a member of a cluster: its partitions become
// replica groups and its topics come from the `__meta` log.
type Config struct {
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
	// ChaseWindow is the tail-chase watch's window (replica.Config.
	// ChaseTicks; default the reservation): a follower whose lag has not
	// shrunk over one, after one to measure it, loses its reservation.
	ChaseWindow time.Duration
	// NoLeaderRebalance turns off handing a partition's leadership back
	// to its preferred leader (the first replica of its placement) once
	// that node is back and caught up after a failover: leaders then stay
	// where elections put them.
	NoLeaderRebalance bool
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

// Host is what the cluster needs of its node.
type Host interface {
	// StartTopic starts a topic the metadata declares (its partitions open
	// their replica groups through OpenGroup); started is false when it
	// runs already.
	StartTopic(t meta.Topic) (started bool, err error)
	// StopTopic stops an incarnation of a topic the metadata deleted (its
	// partitions' runners, groups' runners and replica groups) if it runs
	// here, and then, when removeData is set, removes its data. The
	// cluster sets removeData only once the delete is durable in this
	// node's metadata state (meta.json): a restart never starts the
	// incarnation again from half-removed files.
	StopTopic(name string, incarnation uint64, removeData bool)
	// GroupDeleted carries out the delete of a consumer group's
	// incarnation the metadata applied (its runners stop; with
	// removeData, set as for StopTopic, its directories go).
	GroupDeleted(name string, incarnation uint64, removeData bool)
	// TopicUpdated gives the topic's partitions here the settings the
	// metadata now holds for its incarnation, if it runs here.
	TopicUpdated(t meta.Topic)
	// GroupSettingsUpdated gives the group's runners here the settings a
	// group update gave its incarnation.
	GroupSettingsUpdated(st meta.GroupSettings)
	// PublishLocal publishes a forwarded PUB on this node (it does not
	// forward again), into the topic's incarnation when it is not 0; in
	// Manual mode it must not block.
	PublishLocal(pub *wire.Pub, incarnation uint64, reply func(wire.PubOK, *wire.Error))
	// LogRepeatedError logs an ERROR line a persistent fault repeats,
	// limited per subject.
	LogRepeatedError(subject, msg string, args ...any)
	// MetadataApplied tells the node that metadata entries were applied
	// (consumer groups re-read their assignment).
	MetadataApplied()
}

// Options are the node's settings the cluster uses.
type Options struct {
	NodeID, DataDir, ClientAddr string
	Env                         env.Env
	Logger                      *slog.Logger
	// Manual: no goroutine (Step drives the cluster; see node.Config).
	Manual bool
	// The replica groups' storage bounds and retention pace.
	SegmentBytesMax  int64
	RecordBytesMax   int
	RetentionCheckMs int64
	// Replica and SendBeforePersist break the replication kernel and the
	// shared executor on purpose (mutation tests only).
	Replica           replica.Mutations
	SendBeforePersist bool
	// Group breaks the consumer-group kernel (mutation tests only).
	Group group.Mutations
	// DecideBeforeOffice lets the metadata leader decide and read as
	// coordinator as soon as it leads, before it applied its install
	// entry (CoordinatorTookOffice; mutation tests only).
	DecideBeforeOffice bool
	// AnswerWithoutLease lets the metadata leader decide and read as
	// coordinator without its lease (CoordinatorHoldsLease; mutation
	// tests only).
	AnswerWithoutLease bool
	// SaveStateWithoutGroupDeletes writes meta.json without the deleted
	// group incarnations (mutation tests only: the simulator's
	// MetadataAgrees).
	SaveStateWithoutGroupDeletes bool
	// LoneTornTailSilent: a group's only member cuts a torn tail with no
	// WARN line (mutation tests only: the simulator's lone replicas
	// under bit flips).
	LoneTornTailSilent bool
	// ObserveSync and ObserveCommit measure every replica group's fsyncs
	// and replication (replog.Config; nil: not measured).
	ObserveSync, ObserveCommit func(time.Duration)
	// BeforeDrop is every replica group's replog.Config.BeforeDrop, told
	// the group's topic (incarnation key) and partition (nil: none).
	BeforeDrop func(topic string, partition uint32, st replica.Status, synced uint64)
	// ObserveGroupApply, when set, is told of each consumer-group entry
	// of the metadata log this node applies: the group before and after
	// it (before nil: new), and the partition count of each topic then
	// (the simulator's MinimalRebalance check; never set outside tests).
	ObserveGroupApply func(seq uint64, before, after *group.State, partitions group.Topics)
}

// Cluster is a node's membership: the peer network, the metadata log and
// the replica groups of the partitions it hosts.
type Cluster struct {
	host    Host
	opts    Options
	log     *slog.Logger
	cfg     Config
	names   []string // node number i+1 is names[i] (sorted ids)
	self    replica.NodeID
	tr      env.PeerLink // this node on the peer network (Config.Env.Peers)
	metaLog *replog.Log

	mu     sync.RWMutex
	groups map[groupID]*replog.Log

	// Metadata state, applied by the applier goroutine (metaMu guards it
	// for readers).
	metaMu sync.Mutex
	state  *meta.State
	// persisted is the applied seq meta.json holds. The node answers a
	// metadata command and starts a topic only once it is there
	// (StateDurableBeforeAnswer): a one-node cluster's metadata log is
	// its only copy, and an open may cut entries above what meta.json
	// applied as a torn tail.
	persisted uint64
	metaWake  chan struct{}
	toStart   map[string]*meta.Topic // applied but not started yet (startTopics retries)
	// damaged: topics of toStart whose start found damage on this node's
	// disk that its replicas cannot drop and rebuild (replog rebuilds a
	// damaged log range or snapshot point, and recovers a damaged hard
	// state's promise; this is for what none of that covers). They are
	// not retried: the node runs the others; the topic's other replicas
	// serve it.
	damaged map[string]error

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
	groupJobs    []*groupJob // group commands proposed here (groups.go)
	// pubForwards are the publishes forwarded to partition leaders
	// (forward.go).
	pubForwards forwardedPubs

	done chan struct{}
	wg   sync.WaitGroup
}

// MetaStateFile holds the applied metadata state in a node's data directory.
const MetaStateFile = "meta.json"

func (c *Config) setDefaults() {
	if c.Tick == 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.DeclareTimeout == 0 {
		c.DeclareTimeout = 10 * time.Second
	}
}

// New joins the cluster's peer network and restores the applied
// metadata. The node keeps the Cluster, then calls Start.
func New(host Host, cfg Config, opts Options) (*Cluster, error) {
	cfg.setDefaults()
	c := &Cluster{host: host, opts: opts, log: opts.Logger, cfg: cfg, groups: map[groupID]*replog.Log{}, ready: make(chan struct{}),
		metaWake: make(chan struct{}, 1), declForwards: map[uint64]*declareJob{}, done: make(chan struct{}), toStart: map[string]*meta.Topic{}, damaged: map[string]error{}}
	peers := map[uint32]string{}
	for _, m := range cfg.Members {
		c.names = append(c.names, m.ID)
	}
	slices.Sort(c.names)
	if len(c.names) == 0 || len(slices.Compact(slices.Clone(c.names))) != len(c.names) {
		return nil, errors.New("node: cluster members must be non-empty with unique ids")
	}
	if len(c.names) > meta.MembersMax {
		return nil, fmt.Errorf("node: clusters of more than %d nodes are not supported yet (got %d)", meta.MembersMax, len(c.names))
	}
	for _, m := range cfg.Members {
		peers[c.number(m.ID)] = m.PeerAddr
	}
	c.self = replica.NodeID(c.number(opts.NodeID))
	if c.self == 0 {
		return nil, fmt.Errorf("node: %q is not among the cluster members %v", opts.NodeID, c.names)
	}
	st, err := c.loadState()
	if err != nil {
		return nil, err
	}
	c.state, c.persisted = st, st.Applied
	// The peer network first (members send through it), but peer frames
	// wait until every member is open (Start).
	network := opts.Env.Peers
	if network == nil {
		network = tcpPeers{secret: cfg.Secret, listener: cfg.PeerListener, logger: c.log}
	}
	link, err := network.Join(env.PeerEndpoint{ID: uint32(c.self), Addrs: peers, ClientAddr: opts.ClientAddr, Handler: c.handle})
	if err != nil {
		return nil, err // c.tr stays nil: a failed Join may return a typed nil link
	}
	c.tr = link
	return c, nil
}

// Start starts the topics the applied metadata names, the metadata member
// and (not in Manual mode) the applier.
func (c *Cluster) Start() error {
	for _, t := range c.state.Sorted() {
		if err := wire.ValidateTopicOrInternal(t.Config.Name); err != nil {
			// Applied before names were checked: `__meta` would speak for
			// the metadata log on the peer transport.
			c.log.Error("topic not started: its name is reserved or invalid", "topic", t.Config.Name, "err", err)
			continue
		}
		if _, err := c.host.StartTopic(t); err != nil {
			if !errors.Is(err, storage.ErrCorrupt) {
				return err
			}
			// DamageStaysLocal: one damaged topic does not keep the node,
			// and every other topic it holds, down.
			c.log.Error("topic not started: its data on this node is damaged and its replica cannot rebuild it; "+
				"the node runs its other topics", "topic", t.Config.Name, "err", err)
			c.toStart[t.Config.Name], c.damaged[t.Config.Name] = &t, err
		}
	}
	var err error
	var gs GroupOptions
	members := c.allMembers()
	if len(members) == 1 {
		// A one-node cluster's metadata member commits what it synced,
		// and applied no further: a log that would end below what
		// meta.json applied lost committed entries to damage — never cut
		// as a torn tail, whose seqs the next entries would take while
		// the applier, past them, skipped them for good (MetaNotCutBelowApplied).
		gs.DurableThrough = c.state.Applied
	}
	c.metaLog, err = c.OpenGroup(meta.MetaTopic, 0, members, replica.SyncQuorum, c.wakeMeta, gs)
	if errors.Is(err, storage.ErrCorrupt) && gs.DurableThrough > 0 {
		return fmt.Errorf("the metadata log of this one-node cluster is damaged, and no other member holds a copy "+
			"(it applied through seq %d, kept in %s): with the node stopped, run nereus repair --data DIR --salvage --one-node-cluster: %w",
			gs.DurableThrough, MetaStateFile, err)
	}
	if err != nil {
		return err
	}
	c.CampaignIfNew(c.metaLog, 1)
	close(c.ready)
	if c.opts.Manual {
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

// Step is the cluster's share of a Manual node's Step: it pumps every
// replica group this node hosts (the metadata log first, then the
// partitions in (topic, partition) order), applies committed metadata and
// advances DECLAREs. It reports whether anything ran.
func (c *Cluster) Step() bool {
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
	progress = c.stepGroupJobs() || progress
	return c.stepDeclares() || progress
}

// CampaignIfNew starts the first election of a brand-new group on its
// first member a few ticks after it opened (time for the other members to
// apply the same metadata and open theirs), instead of after an election
// timeout: a new topic is usable soon after it is declared. Any member may
// still win; a lost PREPARE goes again a heartbeat interval on.
func (c *Cluster) CampaignIfNew(l *replog.Log, first replica.NodeID) {
	if st := l.Status(); first == c.self && st.Hard.Promised == 0 && st.Last == 0 {
		c.opts.Env.Clock.AfterFunc(5*c.cfg.Tick, l.Campaign)
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
func (c *Cluster) number(id string) uint32 {
	i, ok := slices.BinarySearch(c.names, id)
	if !ok {
		return 0
	}
	return uint32(i + 1)
}

// Name is member id's node id ("" for none).
func (c *Cluster) Name(id replica.NodeID) string {
	if id == 0 || int(id) > len(c.names) {
		return ""
	}
	return c.names[id-1]
}

func (c *Cluster) allMembers() []replica.NodeID {
	out := make([]replica.NodeID, len(c.names))
	for i := range out {
		out[i] = replica.NodeID(i + 1)
	}
	return out
}

// ClientAddr is where a member serves clients ("" = not known yet).
func (c *Cluster) ClientAddr(id replica.NodeID) string {
	if id == c.self {
		return c.opts.ClientAddr
	}
	if id == 0 {
		return ""
	}
	return c.tr.ClientAddr(uint32(id))
}

// GroupOptions is a replica group's retention — nothing for __meta; the
// topic's retention for a partition, compacted no further than Limit —
// and its preferred leader: for a partition, the first replica of its
// placement, to which a leader elsewhere hands leadership back once it is
// healthy (replog.Config.PreferredLeader; 0: none, as for __meta and
// when Config.NoLeaderRebalance is set).
type GroupOptions struct {
	RetentionMs, RetentionBytes int64
	// Retention, when set, is the retention now: it replaces RetentionMs
	// and RetentionBytes at each compaction pass (a topic update).
	Retention       func() (ageMs, bytes int64)
	Limit           func() uint64
	PreferredLeader replica.NodeID
	// ReleaseBeforeTransfer: a rebalancing hand-off waits for the
	// caller's Log.TransferTo (replog.Config.ReleaseBeforeTransfer).
	ReleaseBeforeTransfer bool
	// SegmentBytesMax, when set, replaces the node's segment size for
	// this group's log (scheduler shards compact in small steps).
	SegmentBytesMax int64
	// DurableThrough: a seq this member's log held durably
	// (storage.Options.DurableThrough; a partition's only replica).
	DurableThrough uint64
	// KeepTornSeqs: a member alone fills the seqs a torn tail's headers
	// name with lost records instead of handing them out again
	// (storage.Options.KeepTornSeqs; a partition's only replica).
	KeepTornSeqs bool
}

// TornTailMessage is the WARN line of a torn tail cut off a replica
// group's only member as it opens (and of a single node's partition).
const TornTailMessage = "torn tail truncated"

// TornTailAttrs are TornTailMessage's attributes for t, after the
// log's (topic, partition): where it was, and when its seqs were kept
// (storage.Options.KeepTornSeqs) the last of them, "kept_through".
func TornTailAttrs(t storage.TornTail, logAttrs ...any) []any {
	attrs := append(logAttrs, "file", t.Segment, "offset", t.Offset, "bytes_dropped", t.Bytes, "first_seq", t.FirstSeq)
	if t.Kept {
		attrs = append(attrs, "kept_through", t.LastSeq)
	}
	return attrs
}

// OpenGroup starts this node's member of a replica group and registers it
// for peer traffic.
func (c *Cluster) OpenGroup(topic string, partition uint32, members []replica.NodeID, policy replica.AckPolicy, notify func(), gs GroupOptions) (*replog.Log, error) {
	dir := path.Join(c.opts.DataDir, "meta")
	if topic != meta.MetaTopic {
		dir = path.Join(c.opts.DataDir, "topics", topic, fmt.Sprint(partition))
	}
	gid := groupID{topic, partition}
	preferred := gs.PreferredLeader
	if c.cfg.NoLeaderRebalance {
		preferred = 0
	}
	// Followers learn a commit from the leader's next APPEND. A follower
	// of __meta answers what it forwarded (a DECLARE, a JOIN) once it
	// applied the commit, so __meta's leader heartbeats every tick; a
	// partition's followers apply for no one waiting, and its idle leader
	// heartbeats at the kernel's default, a tenth as often.
	heartbeat := 0
	if topic == meta.MetaTopic {
		heartbeat = 1
	}
	var beforeDrop func(replica.Status, uint64)
	if observe := c.opts.BeforeDrop; observe != nil {
		beforeDrop = func(st replica.Status, synced uint64) { observe(topic, partition, st, synced) }
	}
	var beforeCut func(storage.TornTail) error
	if len(members) == 1 && !c.opts.LoneTornTailSilent {
		// A member alone cuts an invalid tail as torn with no one to make
		// it whole: a batch flushed and acknowledged that went bad since
		// looks the same, so the cut is said, never silent (a larger
		// group's member marks itself uncertain instead: replog).
		// LoneCutIsSaid.
		beforeCut = func(t storage.TornTail) error {
			c.log.Warn(TornTailMessage, TornTailAttrs(t, "topic", topic, "partition", partition)...)
			return nil
		}
	}
	l, err := replog.Open(replog.Config{ID: c.self, BeforeDrop: beforeDrop, Members: members, Policy: policy, Dir: dir, FS: c.opts.Env.FS, Manual: c.opts.Manual,
		Mutations: c.opts.Replica, SendBeforePersist: c.opts.SendBeforePersist,
		Logger: c.log, Tick: c.cfg.Tick, ElectionTicks: c.cfg.ElectionTicks, HeartbeatTicks: heartbeat, Seed: uint64(c.self)<<32 ^ uint64(partition), PreferredLeader: preferred, ReleaseBeforeTransfer: gs.ReleaseBeforeTransfer,
		Storage: storage.Options{SegmentBytesMax: cmp.Or(gs.SegmentBytesMax, c.opts.SegmentBytesMax), RecordBytesMax: c.opts.RecordBytesMax + 64<<10,
			RetentionAgeMs: gs.RetentionMs, RetentionBytes: gs.RetentionBytes, DurableThrough: gs.DurableThrough, BeforeTornTailCut: beforeCut,
			KeepTornSeqs: gs.KeepTornSeqs},
		CompactEvery: time.Duration(c.opts.RetentionCheckMs) * time.Millisecond, CompactLimit: gs.Limit, Retention: gs.Retention,
		Clock: c.opts.Env.Clock, Reservation: c.cfg.Reservation, ChaseWindow: c.cfg.ChaseWindow,
		Notify: notify, ObserveSync: c.opts.ObserveSync, ObserveCommit: c.opts.ObserveCommit,
		Send: func(m replica.Message) { c.tr.Send(uint32(m.To), replog.ToWire(topic, partition, m)) }})
	if err != nil {
		return nil, fmt.Errorf("node: open replica %s/%d: %w", topic, partition, err)
	}
	c.mu.Lock()
	c.groups[gid] = l
	c.mu.Unlock()
	return l, nil
}

// groupBefore names the group a metadata entry's group command changes,
// and a copy of it before (nil: none yet), for ObserveGroupApply ("":
// not observed, or not a group command).
func (c *Cluster) groupBefore(data []byte) (string, *group.State) {
	if c.opts.ObserveGroupApply == nil {
		return "", nil
	}
	var cmd meta.Command
	if json.Unmarshal(data, &cmd) != nil || cmd.Op != meta.OpGroup || cmd.Group == nil {
		return "", nil
	}
	if g := c.state.Groups[cmd.Group.Group]; g != nil {
		return cmd.Group.Group, g.Clone()
	}
	return cmd.Group.Group, nil
}

// CloseGroup forgets a replica group this node no longer hosts.
func (c *Cluster) CloseGroup(topic string, partition uint32) {
	c.mu.Lock()
	delete(c.groups, groupID{topic, partition})
	c.mu.Unlock()
}

// handle receives a frame from an authenticated peer (on its reader
// goroutine: nothing here blocks).
func (c *Cluster) handle(from uint32, f wire.Frame) {
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

func (c *Cluster) wakeMeta() {
	select {
	case c.metaWake <- struct{}{}:
	default:
	}
}

// applyMeta applies committed metadata entries in order, starts the topics
// they create and persists the applied state.
func (c *Cluster) applyMeta() {
	defer c.wg.Done()
	tick := c.opts.Env.Clock.NewTicker(100 * time.Millisecond)
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
		c.stepGroupJobs()
	}
}

func (c *Cluster) applyCommittedMeta() {
	for {
		c.metaMu.Lock()
		from := c.state.Applied + 1
		c.metaMu.Unlock()
		entries, err := c.metaLog.Read(from, 256)
		if err != nil {
			c.host.LogRepeatedError("__meta", "read metadata log failed; will retry", "from", from, "err", err)
			return
		}
		if len(entries) == 0 {
			if c.unpersisted() {
				// A failed write of meta.json is tried again: what it
				// holds is what the node answers.
				if err := c.persistState(); err != nil {
					c.host.LogRepeatedError("meta.json", "persist metadata state failed; will retry", "err", err)
				}
			}
			return
		}
		c.metaMu.Lock()
		var deleted, updated []*meta.Topic
		var groupsDeleted []meta.Change
		var settings []meta.GroupSettings
		for _, e := range entries {
			if replog.IsControl(&e.Record) {
				c.state.Applied = e.Seq
				continue
			}
			name, before := c.groupBefore(e.Record.Value)
			ch, err := c.state.Apply(e.Seq, e.Record.Value)
			if err != nil {
				c.log.Error("metadata entry refused", "seq", e.Seq, "err", err)
			}
			if name != "" {
				st := c.state
				c.opts.ObserveGroupApply(e.Seq, before, st.Groups[name], func(t string) int { return int(st.Topics[t].Config.Partitions) })
			}
			if t := ch.Created; t != nil {
				c.toStart[t.Config.Name] = t
			}
			if t := ch.Deleted; t != nil {
				if s := c.toStart[t.Config.Name]; s != nil && s.Incarnation == t.Incarnation {
					delete(c.toStart, t.Config.Name) // deleted before it started here
					delete(c.damaged, t.Config.Name)
				}
				deleted = append(deleted, t)
			}
			if t := ch.Updated; t != nil {
				if s := c.toStart[t.Config.Name]; s != nil && s.Incarnation == t.Incarnation {
					again := *s
					again.Config = t.Config // not started yet: it starts with them
					c.toStart[t.Config.Name] = &again
				}
				updated = append(updated, t)
			}
			if ch.GroupDeleted != "" {
				groupsDeleted = append(groupsDeleted, ch)
			}
			if ch.GroupSettings != nil {
				settings = append(settings, *ch.GroupSettings)
			}
		}
		c.metaMu.Unlock()
		err = c.persistState()
		if err != nil {
			c.log.Error("persist metadata state failed", "err", err)
		}
		// DeleteAfterDurable: a deleted incarnation's data goes only once
		// meta.json says it is deleted (else its next start removes it);
		// it stops before a later incarnation of its name starts.
		for _, t := range deleted {
			c.host.StopTopic(t.Config.Name, t.Incarnation, err == nil)
			c.log.Info("topic deleted", "topic", t.Config.Name, "incarnation", t.Incarnation)
		}
		for _, ch := range groupsDeleted {
			c.host.GroupDeleted(ch.GroupDeleted, ch.GroupIncarnation, err == nil)
		}
		for _, t := range updated {
			c.host.TopicUpdated(*t)
			c.log.Info("topic updated", "topic", t.Config.Name, "incarnation", t.Incarnation,
				"retention_ms", t.Config.RetentionMs, "retention_bytes", t.Config.RetentionBytes)
		}
		for _, st := range settings {
			c.host.GroupSettingsUpdated(st)
			c.log.Info("group updated", "group", st.Group, "incarnation", st.Incarnation,
				"ack_wait_ms", st.AckWaitMs, "max_deliver", st.MaxDeliver)
		}
		c.host.MetadataApplied()
		c.startTopics()
	}
}

// persistState writes the applied metadata state to meta.json.
func (c *Cluster) persistState() error {
	c.metaMu.Lock()
	saved := c.state
	if c.opts.SaveStateWithoutGroupDeletes {
		short := *c.state
		short.GroupsDeleted = nil
		saved = &short
	}
	applied := saved.Applied
	b, err := json.Marshal(saved)
	c.metaMu.Unlock()
	if err == nil {
		err = storage.WriteFileAtomic(c.opts.Env.FS, path.Join(c.opts.DataDir, MetaStateFile), b)
	}
	if err == nil {
		c.metaMu.Lock()
		c.persisted = max(c.persisted, applied)
		c.metaMu.Unlock()
	}
	return err
}

// unpersisted reports whether the node applied entries meta.json does
// not hold yet.
func (c *Cluster) unpersisted() bool {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return c.persisted < c.state.Applied
}

// startTopics starts the topics applied metadata created here. One whose
// start fails (a disk error opening its replicas) is retried on the next
// apply pass; meanwhile the node answers UNAVAILABLE for it, not
// NOT_FOUND. One whose start finds damage is not retried (damaged).
func (c *Cluster) startTopics() (progress bool) {
	if c.unpersisted() {
		return false // StateDurableBeforeAnswer: not before meta.json holds them
	}
	c.metaMu.Lock()
	names := slices.Sorted(maps.Keys(c.toStart))
	c.metaMu.Unlock()
	for _, name := range names {
		c.metaMu.Lock()
		t, damaged := c.toStart[name], c.damaged[name] != nil
		c.metaMu.Unlock()
		if damaged {
			continue
		}
		started, err := c.host.StartTopic(*t)
		if errors.Is(err, storage.ErrCorrupt) {
			// As at Start: damage does not go away by itself.
			c.log.Error("topic not started: its data on this node is damaged and its replica cannot rebuild it; "+
				"the node runs its other topics", "topic", name, "err", err)
			c.metaMu.Lock()
			c.damaged[name] = err
			c.metaMu.Unlock()
			continue
		}
		if err != nil {
			c.host.LogRepeatedError("topic/"+name, "start topic failed; will retry", "topic", name, "err", err)
			continue
		}
		if started {
			c.log.Info("topic declared", "topic", name, "incarnation", t.Incarnation, "partitions", t.Config.Partitions, "replicas", t.Config.Replicas)
		}
		c.metaMu.Lock()
		delete(c.toStart, name)
		c.metaMu.Unlock()
		progress = true
	}
	return progress
}

// Starting reports whether topic name is declared but not started here,
// and, for a topic whose data here is damaged (not retried), why.
func (c *Cluster) Starting(name string) (starting bool, damage error) {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	_, ok := c.toStart[name]
	return ok, c.damaged[name]
}

// Damaged returns the topics not started here because their data on
// this node is damaged, and why (a copy).
func (c *Cluster) Damaged() map[string]error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return maps.Clone(c.damaged)
}

func (c *Cluster) loadState() (*meta.State, error) {
	st, err := c.readState()
	if st != nil {
		st.GroupMutations = c.opts.Group
	}
	return st, err
}

// readState reads meta.json. A damaged one (its checksum fails) is
// derived state: the node starts from an empty state and the applier
// replays the metadata log — never compacted, so it holds every entry
// from seq 1 — as a node joining with an empty disk does; meta.json is
// written again as it goes.
func (c *Cluster) readState() (*meta.State, error) {
	b, err := storage.ReadFileAtomic(c.opts.Env.FS, path.Join(c.opts.DataDir, MetaStateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return meta.New(), nil
	}
	if errors.Is(err, storage.ErrCorrupt) {
		c.log.Error("the applied metadata state is damaged; rebuilding it from the metadata log (topics start as their entries are applied again)",
			"file", MetaStateFile, "err", err)
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

// Close stops the transport, the applier and the metadata member; the
// partitions' members stop with their partitions.
func (c *Cluster) Close() {
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

// ReplicaView is what this node's member of a replica group says of itself,
// for checkers (the simulator): the kernel's status, and the last seq its
// log has synced (what it holds durably).
type ReplicaView struct {
	Status replica.Status
	Synced uint64
	Log    *storage.Log // the member's log, for reads only
	// LeaseLeft is how long its lease runs on by its node's clock (0: it
	// holds none, or it ran out): unlike Status.LeaseTicks, it does not
	// stand still while the member is held up (replog.Log.LeaseLeft).
	LeaseLeft time.Duration
}

// Replica returns this node's member of a partition's replica group — or
// of the metadata log, for topic meta.MetaTopic — if it hosts one.
func (c *Cluster) Replica(topic string, partition uint32) (ReplicaView, bool) {
	c.mu.RLock()
	l := c.groups[groupID{topic, partition}]
	c.mu.RUnlock()
	if l == nil {
		return ReplicaView{}, false
	}
	lg := l.ReadLog()
	return ReplicaView{Status: l.Status(), Synced: lg.SyncedSeq(), Log: lg, LeaseLeft: l.LeaseLeft()}, true
}

// HoldUp holds up this node's member of a group until its monotonic
// clock reads untilMs (replog.Log.HoldUp; Manual mode, the simulator's
// faults). False: no such member here.
func (c *Cluster) HoldUp(topic string, partition uint32, untilMs int64) bool {
	c.mu.RLock()
	l := c.groups[groupID{topic, partition}]
	c.mu.RUnlock()
	if l == nil {
		return false
	}
	l.HoldUp(untilMs)
	return true
}

// HoldUpAll holds up every member this node hosts, the metadata log's
// included, until its monotonic clock reads untilMs (HoldUp: the
// simulator's model of a disk whose fsyncs hang). It returns how many it
// held up.
func (c *Cluster) HoldUpAll(untilMs int64) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, l := range c.groups {
		l.HoldUp(untilMs)
	}
	return len(c.groups)
}

// Names are the members' node ids, sorted (member number i+1 is Names()[i]).
func (c *Cluster) Names() []string { return slices.Clone(c.names) }

// Self is this node's member number.
func (c *Cluster) Self() replica.NodeID { return c.self }
