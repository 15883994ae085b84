package node

// A single node's partition: its local log, recovered at open under a new
// epoch, with group commit (commit.go), retention and damage found at
// open or by the scrubber.

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

type dupWaiter struct {
	reply replyTo
	epoch uint64
}

// localStore is a single node's partition: it owns the log and the kernel
// state. Only its goroutine (run) appends; readers use the log's concurrent
// Read and the runner's atomics.
type localStore struct {
	*partitionRunner

	// nextRetentionMs is the next retention run in Manual mode (the
	// driver's goroutine).
	nextRetentionMs int64
	// nextMarkMs is the next synced-mark period's end in Manual mode.
	nextMarkMs int64
	// verifyFrom: a seq a reader failed on with damage it could not
	// locate (0: none); verifyWake (capacity 1) wakes run to verify it.
	verifyFrom atomic.Uint64
	verifyWake chan struct{}

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
	marks  syncedMarks // owned by run
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
	snaps     dedupSnapshots
}

// openLocal recovers the partition's log and starts its loop (none in
// Manual mode: Step runs it).
func (p *partitionRunner) openLocal() error {
	s := &localStore{partitionRunner: p, waiters: map[uint64][]dupWaiter{}, ackedWake: make(chan struct{}, 1), verifyWake: make(chan struct{}, 1)}
	if err := s.recover(); err != nil {
		return err
	}
	p.store = s
	if p.node.cfg.Manual {
		s.nextRetentionMs = p.node.monoMs() + p.node.cfg.RetentionCheckMs // a wait: monotonic
		s.nextMarkMs = p.node.monoMs() + p.node.cfg.SyncedMarkMs
		return nil
	}
	p.wg.Add(1)
	go s.run()
	return nil
}

func (p *localStore) accept(r *pubReq) { p.queue(r) }

