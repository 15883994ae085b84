package node

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Sink receives the MSG frames of one subscription. SendMsg is called from
// the group's goroutine and must not block for long (sessions queue). End
// tells the subscriber that the subscription is over (in a cluster: its
// group moved to another coordinator) and why.
type Sink interface {
	SendMsg(m *wire.Msg)
	End(err *wire.Error)
}

// AckReply receives the per-entry outcome of an ACK or NACK once the acks
// are durable in the group's ledger, or an error for the whole request.
type AckReply func(results []wire.Code, err *wire.Error)

// GroupOptions configure a group when its first subscription creates it;
// later subscriptions keep the group's persisted settings. Zero = default.
type GroupOptions struct {
	AckWaitMs  int64
	MaxDeliver uint32
	// Member and Incarnation (from JoinGroup) make the subscription a
	// group member's: it gets only the partitions the member holds.
	Member      string
	Incarnation uint64
}

// Subscription is one session's membership in a group: it receives MSG
// frames while it has credit. Its credit is owned by the group goroutine.
type Subscription struct {
	g      *groupRunner
	id     uint64 // owner id of its deliveries in the cursors
	sink   Sink
	credit uint32
	ended  atomic.Bool
	// member and incarnation: the group member it serves ("" for a
	// competing consumer of a group without members).
	member      string
	incarnation uint64
	idle        bool // came up empty in the current dispatch pass
}

// Ended reports whether the group ended the subscription (Sink.End); a new
// PULL must then subscribe again.
func (s *Subscription) Ended() bool { return s.ended.Load() }

// Serves reports whether the subscription is the given member
// incarnation's ("" for a competing consumer).
func (s *Subscription) Serves(member string, incarnation uint64) bool {
	return s.member == member && s.incarnation == incarnation
}

// AddCredit grants n more messages; total credit is capped.
func (s *Subscription) AddCredit(n uint32) {
	s.g.send(groupCmd{kind: cmdCredit, sub: s, credit: n})
}

// Close ends the subscription. Its unacked deliveries are released for
// redelivery to the group's other members at once.
func (s *Subscription) Close() { s.g.send(groupCmd{kind: cmdClose, sub: s}) }

type cmdKind uint8

const (
	cmdSubscribe cmdKind = iota
	cmdCredit
	cmdClose
	cmdAck
	cmdNack
	cmdSettings // a group update applied (applySettings)
)

type groupCmd struct {
	kind    cmdKind
	sub     *Subscription
	credit  uint32
	entries []wire.AckEntry
	delayMs int64
	reply   AckReply
	// officeUntilMs: an ACK or NACK waiting for a partition this node
	// takes office for (awaitOffice), until then at most (0: never waited).
	officeUntilMs int64
}

type groupSettings struct {
	AckWaitMs  int64  `json:"ack_wait_ms"`
	MaxDeliver uint32 `json:"max_deliver"`
}

// groupRunner delivers one topic to one consumer group. Its goroutine owns
// the cursors (delivery kernels), the ledger and the subscriptions.
type groupRunner struct {
	node  *Node
	topic *topic
	name  string
	// key names the group's incarnation (meta.GroupKeyOf) in its records
	// and directories: a group deleted and used again starts empty.
	key string
	dir string
	// cfg's ack wait and max deliveries change on the runner's goroutine
	// (applySettings), under settingsMu for readers elsewhere (settings).
	cfg        delivery.Config
	settingsMu sync.Mutex
	dlq        string

	cmds   chan groupCmd
	wakeCh chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	// sendMu orders send against stop (send).
	sendMu sync.RWMutex

	// Manual mode (Config.Manual): queued commands and wake-ups, owned by
	// the driver's goroutine instead of run.
	manualQueue []groupCmd
	// officeWaits are ACKs and NACKs waiting for a partition this node
	// takes office for (awaitOffice); owned by the group's goroutine.
	officeWaits []groupCmd
	woken       bool
	nextWakeMs  int64

	// Owned by run.
	// ledger is where acks and delivery counts become durable, chosen
	// when the group starts.
	ledger  ackLedger
	failure error // the ledger failed and could not be reloaded yet
	// cursors are the delivery kernels by partition; in a cluster, nil
	// for a partition this node does not lead (replicatedLedger.follow).
	cursors []*delivery.Cursor
	subs    []*Subscription
	subRR   int // next subscription to offer a message
	// The group's assignment for this topic, re-read when the group
	// state changes (assignVer): with assigned set, partition i goes only
	// to a subscription of owners[i] (dispatch.go).
	assignVer   uint64
	assigned    bool
	assignEpoch uint64 // the group's assignment epoch in that view
	owners      []partOwner
	partRR      int               // next partition to take a message from
	leasedNow   []bool            // per partition: ledger.leased, read once a dispatch pass
	cache       [][]storage.Entry // per partition: contiguous visible entries
	cacheEpoch  []uint64          // partition epoch the cache was read under
	ledgerBatch []byte
	// countBatch holds delivery counts to record with the next flush, as
	// (partition u32, seq u64, count u32) entries.
	countBatch []byte
	replies    []groupReply
	// deadPending are dead letters whose count record (MaxDeliver) is in
	// countBatch or in flight; deadReady those whose record is durable,
	// so their publish may start: a message is known dead durably before
	// its copy leaves, and is never delivered again after a restart.
	deadPending []ackKey
	deadReady   []ackKey
	dlqRetries  []dlqRetry
	dlqFailures map[ackKey]int // failed publish attempts of a dead letter
	// dlqProducers are the producer identities of the dead letters, one
	// per partition of the topic (dlqProducerIDs).
	dlqProducers []uint64

	// ledgerCompactBytes is the threshold of ledger compaction or
	// checkpoints (≤ 0 disables it). It is atomic only so tests can lower
	// it while run reads it.
	ledgerCompactBytes atomic.Int64

	// Published for metrics: the durable ack floor per partition, and
	// whether this node delivers the partition (a cluster's leader).
	floors     []atomic.Uint64
	delivering []atomic.Bool

	nextSubID atomic.Uint64

	dlqMu      sync.Mutex
	dlqResults []dlqResult

	// endSubs, set before a stop, ends the subscriptions with its error
	// (the group was deleted) rather than leaving them to a stopped group.
	endSubs atomic.Pointer[wire.Error]
}

