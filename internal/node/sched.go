package node

// Scheduled delivery on a single node: the shards are the partitions of
// the internal topic __sched (created at the first SCHEDULE), and each
// shard has a runner — the shell of the scheduler kernel (internal/sched).
// The runner applies the shard's committed records to the shard's State,
// feeds the Owner the gates, the clock, probe answers and publish
// outcomes, and carries out its effects: records appended to the shard,
// due messages published to their destination with the producer identity
// of (shard, destination partition) and the fire sequence as
// producer_seq, probes answered from the node's topics.
//
// A single node holds both gates of every shard for as long as it runs:
// the shard's only replica leads it, under the partition's epoch. In a
// cluster a runner runs at every replica of a shard (each applies the
// shard's log); the one whose replica leads the shard, has applied its
// epoch's install entry and holds its lease (replog.Log.LeaseLeft) is
// the owner. In Manual mode (the simulator) Step runs the runners.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// schedHeader marks a shard record; its value is the encoded sched.Record.
// A schedule's message follows as the record's key, value and remaining
// headers.
const schedHeader = "nereus-sched"

// Scheduler settings.
const (
	// SchedShards is the partition count of __sched.
	SchedShards = 2
	// schedEvidenceMs is how long a probe's answer is trusted.
	schedEvidenceMs = 5_000
	// schedFireWindow keeps fire sequences within the destination's dedup
	// window (Config.Dedup's WindowMax, at least this).
	schedFireWindow = 256
	schedClaimMax   = 256
	schedProbeMs    = 100
	// schedGuardMs: a single node's lease never lapses while it runs; the
	// guard is renewed at every pass.
	schedGuardMs = 60_000
	// schedDrainMs bounds a drain before a planned hand-off: how long the
	// owner waits for its publishes and proposals in flight (release).
	schedDrainMs = 2_000
	// schedRecentResults bounds the applied results kept for replies that
	// arrive after their record was applied.
	schedRecentResults = 4096
	// schedCheckpointChunk bounds the schedules of one checkpoint chunk
	// (at most 55 bytes each: a chunk stays far below a record's limit).
	schedCheckpointChunk = 4096
	// schedCarryMax bounds the carries an owner proposes at once.
	schedCarryMax = 1024
)

// ScheduleReply receives a SCHEDULE's outcome exactly once.
type ScheduleReply func(ok wire.ScheduleOK, err *wire.Error)

// SchedAdminReply receives a SCHED_ADMIN's outcome exactly once.
type SchedAdminReply func(ok *wire.SchedAdminOK, err *wire.Error)

// Schedule stores pub for publication at deliverAtMs and answers once the
// schedule is durable.
func (n *Node) Schedule(f *wire.Schedule, reply ScheduleReply) {
	pub := &f.Pub
	if err := wire.ValidateWritableTopic(pub.Topic); err != nil {
		reply(wire.ScheduleOK{}, asWire(err))
		return
	}
	if werr := n.validateRecord(pub); werr != nil {
		reply(wire.ScheduleOK{}, werr)
		return
	}
	for _, h := range pub.Headers {
		if h.Key == schedHeader {
			reply(wire.ScheduleOK{}, wire.Errorf(wire.CodeInvalidArgument, "header %q is reserved", h.Key))
			return
		}
	}
	t, err := n.topic(pub.Topic)
	if err != nil {
		reply(wire.ScheduleOK{}, asWire(err))
		return
	}
	part, werr := t.partitionFor(pub)
	if werr != nil {
		reply(wire.ScheduleOK{}, werr)
		return
	}
	runners, werr := n.schedRunners()
	if werr != nil {
		reply(wire.ScheduleOK{}, werr)
		return
	}
	shard := wire.SchedShard(pub.Topic, pub.Key, pub.ProducerID, pub.ProducerSeq, part, uint32(len(runners)))
	if runners[shard] == nil {
		reply(wire.ScheduleOK{}, n.schedNotLeader(shard))
		return
	}
	runners[shard].send(schedCmd{schedule: &schedIntake{f: f, partition: part, reply: reply}})
}

// SchedAdmin answers a scheduler administration request for shard
// f.Shard (a client asks each shard's leader and merges the answers).
func (n *Node) SchedAdmin(f *wire.SchedAdmin, reply SchedAdminReply) {
	if f.Op < wire.SchedList || f.Op > wire.SchedLane {
		reply(nil, wire.Errorf(wire.CodeInvalidArgument, "scheduler operation %d", f.Op))
		return
	}
	if f.Op == wire.SchedLane {
		if err := wire.ValidateName("topic", f.Topic); err != nil {
			reply(nil, asWire(err))
			return
		}
		if _, err := n.topic(f.Topic); err != nil {
			reply(nil, asWire(err))
			return
		}
	}
	r, werr := n.schedRunnerOf(f.Shard)
	if werr != nil {
		reply(nil, werr)
		return
	}
	r.send(schedCmd{admin: f, adminReply: reply})
}

// schedRunnerOf is this node's runner of shard, or the error that
// answers a request for it: no such shard, or another node leads it.
func (n *Node) schedRunnerOf(shard uint32) (*schedRunner, *wire.Error) {
	runners, werr := n.schedRunners()
	if werr != nil {
		return nil, werr
	}
	if int(shard) >= len(runners) {
		return nil, wire.Errorf(wire.CodeNotFound, "no schedule shard %d (there are %d)", shard, len(runners))
	}
	if runners[shard] == nil {
		return nil, n.schedNotLeader(shard)
	}
	return runners[shard], nil
}

// SchedListReply receives a SCHED_LIST_PAGE's outcome exactly once.
type SchedListReply func(ok *wire.SchedListPageOK, err *wire.Error)

// SchedListPage answers one page of shard f.Shard's live schedules (a
// client pages through each shard and merges them). Only the shard's
// owner in office answers, from its state caught up with the shard's
// commit point: a page lists the schedules live when it is made.
func (n *Node) SchedListPage(f *wire.SchedListPage, reply SchedListReply) {
	if f.Topic != "" {
		if err := wire.ValidateName("topic", f.Topic); err != nil {
			reply(nil, asWire(err))
			return
		}
	}
	r, werr := n.schedRunnerOf(f.Shard)
	if werr != nil {
		reply(nil, werr)
		return
	}
	r.send(schedCmd{list: f, listReply: reply})
}

// schedNotLeader refuses a request for a shard this node holds no
// replica of, naming the shard's leader as this node knows it.
func (n *Node) schedNotLeader(shard uint32) *wire.Error {
	leader := "unknown"
	if t, err := n.topic(wire.SchedTopic); err == nil && int(shard) < len(t.partitions) {
		if info := t.partitions[shard].info(); info.Leader != "" {
			leader = info.Leader + " at " + info.LeaderAddr
		}
	}
	return wire.Errorf(wire.CodeNotLeader, "schedule shard %d: this node does not own it; leader: %s", shard, leader)
}

