package node

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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

	// Cluster only: this node's member of the partition's replica group
	// (nil when the node does not host the partition), and the state the
	// replicated loop owns.
	repl *replog.Log
	rs   *replState

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
	}
	if n.cluster != nil {
		return p, p.openReplicated()
	}
	if err := p.recover(); err != nil {
		return nil, err
	}
	if n.cfg.Manual {
		p.nextRetentionMs = n.cfg.NowMs() + n.cfg.RetentionCheckMs
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
	lg, err := storage.Open(cfg.FS, p.dir, storage.Options{
		SegmentBytesMax: cfg.SegmentBytesMax,
		RetentionBytes:  p.topic.cfg.RetentionBytes,
		RetentionAgeMs:  p.topic.cfg.RetentionMs,
		RecordBytesMax:  cfg.RecordBytesMax + 64<<10,
	})
	if err != nil {
		return fmt.Errorf("partition %s/%d: open log: %w", p.topic.cfg.Name, p.id, err)
	}
	epoch, err := p.bumpEpoch(lg.LastEpoch())
	if err != nil {
		lg.Close()
		return err
	}
	st := partition.NewState(cfg.Dedup, epoch, lg.NextSeq())
	for from := lg.StartSeq(); from < lg.NextSeq(); {
		entries, err := lg.Read(from, 4096, 16<<20)
		if err != nil {
			lg.Close()
			return fmt.Errorf("partition %s/%d: replay from %d: %w", p.topic.cfg.Name, p.id, from, err)
		}
		for _, e := range entries {
			if !cfg.Mutations.SkipDedupRebuild {
				st.Replay(e.Seq, e.Epoch, e.Record.ProducerID, e.Record.ProducerSeq)
			}
		}
		from = entries[len(entries)-1].Seq + 1
	}
	st.ReplayDone(lg.StartSeq() > 1)
	p.log, p.state, p.failure = lg, st, nil
	p.readLog.Store(lg)
	p.epoch.Store(epoch)
	p.startSeq.Store(lg.StartSeq())
	p.commitSeq.Store(st.CommitSeq())
	return nil
}

