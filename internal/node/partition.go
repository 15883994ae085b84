package node

// A partition's shared core (partitionRunner) and the choice of its store.

import (
	"errors"
	"math"
	"path"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nereus-broker/nereus/internal/budget"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// PubReply receives the outcome of one publish exactly once, from the
// partition's goroutine. It must not block.
type PubReply func(ok wire.PubOK, err *wire.Error)

// BatchReply receives the outcome of the i-th publish of a batch
// (PublishBatchCorked) exactly once, as PubReply does.
type BatchReply func(i int, ok wire.PubOK, err *wire.Error)

// replyTo is where one publish's outcome goes: fn, or the i-th record of
// batch. A value, so that a batch's records need no closure each.
type replyTo struct {
	fn    PubReply
	batch BatchReply
	i     int
}

func (r replyTo) answer(ok wire.PubOK, err *wire.Error) {
	if r.batch != nil {
		r.batch(r.i, ok, err)
		return
	}
	r.fn(ok, err)
}

// pubReq is one publish on its way to its partition's goroutine. The
// publishes of one batch for one partition travel as a chain (next), in
// their order: one hand-off for all of them.
type pubReq struct {
	rec         storage.Record
	producerID  uint64
	producerSeq uint64
	reply       replyTo
	corker      Corker // of reply's connection, or nil
	next        *pubReq
	// retryOnly, when set, takes the publish only as a retry of one the
	// partition knows (RetryIsItsOriginal: a SCHEDULE to a lane closed
	// since): a new one is not appended but answered with this error.
	retryOnly *wire.Error
	// queuedBytes, on the head of a hand-off made by Publish, publish or
	// PublishBatchCorked (clients', dead letters, scheduled messages), is
	// the record bytes of the chain, held in the partition's reqBytes
	// until its goroutine takes it (take). 0: not counted (a KV bucket's
	// or a scheduler shard's writes to its own log, bounded by its own
	// window).
	queuedBytes int64
}

func (r *pubReq) answer(ok wire.PubOK, err *wire.Error) { r.reply.answer(ok, err) }

// unlink detaches r from its chain and returns the request after it.
func (r *pubReq) unlink() *pubReq {
	next := r.next
	r.next = nil
	return next
}

// appendChain appends r and every request chained after it to batch,
// unlinked, in order.
func appendChain(batch []*pubReq, r *pubReq) []*pubReq {
	for r != nil {
		next := r.unlink()
		batch = append(batch, r)
		r = next
	}
	return batch
}

// answerChain answers r and every request chained after it with err.
func answerChain(r *pubReq, err *wire.Error) {
	for r != nil {
		next := r.unlink()
		r.answer(wire.PubOK{}, err)
		r = next
	}
}

// partitionRunner is one partition of a topic as this node knows it: what
// every kind of partition shares — its names, its publish queue and the
// positions readers use — and its store, which does the rest. The store is
// chosen once, when the partition opens, and never changes.
type partitionRunner struct {
	node  *Node
	topic *topic
	id    uint32
	dir   string

	// store is the local log, this node's replica, or nothing hosted here.
	store partitionStore

	// The publish queue, drained by the store's goroutine — or, in Manual
	// mode (Config.Manual), manualQueue, owned by the driver's goroutine.
	reqs        chan *pubReq
	reqBytes    *budget.Bytes // clients' record bytes in reqs (PublishQueueBytesMax)
	done        chan struct{}
	wg          sync.WaitGroup
	manualQueue []*pubReq
	stopOnce    sync.Once

	// damage is the first damaged range of the log (nil when healthy):
	// set by recovery or the scrubber, it makes the partition refuse
	// publishes with DATA_CORRUPT until a repair.
	damage atomic.Pointer[storage.Damage]
	// damageSaid lists the ranges noteDamage said (each once: a read
	// refused by name passes its range every time).
	damageMu   sync.Mutex
	damageSaid []storage.Damage

	// Published for readers (groups, METADATA, metrics, the scrubber); the
	// store's goroutine writes them.
	readLog   atomic.Pointer[storage.Log] // nil when not hosted; replaced by recovery
	epoch     atomic.Uint64
	startSeq  atomic.Uint64
	commitSeq atomic.Uint64
	// kvCompactLimit is, on a bucket's partition, the base of the latest
	// complete checkpoint its runner applied (of one replica: the one
	// before; kv.go): the log may be compacted through it and no further
	// (0: not at all).
	kvCompactLimit atomic.Uint64
	// schedLimit is a scheduler shard's compaction limit, published by
	// its runner (sched.State.CompactLimit; 0 until it has one).
	schedLimit atomic.Uint64
}

// compaction is how a partition's log is kept: a scheduler shard in
// segments of Config.SchedSegmentBytesMax, compacted as far as its
// runner's limit allows, and a KV bucket through its latest checkpoint
// (the limits are the rule, so any sealed segment below them goes); any
// other in the node's segments, by its topic's retention.
func (p *partitionRunner) compaction() (segmentBytes, retentionBytes int64, limit func() uint64) {
	switch {
	case p.topic.cfg.Name == wire.SchedTopic:
		return p.node.cfg.SchedSegmentBytesMax, 1, p.schedLimit.Load
	case wire.IsKVTopic(p.topic.cfg.Name):
		// A bucket's log keeps only what its latest checkpoint does not
		// carry: a retention of one byte compacts every whole segment the
		// limit lets go — through that checkpoint's base, no further.
		return p.node.cfg.SegmentBytesMax, 1, p.kvCompactLimit.Load
	}
	_, bytes := p.topic.retention()
	return p.node.cfg.SegmentBytesMax, bytes, func() uint64 { return math.MaxUint64 }
}

// retention is the partition's retention now: its topic's (age, and bytes
// as compaction sets them: an internal log's own bound).
func (p *partitionRunner) retention() (ageMs, bytes int64) {
	ageMs, _ = p.topic.retention()
	_, bytes, _ = p.compaction()
	return ageMs, bytes
}

// partitionStore is what differs between the kinds of partition: a single
// node's local log with group commit (localStore), this node's member of
// the partition's replica group (replicaStore), or, in a cluster, a
// partition with no replica on this node (unhostedStore). Unless noted, a
// method runs on the goroutine that owns the partition (the store's, or
// the driver's in Manual mode).
type partitionStore interface {
	// accept takes a publish, and those chained after it, from any
	// goroutine: it queues them for the store's loop
	// (partitionRunner.queue) or answers them at once.
	accept(r *pubReq)
	// stepManual does the store's due work at monoMs (the monotonic
	// clock: its schedule is a wait) in Manual mode and reports whether
	// it did any.
	stepManual(monoMs int64) bool
	// shutdown answers everything queued or in flight and closes what the
	// loop owns; it runs once, as the loop ends.
	shutdown()
	// release gives back what outlives the loop (a replica group's
	// member), after it ended; from the goroutine that stops the node.
	release()
	// foundDamage reacts to damage a reader found in the log (any
	// goroutine): ds lists the damaged ranges when the reader knows them
	// (the scrubber, a read refused by name); a read that failed on damage
	// no check has located yet passes none, and at, the seq it asked for.
	foundDamage(ds []storage.Damage, at uint64)
	// describe fills in what METADATA says of the partition beyond its
	// positions: leader, replicas, degraded (any goroutine).
	describe(info *wire.PartitionInfo)
	// forwardTo names the node a publish of this partition should go to,
	// the attempt-th try; ok is false when this node answers it itself
	// (any goroutine).
	forwardTo(attempt int) (target replica.NodeID, ok bool)
	// collect adds the store's own gauges for a metrics scrape (any
	// goroutine).
	collect(ch chan<- prometheus.Metric, topic, partition string)
}

func (n *Node) openPartition(t *topic, id uint32) (*partitionRunner, error) {
	p := &partitionRunner{node: n, topic: t, id: id,
		dir:      path.Join(n.cfg.DataDir, "topics", t.key(), strconv.Itoa(int(id))),
		reqs:     make(chan *pubReq, n.cfg.PublishQueueMax),
		reqBytes: budget.NewBytes(n.cfg.PublishQueueBytesMax),
		done:     make(chan struct{}),
	}
	var err error
	switch {
	case n.cluster == nil:
		err = p.openLocal()
		if errors.Is(err, storage.ErrCorrupt) {
			p.openDamaged(err) // DamageStaysLocal: the node runs its other partitions
			err = nil
		}
	case t.hosts(int(id), uint32(n.cluster.Self())):
		err = p.openReplica()
		if errors.Is(err, storage.ErrCorrupt) && len(t.placement[id]) == 1 {
			p.openDamaged(err)
			err = nil
		}
	default:
		// Known from the metadata, held by other nodes.
		p.store = unhostedStore{p}
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// key names this incarnation's directories and replica groups
// (meta.TopicKey).
func (t *topic) key() string { return meta.TopicKey(t.cfg.Name, t.incarnation) }

func (t *topic) hosts(partition int, node uint32) bool {
	for _, id := range t.placement[partition] {
		if id == node {
			return true
		}
	}
	return false
}

// replica is this node's member of the partition's replica group, or nil
// when the partition is not replicated here: the one place that asks
// which store a partition has, for what only a replica can answer (the
// groups' coordinator and ack log, tests).
func (p *partitionRunner) replica() *replicaStore {
	r, _ := p.store.(*replicaStore)
	return r
}

// unopenedForDamage reports whether the partition is this node's only
// replica left unopened for damage (openDamaged) until a repair.
func (p *partitionRunner) unopenedForDamage() bool {
	_, ok := p.store.(damagedStore)
	return ok
}

// held reports whether this node holds the partition's log (a local log
// or a replica).
func (p *partitionRunner) held() bool { return p.readLog.Load() != nil }

// subject names the partition in throttled log lines.
func (p *partitionRunner) subject() string { return p.topic.cfg.Name + "/" + strconv.Itoa(int(p.id)) }

// enqueue hands a publish to the partition's store; it blocks while the
// queue is full (backpressure on the publishing session).
func (p *partitionRunner) enqueue(r *pubReq) { p.store.accept(r) }

// queue puts a publish, and those chained after it, on the partition's
// queue for its loop, or answers UNAVAILABLE once the partition is
// stopping.
func (p *partitionRunner) queue(r *pubReq) {
	if p.node.cfg.Manual {
		select {
		case <-p.done:
			answerChain(r, wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
		default:
			p.manualQueue = appendChain(p.manualQueue, r)
		}
		return
	}
	// Room for its bytes first, then for the hand-off.
	if r.queuedBytes == 0 || p.reqBytes.Acquire(r.queuedBytes, p.done) {
		select {
		case <-p.done:
		default:
			select {
			case p.reqs <- r: // room in the queue: skip the two-way select
				return
			default:
			}
			select {
			case p.reqs <- r:
				return
			case <-p.done:
			}
		}
		p.reqBytes.Release(r.queuedBytes)
	}
	answerChain(r, wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
}

// take is r as the partition's goroutine takes it from the queue: its
// bytes leave the queue's count.
func (p *partitionRunner) take(r *pubReq) *pubReq {
	p.reqBytes.Release(r.queuedBytes)
	return r
}

func (p *partitionRunner) stop() {
	p.stopOnce.Do(func() {
		close(p.done)
		if p.node.cfg.Manual {
			p.store.shutdown()
		}
	})
	p.wg.Wait()
	p.store.release()
}

// step does the partition's due work at monoMs (the monotonic clock) in
// manual mode and reports whether it did any.
func (p *partitionRunner) step(monoMs int64) bool { return p.store.stepManual(monoMs) }

// failQueued answers every queued publish UNAVAILABLE (shutdown).
func (p *partitionRunner) failQueued() {
	err := wire.Errorf(wire.CodeUnavailable, "partition is shutting down")
	for _, r := range p.manualQueue {
		r.answer(wire.PubOK{}, err)
	}
	p.manualQueue = nil
	for {
		select {
		case r := <-p.reqs:
			answerChain(r, err)
		default:
			return
		}
	}
}

// read returns visible entries from seq on; never beyond commitSeq.
func (p *partitionRunner) read(from uint64, recordsMax, bytesMax int) ([]storage.Entry, error) {
	if p.readLog.Load() == nil {
		return nil, wire.Errorf(wire.CodeNotLeader, "partition %s/%d is not hosted on this node", p.topic.cfg.Name, p.id)
	}
	commit := p.commitSeq.Load()
	if from > commit {
		return nil, nil
	}
	recordsMax = min(recordsMax, int(commit-from+1))
	entries, err := p.readLog.Load().Read(from, recordsMax, bytesMax)
	if ce := (*storage.CorruptError)(nil); errors.As(err, &ce) {
		p.store.foundDamage([]storage.Damage{ce.Damage}, 0) // refused by name: said once (noteDamage)
	} else if errors.Is(err, storage.ErrCorrupt) {
		p.store.foundDamage(nil, from) // not located yet
	}
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		// The log ends below the commit this node published: a replica
		// that just dropped a damaged range (or restarted in place) before
		// its status caught up. That is not the end of the committed
		// records — a group replaying its acks must not stop there.
		return nil, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: its log ends below seq %d, committed; retry", p.topic.cfg.Name, p.id, from)
	}
	for i, e := range entries {
		if e.Seq > commit {
			return entries[:i], nil
		}
	}
	return entries, nil
}

// info describes the partition for METADATA.
func (p *partitionRunner) info() wire.PartitionInfo {
	info := wire.PartitionInfo{Partition: p.id, Epoch: p.epoch.Load(), StartSeq: p.startSeq.Load(), CommitSeq: p.commitSeq.Load()}
	if p.damage.Load() != nil {
		info.State = wire.PartitionStateCorrupt
	}
	p.store.describe(&info)
	return info
}

// openDamaged stands in for a partition whose only replica, this node's,
// refused to open its damaged log (no healthy copy to rebuild from): the
// partition runs as corrupt — publishes refused with DATA_CORRUPT, listed
// by Damaged (/readyz) — until `nereus repair`, and the topic's other
// partitions here run (DamageStaysLocal).
func (p *partitionRunner) openDamaged(cause error) {
	d := storage.Damage{Cause: cause.Error()}
	if ce := (*storage.CorruptError)(nil); errors.As(cause, &ce) {
		d = ce.Damage
	}
	p.node.log.Error("partition not opened: its only replica's data is damaged; publishes refused until `nereus repair` (the node stopped)",
		"topic", p.topic.cfg.Name, "partition", p.id, "err", cause)
	p.damage.Store(&d)
	p.store = damagedStore{p}
}

// damagedStore is a partition openDamaged could not open: it holds no
// log and answers every publish DATA_CORRUPT, here (it is the partition's
// only replica).
type damagedStore struct{ *partitionRunner }

func (p damagedStore) accept(r *pubReq)                               { answerChain(r, p.corruptError()) }
func (damagedStore) stepManual(int64) bool                            { return false }
func (p damagedStore) shutdown()                                      { p.failQueued() }
func (damagedStore) release()                                         {}
func (damagedStore) foundDamage([]storage.Damage, uint64)             {}
func (damagedStore) forwardTo(int) (replica.NodeID, bool)             { return 0, false }
func (damagedStore) collect(chan<- prometheus.Metric, string, string) {}

// describe names this node, the only replica, as the partition's leader:
// a publish sent here gets the DATA_CORRUPT answer.
func (p damagedStore) describe(info *wire.PartitionInfo) {
	info.Leader, info.LeaderAddr = p.node.cfg.NodeID, p.node.cfg.ClientAddr
	info.Replicas = []wire.ReplicaInfo{{Node: p.node.cfg.NodeID}}
}

// unhostedStore is a cluster's partition with no replica on this node: it
// is known from the metadata, holds no log, and sends publishes on to its
// replicas.
type unhostedStore struct{ *partitionRunner }

// accept answers publishes NOT_LEADER, naming where to try.
func (p unhostedStore) accept(r *pubReq) {
	info := p.info()
	answerChain(r, wire.Errorf(wire.CodeNotLeader, "partition %s/%d has no replica on this node; try %s at %s",
		p.topic.cfg.Name, p.id, info.Leader, info.LeaderAddr))
}

func (unhostedStore) stepManual(int64) bool { return false }

func (p unhostedStore) shutdown() { p.failQueued() }

func (unhostedStore) release() {}

func (unhostedStore) foundDamage([]storage.Damage, uint64) {} // it holds no log to read

// describe names the first replica as the leader, the best hint (the only
// one with R=1); the client is redirected from there if needed.
func (p unhostedStore) describe(info *wire.PartitionInfo) {
	c, group := p.node.cluster, p.topic.placement[p.id]
	info.Leader, info.LeaderAddr = c.Name(replica.NodeID(group[0])), c.ClientAddr(replica.NodeID(group[0]))
	for _, id := range group {
		info.Replicas = append(info.Replicas, wire.ReplicaInfo{Node: c.Name(replica.NodeID(id))})
	}
}

// forwardTo sends the attempt-th try to the attempt-th replica in turn, so
// that retries reach the leader without a hint.
func (p unhostedStore) forwardTo(attempt int) (replica.NodeID, bool) {
	group := p.topic.placement[p.id]
	return replica.NodeID(group[attempt%len(group)]), true
}

func (unhostedStore) collect(chan<- prometheus.Metric, string, string) {}
