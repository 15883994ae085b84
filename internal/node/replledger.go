package node

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// In a cluster a group's acks are not written to a local ledger: they are
// control records in the replicated log of the topic's partition 0, whose
// leader coordinates the topic's groups. An ACK_OK follows the commit of
// its record (a quorum fsynced it), and a new coordinator rebuilds every
// group's cursors from the committed log, so acks survive failover.

//
// A group checkpoints its cursors into the same log once its ack records
// since the last checkpoint pass the ledger compaction threshold: a
// checkpoint record holds the done state of every partition (the local
// ledger snapshot's layout) as of its place in the log. A new coordinator
// starts from the group's latest checkpoint, and partition 0 is compacted
// no further than the oldest record some group still needs (its latest
// checkpoint, or its first ack when it has none).

// ackHeader names the group of a group control record. An ack record's
// value holds (partition u32, seq u64) pairs and a count record's
// (partition u32, seq u64, count u32) entries, as the local ledger's do; a
// checkpoint's holds encodeLedgerSnapshot's layout.
const ackHeader = "nereus-group"

// Kinds of group control records.
const (
	groupAck        = "ack"
	groupCount      = "count"
	groupCheckpoint = "checkpoint"
)

func groupRecord(kind, group string, value []byte) storage.Record {
	return storage.Record{Value: value, Headers: []storage.Header{
		{Key: replog.ControlHeader, Value: []byte(kind)}, {Key: ackHeader, Value: []byte(group)}}}
}

// groupRecordOf returns the kind and group of a group control record.
func groupRecordOf(r *storage.Record) (kind, group string, ok bool) {
	if !replog.IsControl(r) || len(r.Headers) != 2 || r.Headers[1].Key != ackHeader {
		return "", "", false
	}
	switch kind := string(r.Headers[0].Value); kind {
	case groupAck, groupCount, groupCheckpoint:
		return kind, string(r.Headers[1].Value), true
	}
	return "", "", false
}

// replLedger is the group's state of the replicated ledger (run-owned but
// for the completion queue).
type replLedger struct {
	gen      uint64         // bumped on retirement: completions of older proposals fail
	inflight []*ackProposal // proposals not completed yet, oldest first
	// undurable holds acks applied to the cursors whose record did not
	// commit (quorum lost, leadership moved). A repeated ack of one is
	// proposed again rather than confirmed from the cursor: an ACK_OK must
	// follow a commit.
	undurable map[ackKey]bool
	// checkpointing: a checkpoint record is in flight (at most one).
	checkpointing bool

	mu   sync.Mutex
	done []*ackProposal
}

// ackProposal is one batch of acks in flight and the replies waiting for it
// (its own, and those of requests that needed no new record but must not
// be answered before it: a re-ack of a seq whose first ack is in flight).
type ackProposal struct {
	gen        uint64
	checkpoint bool   // a checkpoint record, not acks
	batch      []byte // (partition u32, seq u64) pairs of an ack record
	counts     bool   // a count record (its batch is nil)
	// dead are the dead letters whose record (MaxDeliver) this count
	// record carries: their publish starts when it commits.
	dead    []ackKey
	replies []func(failed *wire.Error)
	err     error // set by the completion, under replLedger.mu
}

type ackKey struct {
	partition uint32
	seq       uint64
}

// needsRecord reports whether an ack must go into the next record: it is
// new to the cursor, or an earlier record of it did not commit.
func (g *groupRunner) needsRecord(isNew bool, partition uint32, seq uint64) bool {
	return isNew || g.repl.undurable[ackKey{partition, seq}]
}

func forEachAck(batch []byte, f func(ackKey)) {
	for ; len(batch) >= ledgerEntryBytes; batch = batch[ledgerEntryBytes:] {
		f(ackKey{binary.BigEndian.Uint32(batch), binary.BigEndian.Uint64(batch[4:])})
	}
}

// coordinator is partition 0's member on this node (nil if not hosted).
func (g *groupRunner) coordinator() *partitionRunner { return g.topic.partitions[0] }