// groupReply answers one ACK or NACK once what it waits for is durable.
// parts are the partitions its entries name that this node delivers: in a
// cluster it waits for the records of each of their ack logs.
type groupReply struct {
	answer func(failed *wire.Error)
	parts  []uint32
}

// ackLedger is where a group's acks and delivery counts become durable:
// a single node's file ledger (fileLedger, ledger.go) or the control
// records of a cluster's replicated ack logs, in each partition's own log
// (replicatedLedger, replledger.go). The group chooses one when it starts;
// its methods run on the group's goroutine and read and clear the batches
// the group keeps for them (ledgerBatch, countBatch, deadPending,
// replies).
type ackLedger interface {
	// load rebuilds the cursors from what is durable, with delivery ids
	// under incarnation inc. On error the ledger's previous state stays.
	load(inc uint64) ([]*delivery.Cursor, error)
	// needsRecord reports whether an ack must go into the next record:
	// isNew says it is new to its cursor.
	needsRecord(isNew bool, partition uint32, seq uint64) bool
	// flush makes the batched acks and counts durable, then answers every
	// ACK/NACK received since the last flush: an ACK_OK never precedes
	// the durability of its ack. Dead letters whose record is durable move
	// to deadReady.
	flush()
	// holdMs is how soon the group must look again at batches it holds
	// (0: none held): while a partition's leader hands leadership over, a
	// record proposed would only be refused at once.
	holdMs() int64
	// follow takes in which partitions this node delivers (a cluster's
	// leaders): cursors start and stop with leadership.
	follow(now int64)
	// fenced reports whether partition pi may go to its owner at
	// ownerEpoch, judged by a view of the group at viewEpoch (a cluster's
	// partition fence; a single node has one view).
	fenced(pi int, ownerEpoch, viewEpoch uint64) bool
	// leased reports whether deliveries of partition pi may go out now
	// (DeliverUnderLease): a cluster's leader of pi holds its lease, so
	// no other replica can have taken office and committed acks its
	// cursor does not hold, or it is READ_ONLY_DEGRADED; a single node
	// always may.
	leased(pi int) bool
	// wakeAtMs is when the ledger wants the group to look again (0: no
	// need): a failed fence record's retry.
	wakeAtMs() int64
	// settled reports whether every ack applied to partition pi's cursor
	// is durable (nothing of it batched, in flight or undurable), so its
	// floor may be published as durable.
	settled(pi int) bool
	// takingOffice reports whether this node may deliver partition pi
	// soon but does not yet: it leads pi and its install entry is not
	// applied or the group has not rebuilt its position from the log, or
	// an election for pi runs.
	takingOffice(pi int) bool
	// close releases the ledger (the group is shutting down).
	close()
}

