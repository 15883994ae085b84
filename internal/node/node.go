package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Config configures a Node. Zero fields take the defaults below.
type Config struct {
	NodeID  string
	DataDir string
	// Env is the world the node touches: files, clock and timers,
	// randomness and, in a cluster, the peer network. Unset parts are the
	// operating system's (env.OS); a nil Env.Peers is TCP (internal/peer)
	// as the ClusterConfig describes it. Tests and the simulator inject
	// their own.
	Env    env.Env
	Logger *slog.Logger
	// Manual makes the node start no goroutines: partitions and groups only
	// queue work, and the driver (the simulator) runs it by calling Step on
	// one goroutine. Production leaves it false.
	Manual bool
	// Mutations deliberately break guards, so tests can prove that the
	// simulator's checkers catch each one. Never set outside tests.
	Mutations Mutations
	// SchedPublishObserver, when set, is called by a schedule shard's
	// runner just before each publish of a due message (the simulator's
	// ghost of the owner's gates checks it at that instant). Never set
	// outside tests; it must not block.
	SchedPublishObserver func(shard uint32, p sched.Publish)
	// SchedCompactObserver, when set, is told what a schedule shard's
	// runner saw of its compaction: "checkpoint" (it applied a complete
	// checkpoint), "truncated" (its log's start moved up), "restored"
	// (a new state loaded a checkpoint at a start from the checkpoint
	// hint), "rebuilt" (a state loaded one because its log now starts
	// after what it applied: a follower rebuilt from its leader's
	// snapshot point). Never set outside tests; it must not block.
	SchedCompactObserver func(shard uint32, event string)
	// ReplicaDropObserver, when set, is told what a running replica
	// holds just before it drops a damaged range (cluster.Options.
	// BeforeDrop; the simulator's checker).
	ReplicaDropObserver func(topic string, partition uint32, st replica.Status, synced uint64)
	// GroupApplyObserver, when set, is told of each consumer-group entry
	// of the metadata log a cluster member applies
	// (cluster.Options.ObserveGroupApply; the simulator's checker). It
	// must not block or keep the states.
	GroupApplyObserver func(seq uint64, before, after *group.State, partitions group.Topics)
	// ClientAddr is the address clients reach this node at; METADATA
	// names it as the leader of what this node leads.
	ClientAddr string
	// Cluster, when set, makes the node a cluster member (replicated
	// partitions, metadata log); nil runs a single node.
	Cluster *ClusterConfig

	SegmentBytesMax int64
	RecordBytesMax  int // key + value + headers of one record
	PublishBatchMax int // records per group commit
	PublishQueueMax int // queued hand-offs per partition (a PUB, or a PUB_BATCH's PUBs for it) before senders block
	// PublishQueueBytesMax bounds the record bytes of publishes (clients',
	// dead letters, fired schedules) queued per partition before senders
	// block; a larger hand-off goes in alone, when the queue holds none.
	PublishQueueBytesMax  int64
	RetentionCheckMs      int64 // how often retention runs
	DefaultAckWaitMs      int64
	DefaultMaxDeliver     uint32
	InflightMax           int // unacked deliveries per group and partition
	SubscriptionCreditMax uint32
	// LedgerCompactBytes: a group's ack ledger is compacted into a snapshot
	// once it grows past this; 0 = LedgerCompactBytesDefault, < 0 = never.
	LedgerCompactBytes int64
	// GroupCheckpointSpanBytes: a group's runner on a replicated
	// partition's leader checkpoints again once about this much of the
	// log follows its latest checkpoint, which bounds what a new leader
	// reads to rebuild the group; 0 = GroupCheckpointSpanBytesDefault.
	GroupCheckpointSpanBytes int64
	// ScrubBytesPerSecond bounds the background scrubber's average read
	// rate; 0 = ScrubBytesPerSecondDefault, < 0 = no scrubber. Manual mode
	// runs no scrubber.
	ScrubBytesPerSecond int64
	// SchedWindow bounds the pending schedules of each lane (destination
	// topic) a scheduler shard keeps in RAM, the nearest ones: up to
	// twice it; the rest wait in the shard's spill on disk
	// (sched-spill/). 0 = SchedWindowDefault.
	SchedWindow int
	// KVCheckpointMinBytes: a bucket's leader writes a checkpoint of the
	// bucket into its log (kv.go) once the log since the last one
	// outgrows both this and the bucket's encoded state; the log before a
	// checkpoint is then truncated by whole segments. 0 =
	// KVCheckpointMinBytesDefault, < 0 = never (the log grows forever).
	KVCheckpointMinBytes int64
	// SchedCheckpointEvery: a scheduler shard's owner checkpoints its
	// state once at least this many records (and half as many as it has
	// live schedules) were applied since the last checkpoint, carrying forward
	// the messages of schedules older than it, so the shard's log is
	// compacted; 0 = SchedCheckpointEveryDefault, < 0 = never (the shard
	// keeps its whole log).
	SchedCheckpointEvery int
	// SchedSegmentBytesMax is the segment size of the scheduler shards'
	// logs: their compaction deletes whole segments, so it is the step
	// by which a shard's log shrinks; 0 = 4 MiB (or SegmentBytesMax if
	// smaller).
	SchedSegmentBytesMax int64
	// DedupSnapshotBytes: a partition writes its dedup snapshot (the file
	// "dedup" beside its log, dedupsnap.go) once this many record bytes
	// were applied since the last one, and when it closes, so a restart
	// reads only the log after it. 0 = DedupSnapshotBytesDefault, < 0 =
	// never (a restart replays the whole retained log).
	DedupSnapshotBytes int64
	// SyncedMarkMs: a partition with no other replica that took no
	// append for this long, everything it appended synced, writes its
	// synced mark (the file "synced" beside its log, syncedmark.go), so a
	// bit flip into its idle tail is damage after a crash, not a torn
	// write. 0 = SyncedMarkMsDefault, < 0 = never.
	SyncedMarkMs int64
	Dedup        partition.Config
}