// loadReplicated builds cursors from this group's latest checkpoint and
// the ack records after it in partition 0's committed log. The delivery ids
// start from the partition's epoch, so a new coordinator never reuses an
// old one's ids.
func (g *groupRunner) loadReplicated(inc uint64) ([]*delivery.Cursor, error) {
	p0 := g.coordinator()
	epoch := p0.epoch.Load()
	var cursors []*delivery.Cursor
	fresh := func() error {
		cursors = make([]*delivery.Cursor, len(g.topic.partitions))
		for i, p := range g.topic.partitions {
			c, err := delivery.NewCursor(g.cfg, p.startSeq.Load(), (epoch<<10|inc&0x3ff)<<30)
			if err != nil {
				return err
			}
			cursors[i] = c
		}
		return nil
	}
	if err := fresh(); err != nil {
		return nil, err
	}
	g.ledgerBytes = 0
	for from := p0.startSeq.Load(); ; {
		entries, err := p0.read(from, 4096, 16<<20)
		if err != nil {
			return nil, fmt.Errorf("group %s: replay acks: %w", g.name, err)
		}
		if len(entries) == 0 {
			break
		}
		for _, e := range entries {
			kind, name, ok := groupRecordOf(&e.Record)
			if !ok || name != g.name {
				continue
			}
			v := e.Record.Value
			if kind == groupCheckpoint {
				snap, err := decodeLedgerSnapshot(v)
				if err != nil {
					return nil, fmt.Errorf("group %s: checkpoint record %d: %w", g.name, e.Seq, err)
				}
				if err := fresh(); err != nil {
					return nil, err
				}
				for i, c := range cursors {
					if err := snap.restore(i, c); err != nil {
						return nil, fmt.Errorf("group %s: checkpoint record %d, partition %d: %w", g.name, e.Seq, i, err)
					}
				}
				g.ledgerBytes = 0
				continue
			}
			g.ledgerBytes += ledgerRecordOverheadBytes + int64(len(v))
			replay := replayAcks
			if kind == groupCount {
				replay = replayCounts
			}
			if err := replay(cursors, v); err != nil {
				return nil, fmt.Errorf("group %s: record %d: %w", g.name, e.Seq, err)
			}
		}
		from = entries[len(entries)-1].Seq + 1
	}
	return cursors, nil
}

// flushReplicated proposes the batched acks and hands the replies waiting
// for them to the proposal; they are answered when it commits.
func (g *groupRunner) flushReplicated() {
	rl := &g.repl
	g.collectAckCommits()
	if g.coordinatorDegraded() {
		// The records in flight may still commit once the quorum is back;
		// until then their acks are answered now, as not durable.
		werr := wire.Errorf(wire.CodeQuorumLost, "topic %q: the coordinator lost its quorum; acks are not durable", g.topic.cfg.Name)
		for _, prop := range rl.inflight {
			g.answer(prop.replies, werr)
			prop.replies = nil
			g.markUndurable(prop.batch)
		}
	}
	if len(g.countBatch) > 0 {
		// Counts need no reply; the dead letters they record are published
		// once this record commits.
		prop := &ackProposal{gen: rl.gen, counts: true, dead: g.deadPending}
		g.ledgerBytes += ledgerRecordOverheadBytes + int64(len(g.countBatch))
		g.propose(prop, groupRecord(groupCount, g.name, g.countBatch))
		g.countBatch, g.deadPending = nil, nil
	}
	if len(g.ledgerBatch) == 0 {
		if n := len(rl.inflight); n > 0 {
			rl.inflight[n-1].replies = append(rl.inflight[n-1].replies, g.replies...)
		} else {
			g.answer(g.replies, nil) // nothing in flight to wait for
		}
		g.replies = g.replies[:0]
		g.maybeCheckpoint()
		return
	}
	prop := &ackProposal{gen: rl.gen, batch: g.ledgerBatch, replies: append([]func(*wire.Error){}, g.replies...)}
	g.replies = g.replies[:0]
	g.ledgerBytes += ledgerRecordOverheadBytes + int64(len(g.ledgerBatch))
	g.propose(prop, groupRecord(groupAck, g.name, g.ledgerBatch))
	g.ledgerBatch = nil
}

func (g *groupRunner) propose(prop *ackProposal, rec storage.Record) {
	rl := &g.repl
	rl.inflight = append(rl.inflight, prop)
	g.coordinator().repl.ProposeFunc(rec, func(_, _ uint64, err error) {
		rl.mu.Lock()
		prop.err = err
		rl.done = append(rl.done, prop)
		rl.mu.Unlock()
		g.poke()
	})
}

// maybeCheckpoint proposes a checkpoint of the cursors once the group's
// ack records since the last one pass the threshold, at a moment when the
// cursors hold exactly the committed acks: nothing in flight, batched or
// undurable.
func (g *groupRunner) maybeCheckpoint() {
	rl := &g.repl
	threshold := g.ledgerCompactBytes.Load()
	if threshold <= 0 || g.ledgerBytes < max(threshold, g.compactRetryBytes) || rl.checkpointing ||
		len(rl.inflight) > 0 || len(rl.undurable) > 0 || len(g.ledgerBatch) > 0 || len(g.countBatch) > 0 ||
		g.coordinatorDegraded() {
		return
	}
	value := encodeLedgerSnapshot(snapshotCursors(0, g.cursors))
	if len(value) > g.node.cfg.RecordBytesMax {
		g.node.log.Warn("group checkpoint too large; partition 0 keeps the group's ack records", "group", g.name,
			"topic", g.topic.cfg.Name, "bytes", len(value))
		g.compactRetryBytes = g.ledgerBytes + threshold
		return
	}
	rl.checkpointing = true
	g.propose(&ackProposal{gen: rl.gen, checkpoint: true}, groupRecord(groupCheckpoint, g.name, value))
}