// Subscribe joins sink to group on topic, creating the group on first use.
func (n *Node) Subscribe(topicName, group string, opts GroupOptions, sink Sink) (*Subscription, error) {
	if err := validateConsumer(topicName, group); err != nil {
		return nil, err
	}
	t, err := n.topic(topicName)
	if err != nil {
		return nil, err
	}
	if err := n.servesGroups(t); err != nil {
		return nil, err
	}
	if err := n.members.mayConsume(group, topicName, opts.Member, opts.Incarnation); err != nil {
		return nil, err
	}
	key := groupKey{group: group, topic: topicName}
	var g *groupRunner
	for {
		incKey := n.runnerKey(group)
		n.mu.Lock()
		var ok bool
		if g, ok = n.groups[key]; !ok {
			if g, err = n.startGroup(t, group, incKey, opts); err != nil {
				n.mu.Unlock()
				return nil, err
			}
			n.groups[key] = g
		}
		n.mu.Unlock()
		// Checked again once the runner is in n.groups: a delete applied
		// since then either finds it there (groupDeleted stops it) or is
		// seen here.
		if g.key == n.runnerKey(group) {
			break
		}
		// A deleted incarnation's, which this node has not stopped yet:
		// the next incarnation gets a runner of its own.
		n.mu.Lock()
		if n.groups[key] == g {
			delete(n.groups, key)
		}
		n.mu.Unlock()
		n.stopGroupRunners([]*groupRunner{g}, groupDeletedError(group))
	}
	g.noteAsked(opts)
	s := &Subscription{g: g, id: g.nextSubID.Add(1), sink: sink, member: opts.Member, incarnation: opts.Incarnation}
	g.send(groupCmd{kind: cmdSubscribe, sub: s})
	return s, nil
}

// GroupSettingsInfo is a group's settings in force on this node for one
// topic (fixed when the group was created here).
type GroupSettingsInfo struct {
	Group, Topic string
	AckWaitMs    int64
	MaxDeliver   uint32
}

// GroupSettings lists the settings of every group running on this node,
// by group and topic: what a subscriber asking others gets
// (SettingsAskedAreNotSilent).
func (n *Node) GroupSettings() []GroupSettingsInfo {
	n.mu.Lock()
	out := make([]GroupSettingsInfo, 0, len(n.groups))
	for k, g := range n.groups {
		st := g.settings()
		out = append(out, GroupSettingsInfo{Group: k.group, Topic: k.topic, AckWaitMs: st.AckWaitMs, MaxDeliver: st.MaxDeliver})
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b GroupSettingsInfo) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic))
	})
	return out
}

// noteAsked warns of a subscriber whose options differ from the group's
// settings here (SettingsAskedAreNotSilent), at most once a repeat window
// per distinct ask: they were fixed when the group was created on this
// node, and a later PULL does not change them, so the subscriber's ack
// wait or max deliveries are not the ones in force.
func (g *groupRunner) noteAsked(opts GroupOptions) {
	st := g.settings()
	if (opts.AckWaitMs <= 0 || opts.AckWaitMs == st.AckWaitMs) && (opts.MaxDeliver == 0 || opts.MaxDeliver == st.MaxDeliver) {
		return
	}
	g.node.logRepeated(slog.LevelWarn, fmt.Sprintf("group %s/%s asks %d ms, %d", g.key, g.topic.cfg.Name, opts.AckWaitMs, opts.MaxDeliver),
		"a subscriber asks other settings than the group keeps: they were fixed by a group update or, without one, when the group was created on this node (`nereus group update` sets them; /api/v1/group-settings lists them)",
		"group", g.name, "topic", g.topic.cfg.Name, "asked_ack_wait_ms", opts.AckWaitMs, "asked_max_deliver", opts.MaxDeliver,
		"ack_wait_ms", st.AckWaitMs, "max_deliver", st.MaxDeliver)
}

// Ack completes deliveries; reply is called after they are durable.
func (n *Node) Ack(topicName, group string, entries []wire.AckEntry, reply AckReply) {
	n.ackOrNack(topicName, group, groupCmd{kind: cmdAck, entries: entries, reply: reply})
}

// Nack returns deliveries for redelivery after delayMs.
func (n *Node) Nack(topicName, group string, entries []wire.AckEntry, delayMs int64, reply AckReply) {
	n.ackOrNack(topicName, group, groupCmd{kind: cmdNack, entries: entries, delayMs: delayMs, reply: reply})
}

// validateConsumer checks the names a client consumes by: any valid topic,
// dead-letter topics included, and a valid group.
func validateConsumer(topicName, group string) error {
	if err := wire.ValidateName("topic", topicName); err != nil {
		return err
	}
	return wire.ValidateName("group", group)
}

func (n *Node) ackOrNack(topicName, group string, c groupCmd) {
	if err := validateConsumer(topicName, group); err != nil {
		c.reply(nil, asWire(err))
		return
	}
	n.mu.RLock()
	g := n.groups[groupKey{group: group, topic: topicName}]
	n.mu.RUnlock()
	if g == nil {
		c.reply(nil, wire.Errorf(wire.CodeNotFound, "group %q has no subscription on topic %q", group, topicName))
		return
	}
	g.send(c)
}

func dlqTopicName(group, topic string) string { return "dlq." + group + "." + topic }