// schedRunners returns the shards' runners, creating __sched and
// starting them at the first use.
func (n *Node) schedRunners() ([]*schedRunner, *wire.Error) {
	n.schedMu.Lock()
	runners := n.sched
	n.schedMu.Unlock()
	if runners != nil {
		return runners, nil
	}
	t, err := n.topic(wire.SchedTopic)
	if err != nil && n.cfg.Manual && n.cluster != nil {
		// Its driver's goroutine must not wait for the metadata log: the
		// shards are declared, and this request is answered for a retry.
		n.declareAsync(wire.TopicConfig{Name: wire.SchedTopic, Partitions: SchedShards}, func(bool, error) {})
		return nil, wire.Errorf(wire.CodeUnavailable, "the schedule shards are being created; retry")
	}
	if err != nil {
		// A cluster declares it through the metadata log (and starts the
		// runners as it applies it: clusterHost.StartTopic).
		if _, err := n.declare(wire.TopicConfig{Name: wire.SchedTopic, Partitions: SchedShards}); err != nil {
			return nil, asWire(err)
		}
		if t, err = n.topic(wire.SchedTopic); err != nil {
			return nil, asWire(err)
		}
	}
	if err := n.startSched(t); err != nil {
		return nil, asWire(err)
	}
	n.schedMu.Lock()
	defer n.schedMu.Unlock()
	return n.sched, nil
}

// startSched starts a runner for every shard of t this node holds a
// replica of, once (the later calls find them running). It may run with
// n.mu held (clusterHost.StartTopic).
func (n *Node) startSched(t *topic) error {
	n.schedMu.Lock()
	defer n.schedMu.Unlock()
	if n.schedStopped {
		return wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	}
	if n.sched != nil {
		return nil
	}
	runners := make([]*schedRunner, len(t.partitions))
	for i, p := range t.partitions {
		if !p.held() && p.replica() == nil {
			continue // a cluster's shard with no replica here
		}
		r, err := newSchedRunner(n, p)
		if err != nil {
			for _, r := range runners {
				if r != nil {
					r.spill.close()
				}
			}
			return fmt.Errorf("scheduler shard %d: %w", p.id, err)
		}
		runners[i] = r
		t.groupsMu.Lock()
		t.sched = append(t.sched, r)
		t.groupsMu.Unlock()
		if n.cfg.Manual {
			r.woken = true // Step runs it
			continue
		}
		r.wg.Add(1)
		go r.run()
	}
	n.sched = runners
	return nil
}

// drainSched lets each shard owner in office drain before the node
// shuts down (Close, before anything else stops, so its publishes in
// flight can still land): no claims or admissions, its publishes and
// their FIRED records in flight finished, for at most schedDrainMs (Drain
// and takeover: the next owner then has nothing to publish again). The
// owners take no office again. A Manual node (the simulator's) does not
// drain: its driver is the caller.
func (n *Node) drainSched() {
	if n.cfg.Manual {
		return
	}
	n.schedMu.Lock()
	runners := n.sched
	n.schedMu.Unlock()
	var drains []chan struct{}
	for _, r := range runners {
		if r != nil {
			d := make(chan struct{})
			r.send(schedCmd{stopping: d})
			drains = append(drains, d)
		}
	}
	deadline := make(chan struct{})
	timer := n.cfg.Env.Clock.AfterFunc(schedDrainMs*time.Millisecond+time.Second, func() { close(deadline) })
	defer timer.Stop()
	for _, d := range drains {
		select {
		case <-d:
		case <-deadline:
			return
		}
	}
}

// stopSched stops the runners, and any start after it (Close).
func (n *Node) stopSched() {
	n.schedMu.Lock()
	runners := n.sched
	n.schedStopped = true
	n.schedMu.Unlock()
	for _, r := range runners {
		if r != nil {
			r.stop()
		}
	}
}

// drained tells stopSched the owner's drain for a shutdown ended.
func (r *schedRunner) drained() {
	if r.stopping != nil {
		select {
		case <-r.stopping:
		default:
			close(r.stopping)
		}
	}
}

// schedCmd is one request for a runner: exactly one field is set.
type schedCmd struct {
	schedule   *schedIntake
	admin      *wire.SchedAdmin
	adminReply SchedAdminReply
	list       *wire.SchedListPage
	listReply  SchedListReply
	appended   *schedAppended
	published  *schedPublished
	// stopping: the node is shutting down; closed once the owner drained
	// (drainSched).
	stopping chan struct{}
}

type schedIntake struct {
	f         *wire.Schedule
	partition uint32
	reply     ScheduleReply
}

// schedAppended is the end of an append to the shard: an owner proposal
// (ref != 0), a schedule (intake) or an admin command (admin).
type schedAppended struct {
	ref        uint64
	gen        uint64 // the runner's restart the proposal (ref != 0) is of
	intake     *schedIntake
	adminReply SchedAdminReply
	ok         wire.PubOK
	err        *wire.Error
}

type schedPublished struct {
	pub sched.Publish
	ok  wire.PubOK
	err *wire.Error
	// lost: the schedule's message is in seqs a repair dropped (publish),
	// so it can never be published.
	lost bool
}

