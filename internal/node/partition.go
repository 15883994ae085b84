package node

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// PubReply receives the outcome of one publish exactly once, from the
// partition's goroutine. It must not block.
type PubReply func(ok wire.PubOK, err *wire.Error)

type pubReq struct {
	rec         storage.Record
	producerID  uint64
	producerSeq uint64
	reply       PubReply
	corker      Corker // of reply's connection, or nil
}

type dupWaiter struct {
	reply PubReply
	epoch uint64
}

// partitionRunner owns one partition's log and kernel state. Only its
// goroutine (run) appends; readers use the log's concurrent Read and the
// atomics below.
type partitionRunner struct {
	node  *Node
	topic *topic
	id    uint32
	dir   string

	reqs chan *pubReq
	done chan struct{}
	wg   sync.WaitGroup

	// Manual mode (Config.Manual): queued publishes and the next retention
	// run, owned by the driver's goroutine instead of run.
	manualQueue     []*pubReq
	nextRetentionMs int64

	// Owned by run.
	log     *storage.Log
	state   *partition.State
	failure error // set when the log could not be reopened; PUBs fail fast
	waiters map[uint64][]dupWaiter
	// pending are the appended batches not yet acknowledged, in seq order.
	// run appends to it; acknowledgeThrough takes what an fsync made
	// durable, under ackMu, on run or on the syncer.
	pendingMu sync.Mutex
	pending   []*pendingSync
	ackMu     sync.Mutex
	// corked is acknowledge's scratch list of the connections it corked
	// (under ackMu, or in manual mode).
	corked []Corker
	// acked holds the results of fsyncs the syncer acknowledged itself,
	// for run to settle when it next wakes: waking it for each would cost
	// the next ack the same goroutine wakeup the syncer saved. The syncer
	// wakes run (ackedWake) only when run must act: duplicates wait
	// (runWaits), or something was appended that no fsync request covers.
	ackedMu   sync.Mutex
	acked     []syncResult
	runWaits  bool          // under ackedMu: p.waiters is not empty
	ackedWake chan struct{} // capacity 1
	// Reused by appendBatch: the records of one Append, and answered
	// pendingSyncs (their news slices), so a batch allocates neither.
	recsBuf   []storage.Record
	freeSyncs []*pendingSync

	// Cluster only: this node's member of the partition's replica group
	// (nil when the node does not host the partition), and the state the
	// replicated loop owns.
	repl *replog.Log
	rs   *replState

	// damage is the first damaged range of the log (nil when healthy):
	// set by recovery or the scrubber, it makes the partition refuse
	// publishes with DATA_CORRUPT until a repair.
	damage atomic.Pointer[storage.Damage]

	// Published for readers.
	readLog   atomic.Pointer[storage.Log] // replaced by recover
	epoch     atomic.Uint64
	startSeq  atomic.Uint64
	commitSeq atomic.Uint64

	stopOnce sync.Once
}