// servesGroups checks that this node may deliver the topic to groups: a
// single node delivers every partition; in a cluster each partition's
// leader delivers it, so a node must hold some partition of the topic (a
// subscription at a node that leads none now waits for leadership).
func (n *Node) servesGroups(t *topic) error {
	if n.cluster == nil {
		return nil
	}
	for _, p := range t.partitions {
		if p.replica() != nil {
			return nil
		}
	}
	return wire.Errorf(wire.CodeNotLeader, "topic %q: this node holds none of its partitions; subscribe at the leaders of its partitions", t.cfg.Name)
}

// incarnationFile, in a group's directory of a topic, numbers the runner's
// loads: the high bits of its delivery ids. incarnationCopyFile holds the
// same count, written after it at every load: a bit flip in one leaves
// the other (redundant copies of small critical state, as TigerBeetle
// keeps its superblock's), so the count goes on and ids do not repeat.
// Only with both damaged does it start from a fresh range
// (damagedIncarnation), whose clock-derived start may meet an earlier
// fresh range's.
const (
	incarnationFile     = "incarnation"
	incarnationCopyFile = "incarnation.copy"
)

// readLoadCount reads the load count of the group directory dir of a
// topic from both copies: the higher of those that verify, 0 when
// neither exists; damaged lists the copies that did not verify.
func readLoadCount(fsys vfs.FS, dir string) (inc uint64, valid bool, damaged []error, err error) {
	for _, name := range []string{incarnationFile, incarnationCopyFile} {
		b, rerr := storage.ReadFileAtomic(fsys, path.Join(dir, name))
		if errors.Is(rerr, fs.ErrNotExist) {
			continue
		}
		if rerr == nil {
			n, perr := strconv.ParseUint(string(b), 10, 64)
			if perr == nil {
				inc, valid = max(inc, n), true
				continue
			}
			rerr = fmt.Errorf("%w: %s: %w", storage.ErrCorrupt, path.Join(dir, name), perr)
		}
		if !errors.Is(rerr, storage.ErrCorrupt) {
			return 0, false, nil, fmt.Errorf("read %s: %w", name, rerr)
		}
		damaged = append(damaged, rerr)
	}
	return inc, valid, damaged, nil
}

// writeLoadCount writes inc to both copies of dir's load count, the
// first one first.
func writeLoadCount(fsys vfs.FS, dir string, inc uint64) error {
	for _, name := range []string{incarnationFile, incarnationCopyFile} {
		if err := storage.WriteFileAtomic(fsys, path.Join(dir, name), []byte(strconv.FormatUint(inc, 10))); err != nil {
			return err
		}
	}
	return nil
}

// damagedIncarnation is where a runner whose incarnation files are both
// damaged numbers its loads from: the count of before is lost, and
// delivery ids should not repeat. Loads count up from 1, so 2^23 plus the
// clock's milliseconds modulo 2^21 lies past any count of before, and a
// single node's ids (incarnation << 40) stay within 64 bits for 2^22 more
// loads. Two such fresh ranges meet only if they start within as many
// milliseconds (mod 35 minutes) as the first one has loads: milliseconds
// rather than seconds, so damage repeated in a burst — a failing disk —
// does not meet the range of a second before. A cluster's ids take the
// partition's epoch and only 10 bits of it: there a load in the same
// epoch reuses ids by a 1-in-1,024 chance (a stale ACK then counts for a
// redelivery of the message it acked).
func damagedIncarnation(nowMs int64) uint64 {
	return 1<<23 | uint64(max(nowMs, 0))&(1<<21-1)
}

// runnerKey is the key a runner of group's current incarnation names its
// records and directories by.
func (n *Node) runnerKey(group string) string {
	if n.cfg.Mutations.GroupKeyIgnoresIncarnation {
		return group
	}
	return n.groupKey(group)
}

// startGroup creates the runner of group's incarnation key; the caller
// holds n.mu.
func (n *Node) startGroup(t *topic, group, key string, opts GroupOptions) (*groupRunner, error) {
	dlq := dlqTopicName(group, t.cfg.Name)
	if err := wire.ValidateName("dead-letter topic", dlq); err != nil {
		return nil, wire.Errorf(wire.CodeInvalidArgument, "group and topic names too long together: %v", err)
	}
	g := &groupRunner{
		node: n, topic: t, name: group, key: key, dlq: dlq,
		dir:          path.Join(n.cfg.DataDir, "groups", key, t.key()),
		cmds:         make(chan groupCmd, 1024),
		wakeCh:       make(chan struct{}, 1),
		done:         make(chan struct{}),
		floors:       make([]atomic.Uint64, len(t.partitions)),
		delivering:   make([]atomic.Bool, len(t.partitions)),
		dlqProducers: dlqProducerIDs(key, t.cfg.Name, len(t.partitions)),
	}
	g.ledgerCompactBytes.Store(n.cfg.LedgerCompactBytes)
	if n.cluster != nil {
		// Each partition's leader keeps the group's acks in its log.
		g.ledger = &replicatedLedger{g: g}
	} else {
		g.ledger = &fileLedger{g: g}
	}
	if err := g.loadSettings(opts); err != nil {
		return nil, err
	}
	if err := g.load(); err != nil {
		return nil, err
	}
	t.groupsMu.Lock()
	t.groups = append(t.groups, g)
	t.groupsMu.Unlock()
	if n.cfg.Manual {
		g.woken = true
		return g, nil
	}
	g.wg.Add(1)
	go g.run()
	return g, nil
}

