package node

// The group commit of a single-node partition: run, the production loop
// (appends pipelined with fsyncs), and what it shares with the Manual path.

import (
	"fmt"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// syncsMax bounds the fsync requests of run in flight: one running, one
// queued behind it.
const syncsMax = 2

// syncResult is the outcome of one fsync request of run: the last seq the
// log knows durable after it and, when the syncer acknowledged them itself,
// the batches it acknowledged (run settles them).
type syncResult struct {
	synced uint64
	done   []*pendingSync
	err    error
}

// run is the production loop: group commit, pipelined. While the syncer
// goroutine fsyncs, the next publishes are decided and appended; a second
// fsync request waits queued behind the running one, so the syncer starts
// the next fsync as soon as the previous returns, without waiting for this
// goroutine. An fsync covers what was appended before it started
// (Log.SyncedSeq). When no other request is queued behind an fsync, the
// syncer itself acknowledges the batches at or below it, on the goroutine
// the fsync returned on, and leaves the result for this goroutine to settle
// (the kernel's commit point, waiting duplicates) when it next wakes: on a
// 2-vCPU VM each goroutine wakeup on the ack's path costs tens of µs.
func (p *localStore) run() {
	defer p.wg.Done()
	// At most syncsMax requests are unanswered: neither channel blocks.
	syncReq := make(chan *storage.Log, syncsMax)
	syncDone := make(chan syncResult, syncsMax)
	syncerExited := make(chan struct{})
	go func() {
		defer close(syncerExited)
		for lg := range syncReq {
			err := p.syncLog(lg)
			synced := lg.SyncedSeq()
			if p.node.cfg.Mutations.AckBeforeFsync {
				synced = lg.NextSeq() - 1
			}
			r := syncResult{synced: synced, err: err}
			if err != nil || len(syncReq) > 0 {
				// With an fsync queued, start it first and let run
				// acknowledge; a failure is run's to handle.
				syncDone <- r
				continue
			}
			// Nothing queued behind this fsync: acknowledge here, on the
			// goroutine the fsync returned on (a handoff to run would cost
			// the ack a goroutine wakeup), and leave the result for run.
			// The write of the corked replies goes last: it wakes the
			// publisher's reader, which the kernel may place on this CPU.
			p.acknowledgeThrough(synced, true, func(done []*pendingSync) {
				r.done = done
				p.leaveAcked(r)
			})
		}
	}()
	syncs := 0 // fsync requests whose result this goroutine has not yet had
	// requested is the last seq appended when the latest fsync request was
	// made: that request covers it. A request is needed only for what was
	// appended since (the syncer may have acknowledged a request's batches
	// before this goroutine hears of it, and a publish that followed that
	// acknowledgment must not make a second request for the same batch).
	var requested uint64
	lastPending := func() uint64 {
		p.pendingMu.Lock()
		defer p.pendingMu.Unlock()
		if len(p.pending) == 0 {
			return 0
		}
		return p.pending[len(p.pending)-1].last
	}
	takePending := func() []*pendingSync {
		p.pendingMu.Lock()
		defer p.pendingMu.Unlock()
		pending := p.pending
		p.pending = nil
		return pending
	}
	// takeAcked settles what the syncer acknowledged by itself, and tells
	// it whether duplicates wait (so that it wakes this goroutine when it
	// acknowledges). Every decision that depends on syncs or on the
	// kernel's commit point follows a call; so does adding waiters, which
	// closes the race with leaveAcked: under ackedMu either the syncer sees
	// runWaits or this goroutine sees the result.
	takeAcked := func() {
		for {
			p.ackedMu.Lock()
			acked := p.acked
			p.acked = nil
			p.runWaits = len(p.waiters) > 0
			p.ackedMu.Unlock()
			if len(acked) == 0 {
				return
			}
			for _, r := range acked {
				syncs--
				p.settle(r.done)
			}
		}
	}
	requestSync := func() {
		takeAcked()
		if last := lastPending(); syncs < syncsMax && p.failure == nil && last > requested {
			syncs++
			requested = last
			syncReq <- p.log
		}
	}
	// recoverIfFailed fails what is pending and recovers the partition after
	// a failed append or fsync, once no fsync runs on the old log.
	recoverIfFailed := func() {
		takeAcked()
		if p.failure != nil && syncs == 0 {
			if pending := takePending(); len(pending) > 0 {
				p.failPending(p.failure, pending...)
			}
			p.recoverNow()
			requested = 0 // the reopened log may reuse the failed seqs
		}
	}
	defer func() {
		close(syncReq)
		<-syncerExited // every result is now in syncDone or acked
		for ; len(syncDone) > 0; syncs-- {
			if r := <-syncDone; r.err == nil {
				p.settle(p.acknowledgeThrough(r.synced, false, nil))
			}
		}
		takeAcked()
		werr := wire.Errorf(wire.CodeUnavailable, "partition is shutting down")
		for _, ps := range takePending() {
			for _, a := range ps.news {
				a.req.answer(wire.PubOK{}, werr)
			}
		}
		p.shutdown()
	}()
	retention := p.node.cfg.Env.Clock.NewTicker(time.Duration(p.node.cfg.RetentionCheckMs) * time.Millisecond)
	defer retention.Stop()
	var markDue <-chan time.Time // nil: marks off
	if ms := p.node.cfg.SyncedMarkMs; ms > 0 {
		mark := p.node.cfg.Env.Clock.NewTicker(time.Duration(ms) * time.Millisecond)
		defer mark.Stop()
		markDue = mark.C()
	}
	batch := make([]*pubReq, 0, p.node.cfg.PublishBatchMax)
	for {
		select {
		case <-p.done:
			return
		case <-p.ackedWake:
			takeAcked()
			requestSync()
		case <-p.verifyWake:
			p.verifyAt()
		case <-retention.C():
			takeAcked()
			if syncs == 0 {
				p.applyRetention()
			}
		case <-markDue:
			takeAcked() // the commit point: what is synced
			p.markTail()
		case r := <-syncDone:
			syncs--
			if r.err != nil {
				// The log is failed: nothing appended since is durable
				// either.
				if pending := takePending(); len(pending) > 0 || p.failure == nil {
					p.failPending(r.err, pending...)
				}
			} else {
				requestSync() // before acknowledging: the next fsync overlaps it
				p.settle(p.acknowledgeThrough(r.synced, false, nil))
			}
			recoverIfFailed()
		case r := <-p.reqs:
			takeAcked() // the kernel's commit point for the duplicates below
			batch = appendChain(batch[:0], p.take(r))
		drain:
			for len(batch) < cap(batch) {
				select {
				case r := <-p.reqs:
					batch = appendChain(batch, p.take(r))
				default:
					break drain
				}
			}
			if syncs > 0 && p.failure != nil {
				// Cannot recover while an fsync runs on the old log.
				for _, r := range batch {
					r.answer(wire.PubOK{}, wire.Errorf(wire.CodeStorage, "partition unavailable: %v", p.failure))
				}
			} else if ps := p.appendBatch(batch); ps != nil {
				p.pendingMu.Lock()
				p.pending = append(p.pending, ps)
				p.pendingMu.Unlock()
				requestSync()
			} else {
				recoverIfFailed()
			}
			clear(batch)
			takeAcked() // appendBatch may have added waiters
		}
	}
}

// leaveAcked hands run the result of an fsync the syncer acknowledged,
// waking run only when it must act now: duplicates wait for a commit, or a
// batch is pending that no fsync request may cover (run declined to make
// one while this fsync ran). Otherwise run settles the result when it next
// wakes for its own reasons.
func (p *localStore) leaveAcked(r syncResult) {
	p.ackedMu.Lock()
	p.acked = append(p.acked, r)
	wake := p.runWaits
	p.ackedMu.Unlock()
	if !wake {
		p.pendingMu.Lock()
		wake = len(p.pending) > 0
		p.pendingMu.Unlock()
	}
	if wake {
		select {
		case p.ackedWake <- struct{}{}:
		default:
		}
	}
}

// splitSynced splits the pending batches (in seq order) into those at or
// below synced, now durable, and the rest.
func splitSynced(pending []*pendingSync, synced uint64) (done, rest []*pendingSync) {
	n := 0
	for n < len(pending) && pending[n].last <= synced {
		n++
	}
	return pending[:n], pending[n:]
}

// answer completes durable batches in order (manual mode, on the
// partition's goroutine).
func (p *localStore) answer(done []*pendingSync) {
	p.acknowledge(done, false, nil)
	p.settle(done)
}

// acknowledgeThrough takes the pending batches at or below synced and
// acknowledges them, in order with any other acknowledgment (run and the
// syncer both call it), and returns them for run to settle. corked and
// beforeUncork are acknowledge's.
func (p *localStore) acknowledgeThrough(synced uint64, corked bool, beforeUncork func([]*pendingSync)) []*pendingSync {
	p.ackMu.Lock()
	defer p.ackMu.Unlock()
	p.pendingMu.Lock()
	done, rest := splitSynced(p.pending, synced)
	p.pending = rest
	p.pendingMu.Unlock()
	p.acknowledge(done, corked, beforeUncork)
	return done
}

// acknowledge makes durable batches visible and answers their publishes:
// PUB_OK is sent only here, after the fsync covering the records returned
// successfully. It may run on the syncer goroutine: it touches only the
// batches, which run no longer changes, and what is safe for concurrent use;
// ackMu (or manual mode) keeps one acknowledgment at a time. With corked,
// each connection's PUB_OKs leave in one write made here (the syncer, when
// nothing else waits for it: the ack's latency); else connections write
// them on their own goroutines (run, whose next appends must not wait for
// socket writes: throughput). beforeUncork, when set, gets done after the
// replies are made and before the connections are uncorked.
func (p *localStore) acknowledge(done []*pendingSync, corked bool, beforeUncork func([]*pendingSync)) {
	if len(done) == 0 {
		if beforeUncork != nil {
			beforeUncork(done)
		}
		return
	}
	m := p.node.metrics
	corkers := p.corked[:0]
	for _, ps := range done {
		for _, a := range ps.news {
			if c := a.req.corker; corked && c != nil && len(corkers) < corkedMax && !slices.Contains(corkers, c) {
				c.Cork()
				corkers = append(corkers, c)
			}
		}
	}
	records := 0
	for _, ps := range done {
		p.commitSeq.Store(ps.last)
		m.publishes.WithLabelValues(p.topic.cfg.Name).Add(float64(len(ps.news)))
		m.publishBytes.WithLabelValues(p.topic.cfg.Name).Add(float64(ps.bytes))
		for _, a := range ps.news {
			a.req.answer(wire.PubOK{Partition: p.id, Seq: a.seq, Epoch: ps.epoch}, nil)
		}
		records += len(ps.news)
	}
	m.commitBatch.Observe(float64(records))
	p.topic.notifyGroups()
	if beforeUncork != nil {
		beforeUncork(done)
	}
	for _, c := range corkers {
		c.Uncork()
	}
	clear(corkers)
	p.corked = corkers[:0]
}

// corkedMax bounds the connections acknowledge corks for one burst (and
// its linear search among them); the replies of others go out uncorked.
const corkedMax = 16

// settle brings the kernel up to acknowledged batches, on the partition's
// goroutine: the commit point, duplicates that waited for it, and the
// batches' reuse.
func (p *localStore) settle(done []*pendingSync) {
	for _, ps := range done {
		p.state.Committed(ps.last)
		for seq, ws := range p.waiters {
			if seq <= ps.last {
				for _, w := range ws {
					w.reply.answer(wire.PubOK{Partition: p.id, Seq: seq, Epoch: w.epoch, Duplicate: true}, nil)
				}
				delete(p.waiters, seq)
			}
		}
		p.snaps.bytes += int64(ps.bytes)
		p.recycle(ps)
	}
	p.snapshotDedup(false)
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
func (p *localStore) appendBatch(batch []*pubReq) *pendingSync {
	if werr := p.corruptError(); werr != nil {
		for _, r := range batch {
			r.answer(wire.PubOK{}, werr)
		}
		return nil
	}
	if p.failure != nil {
		p.recoverNow()
		if p.failure != nil {
			for _, r := range batch {
				r.answer(wire.PubOK{}, wire.Errorf(wire.CodeStorage, "partition unavailable: %v", p.failure))
			}
			return nil
		}
	}
	recs := p.recsBuf[:0]
	ps := p.newPendingSync()
	for _, r := range batch {
		var d partition.Decision
		if r.retryOnly != nil {
			if d = p.state.Lookup(r.producerID, r.producerSeq); d.Verdict == partition.VerdictNew {
				r.answer(wire.PubOK{}, r.retryOnly)
				continue
			}
		} else {
			d = p.state.Publish(r.producerID, r.producerSeq)
		}
		switch d.Verdict {
		case partition.VerdictNew:
			recs = append(recs, r.rec)
			ps.news = append(ps.news, appended{req: r, seq: d.Seq})
			ps.bytes += len(r.rec.Value) + len(r.rec.Key)
		case partition.VerdictDuplicate:
			ok := wire.PubOK{Partition: p.id, Seq: d.Seq, Epoch: d.Epoch, Duplicate: true}
			if d.Seq <= p.state.CommitSeq() {
				r.answer(ok, nil)
			} else {
				p.waiters[d.Seq] = append(p.waiters[d.Seq], dupWaiter{reply: r.reply, epoch: d.Epoch})
			}
		case partition.VerdictTooOld:
			r.answer(wire.PubOK{}, wire.Errorf(wire.CodeProducerSeqTooOld,
				"producer %d seq %d is below the dedup window of partition %d", r.producerID, r.producerSeq, p.id))
		}
	}
	if len(recs) == 0 {
		p.recycle(ps)
		return nil
	}
	err := p.appendRecords(ps.epoch, recs, ps.news)
	clear(recs) // Append copied them: drop the references to the payloads
	p.recsBuf = recs[:0]
	if err != nil {
		p.failPending(err, ps)
		return nil
	}
	ps.last = ps.news[len(ps.news)-1].seq
	return ps
}

// appendBytesMax bounds the encoded records of one Log.Append: the log
// keeps its encoding buffer for the next Append only up to 1 MiB, so a
// bigger one (a batch of 64 KiB records) would allocate and grow a new
// buffer every time — and a batch over the storage's 16 MiB is refused.
const appendBytesMax = storage.BatchRecordBytesReused

// appendRecords appends recs, decided as news, in as few Log.Appends of at
// most appendBytesMax as it takes.
func (p *localStore) appendRecords(epoch uint64, recs []storage.Record, news []appended) error {
	for len(recs) > 0 {
		n, bytes := 0, 0
		for n < len(recs) {
			size := storage.RecordBytes(&recs[n]) // headers too: a scheduler's checkpoint lives in them
			if n > 0 && bytes+size > appendBytesMax {
				break
			}
			bytes += size
			n++
		}
		first, err := p.log.Append(epoch, recs[:n])
		if err == nil && first != news[0].seq {
			err = fmt.Errorf("log assigned seq %d, kernel %d", first, news[0].seq)
		}
		if err != nil {
			return err
		}
		recs, news = recs[n:], news[n:]
	}
	return nil
}

// newPendingSync returns an empty pendingSync, reusing an answered one.
func (p *localStore) newPendingSync() *pendingSync {
	ps := &pendingSync{}
	if n := len(p.freeSyncs); n > 0 {
		ps, p.freeSyncs = p.freeSyncs[n-1], p.freeSyncs[:n-1]
	}
	ps.epoch = p.state.Epoch()
	return ps
}

// freeSyncsMax bounds the answered pendingSyncs kept for reuse: a few are
// pending at a time.
const freeSyncsMax = 4

// recycle keeps an answered pendingSync for reuse; nothing may refer to it.
func (p *localStore) recycle(ps *pendingSync) {
	if len(p.freeSyncs) < freeSyncsMax {
		clear(ps.news)
		*ps = pendingSync{news: ps.news[:0]}
		p.freeSyncs = append(p.freeSyncs, ps)
	}
}

// syncLog fsyncs the partition log (and times it). Safe to run on another
// goroutine while the partition goroutine appends.
func (p *localStore) syncLog(lg *storage.Log) error {
	if p.node.cfg.Mutations.AckBeforeFsync {
		return nil
	}
	before := lg.SyncedSeq()
	start := p.node.nowNanos()
	err := lg.Sync()
	if err != nil || lg.SyncedSeq() != before { // not a request already covered
		p.node.metrics.fsyncSeconds.WithLabelValues("log").Observe(float64(p.node.nowNanos()-start) / 1e9)
	}
	return err
}