// KVCheckpointMinBytesDefault is Config.KVCheckpointMinBytes's default.
const KVCheckpointMinBytesDefault = 4 << 20

// SchedCheckpointEveryDefault is Config.SchedCheckpointEvery's default.
const SchedCheckpointEveryDefault = 10_000

// SchedWindowDefault is Config.SchedWindow's default: a lane keeps at most
// 100,000 pending schedules in RAM (about 16 MB) per shard.
const SchedWindowDefault = 50_000

func (c *Config) setDefaults() {
	if c.NodeID == "" {
		c.NodeID = "n1"
	}
	c.Env = c.Env.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SegmentBytesMax == 0 {
		c.SegmentBytesMax = 64 << 20
	}
	if c.RecordBytesMax == 0 {
		c.RecordBytesMax = wire.DefaultFrameBytesMax - 64<<10
	}
	if c.PublishBatchMax == 0 {
		c.PublishBatchMax = 4096
	}
	if c.PublishQueueMax == 0 {
		c.PublishQueueMax = 8192
	}
	if c.PublishQueueBytesMax == 0 {
		c.PublishQueueBytesMax = 64 << 20
	}
	if c.RetentionCheckMs == 0 {
		c.RetentionCheckMs = 30_000
	}
	if c.ScrubBytesPerSecond == 0 {
		c.ScrubBytesPerSecond = ScrubBytesPerSecondDefault
	}
	if c.DefaultAckWaitMs == 0 {
		c.DefaultAckWaitMs = 30_000
	}
	if c.DefaultMaxDeliver == 0 {
		c.DefaultMaxDeliver = 5
	}
	if c.InflightMax == 0 {
		c.InflightMax = 10_000
	}
	if c.SubscriptionCreditMax == 0 {
		c.SubscriptionCreditMax = 100_000
	}
	if c.LedgerCompactBytes == 0 {
		c.LedgerCompactBytes = LedgerCompactBytesDefault
	}
	if c.GroupCheckpointSpanBytes == 0 {
		c.GroupCheckpointSpanBytes = GroupCheckpointSpanBytesDefault
	}
	if c.Dedup == (partition.Config{}) {
		c.Dedup = partition.DefaultConfig
	}
	if c.SchedWindow == 0 {
		c.SchedWindow = SchedWindowDefault
	}
	if c.DedupSnapshotBytes == 0 {
		c.DedupSnapshotBytes = DedupSnapshotBytesDefault
	}
	if c.SyncedMarkMs == 0 {
		c.SyncedMarkMs = SyncedMarkMsDefault
	}
	if c.KVCheckpointMinBytes == 0 {
		c.KVCheckpointMinBytes = KVCheckpointMinBytesDefault
	}
	if c.SchedSegmentBytesMax == 0 {
		c.SchedSegmentBytesMax = min(4<<20, c.SegmentBytesMax)
	}
	if c.SchedCheckpointEvery == 0 {
		c.SchedCheckpointEvery = SchedCheckpointEveryDefault
	}
}