func (g *groupRunner) loadSettings(opts GroupOptions) error {
	if st, ok := g.node.updatedSettings(g.name); ok && !g.node.cfg.Mutations.GroupSettingsPerNode {
		// A group update's settings hold whatever settings.json or the
		// PULL say (GroupSettingsOnEveryNode).
		if err := g.writeSettings(st); err != nil {
			return fmt.Errorf("group %s: persist settings: %w", g.name, err)
		}
		g.setSettings(st)
		return g.cfg.Validate()
	}
	fsys, file := g.node.cfg.Env.FS, path.Join(g.dir, "settings.json")
	var st groupSettings
	b, err := storage.ReadFileAtomic(fsys, file)
	if errors.Is(err, storage.ErrCorrupt) {
		// Settings are this node's configuration of the group, not its
		// data: they are set again as for a group new here — from the
		// options of the subscriber at hand, or the defaults.
		g.node.log.Error("group settings damaged; set again from this subscriber's options or the defaults",
			"group", g.name, "topic", g.topic.cfg.Name, "file", file, "err", err)
		err = fs.ErrNotExist
	}
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("group %s: bad settings: %w", g.name, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		st = groupSettings{AckWaitMs: opts.AckWaitMs, MaxDeliver: opts.MaxDeliver}
		if st.AckWaitMs <= 0 {
			st.AckWaitMs = g.node.cfg.DefaultAckWaitMs
		}
		if st.MaxDeliver == 0 {
			st.MaxDeliver = g.node.cfg.DefaultMaxDeliver
		}
		if err := g.writeSettings(st); err != nil {
			return fmt.Errorf("group %s: persist settings: %w", g.name, err)
		}
	default:
		return fmt.Errorf("group %s: read settings: %w", g.name, err)
	}
	g.setSettings(st)
	return g.cfg.Validate()
}

// setSettings makes st the settings of a runner not yet running.
func (g *groupRunner) setSettings(st groupSettings) {
	g.cfg = delivery.Config{AckWaitMs: st.AckWaitMs, MaxDeliver: st.MaxDeliver, InflightMax: g.node.cfg.InflightMax,
		Mutations: delivery.Mutations{DeadOnLastDelivery: g.node.cfg.Mutations.DeadOnLastDelivery}}
}

// load (re)builds the cursors from the durable ledger under a new
// incarnation, so delivery ids never repeat across restarts or reloads.
//
// It replaces the group's state only when it fully succeeds; on error the
// old state stays (and g.failure keeps acks refused until a load succeeds).
//
// A load succeeds only after persisting the incarnation, whose
// WriteFileAtomic fsyncs the group dir: that makes the ledger snapshot load
// reads durable even if the compaction that renamed it into place failed
// before its own directory fsync (ledger.go, step 3), so no ack is accepted
// against a generation that a crash could still revert.
func (g *groupRunner) load() error {
	fsys := g.node.cfg.Env.FS
	inc, valid, damaged, err := readLoadCount(fsys, g.dir)
	if err != nil {
		return fmt.Errorf("group %s: %w", g.name, err)
	}
	switch {
	case len(damaged) > 0 && valid:
		g.node.log.Warn("group incarnation copy damaged; the other copy holds the count, both are written again",
			"group", g.name, "topic", g.topic.cfg.Name, "incarnation", inc+1, "err", damaged[0])
	case len(damaged) > 0:
		inc = damagedIncarnation(g.node.nowMs())
		g.node.log.Error("group incarnation damaged; numbering this runner's loads from a fresh range",
			"group", g.name, "topic", g.topic.cfg.Name, "dir", g.dir, "incarnation", inc+1, "err", errors.Join(damaged...))
	}
	inc++
	if err := writeLoadCount(fsys, g.dir, inc); err != nil {
		return fmt.Errorf("group %s: persist incarnation: %w", g.name, err)
	}
	cursors, err := g.ledger.load(inc)
	if err != nil {
		return err
	}
	g.setCursors(cursors)
	return nil
}

func (g *groupRunner) setCursors(cursors []*delivery.Cursor) {
	// Dead letters waiting for their record start over from the cursors
	// (which offer every dead seq again through TakeDead).
	g.deadPending, g.deadReady, g.countBatch, g.dlqRetries = nil, nil, nil, nil
	g.cursors = cursors
	g.cache = make([][]storage.Entry, len(cursors))
	g.cacheEpoch = make([]uint64, len(cursors))
	for i, c := range cursors {
		if c != nil {
			g.floors[i].Store(c.AckFloor())
		}
		g.delivering[i].Store(c != nil)
	}
}