func (n *Node) openPartition(t *topic, id uint32) (*partitionRunner, error) {
	p := &partitionRunner{node: n, topic: t, id: id,
		dir:     path.Join(n.cfg.DataDir, "topics", t.cfg.Name, strconv.Itoa(int(id))),
		reqs:    make(chan *pubReq, n.cfg.PublishQueueMax),
		done:    make(chan struct{}),
		waiters: map[uint64][]dupWaiter{},

		ackedWake: make(chan struct{}, 1),
	}
	if n.cluster != nil {
		return p, p.openReplicated()
	}
	if err := p.recover(); err != nil {
		return nil, err
	}
	if n.cfg.Manual {
		p.nextRetentionMs = n.nowMs() + n.cfg.RetentionCheckMs
		return p, nil
	}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// recover opens the log, starts a new epoch and rebuilds the kernel state
// (dedup table) from the retained log.
func (p *partitionRunner) recover() error {
	cfg := &p.node.cfg
	if p.log != nil {
		p.log.Close()
		p.log = nil
	}
	lg, err := storage.Open(cfg.Env.FS, p.dir, storage.Options{
		SegmentBytesMax: cfg.SegmentBytesMax,
		RetentionBytes:  p.topic.cfg.RetentionBytes,
		RetentionAgeMs:  p.topic.cfg.RetentionMs,
		RecordBytesMax:  cfg.RecordBytesMax + 64<<10,
	})
	if err != nil {
		return fmt.Errorf("partition %s/%d: open log: %w", p.topic.cfg.Name, p.id, err)
	}
	p.reportRecovery(lg)
	epoch, err := p.bumpEpoch(lg.LastEpoch())
	if err != nil {
		lg.Close()
		return err
	}
	st := partition.NewState(cfg.Dedup, epoch, lg.NextSeq())
	err = replayLog(lg, func(e storage.Entry) error {
		if !cfg.Mutations.SkipDedupRebuild {
			st.Replay(e.Seq, e.Epoch, e.Record.ProducerID, e.Record.ProducerSeq)
		}
		return nil
	})
	if err != nil {
		lg.Close()
		return fmt.Errorf("partition %s/%d: %w", p.topic.cfg.Name, p.id, err)
	}
	p.noteDamage(lg.Damage())
	st.ReplayDone(lg.StartSeq() > 1)
	p.log, p.state, p.failure = lg, st, nil
	p.readLog.Store(lg)
	p.epoch.Store(epoch)
	p.startSeq.Store(lg.StartSeq())
	p.commitSeq.Store(st.CommitSeq())
	return nil
}

// replayLog calls apply for every readable entry of lg, in order, until
// apply fails. It steps over gaps and damaged ranges (lg.Damage() lists
// the latter afterwards); damage that recovery could not see (a sealed
// segment trusted through its index) is found by verifying the sealed
// segments, once, and then stepped over too.
func replayLog(lg *storage.Log, apply func(storage.Entry) error) error {
	verified := false
	for from := lg.StartSeq(); from < lg.NextSeq(); {
		entries, err := lg.Read(from, 4096, 16<<20)
		var damaged *storage.CorruptError
		var gap *storage.GapError
		switch {
		case errors.As(err, &damaged):
			from = damaged.Damage.LastSeq + 1
			continue
		case errors.As(err, &gap):
			from = gap.Next
			continue
		case errors.Is(err, storage.ErrCorrupt) && !verified:
			verified = true
			for next := lg.StartSeq(); ; {
				if next, _, _, err = lg.Verify(next, math.MaxInt64); err != nil || next == 0 {
					break
				}
			}
			if err != nil {
				return fmt.Errorf("verify: %w", err)
			}
			continue
		case err != nil:
			return fmt.Errorf("replay from %d: %w", from, err)
		}
		for _, e := range entries {
			if err := apply(e); err != nil {
				return err
			}
		}
		from = entries[len(entries)-1].Seq + 1
	}
	return nil
}

// reportRecovery logs what opening the log cut off.
func (p *partitionRunner) reportRecovery(lg *storage.Log) {
	if t, ok := lg.TornTail(); ok {
		p.node.log.Warn("torn tail truncated", "topic", p.topic.cfg.Name, "partition", p.id,
			"file", t.Segment, "offset", t.Offset, "bytes_dropped", t.Bytes)
	}
}

// noteDamage marks the partition corrupt when ds is not empty, logging
// each damaged range once.
func (p *partitionRunner) noteDamage(ds []storage.Damage) {
	for _, d := range ds {
		p.node.log.Error("partition data corrupt; publishes refused until `nereus repair`", "topic", p.topic.cfg.Name,
			"partition", p.id, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes,
			"first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	}
	if len(ds) > 0 && p.damage.Load() == nil {
		p.damage.Store(&ds[0])
	}
}

// subject names the partition in throttled log lines.
func (p *partitionRunner) subject() string { return p.topic.cfg.Name + "/" + strconv.Itoa(int(p.id)) }

// corruptError is the DATA_CORRUPT answer of a damaged partition, or nil.
func (p *partitionRunner) corruptError() *wire.Error {
	d := p.damage.Load()
	if d == nil {
		return nil
	}
	return wire.Errorf(wire.CodeDataCorrupt, "partition %s/%d is damaged at seqs %d-%d (%s offset %d); it refuses publishes until repaired",
		p.topic.cfg.Name, p.id, d.FirstSeq, d.LastSeq, d.Segment, d.Offset)
}

// bumpEpoch starts a new reign: one past both the persisted epoch and the
// last epoch in the log, persisted before any record is written under it.
func (p *partitionRunner) bumpEpoch(logEpoch uint64) (uint64, error) {
	fsys := p.node.cfg.Env.FS
	file := path.Join(p.dir, "epoch")
	var stored uint64
	b, err := storage.ReadFileAtomic(fsys, file)
	switch {
	case err == nil:
		stored, err = strconv.ParseUint(string(b), 10, 64)
		if err != nil {
			err = fmt.Errorf("%w: %w", storage.ErrCorrupt, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		err = nil
	}
	if errors.Is(err, storage.ErrCorrupt) {
		// The epoch is a lower bound for the next reign; without it the
		// partition takes no writes (so no record can carry a reused
		// epoch) until a repair removes the file: logEpoch+1 is then safe,
		// since a reign that wrote no record left no trace.
		p.noteDamage([]storage.Damage{{Segment: file, Cause: err.Error()}})
		return logEpoch + 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("partition %s/%d: read epoch: %w", p.topic.cfg.Name, p.id, err)
	}
	epoch := max(stored, logEpoch) + 1
	if err := storage.WriteFileAtomic(fsys, file, []byte(strconv.FormatUint(epoch, 10))); err != nil {
		return 0, fmt.Errorf("partition %s/%d: persist epoch: %w", p.topic.cfg.Name, p.id, err)
	}
	return epoch, nil
}

// enqueue hands a publish to the partition goroutine; it blocks while the
// queue is full (backpressure on the publishing session).
func (p *partitionRunner) enqueue(r *pubReq) {
	if p.node.cluster != nil && p.repl == nil {
		r.reply(wire.PubOK{}, p.notHosted())
		return
	}
	if p.node.cfg.Manual {
		select {
		case <-p.done:
			r.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
		default:
			p.manualQueue = append(p.manualQueue, r)
		}
		return
	}
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
	r.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
}

func (p *partitionRunner) stop() {
	p.stopOnce.Do(func() {
		close(p.done)
		if p.node.cfg.Manual {
			p.shutdown()
		}
	})
	p.wg.Wait()
	if p.repl != nil {
		p.node.cluster.CloseGroup(p.topic.cfg.Name, p.id)
		p.repl.Close()
	}
}

// shutdown fails what is queued and closes the log; it runs on the goroutine
// that owns the partition (run, or the driver in manual mode).
func (p *partitionRunner) shutdown() {
	if p.rs != nil {
		p.failReplicated(wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	}
	p.failQueued()
	if p.log != nil {
		p.log.Close()
	}
}

// step does the partition's due work at nowMs in manual mode: retention when
// due, then every queued publish in batches. It reports whether it did any.
func (p *partitionRunner) step(nowMs int64) bool {
	if p.node.cluster != nil {
		return p.repl != nil && p.stepReplicated()
	}
	progress := false
	if nowMs >= p.nextRetentionMs {
		p.applyRetention()
		p.nextRetentionMs = nowMs + p.node.cfg.RetentionCheckMs
		progress = true
	}
	for len(p.manualQueue) > 0 {
		n := min(len(p.manualQueue), p.node.cfg.PublishBatchMax)
		batch := p.manualQueue[:n:n]
		p.manualQueue = p.manualQueue[n:]
		p.commitBatch(batch)
		progress = true
	}
	return progress
}

// commitBatch is the unpipelined path (manual mode): append, fsync, answer.
func (p *partitionRunner) commitBatch(batch []*pubReq) {
	ps := p.appendBatch(batch)
	if ps == nil {
		if p.failure != nil {
			p.recoverNow()
		}
		return
	}
	if err := p.syncLog(p.log); err != nil {
		p.failPending(err, ps)
		p.recoverNow()
		return
	}
	p.answer([]*pendingSync{ps})
}

// failPending answers the given batches with STORAGE_ERROR and marks the
// partition for recovery: after a failed write or fsync the file's state is
// unknown, so the partition recovers from what is on disk (as after a
// crash) instead of retrying the fsync.
func (p *partitionRunner) failPending(cause error, pending ...*pendingSync) {
	p.node.logRepeatedError(p.subject(), "partition write failed; recovering", "topic", p.topic.cfg.Name, "partition", p.id, "err", cause)
	werr := wire.Errorf(wire.CodeStorage, "write not durable: %v", cause)
	for _, ps := range pending {
		for _, a := range ps.news {
			a.req.reply(wire.PubOK{}, werr)
		}
	}
	if p.failure == nil {
		p.failure = cause
	}
}

// recoverNow reopens the log and rebuilds the kernel from it. Duplicates
// waiting for a pending seq are answered with an error (their producers
// retry). Records that did reach the disk may become visible; the retries
// then get them back as duplicates, never twice. No fsync may be running.
func (p *partitionRunner) recoverNow() {
	werr := wire.Errorf(wire.CodeStorage, "write not durable: %v", p.failure)
	for seq, ws := range p.waiters {
		for _, w := range ws {
			w.reply(wire.PubOK{}, werr)
		}
		delete(p.waiters, seq)
	}
	if err := p.recover(); err != nil {
		p.failure = err
		p.node.logRepeatedError(p.subject(), "partition recovery failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	p.topic.notifyGroups()
}

func (p *partitionRunner) failQueued() {
	err := wire.Errorf(wire.CodeUnavailable, "partition is shutting down")
	for _, r := range p.manualQueue {
		r.reply(wire.PubOK{}, err)
	}
	p.manualQueue = nil
	for {
		select {
		case r := <-p.reqs:
			r.reply(wire.PubOK{}, err)
		default:
			for seq, ws := range p.waiters {
				for _, w := range ws {
					w.reply(wire.PubOK{}, err)
				}
				delete(p.waiters, seq)
			}
			return
		}
	}
}

func (p *partitionRunner) applyRetention() {
	if p.failure != nil {
		return
	}
	deleted, err := p.log.ApplyRetention(p.node.nowMs())
	if err != nil {
		p.node.log.Error("retention failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	if deleted > 0 {
		p.startSeq.Store(p.log.StartSeq())
		p.node.log.Info("retention deleted segments", "topic", p.topic.cfg.Name, "partition", p.id,
			"segments", deleted, "start_seq", p.log.StartSeq())
		p.topic.notifyGroups()
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
	if err != nil && p.repl != nil && errors.Is(err, storage.ErrCorrupt) {
		// This replica's copy of committed records is damaged (a group's
		// delivery or replay, a client read found it): the member drops
		// the range and is made whole from a healthy replica; readers
		// retry. A single node's damage waits for `nereus repair`.
		p.repl.Damaged()
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