// schedRunner is one shard's scheduler on this node, run by its own
// goroutine; everything below is owned by it.
type schedRunner struct {
	node  *Node
	p     *partitionRunner
	shard uint32
	st    *sched.State
	o     *sched.Owner
	spill *schedSpill
	// gen counts restarts: an earlier owner's proposals are not this
	// one's. restartAt paces restarts after spill failures.
	gen       uint64
	restartAt int64
	// barrier is the commit point when the runner started: the owner is
	// active once everything committed before it is applied.
	barrier uint64
	// handOff is the replica the shard's leadership goes to once the
	// owner drained (release); released: the drain ended and the hand-off
	// was asked for, so the owner stays out of office until it happens
	// or is abandoned.
	handOff  replica.NodeID
	released bool
	// stopping, once the node shuts down: closed when the owner drained
	// (Release), and no office is taken again.
	stopping chan struct{}
	metrics  schedMetrics // for scrapes (schedmetrics.go)
	reads    schedReads   // the last read of the log, for publishes (schedread.go)
	started  bool
	// appending counts the runner's appends to the shard not completed
	// yet: the owner maintains the shard (carries, checkpoints) only when
	// none is on its way, so a checkpoint lands right after what it lists.
	appending int
	// hint is the base of the latest complete checkpoint this runner
	// wrote to its hint file (a restart starts there); noHint: the
	// hint did not lead to a checkpoint, the log's start is used.
	hint   uint64
	noHint bool
	// readBytes counts the bytes of shard entries the runner read to
	// apply them (restart measurements; read by tests).
	readBytes atomic.Int64
	// start is the log's start as last seen; restoring, while the state
	// waits for a checkpoint, why: "restored" (a start from the hint or
	// a compacted log) or "rebuilt" (the log's start passed the state)
	// (SchedCompactObserver).
	start     uint64
	restoring string
	// recent keeps the results of applied records that refused something,
	// for a reply whose append completes after its record was applied.
	recent map[uint64]sched.Result
	// waiting: appends that completed before their record was applied,
	// by seq.
	waiting map[uint64]*schedAppended
	// adminRefs: lane and cancel proposals, answered when applied.
	adminRefs map[uint64]SchedAdminReply
	// refusals counts, per destination partition, the publishes refused
	// in a row: the attempt a publish is forwarded as (publishToLeader),
	// so that a node without a replica of the partition tries its
	// replicas in turn (PublishFindsTheLeader).
	refusals map[schedDest]int

	cmds chan schedCmd // sessions' requests
	// Manual mode (Config.Manual): no goroutine; Step runs the runner when
	// woken, when a request is queued, or at nextWakeMs.
	manualQueue []schedCmd
	woken       bool
	nextWakeMs  int64
	// inbox: completions of appends and publishes, from the partitions'
	// goroutines, which must never block on the runner (it may be waiting
	// for their queues).
	inboxMu sync.Mutex
	inbox   []schedCmd
	wakeCh  chan struct{}
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newSchedRunner(n *Node, p *partitionRunner) (*schedRunner, error) {
	r := &schedRunner{node: n, p: p, shard: p.id,
		waiting: map[uint64]*schedAppended{}, adminRefs: map[uint64]SchedAdminReply{},
		cmds: make(chan schedCmd, 1024), wakeCh: make(chan struct{}, 1), done: make(chan struct{})}
	if err := r.restart(); err != nil {
		return nil, err
	}
	return r, nil
}

// restart gives the runner a new state, spill and owner, which the log's
// replay fills: at start, and after the spill failed (a disk error in a
// file derived from the log is no integrity failure of the shard).
func (r *schedRunner) restart() error {
	n := r.node
	if r.spill != nil {
		r.spill.close()
	}
	sp, err := newSchedSpill(n.cfg.Env.FS, path.Join(n.cfg.DataDir, "sched-spill", strconv.Itoa(int(r.shard))),
		min(schedSpillTable, n.cfg.SchedWindow), r.findSchedule)
	if err != nil {
		return err
	}
	r.reads = schedReads{}
	st := sched.NewState()
	st.Mutations = n.cfg.Mutations.SchedState
	st.SetSpill(sp, n.cfg.SchedWindow)
	st.Restore(r.restoreFrom())
	cfg := sched.Config{ClaimMax: schedClaimMax, FireWindow: min(schedFireWindow, uint64(max(1, n.cfg.Dedup.DedupWindowMax))), ProbeEveryMs: schedProbeMs,
		CheckpointEvery: uint64(max(0, n.cfg.SchedCheckpointEvery)), CheckpointChunkEntries: schedCheckpointChunk, CarryMax: schedCarryMax,
		Mutations: n.cfg.Mutations.Sched}
	r.st, r.spill, r.o, r.recent = st, sp, sched.NewOwner(cfg, st), map[uint64]sched.Result{}
	r.restoring = ""
	if st.Restoring() {
		r.restoring = "restored"
	}
	r.gen++
	// The earlier owner's proposals may still commit; its admin
	// commands' outcomes are not known here any more.
	for ref, reply := range r.adminRefs {
		reply(nil, wire.Errorf(wire.CodeUnavailable, "scheduler shard %d restarted; the command may or may not have applied", r.shard))
		delete(r.adminRefs, ref)
	}
	if r.started {
		r.barrier = r.p.commitSeq.Load()
	}
	return nil
}

// recoverSpill restarts the runner once its state failed in its spill, at
// most once a second (a disk that keeps failing is retried, not spun on).
func (r *schedRunner) recoverSpill(now int64) {
	err := r.st.Failed()
	if err == nil || !errors.Is(err, sched.ErrSpill) || now < r.restartAt {
		return
	}
	r.restartAt = now + 1000
	r.node.log.Warn("scheduler shard's spill failed; rebuilding its state from the log", "shard", r.shard, "err", err)
	if err := r.restart(); err != nil {
		r.node.logRepeatedError(r.p.subject(), "scheduler shard cannot restart its spill; will retry", "err", err)
	}
}

// schedSpillTable is how many spilled schedules of a lane wait in RAM
// before they are written as a run (and how many deleted entries its runs
// may hold before they merge), or the window if smaller.
const schedSpillTable = 4096

// findSchedule reads schedule id's lane and key from the shard's log,
// for the spill (a cancel or a claim of a spilled schedule): its
// SCHEDULE record, or errScheduleCompacted once compaction took it.
func (r *schedRunner) findSchedule(id uint64) (string, sched.Key, bool, error) {
	if id < r.p.startSeq.Load() {
		return "", sched.Key{}, false, errScheduleCompacted
	}
	entries, err := r.p.read(id, 1, r.node.cfg.RecordBytesMax+(64<<10))
	if err != nil {
		return "", sched.Key{}, false, err
	}
	if len(entries) == 0 || entries[0].Seq != id {
		return "", sched.Key{}, false, nil
	}
	hs := entries[0].Record.Headers
	if len(hs) == 0 || hs[0].Key != schedHeader {
		return "", sched.Key{}, false, nil
	}
	d, err := sched.Decode(hs[0].Value)
	if err != nil || d.Kind != sched.KindSchedule {
		return "", sched.Key{}, false, err
	}
	return d.Schedule.Topic, sched.Key{DeliverAtMs: d.Schedule.DeliverAtMs, ID: id, Partition: d.Schedule.Partition, At: id}, true, nil
}

// message reads the message held by the shard record at seq (a SCHEDULE
// or a CARRY): the record without its scheduler header.
func (r *schedRunner) message(seq uint64) (*storage.Record, error) {
	cached, err := r.record(seq)
	if err != nil {
		return nil, err
	}
	rec := *cached // the read-ahead's own stays whole
	hs := rec.Headers
	if len(hs) == 0 || hs[0].Key != schedHeader {
		return nil, fmt.Errorf("shard entry %d holds no scheduler record", seq)
	}
	if v := hs[0].Value; len(v) == 0 || (sched.Kind(v[0]) != sched.KindSchedule && sched.Kind(v[0]) != sched.KindCarry) {
		return nil, fmt.Errorf("shard entry %d holds no message", seq)
	}
	rec.Headers = hs[1:]
	return &rec, nil
}

func (r *schedRunner) observe(event string) {
	if f := r.node.cfg.SchedCompactObserver; f != nil {
		f(r.shard, event)
	}
}

// deliver queues a completion for the runner without blocking.
func (r *schedRunner) deliver(c schedCmd) {
	r.inboxMu.Lock()
	r.inbox = append(r.inbox, c)
	r.inboxMu.Unlock()
	r.poke()
}

// send hands a session's request to the runner; after stop it is
// answered UNAVAILABLE.
func (r *schedRunner) send(c schedCmd) {
	if r.node.cfg.Manual {
		r.manualQueue = append(r.manualQueue, c)
		return
	}
	select {
	case r.cmds <- c:
	case <-r.done:
		werr := wire.Errorf(wire.CodeUnavailable, "node is shutting down")
		switch {
		case c.schedule != nil:
			c.schedule.reply(wire.ScheduleOK{}, werr)
		case c.adminReply != nil:
			c.adminReply(nil, werr)
		case c.listReply != nil:
			c.listReply(nil, werr)
		}
	}
}

func (r *schedRunner) poke() {
	if r.node.cfg.Manual {
		r.woken = true
		return
	}
	select {
	case r.wakeCh <- struct{}{}:
	default:
	}
}

func (r *schedRunner) stop() {
	r.once.Do(func() { close(r.done) })
	r.wg.Wait()
	if r.node.cfg.Manual {
		r.shutdown()
	}
	r.spill.close()
}

// pass is one round of the runner: completions, the shard's new
// commits, the gates, the owner's effects. It returns how long the runner
// may sleep.
func (r *schedRunner) pass() (waitMs int64) {
	r.inboxMu.Lock()
	inbox := r.inbox
	r.inbox = nil
	r.inboxMu.Unlock()
	for _, c := range inbox {
		r.handle(c)
	}
	now := r.node.nowMs()
	r.apply(now)
	if r.st.Failed() != nil {
		r.recoverSpill(now)
		r.apply(now)
	}
	r.o.SetAuthority(now, r.authority(now))
	r.release(now)
	r.carryOut(now)
	r.publishMetrics(now)
	if r.appending == 0 && len(r.waiting) == 0 && r.st.Applied() >= r.p.commitSeq.Load() {
		r.o.Maintain(now)
		r.carryOut(now)
	}
	wait := int64(1000)
	if r.st.Failed() != nil && r.restartAt > now {
		wait = r.restartAt - now
	}
	if at := r.o.NextWakeMs(now); at != 0 {
		wait = max(1, min(wait, at-now))
	}
	return wait
}

// step runs the runner in Manual mode if it has something to do at
// nowMs, and reports whether it ran.
func (r *schedRunner) step(nowMs int64) bool {
	r.inboxMu.Lock()
	pending := len(r.inbox) > 0
	r.inboxMu.Unlock()
	if len(r.manualQueue) == 0 && !pending && !r.woken && nowMs < r.nextWakeMs {
		return false
	}
	if !r.started {
		r.started, r.barrier = true, r.p.commitSeq.Load()
	}
	if len(r.manualQueue) > 0 {
		r.refreshGates()
	}
	for len(r.manualQueue) > 0 {
		c := r.manualQueue[0]
		r.manualQueue = r.manualQueue[1:]
		r.handle(c)
	}
	r.woken = false
	r.nextWakeMs = nowMs + r.pass()
	return true
}

func (r *schedRunner) run() {
	defer r.wg.Done()
	var timer env.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	r.started, r.barrier = true, r.p.commitSeq.Load()
	for {
		wait := r.pass()
		if timer != nil {
			timer.Stop()
		}
		timer = r.node.cfg.Env.Clock.AfterFunc(time.Duration(wait)*time.Millisecond, r.poke)
		select {
		case <-r.done:
			r.shutdown()
			return
		case c := <-r.cmds:
			r.refreshGates()
			r.handle(c)
		drain:
			for {
				select {
				case c := <-r.cmds:
					r.handle(c)
				default:
					break drain
				}
			}
		case <-r.wakeCh:
		}
	}
}

// refreshGates gives the owner the gates as of now before it judges
// commands: the guard the last pass set ends with the lease as it stood
// then, and the replica may have renewed it since — an owner would
// refuse an intake it may take (IntakeNeverBlocked).
func (r *schedRunner) refreshGates() {
	now := r.node.nowMs()
	r.o.SetAuthority(now, r.authority(now))
}

// authority: a single node's shard is always its own, under the
// partition's epoch. A cluster's is this node's while its replica leads
// the shard and holds its lease: the guard closes when the lease runs out
// on the clock (replog.Log.LeaseLeft), unless a later pass finds it
// renewed — a leader that lost its quorum is fenced by it long before it
// turns read-only. The barrier is the epoch's install entry.
func (r *schedRunner) authority(now int64) sched.Authority {
	if r.stopping != nil && r.o.Lifecycle() != sched.Draining {
		return sched.Authority{} // shut down once drained: no office again
	}
	rs := r.p.replica()
	if rs == nil {
		return sched.Authority{Assigned: true, Leader: true, Epoch: max(1, r.p.epoch.Load()), GuardUntilMs: now + schedGuardMs, Barrier: r.barrier}
	}
	st, v := rs.leaderView()
	if r.released && v.Leader && (st.TransferTo == r.handOff || st.TransferWanted == r.handOff) {
		// Drained for a hand-off that has not happened yet: no new office
		// in between (ReleasedStaysOut).
		return sched.Authority{}
	}
	r.released = false
	// The lease's end is a reading of the monotonic clock; the guard is in
	// the wall clock's milliseconds (now), so it gets what is left of it.
	guard := now + rs.repl.LeaseLeft().Milliseconds()
	if r.node.cfg.Mutations.SchedGuardFromTicks {
		guard = now + int64(st.LeaseTicks)*rs.repl.Tick().Milliseconds()
	}
	return sched.Authority{Assigned: true, Leader: v.Leader, Epoch: v.Epoch, GuardUntilMs: guard, Barrier: max(v.InstallSeq, 1)}
}

// release drains the owner before a planned hand-off (issue 14, "Drain
// and takeover"). The shard's replica wants to hand leadership to its
// preferred leader and waits for this runner (ReleaseBeforeTransfer):
// the owner stops claiming and admitting, waits up to schedDrainMs for
// its publishes and proposals in flight, and its Release effect asks the
// replica for the hand-off (carryOut). An owner with no office has
// nothing to drain. A drain that times out leaves the owner FENCED, which
// is safe: the next owner publishes the unresolved intents again, and the
// destination deduplicates them.
func (r *schedRunner) release(now int64) {
	rs := r.p.replica()
	if rs == nil {
		return
	}
	want := rs.repl.Status().TransferWanted
	if r.released {
		if want == r.handOff {
			rs.repl.TransferTo(want) // not started yet: ask again (the same target is a no-op)
		}
		return
	}
	if want == 0 {
		return
	}
	r.handOff = want
	switch r.o.Lifecycle() {
	case sched.Active:
		r.o.Drain(now, now+schedDrainMs)
	case sched.Draining:
	default:
		r.handOver()
	}
}

// handOver asks the shard's replica for the hand-off the owner drained
// for, and keeps the owner out of office until it happened.
func (r *schedRunner) handOver() {
	if rs := r.p.replica(); rs != nil && r.handOff != 0 {
		rs.repl.TransferTo(r.handOff)
		r.released = true
	}
}

// apply applies the shard's newly committed entries to the state; the
// state is loaded once it caught up with the commit point it started at.
func (r *schedRunner) apply(now int64) {
	for {
		from := r.st.Applied() + 1
		if start := r.p.startSeq.Load(); from < start {
			// The log lost what the state had not applied: this replica
			// was rebuilt from its leader's snapshot point. It restores
			// from the first checkpoint of what is left (the shard is
			// compacted no further than its latest one).
			r.node.log.Info("scheduler shard's log starts after its state; restoring from its checkpoint", "shard", r.shard, "start", start, "applied", from-1)
			r.noHint = true
			if err := r.restart(); err != nil {
				r.node.logRepeatedError(r.p.subject(), "scheduler shard cannot restart; will retry", "err", err)
				return
			}
			r.restoring = "rebuilt"
			continue
		}
		entries, err := r.p.read(from, 1024, 4<<20)
		if gap := (*storage.GapError)(nil); errors.As(err, &gap) {
			r.node.log.Warn("scheduler shard's log lost seqs to a repair; what they held is gone", "shard", r.shard, "first_seq", from, "last_seq", gap.Next-1)
			if err := r.st.Drop(from, gap.Next-1); err != nil {
				r.fail(err)
				return
			}
			continue
		}
		if err != nil {
			r.node.logRepeatedError(r.p.subject(), "scheduler cannot read its shard; will retry", "err", err)
			return
		}
		if len(entries) == 0 {
			break
		}
		for i := range entries {
			n := len(entries[i].Record.Key) + len(entries[i].Record.Value)
			for _, h := range entries[i].Record.Headers {
				n += len(h.Key) + len(h.Value)
			}
			r.readBytes.Add(int64(n))
			r.applyEntry(now, &entries[i])
			if r.st.Failed() != nil {
				return
			}
		}
		r.noteCheckpoint()
	}
	if start := r.p.startSeq.Load(); start > r.start {
		if r.start != 0 {
			r.observe("truncated")
		}
		r.start = start
	}
	if r.st.Restoring() && r.st.Applied() >= r.p.commitSeq.Load() && !r.noHint {
		// The hint led to no checkpoint: from the log's start.
		r.node.log.Warn("scheduler shard found no checkpoint at its hint; restoring from the log's start", "shard", r.shard, "hint", r.hint)
		r.noHint = true
		if err := r.restart(); err == nil {
			r.apply(now)
		}
		return
	}
	if !r.st.Loaded() && !r.st.Restoring() && r.st.Applied() >= r.barrier {
		r.st.MarkLoaded()
	}
	r.p.schedLimit.Store(r.st.CompactLimit())
}

// schedHintDir holds each shard's checkpoint hint: the base of the latest
// complete checkpoint its runner applied, so a restart reads the shard's
// log from there instead of from its start. A hint is only a place to
// look: the checkpoint found there must be complete and valid, or the
// restart reads from the log's start.
const schedHintDir = "sched-checkpoint"

func (r *schedRunner) hintPath() string {
	return path.Join(r.node.cfg.DataDir, schedHintDir, strconv.Itoa(int(r.shard)))
}

// restoreFrom is where a new state starts reading the shard's log: its
// start, or the hint's checkpoint if that lies after it.
func (r *schedRunner) restoreFrom() uint64 {
	from := max(1, r.p.startSeq.Load())
	if r.noHint {
		return from
	}
	b, err := storage.ReadFileAtomic(r.node.cfg.Env.FS, r.hintPath())
	if err != nil || len(b) != 8 {
		return from
	}
	r.hint = binary.BigEndian.Uint64(b)
	if r.hint+1 > from && r.hint < r.p.commitSeq.Load() {
		return r.hint + 1
	}
	return from
}

// noteCheckpoint writes the hint once the state applied a newer
// complete checkpoint.
func (r *schedRunner) noteCheckpoint() {
	if r.restoring != "" && !r.st.Restoring() {
		r.observe(r.restoring)
		r.restoring = ""
	}
	base := r.st.LastCheckpoint()
	if base == 0 || base == r.hint {
		return
	}
	r.observe("checkpoint")
	fs := r.node.cfg.Env.FS
	err := fs.MkdirAll(path.Join(r.node.cfg.DataDir, schedHintDir))
	if err == nil {
		err = storage.WriteFileAtomic(fs, r.hintPath(), binary.BigEndian.AppendUint64(nil, base))
	}
	if err != nil {
		r.node.logRepeatedError(r.p.subject(), "scheduler cannot write its checkpoint hint (a restart reads more of the log)", "err", err)
		return
	}
	r.hint = base
}

func (r *schedRunner) applyEntry(now int64, e *storage.Entry) {
	var rec *sched.Record
	if hs := e.Record.Headers; len(hs) > 0 && hs[0].Key == schedHeader {
		d, err := sched.Decode(hs[0].Value)
		if err != nil {
			r.fail(fmt.Errorf("shard entry %d: %w", e.Seq, err))
			return
		}
		rec = &d
	}
	res, err := r.st.Apply(e.Seq, rec)
	if err != nil {
		r.fail(err)
		return
	}
	if res.Err != nil || len(res.Skipped) > 0 {
		r.recent[e.Seq] = res
		delete(r.recent, e.Seq-schedRecentResults)
	}
	if a := r.waiting[e.Seq]; a != nil {
		delete(r.waiting, e.Seq)
		r.answer(now, a, res)
	}
}

func (r *schedRunner) fail(err error) {
	r.node.logRepeatedError(r.p.subject(), "scheduler shard FAILED: its state cannot be applied (integrity)", "err", err)
}

func (r *schedRunner) handle(c schedCmd) {
	now := r.node.nowMs()
	switch {
	case c.schedule != nil:
		r.intake(now, c.schedule)
	case c.admin != nil:
		r.admin(now, c.admin, c.adminReply)
	case c.list != nil:
		out, werr := r.listPage(now, c.list.Topic, sched.ListCursor{DeliverAtMs: c.list.AfterDeliverAtMs, ID: c.list.AfterID}, int(c.list.Limit))
		c.listReply(out, werr)
	case c.stopping != nil:
		r.stopping = c.stopping
		if r.o.Lifecycle() == sched.Active {
			r.o.Drain(now, now+schedDrainMs)
			r.carryOut(now)
		}
		if r.o.Lifecycle() != sched.Draining {
			r.drained()
		}
	case c.appended != nil:
		a := c.appended
		r.appending--
		if a.ref != 0 && a.gen != r.gen {
			return // an earlier owner's proposal
		}
		if a.err != nil || a.ok.Seq <= r.st.Applied() {
			res := r.recent[a.ok.Seq]
			if a.err == nil && a.intake != nil && res.Err == nil && !r.node.cfg.Mutations.SchedRefusalForgotten {
				// A retry of a schedule applied long ago (or before a
				// restart): the lane remembers whether it refused it
				// (RefusalOutlivesItsAnswer).
				res.Err = r.st.Refused(a.intake.f.Pub.Topic, a.ok.Seq)
			}
			r.answer(now, a, res)
			return
		}
		r.waiting[a.ok.Seq] = a // answered when applied
	case c.published != nil:
		r.published(now, c.published)
	}
}

// answer ends an append whose record is applied (or that failed).
func (r *schedRunner) answer(now int64, a *schedAppended, res sched.Result) {
	switch {
	case a.ref != 0:
		var err error
		if a.err != nil {
			err = a.err
		}
		r.o.Proposed(now, a.ref, err)
		if reply, ok := r.adminRefs[a.ref]; ok {
			delete(r.adminRefs, a.ref)
			switch {
			case a.err != nil:
				reply(nil, a.err)
			case res.Err != nil:
				reply(nil, wire.Errorf(wire.CodeInvalidArgument, "%v", res.Err))
			case len(res.Skipped) > 0:
				reply(nil, wire.Errorf(wire.CodeNotFound, "schedule %d of shard %d is not pending (unknown, firing or done)", res.Skipped[0], r.shard))
			default:
				reply(&wire.SchedAdminOK{}, nil)
			}
		}
	case a.intake != nil:
		switch {
		case a.err != nil:
			a.intake.reply(wire.ScheduleOK{}, a.err)
		case errors.Is(res.Err, sched.ErrRefusalForgotten):
			a.intake.reply(wire.ScheduleOK{}, wire.Errorf(wire.CodeOutcomeUnknown, "schedule shard %d: %v", r.shard, res.Err))
		case res.Err != nil:
			a.intake.reply(wire.ScheduleOK{}, wire.Errorf(wire.CodeInvalidArgument, "%v", res.Err))
		default:
			a.intake.reply(wire.ScheduleOK{Shard: r.shard, ID: a.ok.Seq, DeliverAtMs: a.intake.f.DeliverAtMs, Duplicate: a.ok.Duplicate}, nil)
		}
	}
}

// refusal words the owner's refusal of a command: in a cluster a shard
// this node does not own (yet) is NOT_LEADER, naming the leader.
func (r *schedRunner) refusal(err error) *wire.Error {
	if !errors.Is(err, sched.ErrNotActive) {
		return wire.Errorf(wire.CodeInvalidArgument, "%v", err)
	}
	if life := r.o.Lifecycle(); r.p.replica() != nil && life != sched.CatchingUp && life != sched.Restoring && life != sched.Draining && !r.released {
		return r.node.schedNotLeader(r.shard)
	}
	return wire.Errorf(wire.CodeUnavailable, "schedule shard %d: %v; retry", r.shard, err)
}

// intake appends a schedule to the shard once the owner admits it.
func (r *schedRunner) intake(now int64, in *schedIntake) {
	pub := &in.f.Pub
	sc := sched.Schedule{DeliverAtMs: in.f.DeliverAtMs, Topic: pub.Topic, Incarnation: r.node.scheduleIncarnation(pub.Topic), Partition: in.partition}
	// RetryIsItsOriginal: an idempotent SCHEDULE to a lane closed (or
	// retired) since goes to the shard's log all the same. One admitted
	// before is answered by the shard's producer table with the
	// original's SCHEDULE_OK — it is live and fires once the lane opens,
	// or was cancelled by a retire — where the refusal told its client
	// "not scheduled".
	//
	// RefusalIsFinal: a new one to a CLOSED lane is appended and refused
	// as it applies, so that its producer_seq keeps that answer: another
	// send of it still on its way (a client's retry of a send whose answer
	// was late) arriving once the lane is open again is answered as the
	// refused original, never taken as new — its client was told
	// "refused" of a schedule that would then fire. A RETIRED lane never
	// opens again: a new one is refused with nothing appended.
	var retryOnly *wire.Error
	if err := r.o.Admit(now, sc); err != nil {
		if !errors.Is(err, sched.ErrLaneAdmitsNone) || pub.ProducerID == 0 || r.node.cfg.Mutations.SchedRetryRefusedOnClosedLane {
			in.reply(wire.ScheduleOK{}, r.refusal(err))
			return
		}
		if l, _ := r.st.Lane(pub.Topic); l.Gate == sched.GateRetired || r.node.cfg.Mutations.SchedRefusalNotRecorded {
			retryOnly = r.refusal(err)
		}
	}
	rec := sched.Record{Kind: sched.KindSchedule, Schedule: sc}
	v, err := rec.Encode()
	if err != nil {
		in.reply(wire.ScheduleOK{}, wire.Errorf(wire.CodeInvalidArgument, "%v", err))
		return
	}
	headers := make([]storage.Header, 0, len(pub.Headers)+1)
	headers = append(headers, storage.Header{Key: schedHeader, Value: v})
	for _, h := range pub.Headers {
		headers = append(headers, storage.Header{Key: h.Key, Value: h.Value})
	}
	ts := pub.TimestampMs
	if ts == 0 {
		ts = now
	}
	a := &schedAppended{intake: in}
	r.appending++
	r.p.enqueue(&pubReq{
		rec:        storage.Record{TimestampMs: ts, Key: pub.Key, Value: pub.Value, Headers: headers, ProducerID: pub.ProducerID, ProducerSeq: pub.ProducerSeq},
		producerID: pub.ProducerID, producerSeq: pub.ProducerSeq, retryOnly: retryOnly,
		reply: replyTo{fn: func(ok wire.PubOK, err *wire.Error) {
			a.ok, a.err = ok, err
			r.deliver(schedCmd{appended: a})
		}},
	})
}

// carryOut does the owner's effects, and those they lead to (a probe's
// answer makes a lane ready, which claims).
func (r *schedRunner) carryOut(now int64) {
	for effects := r.o.TakeEffects(); len(effects) > 0; effects = r.o.TakeEffects() {
		for _, e := range effects {
			switch {
			case e.Propose != nil:
				r.propose(e.Propose.Ref, e.Propose.Record)
			case e.Publish != nil:
				r.publish(now, *e.Publish)
			case e.Probe != "":
				r.o.Evidence(now, r.evidence(now, e.Probe))
			case e.Release:
				r.handOver()
				r.drained()
				// Out of office at once: a later step in this pass (the
				// upkeep) must not take it again under the gates read
				// before the release (ReleasedStaysOut).
				r.o.SetAuthority(now, r.authority(now))
			}
		}
	}
}

// propose appends an owner's record to the shard: a carry with the
// message it carries.
func (r *schedRunner) propose(ref uint64, rec sched.Record) {
	a := &schedAppended{ref: ref, gen: r.gen}
	r.appending++
	v, err := rec.Encode()
	if err != nil {
		a.err = wire.Errorf(wire.CodeInvalidArgument, "%v", err)
		r.deliver(schedCmd{appended: a})
		return
	}
	out := storage.Record{TimestampMs: r.node.nowMs(), Headers: []storage.Header{{Key: schedHeader, Value: v}}}
	if rec.Kind == sched.KindCarry {
		msg, err := r.message(rec.Carry.From)
		if err != nil {
			a.err = wire.Errorf(wire.CodeStorage, "carry schedule %d of shard %d: %v", rec.Carry.ID, r.shard, err)
			r.deliver(schedCmd{appended: a})
			return
		}
		out.TimestampMs, out.Key, out.Value = msg.TimestampMs, msg.Key, msg.Value
		out.Headers = append(out.Headers, msg.Headers...)
	}
	r.p.enqueue(&pubReq{
		rec: out,
		reply: replyTo{fn: func(ok wire.PubOK, err *wire.Error) {
			a.ok, a.err = ok, err
			r.deliver(schedCmd{appended: a})
		}},
	})
}

// evidence answers a probe from this node's view of the topics: a
// topic's current incarnation, 0 while it does not exist.
func (r *schedRunner) evidence(now int64, topic string) sched.Evidence {
	ev := sched.Evidence{Topic: topic, ValidUntilMs: now + schedEvidenceMs}
	t, err := r.node.topic(topic)
	if err != nil {
		return ev
	}
	// The incarnation running here: a lane pinned to a deleted one breaks
	// (ORDERING_BROKEN) once the name is declared again; while it is gone
	// (err above: incarnation 0) the lane is BLOCKED.
	ev.Incarnation, ev.Partitions, ev.Writable = t.incarnation, uint32(len(t.partitions)), true
	for _, p := range t.partitions {
		info := p.info()
		if info.State == wire.PartitionStateCorrupt || info.ReadOnly || info.Leader == "" {
			// DATA_CORRUPT refuses writes until a repair; a degraded or
			// leaderless partition until it recovers.
			ev.Writable = false
		}
	}
	return ev
}

// schedProducerID is the producer identity of (shard, topic, partition):
// the fire sequences of that destination partition are its producer_seqs.
func schedProducerID(shard uint32, topic string, partition uint32) uint64 {
	h := fnv.New64a()
	h.Write([]byte("nereus-sched\x00"))
	h.Write(binary.BigEndian.AppendUint32(nil, shard))
	h.Write([]byte(topic))
	h.Write(binary.BigEndian.AppendUint32([]byte{0}, partition))
	return h.Sum64() | 1 // never 0 (0 = not idempotent)
}

// schedDest is a destination partition.
type schedDest struct {
	topic     string
	partition uint32
}

// publish reads the due schedule's message from the shard and publishes it.
func (r *schedRunner) publish(now int64, p sched.Publish) {
	if observe := r.node.cfg.SchedPublishObserver; observe != nil {
		observe(r.shard, p)
	}
	done := func(ok wire.PubOK, err *wire.Error) {
		r.deliver(schedCmd{published: &schedPublished{pub: p, ok: ok, err: err}})
	}
	rec, err := r.message(p.At)
	if gap := (*storage.GapError)(nil); errors.As(err, &gap) {
		// A checkpoint lists the schedule, but a repair dropped the
		// record holding its message: it can never be published.
		r.deliver(schedCmd{published: &schedPublished{pub: p, lost: true}})
		return
	}
	if err != nil {
		done(wire.PubOK{}, wire.Errorf(wire.CodeStorage, "read schedule %d of shard %d at %d: %v", p.ID, r.shard, p.At, err))
		return
	}
	var hs []wire.Header
	for _, h := range rec.Headers {
		hs = append(hs, wire.Header{Key: h.Key, Value: h.Value})
	}
	// To the destination partition's leader, wherever it is.
	// Into the incarnation the lane's certificate vouched for, and no other.
	r.node.publishToLeader(&wire.Pub{Topic: p.Topic, Partition: int32(p.Partition), ProducerID: schedProducerID(r.shard, p.Topic, p.Partition),
		ProducerSeq: p.FireSeq, TimestampMs: rec.TimestampMs, Key: rec.Key, Value: rec.Value, Headers: hs}, p.Incarnation,
		r.refusals[schedDest{p.Topic, p.Partition}], done)
}

func (r *schedRunner) published(now int64, p *schedPublished) {
	// PublishFindsTheLeader: a node without a replica of the destination
	// partition forwards to the replica its attempt names (the first one
	// for attempt 0). Sent as attempt 0 every time, a publish went to the
	// first replica, which refused it NOT_LEADER while another led: the
	// lane was BLOCKED, probed READY and refused again, until the first
	// replica led again (`nereus sim --nodes 5 --replicas 3 --members --kv
	// 30 --schedules 30 --retention`, seed 1: ScheduledOnTime).
	dest := schedDest{p.pub.Topic, p.pub.Partition}
	if p.err != nil && !r.node.cfg.Mutations.SchedForwardsToFirstReplica {
		if r.refusals == nil {
			r.refusals = map[schedDest]int{}
		}
		r.refusals[dest]++
	} else {
		delete(r.refusals, dest)
	}
	out := sched.Landed
	switch {
	case p.lost:
		// LostMessageResolvedUnknown: recorded UNKNOWN (an earlier
		// office may have published it before the damage), never
		// guessed. Before, its publish failed for good: it stayed FIRING
		// and blocked its lane at every try.
		out = sched.Unprovable
		r.node.log.Warn("scheduled message lost to a repair; its schedule is resolved unknown", "shard", r.shard, "id", p.pub.ID, "topic", p.pub.Topic, "at", p.pub.At)
	case p.err == nil:
	case p.err.Code == wire.CodeProducerSeqTooOld:
		out = sched.Unprovable
	default:
		out = sched.Refused
		r.node.logRepeatedError(r.p.subject()+"/"+p.pub.Topic, "scheduled publish refused; its lane is blocked until a probe finds the destination ready",
			"topic", p.pub.Topic, "partition", p.pub.Partition, "err", p.err)
	}
	r.countPublished(now, p.pub, out)
	r.o.Published(now, p.pub, out, p.ok.Seq)
}

// admin answers one shard's part of a SCHED_ADMIN.
func (r *schedRunner) admin(now int64, f *wire.SchedAdmin, reply SchedAdminReply) {
	switch f.Op {
	case wire.SchedList:
		// SCHED_ADMIN's list (protocol v1's first form): the first page of
		// the listing, so it is bounded too.
		page, werr := r.listPage(now, f.Topic, sched.ListCursor{}, int(f.Limit))
		if werr != nil {
			reply(nil, werr)
			return
		}
		reply(&wire.SchedAdminOK{Schedules: page.Schedules}, nil)
	case wire.SchedStatus:
		c := r.st.Counts()
		info := wire.ShardInfo{Shard: r.shard, Lifecycle: r.o.Lifecycle().String(), Owner: r.node.cfg.NodeID, OwnerEpoch: r.o.Epoch(),
			Pending: uint32(r.st.Live()), Fired: c.Fired, Unknown: c.Unknown, Cancelled: c.Cancelled}
		out := &wire.SchedAdminOK{}
		for _, t := range r.st.Lanes() {
			l, _ := r.st.Lane(t)
			if due, ok := r.st.NextDue(t); ok && (info.NextDueMs == 0 || due < info.NextDueMs) {
				info.NextDueMs = due
			}
			if f.Topic == "" || f.Topic == t {
				out.Lanes = append(out.Lanes, wire.LaneInfo{Shard: r.shard, Topic: t, Gate: l.Gate.String(), Readiness: r.o.LaneReadiness(t).String(),
					Incarnation: l.Incarnation, Pending: uint32(l.Pending)})
			}
		}
		out.Shards = []wire.ShardInfo{info}
		reply(out, nil)
	case wire.SchedCancel:
		ref, err := r.o.Cancel(now, []uint64{f.ID})
		if err != nil {
			reply(nil, r.refusal(err))
			return
		}
		r.adminRefs[ref] = reply
	case wire.SchedLane:
		op, ok := map[uint8]sched.LaneOp{wire.LanePause: sched.LanePause, wire.LaneResume: sched.LaneResume,
			wire.LaneClose: sched.LaneClose, wire.LaneRetire: sched.LaneRetire}[f.LaneOp]
		if !ok {
			reply(nil, wire.Errorf(wire.CodeInvalidArgument, "lane command %d", f.LaneOp))
			return
		}
		ref, err := r.o.Manage(now, sched.LaneCommand{Topic: f.Topic, Op: op, Incarnation: r.node.resumeIncarnation(f.Topic, op)})
		if err != nil {
			reply(nil, r.refusal(err))
			return
		}
		r.adminRefs[ref] = reply
	}
	r.carryOut(now)
}

// listPage answers a page of the shard's live schedules of topic ("" =
// all) after cursor, at most limit (0 or above wire.SchedListLimitMax:
// that). Only the owner in office answers — its lease holds, so no other
// replica commits to the shard meanwhile — after applying everything
// committed: a schedule listed is live at the time of the page (never
// one fired or cancelled since), and the cursor, a schedule's key, means
// the same on every replica and across a rebuilt spill. A state that is
// loading, restoring or failed is not listed (UNAVAILABLE: retry).
func (r *schedRunner) listPage(now int64, topic string, cursor sched.ListCursor, limit int) (*wire.SchedListPageOK, *wire.Error) {
	if limit <= 0 || limit > wire.SchedListLimitMax {
		limit = wire.SchedListLimitMax
	}
	commit := r.p.commitSeq.Load()
	r.apply(now)
	if r.st.Failed() != nil {
		r.recoverSpill(now)
		r.apply(now)
	}
	if err := r.o.Serving(now); err != nil {
		return nil, r.refusal(err)
	}
	if !r.st.Loaded() || r.st.Applied() < commit {
		return nil, wire.Errorf(wire.CodeUnavailable, "schedule shard %d is catching up with its log; retry", r.shard)
	}
	page, more, err := r.st.List(topic, cursor, limit)
	if err != nil {
		return nil, wire.Errorf(wire.CodeUnavailable, "schedule shard %d cannot list its schedules now (%v); retry", r.shard, err)
	}
	out := &wire.SchedListPageOK{More: more}
	for _, e := range page {
		out.Schedules = append(out.Schedules, wire.ScheduleInfo{Shard: r.shard, ID: e.ID, DeliverAtMs: e.DeliverAtMs, Topic: e.Topic, Partition: e.Partition, State: e.Status.String()})
	}
	return out, nil
}

// shutdown answers what waits: the shard's records may still commit.
func (r *schedRunner) shutdown() {
	werr := wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	for _, a := range r.waiting {
		if a.intake != nil {
			a.intake.reply(wire.ScheduleOK{}, werr)
		}
	}
	for _, reply := range r.adminRefs {
		reply(nil, werr)
	}
	r.inboxMu.Lock()
	inbox := r.inbox
	r.inbox = nil
	r.inboxMu.Unlock()
	for _, c := range inbox {
		if a := c.appended; a != nil && a.intake != nil {
			a.intake.reply(wire.ScheduleOK{}, werr)
		} else if a != nil && r.adminRefs[a.ref] != nil {
			r.adminRefs[a.ref](nil, werr)
		}
	}
	refuse := func(c schedCmd) {
		switch {
		case c.schedule != nil:
			c.schedule.reply(wire.ScheduleOK{}, werr)
		case c.adminReply != nil:
			c.adminReply(nil, werr)
		case c.listReply != nil:
			c.listReply(nil, werr)
		}
	}
	for _, c := range r.manualQueue {
		refuse(c)
	}
	r.manualQueue = nil
	for {
		select {
		case c := <-r.cmds:
			refuse(c)
		default:
			return
		}
	}
}