// setCursor starts delivering partition i from c (a cluster's new leader).
func (g *groupRunner) setCursor(i int, c *delivery.Cursor) {
	// Built when its rebuild started: a group update since then holds.
	if err := c.SetLimits(g.cfg.AckWaitMs, g.cfg.MaxDeliver); err != nil {
		g.node.log.Error("group settings refused by a cursor", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
	}
	g.cursors[i], g.cache[i] = c, nil
	g.floors[i].Store(c.AckFloor())
	g.delivering[i].Store(true)
}

// forgetPartition stops delivering partition pi (a cluster's leadership
// moved): its cursor and everything batched of it go, and the replies
// waiting for its acks are answered failed.
func (g *groupRunner) forgetPartition(pi uint32, failed *wire.Error) {
	g.cursors[pi], g.cache[pi] = nil, nil
	g.delivering[pi].Store(false)
	g.ledgerBatch = dropEntries(g.ledgerBatch, acklog.AckEntryBytes, pi)
	g.countBatch = dropEntries(g.countBatch, acklog.CountEntryBytes, pi)
	ofPi := func(k ackKey) bool { return k.partition == pi }
	g.deadPending = slices.DeleteFunc(g.deadPending, ofPi)
	g.deadReady = slices.DeleteFunc(g.deadReady, ofPi)
	g.dlqRetries = slices.DeleteFunc(g.dlqRetries, func(r dlqRetry) bool { return r.partition == pi })
	g.replies = slices.DeleteFunc(g.replies, func(r groupReply) bool {
		if slices.Contains(r.parts, pi) {
			r.answer(failed)
			return true
		}
		return false
	})
}

// dropEntries removes the entries of partition pi from a batch of
// fixed-size entries that each start with their partition.
func dropEntries(batch []byte, size int, pi uint32) []byte {
	kept := batch[:0]
	forEachEntry(batch, size, func(p uint32, e []byte) {
		if p != pi {
			kept = append(kept, e...)
		}
	})
	return kept
}

// forEachEntry calls f with each entry of a batch of fixed-size entries
// (ack or count records' layout) and the partition it starts with.
func forEachEntry(batch []byte, size int, f func(pi uint32, e []byte)) {
	for b := batch; len(b) >= size; b = b[size:] {
		f(binary.BigEndian.Uint32(b), b[:size])
	}
}

func (g *groupRunner) send(c groupCmd) {
	if g.node.cfg.Manual {
		select {
		case <-g.done:
			g.refuse(c)
		default:
			g.manualQueue = append(g.manualQueue, c)
		}
		return
	}
	// Under sendMu: once stop holds it, done is closed and no command is
	// on its way into cmds, so shutdown's drain answers every one that got
	// in (a select alone could still pick cmds after done closed, and the
	// command would sit there unanswered after the drain).
	g.sendMu.RLock()
	defer g.sendMu.RUnlock()
	select {
	case <-g.done:
		g.refuse(c)
		return
	default:
	}
	select {
	case g.cmds <- c:
	case <-g.done:
		g.refuse(c)
	}
}

func (g *groupRunner) poke() {
	if g.node.cfg.Manual {
		g.woken = true
		return
	}
	select {
	case g.wakeCh <- struct{}{}:
	default:
	}
}

func (g *groupRunner) stop() {
	g.once.Do(func() {
		g.sendMu.Lock()
		close(g.done)
		g.sendMu.Unlock()
		if g.node.cfg.Manual {
			g.shutdown()
		}
	})
	g.wg.Wait()
}

// shutdown flushes the ledger, fails queued commands and closes the ledger;
// it runs on the goroutine that owns the group.
func (g *groupRunner) shutdown() {
	if why := g.endSubs.Load(); why != nil {
		for _, s := range g.subs {
			s.ended.Store(true)
			s.sink.End(why)
		}
		g.subs = nil
	}
	g.ledger.flush()
	for _, c := range append(g.manualQueue, g.officeWaits...) {
		g.refuse(c)
	}
	g.manualQueue, g.officeWaits = nil, nil
	for {
		select {
		case c := <-g.cmds:
			g.refuse(c)
		default:
			g.ledger.close()
			return
		}
	}
}

// refuse answers a command the stopped group will not run: UNAVAILABLE,
// or the deleted group's error (endSubs), which also ends a subscription
// that came too late to be served.
func (g *groupRunner) refuse(c groupCmd) {
	why := g.endSubs.Load()
	if why == nil {
		if c.reply != nil {
			c.reply(nil, wire.Errorf(wire.CodeUnavailable, "group is shutting down"))
		}
		return
	}
	switch {
	case c.kind == cmdSubscribe:
		c.sub.ended.Store(true)
		c.sub.sink.End(why)
	case c.reply != nil:
		c.reply(nil, why)
	}
}

// step runs one iteration in manual mode when the group has commands, was
// woken, or reached its next deadline (monoMs: the monotonic clock, as
// every wait of the group). It reports whether it ran.
func (g *groupRunner) step(monoMs int64) bool {
	if len(g.manualQueue) == 0 && !g.woken && monoMs < g.nextWakeMs {
		return false
	}
	for len(g.manualQueue) > 0 {
		c := g.manualQueue[0]
		g.manualQueue = g.manualQueue[1:]
		g.handle(c)
	}
	g.woken = false
	g.nextWakeMs = monoMs + g.iterate(monoMs)
	return true
}

const (
	groupIdleWaitMs    = 1000
	groupReloadRetryMs = 100
	// leaseRetryMs is how often a group looks again at a partition it
	// delivers whose leader lost its lease (a lease comes back with the
	// next answers of a quorum, a tick or two).
	leaseRetryMs = 10
)

// iterate is one pass of the group's loop after its commands were handled:
// dead letters, ledger flush (then ACK replies), dispatch. It returns how
// long the group may sleep before something falls due.
func (g *groupRunner) iterate(now int64) (waitMs int64) {
	g.ledger.follow(now)
	if g.failure != nil {
		g.reload()
		if g.failure != nil {
			g.ledger.flush() // answers the refused acks
			return groupReloadRetryMs
		}
	}
	if waiting := g.officeWaits; len(waiting) > 0 {
		g.officeWaits = nil
		for _, c := range waiting {
			g.handleAcks(c) // waits again while its partition is still taking office
		}
	}
	g.collectDeadLetters(now)
	wait := int64(groupIdleWaitMs)
	if len(g.officeWaits) > 0 {
		// Looked at again soon: an election another node wins wakes
		// nothing here (one this node wins does, with its commit).
		wait = min(wait, leaseRetryMs)
	}
	if hold := g.ledger.holdMs(); hold > 0 {
		wait = hold // the acks and replies wait in their batches
	} else {
		g.ledger.flush()
	}
	g.startReadyDeadLetters()
	g.dispatch(now)
	for i, c := range g.cursors {
		// Dispatch marks records that are no messages done (an epoch's
		// install, the groups' own records, a repaired gap): derivable,
		// never recorded, so no flush publishes the floor they move.
		if c != nil && g.ledger.settled(i) {
			g.floors[i].Store(c.AckFloor())
		}
	}
	for i, c := range g.cursors {
		if c == nil {
			continue
		}
		if !g.leasedNow[i] {
			// Its due deliveries wait for the lease, not for their time.
			wait = min(wait, leaseRetryMs)
			continue
		}
		d := c.NextDeadlineMs()
		if d >= 0 && d <= now && !g.creditFor(i) {
			// A due retry waits for a credit of a subscription that may
			// take it, which wakes the group (a credit, an ASSIGN's ack).
			d = c.NextExpiryMs()
		}
		if d >= 0 {
			wait = min(wait, max(d-now, 1))
		}
	}
	for _, r := range g.dlqRetries {
		wait = min(wait, max(r.dueMs-now, 1))
	}
	if at := g.ledger.wakeAtMs(); at > 0 {
		wait = min(wait, max(at-now, 1))
	}
	return wait
}

func (g *groupRunner) run() {
	defer g.wg.Done()
	defer g.shutdown()
	// The next wake-up: an AfterFunc on the node's clock that pokes the
	// loop like any other wake, replaced after every pass.
	var timer env.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-g.done:
			return
		case c := <-g.cmds:
			g.handle(c)
		drain:
			for {
				select {
				case c := <-g.cmds:
					g.handle(c)
				default:
					break drain
				}
			}
		case <-g.wakeCh:
		}
		wait := g.iterate(g.node.monoMs())
		if timer != nil {
			timer.Stop()
		}
		timer = g.node.cfg.Env.Clock.AfterFunc(time.Duration(wait)*time.Millisecond, g.poke)
	}
}