// collectAckCommits answers the acks whose records committed. A record that
// failed (quorum lost, leadership moved) fails its acks; they stay applied
// to the cursors, so consumers keep reading the visible prefix, and are
// remembered as undurable until a later record of them commits. A new
// coordinator rebuilds from the log and so redelivers them (at least once).
func (g *groupRunner) collectAckCommits() {
	rl := &g.repl
	rl.mu.Lock()
	done := rl.done
	rl.done = nil
	rl.mu.Unlock()
	for _, c := range done {
		if i := slices.Index(rl.inflight, c); i >= 0 {
			rl.inflight = slices.Delete(rl.inflight, i, i+1)
		}
		if c.checkpoint {
			// Its replies (if any) are re-acks that waited on whatever was
			// last in flight: answered below like an ack record's.
			rl.checkpointing = false
			if c.err == nil && c.gen == rl.gen {
				g.ledgerBytes, g.compactRetryBytes = 0, 0
			}
		}
		if c.gen != rl.gen {
			g.answer(c.replies, wire.Errorf(wire.CodeUnavailable, "ack not durable: an earlier ack failed; retry"))
			continue
		}
		if c.counts {
			// Its replies (if any) waited on it like a checkpoint's. If
			// it failed, its dead letters are recorded again after a
			// backoff; a lost retry count costs at most one extra
			// delivery should the coordinator change.
			if c.err != nil {
				now := g.node.nowMs()
				for _, k := range c.dead {
					g.retryDeadLetter(now, k, fmt.Errorf("record not committed: %w", c.err), true)
				}
			} else {
				g.deadReady = append(g.deadReady, c.dead...)
			}
		}
		if c.err != nil {
			g.node.log.Debug("ack record not committed", "group", g.name, "topic", g.topic.cfg.Name, "err", c.err)
			g.markUndurable(c.batch)
			g.answer(c.replies, replicationError(g.coordinator(), c.err))
			continue
		}
		forEachAck(c.batch, func(k ackKey) { delete(rl.undurable, k) })
		g.answer(c.replies, nil)
	}
	if len(done) > 0 && len(rl.undurable) == 0 {
		for i, c := range g.cursors {
			g.floors[i].Store(c.AckFloor())
		}
	}
}

func (g *groupRunner) markUndurable(batch []byte) {
	if g.repl.undurable == nil {
		g.repl.undurable = map[ackKey]bool{}
	}
	forEachAck(batch, func(k ackKey) { g.repl.undurable[k] = true })
}

// coordinatorDegraded reports whether partition 0's leader (this node) is
// READ_ONLY_DEGRADED: ack records cannot commit.
func (g *groupRunner) coordinatorDegraded() bool {
	p0 := g.coordinator()
	if p0.repl == nil {
		return false
	}
	st := p0.repl.Status()
	return st.Role == replica.Leader && st.ReadOnly
}

func (g *groupRunner) answer(replies []func(*wire.Error), failed *wire.Error) {
	for _, r := range replies {
		r(failed)
	}
}

// stillCoordinates reports whether this node still leads partition 0. A
// group that lost it ends its subscriptions with NOT_LEADER (clients move
// to the new coordinator) and retires.
func (g *groupRunner) stillCoordinates() bool {
	if g.node.cluster == nil {
		return true
	}
	p0 := g.coordinator()
	if p0.repl != nil && p0.repl.Status().Role == replica.Leader {
		return true
	}
	info := p0.info()
	werr := wire.Errorf(wire.CodeNotLeader, "the groups of topic %q moved to the leader of its partition 0: %s at %s",
		g.topic.cfg.Name, info.Leader, info.LeaderAddr)
	for _, s := range g.subs {
		s.ended.Store(true)
		s.sink.End(werr)
	}
	g.subs = nil
	g.repl.gen++
	for _, prop := range g.repl.inflight {
		g.answer(prop.replies, werr)
		prop.replies = nil
	}
	g.answer(g.replies, werr)
	g.replies = g.replies[:0]
	g.ledgerBatch, g.countBatch, g.deadPending, g.deadReady = nil, nil, nil, nil
	g.node.retireGroup(g)
	return false
}

// retireGroup forgets a group that stopped coordinating; a later PULL
// starts it again from the log if this node coordinates once more.
func (n *Node) retireGroup(g *groupRunner) {
	n.mu.Lock()
	if n.groups[groupKey{group: g.name, topic: g.topic.cfg.Name}] == g {
		delete(n.groups, groupKey{group: g.name, topic: g.topic.cfg.Name})
	}
	n.mu.Unlock()
	g.topic.groupsMu.Lock()
	for i, x := range g.topic.groups {
		if x == g {
			g.topic.groups = append(g.topic.groups[:i], g.topic.groups[i+1:]...)
			break
		}
	}
	g.topic.groupsMu.Unlock()
	g.retired = true
}