// Node is one broker node. All exported methods are safe for concurrent use.
type Node struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics

	mu     sync.RWMutex
	topics map[string]*topic
	groups map[groupKey]*groupRunner
	closed bool
	// drainOnce: Close drains the scheduler once, before it stops anything.
	drainOnce sync.Once

	cluster *cluster.Cluster // nil on a single node
	members *membership      // consumer-group membership (members.go)
	// groupsGone: the deleted group incarnations the partitions' kernels
	// last learned (groupdelete.go); nil before any.
	groupsGone atomic.Pointer[groupsGone]
	kv         kvRegistry // KV buckets (kv.go)

	// repeats throttles ERROR lines that a persistent fault repeats.
	repeats repeatLimiter

	// scrubStop ends the scrubber's goroutine (nil when none runs).
	scrubStop chan struct{}
	scrubDone chan struct{}
	// dirLock keeps any other node or repair off DataDir while this node
	// has it open (lockFile); Close releases it last.
	dirLock io.Closer

	// sched: the schedule shards' runners (sched.go), started with the
	// __sched topic.
	schedMu      sync.Mutex
	sched        []*schedRunner // by shard; nil where no replica is here
	schedStopped bool
}

type topic struct {
	// cfg changes only in its retention (setConfig), under n.mu and
	// settingsMu; its other fields are read without a lock.
	cfg        wire.TopicConfig
	settingsMu sync.Mutex
	// incarnation numbers this life of the topic's name (meta.Topic);
	// its data lives under meta.TopicKey(name, incarnation).
	incarnation uint64
	placement   [][]uint32 // per partition, its replica group's node numbers (cluster only)
	partitions  []*partitionRunner
	rr          uint32 // round-robin cursor for unkeyed, non-idempotent PUBs

	groupsMu sync.Mutex
	groups   []*groupRunner // woken when a partition commits
	sched    []*schedRunner // the shards' runners of __sched, woken alike

	// kvWake wakes the bucket runner of a KV bucket's topic (kv.go) when
	// its partition commits; nil until the runner starts.
	kvWake atomic.Pointer[func()]
}

type groupKey struct{ group, topic string }

const topicsFile = "topics.json"

// lockFile is the data directory's lock: two processes writing one
// directory would each take the other's files for its own and damage
// them, so a node (Open) and a repair (Repair) hold it while they run.
const lockFile = "LOCK"

// lockDataDir takes dataDir's lock, or says who must stop first.
func lockDataDir(fsys vfs.FS, dataDir string) (io.Closer, error) {
	l, err := fsys.Lock(path.Join(dataDir, lockFile))
	switch {
	case errors.Is(err, vfs.ErrLocked):
		return nil, fmt.Errorf("data directory %s is in use: a node or a repair has it open (%w)", dataDir, err)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("data directory %s does not exist (%w)", dataDir, err)
	}
	return l, err
}