func (g *groupRunner) handle(c groupCmd) {
	switch c.kind {
	case cmdSubscribe:
		g.subs = append(g.subs, c.sub)
	case cmdCredit:
		c.sub.credit = min(c.sub.credit+c.credit, g.node.cfg.SubscriptionCreditMax)
	case cmdClose:
		for i, s := range g.subs {
			if s == c.sub {
				g.subs = append(g.subs[:i], g.subs[i+1:]...)
				break
			}
		}
		now := g.node.monoMs()
		for _, cur := range g.cursors {
			if cur != nil {
				cur.Release(now, c.sub.id)
			}
		}
	case cmdAck, cmdNack:
		g.handleAcks(c)
	case cmdSettings:
		g.applySettings()
	}
}

// officeWaitMs bounds how long an ACK or NACK waits for a partition this
// node takes office for (about an election and an install's commit).
const officeWaitMs = 2000

// awaitOffice holds c back, up to officeWaitMs, when it names a partition
// this node leads, or may lead once an election ends, but does not
// deliver yet (AckAwaitsOffice): the group's rebuild from the partition's
// log, once the install entry is applied, may find the ack already
// durable — the record committed, its ACK_OK lost with the node that took
// it. Answered at once, it got STALE_DELIVERY, "the leader delivers it
// again", and the leader never did: the seq was done (`nereus sim --nodes
// 1 --faults crash`, seeds 2, 6, 8, 11, 14, 15 of 16: the consumer's
// retried ack went unconfirmed for good). The pass after the group starts
// delivering the partition handles c again; after the bound, as before.
func (g *groupRunner) awaitOffice(c groupCmd, now int64) bool {
	if c.officeUntilMs != 0 && now >= c.officeUntilMs || g.node.cfg.Mutations.AckIgnoresOffice {
		return false
	}
	for _, e := range c.entries {
		if pi := int(e.Partition); pi < len(g.cursors) && g.cursors[pi] == nil && g.ledger.takingOffice(pi) {
			if c.officeUntilMs == 0 {
				c.officeUntilMs = now + officeWaitMs
			}
			g.officeWaits = append(g.officeWaits, c)
			return true
		}
	}
	return false
}