// bumpEpoch starts a new reign: one past both the persisted epoch and the
// last epoch in the log, persisted before any record is written under it.
func (p *partitionRunner) bumpEpoch(logEpoch uint64) (uint64, error) {
	fsys := p.node.cfg.FS
	file := path.Join(p.dir, "epoch")
	var stored uint64
	b, err := storage.ReadFileAtomic(fsys, file)
	switch {
	case err == nil:
		stored, err = strconv.ParseUint(string(b), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("partition %s/%d: bad epoch file: %w", p.topic.cfg.Name, p.id, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
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
	case p.reqs <- r:
	case <-p.done:
		r.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	}
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
		p.node.cluster.closeGroup(p.topic.cfg.Name, p.id)
		p.repl.Close()
	}
}

// shutdown fails what is queued and closes the log; it runs on the goroutine
// that owns the partition (run, or the driver in manual mode).
func (p *partitionRunner) shutdown() {
	p.failQueued()
	if p.log != nil {
		p.log.Close()
	}
}

// step does the partition's due work at nowMs in manual mode: retention when
// due, then every queued publish in batches. It reports whether it did any.
func (p *partitionRunner) step(nowMs int64) bool {
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

// run is the production loop: group commit pipelined in two stages. While
// one fsync runs on the syncer goroutine, the next publishes are decided
// and appended; the next fsync then covers all of them. Replies go out
// only from completeSync, after the fsync that covers them.
func (p *partitionRunner) run() {
	defer p.wg.Done()
	syncReq := make(chan *storage.Log)
	syncDone := make(chan error)
	go func() {
		for lg := range syncReq {
			syncDone <- p.syncLog(lg)
		}
	}()
	var inflight, unsynced []*pendingSync
	syncing := false
	defer func() {
		close(syncReq)
		if syncing {
			if err := <-syncDone; err == nil {
				for _, ps := range inflight {
					p.completeSync(ps)
				}
				inflight = nil
			}
		}
		werr := wire.Errorf(wire.CodeUnavailable, "partition is shutting down")
		for _, ps := range append(inflight, unsynced...) {
			for _, a := range ps.news {
				a.req.reply(wire.PubOK{}, werr)
			}
		}
		p.shutdown()
	}()
	retention := time.NewTicker(time.Duration(p.node.cfg.RetentionCheckMs) * time.Millisecond)
	defer retention.Stop()
	batch := make([]*pubReq, 0, p.node.cfg.PublishBatchMax)
	for {
		select {
		case <-p.done:
			return
		case <-retention.C:
			if !syncing {
				p.applyRetention()
			}
		case err := <-syncDone:
			syncing = false
			if err != nil {
				// The log is failed: nothing appended since is durable
				// either. Recover only now that no fsync is running.
				p.failPending(err, append(inflight, unsynced...)...)
				inflight, unsynced = nil, nil
				p.recoverNow()
				break
			}
			done := inflight
			inflight = nil
			if len(unsynced) > 0 && p.failure == nil {
				// Start the next fsync before answering this one, so the
				// replies overlap with the disk.
				inflight, unsynced = unsynced, nil
				syncing = true
				syncReq <- p.log
			}
			records := 0
			for _, ps := range done {
				records += len(ps.news)
				p.completeSync(ps)
			}
			p.node.metrics.commitBatch.Observe(float64(records))
			if p.failure != nil && !syncing { // an append failed while the fsync ran
				p.failPending(p.failure, unsynced...)
				unsynced = nil
				p.recoverNow()
			}
		case r := <-p.reqs:
			batch = append(batch[:0], r)
		drain:
			for len(batch) < cap(batch) {
				select {
				case r := <-p.reqs:
					batch = append(batch, r)
				default:
					break drain
				}
			}
			if syncing && p.failure != nil {
				// Cannot recover while the fsync runs on the old log.
				for _, r := range batch {
					r.reply(wire.PubOK{}, wire.Errorf(wire.CodeStorage, "partition unavailable: %v", p.failure))
				}
			} else if ps := p.appendBatch(batch); ps != nil {
				unsynced = append(unsynced, ps)
			} else if p.failure != nil && !syncing {
				p.failPending(p.failure, unsynced...)
				unsynced = nil
				p.recoverNow()
			}
			clear(batch)
		}
		if !syncing && len(unsynced) > 0 {
			inflight, unsynced = unsynced, nil
			syncing = true
			syncReq <- p.log
		}
	}
}

type appended struct {
	req *pubReq
	seq uint64
}

// pendingSync is one appended batch waiting for the fsync that covers it.
type pendingSync struct {
	news  []appended
	last  uint64
	epoch uint64
	bytes int
}

// appendBatch decides every publish of a batch with the kernel and appends
// the new records as one log batch, without syncing. Duplicates of visible
// records are answered at once; duplicates of pending ones wait for their
// commit. It returns nil when nothing was appended, or when the append
// failed (then the batch was answered and the partition recovered).
func (p *partitionRunner) appendBatch(batch []*pubReq) *pendingSync {
	if p.failure != nil {
		p.recoverNow()
		if p.failure != nil {
			for _, r := range batch {
				r.reply(wire.PubOK{}, wire.Errorf(wire.CodeStorage, "partition unavailable: %v", p.failure))
			}
			return nil
		}
	}
	recs := make([]storage.Record, 0, len(batch))
	ps := &pendingSync{news: make([]appended, 0, len(batch)), epoch: p.state.Epoch()}
	for _, r := range batch {
		d := p.state.Publish(r.producerID, r.producerSeq)
		switch d.Verdict {
		case partition.VerdictNew:
			recs = append(recs, r.rec)
			ps.news = append(ps.news, appended{req: r, seq: d.Seq})
			ps.bytes += len(r.rec.Value) + len(r.rec.Key)
		case partition.VerdictDuplicate:
			ok := wire.PubOK{Partition: p.id, Seq: d.Seq, Epoch: d.Epoch, Duplicate: true}
			if d.Seq <= p.state.CommitSeq() {
				r.reply(ok, nil)
			} else {
				p.waiters[d.Seq] = append(p.waiters[d.Seq], dupWaiter{reply: r.reply, epoch: d.Epoch})
			}
		case partition.VerdictTooOld:
			r.reply(wire.PubOK{}, wire.Errorf(wire.CodeProducerSeqTooOld,
				"producer %d seq %d is below the dedup window of partition %d", r.producerID, r.producerSeq, p.id))
		}
	}
	if len(recs) == 0 {
		return nil
	}
	first, err := p.log.Append(ps.epoch, recs)
	if err == nil && first != ps.news[0].seq {
		err = fmt.Errorf("log assigned seq %d, kernel %d", first, ps.news[0].seq)
	}
	if err != nil {
		p.failPending(err, ps)
		return nil
	}
	ps.last = ps.news[len(ps.news)-1].seq
	return ps
}

// syncLog fsyncs the partition log (and times it). Safe to run on another
// goroutine while the partition goroutine appends.
func (p *partitionRunner) syncLog(lg *storage.Log) error {
	if p.node.cfg.Mutations.AckBeforeFsync {
		return nil
	}
	start := p.node.cfg.NowNanos()
	err := lg.Sync()
	p.node.metrics.fsyncSeconds.WithLabelValues("log").Observe(float64(p.node.cfg.NowNanos()-start) / 1e9)
	return err
}

// completeSync makes a synced batch visible and answers it: PUB_OK is sent
// only here, after the fsync covering the records returned successfully.
func (p *partitionRunner) completeSync(ps *pendingSync) {
	m := p.node.metrics
	p.state.Committed(ps.last)
	p.commitSeq.Store(ps.last)
	m.publishes.WithLabelValues(p.topic.cfg.Name).Add(float64(len(ps.news)))
	m.publishBytes.WithLabelValues(p.topic.cfg.Name).Add(float64(ps.bytes))
	for _, a := range ps.news {
		a.req.reply(wire.PubOK{Partition: p.id, Seq: a.seq, Epoch: ps.epoch}, nil)
	}
	for seq, ws := range p.waiters {
		if seq <= ps.last {
			for _, w := range ws {
				w.reply(wire.PubOK{Partition: p.id, Seq: seq, Epoch: w.epoch, Duplicate: true}, nil)
			}
			delete(p.waiters, seq)
		}
	}
	p.topic.notifyGroups()
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
	p.node.metrics.commitBatch.Observe(float64(len(ps.news)))
	p.completeSync(ps)
}

// failPending answers the given batches with STORAGE_ERROR and marks the
// partition for recovery: after a failed write or fsync the file's state is
// unknown, so the partition recovers from what is on disk (as after a
// crash) instead of retrying the fsync.
func (p *partitionRunner) failPending(cause error, pending ...*pendingSync) {
	p.node.log.Error("partition write failed; recovering", "topic", p.topic.cfg.Name, "partition", p.id, "err", cause)
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
		p.node.log.Error("partition recovery failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
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
	deleted, err := p.log.ApplyRetention(p.node.cfg.NowMs())
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
	if err != nil {
		return nil, err
	}
	for i, e := range entries {
		if e.Seq > commit {
			return entries[:i], nil
		}
	}
	return entries, nil
}
