package node

import (
	"fmt"
	"slices"
	"sync"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// In a cluster a group's delivery of partition p runs on p's leader, and
// its acks of p are not written to a local ledger: they are control
// records in p's own replicated log. An ACK_OK follows the commit of its
// record (a quorum fsynced it), and a new leader of p rebuilds the group's
// cursor of p from p's committed log, so acks fail over with the
// partition and no node needs to host every partition.
//
// A group checkpoints its cursor of p into p's log once its ack records
// since the last checkpoint pass the ledger compaction threshold: a
// checkpoint record holds the done state (the local ledger snapshot's
// layout) as of its place in the log. A new leader starts from the
// group's latest checkpoint, and p is compacted no further than the
// oldest record some group still needs (its latest checkpoint, or its
// first ack when it has none).
//
// The decisions are the ack-log kernel's (internal/acklog), one per
// partition this node leads: which acks need a record, which replies
// wait for which commit, when to checkpoint, how to rebuild. This file is
// its shell: it follows which partitions this node leads, proposes the
// records the kernels return and feeds them their completions.

// ackHeader names the group of a group control record. An ack record's
// value holds (partition u32, seq u64) pairs and a count record's
// (partition u32, seq u64, count u32) entries, as the local ledger's do; a
// checkpoint's holds encodeLedgerSnapshot's layout.
const ackHeader = "nereus-group"

// Kinds of group control records (the control header's value).
const (
	groupAck        = "ack"
	groupCount      = "count"
	groupCheckpoint = "checkpoint"
	groupFence      = "fence"
	groupCarry      = "carry"
)

func groupRecord(kind acklog.Kind, group string, value []byte) storage.Record {
	return storage.Record{Value: value, Headers: []storage.Header{
		{Key: replog.ControlHeader, Value: []byte(kind.String())}, {Key: ackHeader, Value: []byte(group)}}}
}

// groupRecordOf returns the kind and group of a group control record.
func groupRecordOf(r *storage.Record) (kind acklog.Kind, group string, ok bool) {
	if !replog.IsControl(r) || len(r.Headers) != 2 || r.Headers[1].Key != ackHeader {
		return 0, "", false
	}
	switch string(r.Headers[0].Value) {
	case groupAck:
		kind = acklog.KindAck
	case groupCount:
		kind = acklog.KindCount
	case groupCheckpoint:
		kind = acklog.KindCheckpoint
	case groupFence:
		kind = acklog.KindFence
	case groupCarry:
		if _, _, ok := acklog.CarryOf(r.Value); !ok {
			return 0, "", false // no base: no record of the group
		}
		kind = acklog.KindCarry
	default:
		return 0, "", false
	}
	return kind, string(r.Headers[1].Value), true
}

// GroupRecordAcks reads a record of a partition's log as the group
// control record it may be: the acks an ack record holds, and summary
// set for a checkpoint or carry, which holds a group's acks folded in
// (the simulator's checker: which confirmed acks a dropped record took).
func GroupRecordAcks(r *storage.Record) (acks []acklog.Key, summary bool) {
	switch kind, _, ok := groupRecordOf(r); {
	case !ok:
	case kind == acklog.KindAck:
		acklog.ForEachAck(r.Value, func(k acklog.Key) { acks = append(acks, k) })
	case kind == acklog.KindCheckpoint || kind == acklog.KindCarry:
		summary = true
	}
	return acks, summary
}

// foldGroupRecords feeds rb group's records among entries (committed, in
// log order).
func foldGroupRecords(rb *acklog.Rebuild, group string, entries []storage.Entry) error {
	for _, e := range entries {
		kind, name, ok := groupRecordOf(&e.Record)
		if !ok || name != group {
			continue
		}
		var err error
		switch kind {
		case acklog.KindCheckpoint:
			var cp acklog.Checkpoint
			if cp, err = decodeCheckpoint(e.Record.Value); err == nil {
				err = rb.Checkpoint(e.Seq, cp)
			}
		case acklog.KindCarry:
			base, value, _ := acklog.CarryOf(e.Record.Value)
			var cp acklog.Checkpoint
			if cp, err = decodeCheckpoint(value); err == nil {
				_, err = rb.Carry(e.Seq, base, cp)
			}
		default:
			err = rb.Record(e.Seq, kind, e.Record.Value)
		}
		if err != nil {
			return fmt.Errorf("%v record %d: %w", kind, e.Seq, err)
		}
	}
	return nil
}

// decodeCheckpoint decodes a checkpoint record's value (a carry's after
// its base).
func decodeCheckpoint(value []byte) (acklog.Checkpoint, error) {
	snap, err := decodeLedgerSnapshot(value)
	if err != nil {
		return acklog.Checkpoint{}, err
	}
	return acklog.Checkpoint{States: snap.states, Counts: snap.counts, Fence: snap.fence}, nil
}

// encodeCheckpoint lays a checkpoint out as a record value.
func encodeCheckpoint(cp acklog.Checkpoint) []byte {
	return encodeLedgerSnapshot(ledgerSnapshot{states: cp.States, counts: cp.Counts, fence: cp.Fence})
}

// replicatedLedger is a cluster group's ack logs on this node: one per
// partition it leads, owned by the group's goroutine.
type replicatedLedger struct {
	g *groupRunner
	// inc is the group's incarnation on this node, part of every delivery
	// id with the partition's epoch.
	inc   uint64
	parts []*partLedger // by partition; nil where this node does not deliver
}

// partLedger is the group's ack log of one partition this node leads.
type partLedger struct {
	id    uint32
	store *replicaStore
	epoch uint64 // the epoch this node leads the partition in
	log   *acklog.Log[func(failed *wire.Error)]
	// scope is what the log checkpoints: the partition's cursor at its
	// index, nil elsewhere.
	scope []*delivery.Cursor
	// The group's batches of this partition, split off at each flush and
	// kept while the partition is handed over (holding).
	acks, counts []byte
	dead         []acklog.Key
	replies      []func(failed *wire.Error)
	// fenceAsked is the highest fence proposed (committed or not): a
	// checkpoint carries it.
	fenceAsked uint64
	// activeMs is when the group last batched a record for the partition
	// (quiet: checkpointQuietMs later).
	activeMs int64

	mu   sync.Mutex
	done []acklog.Completion // queued by the member's goroutine
	// fence is the highest assignment epoch the partition's log recorded
	// a delivery under (rebuilt, or committed here); fencing: a fence
	// record is in flight; retryAtMs: one failed, the next waits till then.
	fence     uint64
	fencing   bool
	retryAtMs int64
}

type ackKey struct {
	partition uint32
	seq       uint64
}

// needsRecord: an ack goes into the next record when it is new to the
// cursor, or an earlier record of it did not commit. A seq below this
// replica's log start counts as done here (its record is gone), but
// another replica — a later leader's — may still hold it: its ack is
// recorded anyway, or that leader would deliver it again.
func (l *replicatedLedger) needsRecord(isNew bool, partition uint32, seq uint64) bool {
	pl := l.parts[partition]
	if pl == nil {
		return false // no cursor here: the ack was answered stale
	}
	return pl.log.NeedsRecord(isNew, acklog.Key{Partition: partition, Seq: seq}) ||
		(!isNew && seq < l.g.topic.partitions[partition].startSeq.Load())
}

// load starts the group with no partition: follow takes in those this
// node leads.
func (l *replicatedLedger) load(inc uint64) ([]*delivery.Cursor, error) {
	l.inc = inc
	l.parts = make([]*partLedger, len(l.g.topic.partitions))
	return make([]*delivery.Cursor, len(l.g.topic.partitions)), nil
}

// follow takes in changes of leadership: a partition this node stopped
// leading (or leads again in a later epoch: its cursor is from before)
// stops being delivered here, and one it took office for starts, from its
// cursor rebuilt out of the partition's committed log.
func (l *replicatedLedger) follow(now int64) {
	g := l.g
	for i, p := range g.topic.partitions {
		epoch, leads := l.leads(p)
		if pl := l.parts[i]; pl != nil && (!leads || epoch != pl.epoch) {
			l.stopDelivering(i, now)
		}
		if l.parts[i] == nil && leads {
			if err := l.startDelivering(i, epoch); err != nil {
				g.node.logRepeatedError(g.name+"/"+p.subject(), "group cannot start delivering a partition it leads; will retry",
					"group", g.name, "topic", g.topic.cfg.Name, "partition", i, "err", err)
			}
		}
	}
}

// takingOffice reports whether this node may deliver partition pi soon
// while the group does not deliver it yet: its replica leads it (the
// install entry not applied, or follow has not rebuilt the group's
// position), or hears no leader (an election runs, which it may win — a
// partition's only replica always does).
func (l *replicatedLedger) takingOffice(pi int) bool {
	if l.parts[pi] != nil {
		return false
	}
	store := l.g.topic.partitions[pi].replica()
	if store == nil {
		return false
	}
	st := store.repl.Status()
	return st.Role == replica.Leader || st.Leader == 0
}

// leads reports whether this node leads p and took office in its epoch:
// its install entry is applied, so every group record an earlier leader
// committed is in what it rebuilds from (LeaderDeliversAfterInstall).
func (l *replicatedLedger) leads(p *partitionRunner) (epoch uint64, ok bool) {
	store := p.replica()
	if store == nil {
		return 0, false
	}
	epoch, ok = store.tookOffice()
	if !ok && l.g.node.cfg.Mutations.CoordinateBeforeInstall {
		if st := store.repl.Status(); st.Role == replica.Leader {
			return st.Hard.Promised, true
		}
	}
	return epoch, ok
}

// startDelivering rebuilds the group's cursor of partition i from the
// group's latest checkpoint and the ack records after it in i's committed
// log, and starts the partition's ack log. The delivery ids start from
// the partition's epoch, so a new leader never reuses an old one's ids.
func (l *replicatedLedger) startDelivering(i int, epoch uint64) error {
	g := l.g
	p := g.topic.partitions[i]
	store := p.replica()
	rb, err := acklog.NewRebuild(func() ([]*delivery.Cursor, error) {
		c, err := delivery.NewCursor(g.cfg, p.startSeq.Load(), (epoch<<10|l.inc&0x3ff)<<30)
		if err != nil {
			return nil, err
		}
		scope := make([]*delivery.Cursor, i+1)
		scope[i] = c
		return scope, nil
	}, ledgerRecordOverheadBytes)
	if err != nil {
		return err
	}
	// From the group's latest checkpoint (or first record), which the
	// partition's kernel tracks for compaction: not the whole log.
	for from := store.groupStart(g.key); ; {
		entries, err := store.read(from, 4096, 16<<20)
		if err != nil {
			return fmt.Errorf("replay acks: %w", err)
		}
		if len(entries) == 0 {
			break
		}
		stop := false
		if g.node.cfg.Mutations.GroupReplayStopsAtLost {
			if j := slices.IndexFunc(entries, func(e storage.Entry) bool { return replog.IsLost(&e.Record) }); j >= 0 {
				entries, stop = entries[:j], true
			}
		}
		if err := foldGroupRecords(rb, g.key, entries); err != nil {
			return err
		}
		if stop {
			break
		}
		from = entries[len(entries)-1].Seq + 1
	}
	scope := rb.Cursors()
	l.parts[i] = &partLedger{id: uint32(i), store: store, epoch: epoch, scope: scope, fence: rb.Fence(), fenceAsked: rb.Fence(),
		log: acklog.New[func(*wire.Error)](acklog.Config{
			RecordOverheadBytes: ledgerRecordOverheadBytes,
			RecordBytesMax:      g.node.cfg.RecordBytesMax,
			EncodeCheckpoint:    encodeCheckpoint,
			Mutations:           g.node.cfg.Mutations.AckLog,
		}, rb.RecordBytes())}
	g.setCursor(i, scope[i])
	return nil
}

// stopDelivering: this node no longer delivers partition i. Its
// deliveries end with its cursor (the next leader redelivers what was not
// acked, under new delivery ids), and what waits for its records is
// answered NOT_LEADER: those acks are not known durable.
func (l *replicatedLedger) stopDelivering(i int, now int64) {
	g, pl := l.g, l.parts[i]
	werr := wire.Errorf(wire.CodeNotLeader, "partition %s/%d: this node no longer leads it; acks of it not yet durable may be lost (their messages are redelivered)",
		g.topic.cfg.Name, i)
	g.answer(pl.log.Retire(), werr)
	g.answer(pl.replies, werr)
	l.parts[i] = nil
	g.forgetPartition(uint32(i), werr)
}

// flush splits what the group batched since the last flush by partition,
// hands each partition's ack log its share and its completions, and
// carries out its decisions: answer, propose, then start or retry the
// dead letters whose record completed. An ACK_OK waits for the commit of
// every record it waits for, in each partition its entries name.
func (l *replicatedLedger) flush() {
	g := l.g
	forEachEntry(g.ledgerBatch, acklog.AckEntryBytes, func(pi uint32, e []byte) {
		if pl := l.parts[pi]; pl != nil {
			pl.acks = append(pl.acks, e...)
		}
	})
	forEachEntry(g.countBatch, acklog.CountEntryBytes, func(pi uint32, e []byte) {
		if pl := l.parts[pi]; pl != nil {
			pl.counts = append(pl.counts, e...)
		}
	})
	for _, k := range g.deadPending {
		if pl := l.parts[k.partition]; pl != nil {
			pl.dead = append(pl.dead, acklog.Key{Partition: k.partition, Seq: k.seq})
		}
	}
	for _, r := range g.replies {
		var waits []*partLedger
		for _, pi := range r.parts {
			if pl := l.parts[pi]; pl != nil && !slices.Contains(waits, pl) {
				waits = append(waits, pl)
			}
		}
		if len(waits) == 0 {
			r.answer(nil) // nothing of it needs a record here
			continue
		}
		join := joinReplies(len(waits), r.answer)
		for _, pl := range waits {
			pl.replies = append(pl.replies, join)
		}
	}
	g.ledgerBatch, g.countBatch, g.deadPending = nil, nil, nil
	clear(g.replies)
	g.replies = g.replies[:0]
	for _, pl := range l.parts {
		if pl != nil {
			l.flushPart(pl)
		}
	}
}

// fenced reports whether partition pi may be delivered to an owner that
// holds it at ownerEpoch, by a node whose view of the group is at
// viewEpoch (group.State.CheckPull's fence, DeliveryBehindFence): not
// while the partition's log has recorded a delivery under a later epoch
// than this node's view (an earlier leader applied more of the metadata
// log: this node could still take a replaced owner for the current one),
// and not before the log has recorded ownerEpoch — that record is
// proposed here, one at a time, and delivery starts once it committed.
func (l *replicatedLedger) fenced(pi int, ownerEpoch, viewEpoch uint64) bool {
	pl := l.parts[pi]
	if pl == nil {
		return false
	}
	if l.g.node.cfg.Mutations.DeliverBehindFence {
		return true
	}
	pl.mu.Lock()
	fence, fencing, retryAtMs := pl.fence, pl.fencing, pl.retryAtMs
	pl.mu.Unlock()
	switch {
	case fence > viewEpoch:
		return false // this node's view is behind the log: it waits to apply more
	case ownerEpoch <= fence:
		return true
	case fencing || l.g.node.monoMs() < retryAtMs:
		return false
	}
	pl.mu.Lock() // (only this goroutine sets fencing: no second proposal)
	pl.fencing, pl.retryAtMs = true, 0
	pl.mu.Unlock()
	g := l.g
	pl.fenceAsked = max(pl.fenceAsked, ownerEpoch)
	pl.store.repl.ProposeFunc(groupRecord(acklog.KindFence, g.key, acklog.FenceRecord(ownerEpoch)), func(_, _ uint64, err error) {
		pl.mu.Lock()
		pl.fencing = false
		if err != nil {
			// Tried again after fenceRetryMs (wakeAtMs), not at once: a
			// record refused at once (the leader READ_ONLY_DEGRADED or
			// handing over) and proposed again at once livelocked
			// Node.Step (members campaign seed 90).
			pl.retryAtMs = g.node.monoMs() + fenceRetryMs
			pl.mu.Unlock()
			return
		}
		pl.fence = max(pl.fence, ownerEpoch)
		pl.mu.Unlock()
		g.poke()
	})
	return false
}

func (l *replicatedLedger) settled(pi int) bool {
	pl := l.parts[pi]
	if pl == nil || pl.log.Inflight() > 0 || pl.log.Undurable() > 0 || len(pl.acks) > 0 || len(pl.counts) > 0 {
		return false
	}
	batched := false
	forEachEntry(l.g.ledgerBatch, acklog.AckEntryBytes, func(p uint32, _ []byte) { batched = batched || p == uint32(pi) })
	return !batched
}

// fenceRetryMs is how long a partition's leader waits before proposing
// again a fence record that failed.
const fenceRetryMs = 100

// wakeAtMs is when a failed fence record may be proposed again (0: none
// waits).
func (l *replicatedLedger) wakeAtMs() int64 {
	var at int64
	now := l.g.node.monoMs()
	for _, pl := range l.parts {
		if pl == nil {
			continue
		}
		pl.mu.Lock()
		if r := pl.retryAtMs; r > now && (at == 0 || r < at) {
			at = r
		}
		pl.mu.Unlock()
	}
	return at
}

// leased: while this node's replica leads partition pi with a lease that
// has not run out on its clock (replog.Member.HoldsLease), or once its
// kernel declared it READ_ONLY_DEGRADED, whose consumers keep reading the
// visible prefix (ARCHITECTURE, Known gaps). Not in between: a leader
// woken from a pause, or held up, past its lease leads in its kernel's
// view until its ticks catch up, though another replica may have taken
// office and confirmed acks its cursor does not hold — woken, it handed
// out a message whose ack a consumer already had confirmed (sim seed
// 51003). It waits for its quorum's next answers (the lease back) or for
// its ack timeout (degraded), whichever comes first.
func (l *replicatedLedger) leased(pi int) bool {
	pl := l.parts[pi]
	if pl == nil {
		return false
	}
	return pl.store.repl.HoldsLease() || pl.store.repl.Status().ReadOnly || l.g.node.cfg.Mutations.DeliverWithoutLease
}

// joinReplies answers once after n answers: with the first failure, or
// as durable when none failed. The group's goroutine calls it.
func joinReplies(n int, answer func(failed *wire.Error)) func(failed *wire.Error) {
	var first *wire.Error
	return func(failed *wire.Error) {
		if failed != nil && first == nil {
			first = failed
		}
		if n--; n == 0 {
			answer(first)
		}
	}
}

// flushPart hands one partition's ack log its share. Not while this node
// hands the partition over (see handingOver): its batches wait.
func (l *replicatedLedger) flushPart(pl *partLedger) {
	g := l.g
	st := pl.store.repl.Status()
	if handingOver(st) {
		return
	}
	pl.mu.Lock()
	done := pl.done
	pl.done = nil
	pl.mu.Unlock()
	now := g.node.monoMs()
	if len(pl.acks) > 0 || len(pl.counts) > 0 {
		pl.activeMs = now
	}
	eff := pl.log.Flush(acklog.Input[func(*wire.Error)]{Done: done, Degraded: st.Role == replica.Leader && st.ReadOnly,
		Acks: pl.acks, Counts: pl.counts, Dead: pl.dead, Replies: pl.replies,
		CompactBytes: g.ledgerCompactBytes.Load(), Cursors: pl.scope, Fence: pl.fenceAsked,
		Quiet: now-pl.activeMs >= checkpointQuietMs, Pinned: pl.store.pins(g.key)})
	pl.acks, pl.counts, pl.dead = nil, nil, nil // the log keeps them
	clear(pl.replies)
	pl.replies = pl.replies[:0]
	for _, a := range eff.Answers {
		var werr *wire.Error
		switch a.Outcome {
		case acklog.NotCommitted:
			g.node.log.Debug("ack record not committed", "group", g.name, "topic", g.topic.cfg.Name, "partition", pl.id, "err", a.Err)
			werr = pl.store.replicationError(a.Err)
		case acklog.QuorumLost:
			werr = wire.Errorf(wire.CodeQuorumLost, "partition %s/%d lost its quorum; acks are not durable", g.topic.cfg.Name, pl.id)
		case acklog.Superseded:
			werr = wire.Errorf(wire.CodeUnavailable, "ack not durable: the partition's leader changed; retry")
		}
		g.answer(a.Replies, werr)
	}
	if eff.CheckpointTooLargeBytes > 0 {
		g.node.log.Warn("group checkpoint too large; the partition keeps the group's ack records", "group", g.name,
			"topic", g.topic.cfg.Name, "partition", pl.id, "bytes", eff.CheckpointTooLargeBytes)
	}
	for _, prop := range eff.Propose {
		id := prop.ID
		pl.store.repl.ProposeFunc(groupRecord(prop.Kind, g.key, prop.Value), func(_, _ uint64, err error) {
			pl.mu.Lock()
			pl.done = append(pl.done, acklog.Completion{ID: id, Err: err})
			pl.mu.Unlock()
			g.poke()
		})
	}
	for _, k := range eff.DeadReady {
		g.deadReady = append(g.deadReady, ackKey{k.Partition, k.Seq})
	}
	if len(eff.DeadRetry) > 0 {
		// A lost retry count costs at most one extra delivery should the
		// leader change.
		for _, r := range eff.DeadRetry {
			g.retryDeadLetter(now, ackKey{r.Key.Partition, r.Key.Seq}, fmt.Errorf("record not committed: %w", r.Err), true)
		}
	}
	if eff.FloorsDurable {
		g.floors[pl.id].Store(pl.scope[pl.id].AckFloor())
	}
}

// handingOver: this node hands the partition's leadership over
// (replica.ErrTransferring), so a record proposed now would fail at once
// and be proposed again at once, forever. Its batches wait; the hand-off
// ends within an election timeout — this node no longer leads it
// (follow stops delivering it), or it leads on and flushes.
func handingOver(st replica.Status) bool { return st.Role == replica.Leader && st.TransferTo != 0 }

// holdMs: while a partition is handed over, the group looks again soon.
func (l *replicatedLedger) holdMs() int64 {
	for _, pl := range l.parts {
		if pl != nil && handingOver(pl.store.repl.Status()) {
			return transferHoldMs
		}
	}
	return 0
}

// checkpointQuietMs: a group that batched no record for a partition this
// long checkpoints it (acklog.Input.Quiet), so an idle group pins none of
// the partition's log beyond its checkpoint. The group's idle wake-up
// (groupIdleWaitMs) comes within it.
const checkpointQuietMs = 1000

// transferHoldMs is how often a group whose partition's leader hands
// over looks again.
const transferHoldMs = 10

// close: the logs are the partitions', which outlive the group.
func (l *replicatedLedger) close() {}

func (g *groupRunner) answer(replies []func(*wire.Error), failed *wire.Error) {
	for _, r := range replies {
		r(failed)
	}
}