// stepManual does the partition's due work at monoMs in manual mode:
// retention when due, then every queued publish in batches.
func (p *localStore) stepManual(monoMs int64) bool {
	progress := false
	if p.verifyFrom.Load() != 0 {
		p.verifyAt()
		progress = true
	}
	if monoMs >= p.nextRetentionMs {
		p.applyRetention()
		p.nextRetentionMs = monoMs + p.node.cfg.RetentionCheckMs
		progress = true
	}
	if p.node.cfg.SyncedMarkMs > 0 && monoMs >= p.nextMarkMs {
		p.nextMarkMs = monoMs + p.node.cfg.SyncedMarkMs
		progress = p.markTail() || progress
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

// shutdown fails what is queued or waiting and closes the log; it runs on
// the goroutine that owns the partition (run, or the driver in manual
// mode).
func (p *localStore) shutdown() {
	p.failQueued()
	p.failWaiters(wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	if p.log != nil {
		p.snapshotDedup(true)
		if st := p.state; st != nil && p.failure == nil && p.snaps.applied < st.CommitSeq() {
			// No snapshot stands for the tail (off, too large, or not
			// written): the mark does, as after an idle period.
			p.node.writeSyncedMark(&p.marks, p.dir, st.CommitSeq(), p.subject(), "topic", p.topic.cfg.Name, "partition", p.id)
		}
		p.log.Close()
	}
}

// snapshotDedup writes the dedup snapshot when one is due (force: when
// the table moved since the last — at a close, or before retention
// deletes past the last one), and only while nothing appended waits for
// its fsync: the snapshot holds only durable entries.
func (p *localStore) snapshotDedup(force bool) {
	st := p.state
	if p.failure != nil || st == nil || st.CommitSeq() != st.NextSeq()-1 || st.CommitSeq() <= p.snaps.applied {
		return
	}
	if !force && !p.dueDedupSnapshot(&p.snaps, 0) {
		return
	}
	epoch := p.log.LastEpoch() // the epoch of the commit point, the log's last entry
	p.saveDedupSnapshot(&p.snaps, st.CommitSeq(), func(b []byte) ([]byte, error) { return st.AppendSnapshot(b, epoch) })
}

func (p *localStore) release() {}

// markTail writes the synced mark at a period's end over a tail that
// stayed idle through it (syncedmark.go): the commit point is synced.
func (p *localStore) markTail() bool {
	if p.failure != nil || p.log == nil || p.state == nil {
		return false
	}
	return p.markLog(&p.marks, p.log.NextSeq()-1, p.state.CommitSeq())
}

// foundDamage marks the partition corrupt for the ranges found: it
// refuses publishes until `nereus repair`. A read's failure that names no
// range (at: the seq it asked for) — a batch that went bad after open in
// a sealed segment trusted through its index, or in the active segment,
// which the scrubber never reads — has the partition's goroutine verify
// the segment holding it (verifyAt): its damage is then recorded, refused
// by name and reported (DamageNeverSilent). Unverified, a group's
// delivery retried the record for good and nothing asked for a repair
// (`nereus sim`, seeds 20 and 5, once the checker stopped excusing every
// liveness failure of a flipped partition).
func (p *localStore) foundDamage(ds []storage.Damage, at uint64) {
	if len(ds) > 0 || at == 0 || p.node.cfg.Mutations.ReadDamageUnverified {
		p.noteDamage(ds)
		return
	}
	if p.verifyFrom.CompareAndSwap(0, at) {
		select {
		case p.verifyWake <- struct{}{}:
		default:
		}
	}
}

// verifyAt verifies the segment holding the seq a reader failed on
// (foundDamage): the sealed one, else the active one; on the partition's
// goroutine, which alone appends to the log.
func (p *localStore) verifyAt() {
	at := p.verifyFrom.Swap(0)
	if at == 0 || p.log == nil {
		return
	}
	found, err := p.log.VerifyAt(at)
	if err != nil {
		p.node.logRepeatedError(p.subject(), "partition verify failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
	}
	p.noteDamage(found)
}

// describe names this node, the only replica, as the leader.
func (p *localStore) describe(info *wire.PartitionInfo) {
	info.Leader, info.LeaderAddr = p.node.cfg.NodeID, p.node.cfg.ClientAddr
}

func (p *localStore) forwardTo(int) (replica.NodeID, bool) { return 0, false }

func (p *localStore) collect(chan<- prometheus.Metric, string, string) {}

// durableThrough is what the log must hold when it opens: the point of
// its dedup snapshot (durablePoint), unless snapshots are off, or of its
// synced mark, unless marks are off. An unreadable mark is said: the
// open goes on without it.
func (p *partitionRunner) durableThrough() uint64 {
	cfg := &p.node.cfg
	if cfg.Mutations.TornTailBelowDurablePoint {
		return 0
	}
	var point uint64
	if cfg.DedupSnapshotBytes >= 0 {
		point = durablePoint(cfg.Env.FS, p.dir)
	}
	return max(point, p.node.syncedMark(p.dir, "topic", p.topic.cfg.Name, "partition", p.id))
}

// aloneDurableThrough is durableThrough for a replica group of members
// replicas: only a partition's only replica has one.
func (p *partitionRunner) aloneDurableThrough(members int) uint64 {
	if members != 1 {
		return 0
	}
	return p.durableThrough()
}

// recover opens the log, starts a new epoch and rebuilds the kernel state
// (dedup table) from the retained log.
func (p *localStore) recover() error {
	cfg := &p.node.cfg
	if p.log != nil {
		p.log.Close()
		p.log = nil
	}
	segmentBytes, _, _ := p.compaction()
	ageMs, retentionBytes := p.retention()
	durable := p.durableThrough()
	lg, err := storage.Open(cfg.Env.FS, p.dir, storage.Options{
		SegmentBytesMax: segmentBytes,
		RetentionBytes:  retentionBytes,
		RetentionAgeMs:  ageMs,
		RecordBytesMax:  cfg.RecordBytesMax + 64<<10,
		DurableThrough:  durable,
		// A torn tail's named seqs are never handed out again
		// (TornSeqsNotReused): a flip in acknowledged last batches looks
		// torn, and a reader may have gone past them.
		KeepTornSeqs: !cfg.Mutations.TornSeqsReused,
		// Said before the cut: an open that fails after it (an fsync)
		// must not cut in silence — the next open finds nothing to say.
		BeforeTornTailCut: func(t storage.TornTail) error {
			p.node.log.Warn(cluster.TornTailMessage, cluster.TornTailAttrs(t, "topic", p.topic.cfg.Name, "partition", p.id)...)
			return nil
		},
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
	p.marks = syncedMarks{point: durable, seen: lg.NextSeq() - 1} // the open synced what it recovered
	from := lg.StartSeq()
	p.snaps = dedupSnapshots{keepCopy: true}
	restored := false
	if snap := p.loadDedupSnapshot(lg); snap != nil && !cfg.Mutations.SkipDedupRebuild {
		// Only the entries after the snapshot are read again.
		st.Restore(snap)
		from, p.snaps.applied = snap.Applied+1, snap.Applied
		restored = true
	}
	err = replayLog(lg, from, func(e storage.Entry) error {
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
	// A table restored from a dedup snapshot knows every producer_seq
	// retention deleted (retention passes no snapshot's point,
	// DedupSurvivesRetention; the snapshot keeps each window's floor):
	// only one rebuilt from the kept log alone is sealed
	// (RestoredTableNotSealed). Sealed, a producer's seq whose write
	// failed while a higher one landed was refused PRODUCER_SEQ_TOO_OLD
	// for good after the recovery (`nereus sim --retention`, seed 1).
	st.ReplayDone(lg.StartSeq() > 1 && !restored)
	p.log, p.state, p.failure = lg, st, nil
	p.readLog.Store(lg)
	p.epoch.Store(epoch)
	p.startSeq.Store(lg.StartSeq())
	p.commitSeq.Store(st.CommitSeq())
	return nil
}

// replayLog calls apply for every readable entry of lg from from on, in
// order, until apply fails. It steps over gaps and damaged ranges (lg.Damage() lists
// the latter afterwards); damage that recovery could not see (a sealed
// segment trusted through its index) is found by verifying the sealed
// segments, once, and then stepped over too.
func replayLog(lg *storage.Log, from uint64, apply func(storage.Entry) error) error {
	verified := false
	for from = max(from, lg.StartSeq()); from < lg.NextSeq(); {
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

// PartitionCorruptMessage is the ERROR line that says a damaged range of
// a partition (topic, partition, file, first_seq, last_seq), once.
const PartitionCorruptMessage = "partition data corrupt; publishes refused until `nereus repair`"

// noteDamage marks the partition corrupt when ds is not empty, logging
// each damaged range once.
func (p *partitionRunner) noteDamage(ds []storage.Damage) {
	p.damageMu.Lock()
	defer p.damageMu.Unlock()
	for _, d := range ds {
		if slices.Contains(p.damageSaid, d) {
			continue
		}
		p.damageSaid = append(p.damageSaid, d)
		p.node.log.Error(PartitionCorruptMessage, "topic", p.topic.cfg.Name,
			"partition", p.id, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes,
			"first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	}
	if len(ds) > 0 && p.damage.Load() == nil {
		p.damage.Store(&ds[0])
	}
}

// corruptError is the DATA_CORRUPT answer of a damaged partition, or nil.
func (p *partitionRunner) corruptError() *wire.Error {
	d := p.damage.Load()
	if d == nil {
		return nil
	}
	if d.Segment == "" { // not located: the open that found it names no range
		return wire.Errorf(wire.CodeDataCorrupt, "partition %s/%d is damaged (%s); it refuses publishes until repaired (nereus repair, with the node stopped)",
			p.topic.cfg.Name, p.id, d.Cause)
	}
	return wire.Errorf(wire.CodeDataCorrupt, "partition %s/%d is damaged at seqs %d-%d (%s offset %d); it refuses publishes until repaired (nereus repair, with the node stopped)",
		p.topic.cfg.Name, p.id, d.FirstSeq, d.LastSeq, d.Segment, d.Offset)
}

// bumpEpoch starts a new reign: one past both the persisted epoch and the
// last epoch in the log, persisted before any record is written under it.
func (p *localStore) bumpEpoch(logEpoch uint64) (uint64, error) {
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

// commitBatch is the unpipelined path (manual mode): append, fsync, answer.
func (p *localStore) commitBatch(batch []*pubReq) {
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
func (p *localStore) failPending(cause error, pending ...*pendingSync) {
	p.node.logRepeatedError(p.subject(), "partition write failed; recovering", "topic", p.topic.cfg.Name, "partition", p.id, "err", cause)
	werr := wire.Errorf(wire.CodeStorage, "write not durable: %v", cause)
	for _, ps := range pending {
		for _, a := range ps.news {
			a.req.answer(wire.PubOK{}, werr)
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
func (p *localStore) recoverNow() {
	p.failWaiters(wire.Errorf(wire.CodeStorage, "write not durable: %v", p.failure))
	if err := p.recover(); err != nil {
		p.failure = err
		msg := "partition recovery failed"
		if errors.Is(err, storage.ErrCorrupt) {
			msg = "partition recovery found its log damaged; publishes refused until `nereus repair` (the node stopped)"
		}
		p.node.logRepeatedError(p.subject(), msg, "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	p.topic.notifyGroups()
}

// failWaiters answers every duplicate waiting for a pending seq with werr.
func (p *localStore) failWaiters(werr *wire.Error) {
	for seq, ws := range p.waiters {
		for _, w := range ws {
			w.reply.answer(wire.PubOK{}, werr)
		}
		delete(p.waiters, seq)
	}
}

// applyRetention deletes the segments retention lets go. The dedup
// snapshot is written first when they reach past it (DedupSurvivesRetention):
// a restart that found its snapshot older than the log's start would
// rebuild the table from the kept log and forget the producers whose
// records were deleted, so that their retries appended again. Until a
// snapshot can be written the deletion stops at the last one — unless
// the table is too large to snapshot at all.
func (p *localStore) applyRetention() {
	if p.failure != nil {
		return
	}
	// The topic's retention may have changed since the last pass.
	if err := p.log.SetRetention(p.retention()); err != nil {
		p.node.log.Error("retention failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	// An idle partition's last records expire too (IdleLogExpires).
	if _, err := p.log.SealExpired(p.node.nowMs()); err != nil {
		p.node.log.Error("retention failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	_, _, limit := p.compaction()
	point := p.log.RetentionPoint(p.node.nowMs(), limit())
	if point > p.snaps.applied && p.node.cfg.DedupSnapshotBytes >= 0 && !p.node.cfg.Mutations.RetentionPastDedupSnapshot {
		p.snapshotDedup(true)
		if !p.snaps.tooLarge {
			point = min(point, p.snaps.applied)
		}
	}
	deleted, err := p.log.DeleteThrough(point)
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