// reload rebuilds the cursors from the durable ledger after a failure. Until
// it succeeds, acks are refused: the in-memory cursors may hold acks that
// never became durable, and must not confirm a retried one.
func (g *groupRunner) reload() {
	if err := g.load(); err != nil {
		g.node.logRepeatedError(g.name+"/"+g.topic.cfg.Name, "group reload failed; will retry", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
		return
	}
	g.failure = nil
}

// loneHere reports whether partition p's only replica is this node's.
func (g *groupRunner) loneHere(p uint32) bool {
	c := g.node.cluster
	return c != nil && len(g.topic.placement[p]) == 1 && g.topic.hosts(int(p), uint32(c.Self()))
}

func (g *groupRunner) handleAcks(c groupCmd) {
	if g.failure != nil {
		reply, refused := c.reply, wire.Errorf(wire.CodeStorage, "group ledger unavailable: %v", g.failure)
		g.replies = append(g.replies, groupReply{answer: func(*wire.Error) { reply(nil, refused) }})
		return
	}
	now := g.node.monoMs()
	if g.awaitOffice(c, now) {
		return
	}
	m := g.node.metrics
	results := make([]wire.Code, len(c.entries))
	var parts []uint32
	for i, e := range c.entries {
		if int(e.Partition) >= len(g.cursors) {
			results[i] = wire.CodeInvalidArgument
			continue
		}
		cur := g.cursors[e.Partition]
		if cur == nil {
			// A partition this node does not deliver (any more):
			// NOT_LEADER, not STALE_DELIVERY — this node cannot tell
			// whether the ack is durable (it may have committed it
			// while it led), so the client asks the partition's leader,
			// which can (AckFollowsItsPartition). Its only replica here
			// unopened for damage, there is no leader to ask until a
			// repair: DATA_CORRUPT, as its publishes are answered.
			results[i] = wire.CodeNotLeader
			switch {
			case g.topic.partitions[e.Partition].unopenedForDamage():
				results[i] = wire.CodeDataCorrupt
			case g.loneHere(e.Partition) && !g.node.cfg.Mutations.LoneAckRedirected:
				// LoneAckAskedAgainHere: its only replica is here, not
				// delivering yet (restarting in place, taking office):
				// there is no other node to ask, and the ack may be
				// durable in its log — retry here. NOT_LEADER sent the
				// client after a leader that is this node (seed 7 of
				// `--nodes 1` with the metadata log flipped: the ack was
				// durable, the consumer took the answer for a
				// redelivery to come, and waited for good).
				results[i] = wire.CodeUnavailable
			}
			continue
		}
		if !slices.Contains(parts, e.Partition) {
			parts = append(parts, e.Partition)
		}
		var err error
		if c.kind == cmdNack {
			err = cur.Nack(now, e.Seq, e.DeliveryID, c.delayMs)
		} else {
			var isNew bool
			isNew, err = cur.Ack(e.Seq, e.DeliveryID)
			if g.ledger.needsRecord(isNew, e.Partition, e.Seq) && err == nil {
				g.ledgerBatch = binary.BigEndian.AppendUint32(g.ledgerBatch, e.Partition)
				g.ledgerBatch = binary.BigEndian.AppendUint64(g.ledgerBatch, e.Seq)
				m.acks.WithLabelValues(g.topic.cfg.Name, g.name).Inc()
			}
		}
		if errors.Is(err, delivery.ErrStale) {
			results[i] = wire.CodeStaleDelivery
		}
	}
	reply := c.reply
	g.replies = append(g.replies, groupReply{parts: parts, answer: func(failed *wire.Error) {
		if failed != nil {
			reply(nil, failed)
			return
		}
		reply(results, nil)
	}})
}