// Open recovers every topic in cfg.DataDir and starts its partitions.
func Open(cfg Config) (*Node, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" {
		return nil, errors.New("node: DataDir is required")
	}
	if err := cfg.Env.FS.MkdirAll(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("node: create data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.Env.FS, cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n, err := open(cfg, lock)
	if err != nil {
		lock.Close() // the failed open may have closed it already: a second Close is harmless
		return nil, err
	}
	return n, nil
}

// open is Open once the node holds its data directory's lock.
func open(cfg Config, lock io.Closer) (*Node, error) {
	n := &Node{cfg: cfg, log: cfg.Logger, metrics: newMetrics(),
		topics: map[string]*topic{}, groups: map[groupKey]*groupRunner{}, dirLock: lock}
	n.members = newMembership(n)
	if cfg.Cluster != nil {
		if err := n.openCluster(); err != nil {
			n.Close()
			return nil, err
		}
		if err := n.openMembership(); err != nil {
			n.Close()
			return nil, err
		}
		n.metrics.registerNode(n)
		n.startScrubber()
		attrs := []any{"node", cfg.NodeID, "data", cfg.DataDir, "cluster", n.cluster.Names()}
		if mode := vfs.ParkedSyncMode(cfg.Env.FS); mode != "" {
			attrs = append(attrs, "replica_fsync", mode) // replog members sync parked
		}
		n.log.Info("node open", attrs...)
		return n, nil
	}
	groups, damagedGroups, err := loadGroups(n)
	if err != nil {
		return nil, fmt.Errorf("node: group state: %w", err)
	}
	if damagedGroups != nil {
		n.log.Error("groups.json or its copy damaged or behind; the one that verifies stands in and both are written again", "err", damagedGroups)
		if err := saveGroups(n, groups); err != nil {
			return nil, fmt.Errorf("node: write groups.json again: %w", err)
		}
	}
	n.members.local = groups
	configs, damaged, err := n.loadTopics()
	if err != nil {
		return nil, err
	}
	if damaged != nil {
		n.log.Error("topics.json or its copy damaged or behind; the one that verifies stands in and both are written again", "err", damaged)
	}
	rewrite := damaged != nil // write both again (TopicsKeptTwice)
	for _, st := range configs {
		if groups.DeletedKey(meta.TopicKey(st.Name, st.Incarnation)) {
			rewrite = true // deleted, and the node stopped before it rewrote topics.json
			continue
		}
		if _, err := n.startTopic(st.TopicConfig, nil, st.Incarnation); err != nil {
			n.Close()
			return nil, err
		}
	}
	if rewrite {
		if err := n.saveTopicsLocked(); err != nil {
			n.Close()
			return nil, fmt.Errorf("node: write topics.json again: %w", err)
		}
	}
	n.removeDeletedData(groups.DeletedKey)
	n.finishGroupDeletes(groups)
	if err := n.openMembership(); err != nil {
		n.Close()
		return nil, fmt.Errorf("node: group state: %w", err)
	}
	if t, ok := n.topics[wire.SchedTopic]; ok {
		// Schedules made before the restart fire on time.
		if err := n.startSched(t); err != nil {
			n.Close()
			return nil, err
		}
	}
	n.metrics.registerNode(n)
	n.startScrubber()
	n.log.Info("node open", "node", cfg.NodeID, "data", cfg.DataDir, "topics", len(configs))
	return n, nil
}

// nowMs is the node's wall clock in unix milliseconds (Config.Env).
func (n *Node) nowMs() int64 { return n.cfg.Env.Clock.NowMs() }

// nowNanos is the node's clock for measuring durations (Config.Env).
func (n *Node) nowNanos() int64 { return n.cfg.Env.Clock.NowNanos() }

// monoMs is the monotonic clock in milliseconds: what a wait held only in
// memory is measured on (a member's session, a notice's retransmission),
// which a step of the wall clock must not stretch or cut short.
func (n *Node) monoMs() int64 { return n.cfg.Env.Clock.NowNanos() / int64(time.Millisecond) }

// Metrics returns the node's Prometheus metrics.
func (n *Node) Metrics() *Metrics { return n.metrics }

// NodeID returns the configured node id.
func (n *Node) NodeID() string { return n.cfg.NodeID }

// storedTopic is one topic of a single node's topics.json.
type storedTopic struct {
	wire.TopicConfig
	// Incarnation is the topic's (meta.Topic); 0 in a file written before
	// incarnations, read as 1.
	Incarnation uint64 `json:",omitempty"`
}

// loadTopics reads topics.json, or its copy when it is damaged
// (TopicsKeptTwice); damaged reports a copy to write again
// (storage.ReadFileEither).
func (n *Node) loadTopics() (configs []storedTopic, damaged error, err error) {
	b, damaged, err := storage.ReadFileEither(n.cfg.Env.FS, path.Join(n.cfg.DataDir, topicsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if errors.Is(err, storage.ErrCorrupt) {
		return nil, nil, fmt.Errorf("node: read topics: %w (and its copy; stop the node and run nereus repair to rebuild it from the topic directories)", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("node: read topics: %w", err)
	}
	if err := json.Unmarshal(b, &configs); err != nil {
		return nil, nil, fmt.Errorf("node: decode topics: %w", err)
	}
	for i := range configs {
		configs[i].Replicas = 1 // files written before replication omit it
		configs[i].Incarnation = max(configs[i].Incarnation, 1)
	}
	return configs, damaged, nil
}

// saveTopicsLocked persists the topic list; callers hold n.mu.
func (n *Node) saveTopicsLocked() error {
	configs := make([]storedTopic, 0, len(n.topics))
	for _, t := range n.topics {
		configs = append(configs, storedTopic{TopicConfig: t.cfg, Incarnation: t.incarnation})
	}
	slices.SortFunc(configs, func(a, b storedTopic) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return n.writeStateTwice(topicsFile, configs, n.cfg.Mutations.TopicsOnce)
}

// writeStateTwice writes v as JSON to file in the data directory and to
// its copy (storage.WriteFileTwice); once (a mutation) skips the copy.
func (n *Node) writeStateTwice(file string, v any, once bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if once {
		return storage.WriteFileAtomic(n.cfg.Env.FS, path.Join(n.cfg.DataDir, file), b)
	}
	return storage.WriteFileTwice(n.cfg.Env.FS, path.Join(n.cfg.DataDir, file), b)
}

// startTopic opens an incarnation of a topic's partitions; placement is
// nil on a single node. Callers hold n.mu (or own n, while opening).
func (n *Node) startTopic(tc wire.TopicConfig, placement [][]uint32, incarnation uint64) (*topic, error) {
	t := &topic{cfg: tc, placement: placement, incarnation: max(incarnation, 1)}
	for i := uint32(0); i < tc.Partitions; i++ {
		p, err := n.openPartition(t, i)
		if err != nil {
			for _, q := range t.partitions {
				q.stop()
			}
			return nil, err
		}
		t.partitions = append(t.partitions, p)
	}
	n.topics[tc.Name] = t
	if wire.IsKVTopic(tc.Name) {
		n.startKVRunner(t)
	}
	return t, nil
}

// ValidateTopic checks a DECLARE's fields. The name may be a dead-letter
// topic's: Declare refuses those for clients, declare accepts them for the
// group machinery.
func ValidateTopic(tc wire.TopicConfig) error {
	// The schedule shards' topic is declared by the scheduler alone
	// (Node.schedRunners): clients' declarations check the name first.
	if err := wire.ValidateTopicOrInternal(tc.Name); err != nil {
		return err
	}
	if tc.Partitions == 0 || tc.Partitions > wire.PartitionsMax {
		return wire.Errorf(wire.CodeInvalidArgument, "partitions must be 1-%d, got %d", wire.PartitionsMax, tc.Partitions)
	}
	if tc.RetentionMs < 0 || tc.RetentionBytes < 0 {
		return wire.Errorf(wire.CodeInvalidArgument, "retention must not be negative")
	}
	return nil
}

// Declare creates a topic for a client, or confirms an identical existing
// one. A DECLARE that differs from the existing topic fails with
// TOPIC_CONFLICT; one of a dead-letter topic fails with INVALID_ARGUMENT.
// In a cluster it goes through the metadata log (forwarded to its leader)
// and returns once this node has applied it.
func (n *Node) Declare(tc wire.TopicConfig) (created bool, err error) {
	if err := wire.ValidateWritableTopic(tc.Name); err != nil {
		return false, err
	}
	return n.declare(tc)
}

// DeclareAsync is Declare answering through done, exactly once. A Manual
// cluster node answers later, from Step (its driver's only goroutine must
// not wait); otherwise it answers before returning.
func (n *Node) DeclareAsync(tc wire.TopicConfig, done func(created bool, err error)) {
	if err := wire.ValidateWritableTopic(tc.Name); err != nil {
		done(false, err)
		return
	}
	if err := ValidateTopic(tc); err != nil {
		done(false, err)
		return
	}
	switch {
	case n.cluster != nil && n.cfg.Manual:
		n.cluster.DeclareAsync(tc, done)
	case n.cluster != nil:
		// A session's later requests may depend on the topic (DECLARE
		// then PUB, pipelined): its reader waits, keeping them in order.
		done(n.cluster.Declare(tc))
	default:
		done(n.declareLocal(tc))
	}
}

// declareAsync is DeclareAsync without the client's name rule (the group
// machinery declares dead-letter topics through it); in a cluster done is
// called from the goroutine that steps DECLAREs, even in production.
func (n *Node) declareAsync(tc wire.TopicConfig, done func(created bool, err error)) {
	if err := ValidateTopic(tc); err != nil {
		done(false, err)
		return
	}
	if n.cluster != nil {
		n.cluster.DeclareAsync(tc, done)
		return
	}
	done(n.declareLocal(tc))
}

// declare is Declare without the client's name rule.
func (n *Node) declare(tc wire.TopicConfig) (created bool, err error) {
	if err := ValidateTopic(tc); err != nil {
		return false, err
	}
	if n.cluster != nil {
		return n.cluster.Declare(tc)
	}
	return n.declareLocal(tc)
}

// declareLocal creates a topic on a single node.
func (n *Node) declareLocal(tc wire.TopicConfig) (created bool, err error) {
	if tc.Replicas == 0 {
		tc.Replicas = 1
	}
	if tc.Replicas != 1 {
		return false, wire.Errorf(wire.CodeInvalidArgument, "a single node holds 1 replica, not %d; run a cluster for more", tc.Replicas)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false, wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	}
	if t, ok := n.topics[tc.Name]; ok {
		if t.cfg != tc {
			return false, wire.Errorf(wire.CodeTopicConflict, "topic %q exists with partitions=%d retention_ms=%d retention_bytes=%d",
				tc.Name, t.cfg.Partitions, t.cfg.RetentionMs, t.cfg.RetentionBytes)
		}
		return false, nil
	}
	if _, err := n.startTopic(tc, nil, n.members.nextIncarnation(tc.Name)); err != nil {
		return false, wire.Errorf(wire.CodeStorage, "create topic: %v", err)
	}
	if err := n.saveTopicsLocked(); err != nil {
		t := n.topics[tc.Name]
		delete(n.topics, tc.Name)
		for _, p := range t.partitions {
			p.stop()
		}
		return false, wire.Errorf(wire.CodeStorage, "persist topic: %v", err)
	}
	n.members.topicDeclared(tc, n.topics[tc.Name].incarnation)
	n.log.Info("topic declared", "topic", tc.Name, "partitions", tc.Partitions)
	return true, nil
}

// Metadata describes the named topics (all when names is empty).
func (n *Node) Metadata(names []string) []wire.TopicInfo {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if len(names) == 0 {
		for name := range n.topics {
			if !strings.HasPrefix(name, wire.ReservedPrefix) { // internal topics only by name
				names = append(names, name)
			}
		}
		slices.Sort(names)
	}
	var out []wire.TopicInfo
	for _, name := range names {
		if name == wire.CoordinatorTopic && n.cluster != nil {
			out = append(out, n.coordinatorInfo())
			continue
		}
		t, ok := n.topics[name]
		if !ok {
			continue
		}
		info := wire.TopicInfo{Config: t.cfg, Incarnation: t.incarnation}
		for _, p := range t.partitions {
			info.Partitions = append(info.Partitions, p.info())
		}
		out = append(out, info)
	}
	return out
}

func (n *Node) topic(name string) (*topic, error) {
	n.mu.RLock()
	closed := n.closed
	t, ok := n.topics[name]
	n.mu.RUnlock()
	if closed {
		return nil, wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	}
	if !ok && n.cluster != nil {
		switch starting, damage := n.cluster.Starting(name); {
		case damage != nil:
			return nil, wire.Errorf(wire.CodeDataCorrupt, "topic %q is not started on this node: its data here is damaged (%v); the node runs its other topics (docs/OPERATIONS.md: Corruption and repair)", name, damage)
		case starting:
			return nil, wire.Errorf(wire.CodeUnavailable, "topic %q is declared but not started on this node yet (its start failed and is retried); retry", name)
		}
	}
	if !ok {
		return nil, n.topicNotFound(name) // "was deleted" when it was
	}
	return t, nil
}

// Close stops every group and partition; pending requests fail UNAVAILABLE.
// The scheduler's shard owners drain first (drainSched).
func (n *Node) Close() {
	n.drainOnce.Do(n.drainSched)
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	groups := make([]*groupRunner, 0, len(n.groups))
	for _, g := range n.groups {
		groups = append(groups, g)
	}
	topics := make([]*topic, 0, len(n.topics))
	for _, t := range n.topics {
		topics = append(topics, t)
	}
	n.mu.Unlock()
	if n.members != nil {
		n.members.close()
	}
	if n.scrubStop != nil {
		close(n.scrubStop)
		<-n.scrubDone
	}
	for _, g := range groups {
		g.stop()
	}
	n.stopSched()
	for _, t := range topics {
		for _, p := range t.partitions {
			p.stop()
		}
	}
	if n.cluster != nil {
		n.cluster.Close()
	}
	if n.dirLock != nil {
		n.dirLock.Close()
	}
	n.log.Info("node closed", "node", n.cfg.NodeID)
}

func (t *topic) notifyGroups() {
	if wake := t.kvWake.Load(); wake != nil {
		(*wake)()
	}
	t.groupsMu.Lock()
	for _, g := range t.groups {
		g.poke()
	}
	for _, r := range t.sched {
		r.poke()
	}
	t.groupsMu.Unlock()
}

// Read returns up to recordsMax visible entries of a partition from fromSeq
// on (never beyond its commit_seq). Checkers and tools use it.
func (n *Node) Read(topicName string, partition uint32, fromSeq uint64, recordsMax int) ([]storage.Entry, error) {
	t, err := n.topic(topicName)
	if err != nil {
		return nil, err
	}
	if int(partition) >= len(t.partitions) {
		return nil, wire.Errorf(wire.CodeNotFound, "topic %q has no partition %d", topicName, partition)
	}
	return t.partitions[partition].read(fromSeq, recordsMax, 16<<20)
}
