package node

import (
	"fmt"
	"sync"

	"github.com/nereus-broker/nereus/internal/acklog"
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
//
// The decisions are the ack-log kernel's (internal/acklog): which acks
// need a record, which replies wait for which commit, when to checkpoint,
// how to rebuild. This file is its shell: it proposes the records the
// kernel returns and feeds it their completions.

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
	default:
		return 0, "", false
	}
	return kind, string(r.Headers[1].Value), true
}

// replicatedLedger is a cluster group's replicated ack log: the kernel and
// the coordinator's member it proposes to, owned by the group's goroutine,
// and the completions of its records, queued by the member's goroutine.
type replicatedLedger struct {
	g *groupRunner
	// p0 is partition 0's member on this node, whose leader coordinates
	// the group; epoch is the epoch it leads in, from the last load.
	p0    *replicaStore
	epoch uint64
	log   *acklog.Log[func(failed *wire.Error)]

	mu   sync.Mutex
	done []acklog.Completion
}

type ackKey struct {
	partition uint32
	seq       uint64
}

// needsRecord: an ack goes into the next record when it is new to the
// cursor, or an earlier record of it did not commit. A seq below this
// replica's log start counts as done here (its record is gone), but
// another replica — a later coordinator's — may still hold it: its ack is
// recorded anyway, or that coordinator would deliver it again.
func (l *replicatedLedger) needsRecord(isNew bool, partition uint32, seq uint64) bool {
	return l.log.NeedsRecord(isNew, acklog.Key{Partition: partition, Seq: seq}) ||
		(!isNew && seq < l.g.topic.partitions[partition].startSeq.Load())
}

// load builds cursors from this group's latest checkpoint and the ack
// records after it in partition 0's committed log, and starts the group's
// ack log. The delivery ids start from the partition's epoch, so a new
// coordinator never reuses an old one's ids.
func (l *replicatedLedger) load(inc uint64) ([]*delivery.Cursor, error) {
	g, p0 := l.g, l.p0
	epoch, ok := p0.tookOffice()
	if !ok && g.node.cfg.Mutations.CoordinateBeforeInstall {
		epoch, ok = p0.repl.Status().Hard.Promised, true
	}
	if !ok {
		return nil, wire.Errorf(wire.CodeUnavailable, "topic %q: this node no longer coordinates its groups; retry", g.topic.cfg.Name)
	}
	l.epoch = epoch
	rb, err := acklog.NewRebuild(func() ([]*delivery.Cursor, error) {
		cursors := make([]*delivery.Cursor, len(g.topic.partitions))
		for i, p := range g.topic.partitions {
			c, err := delivery.NewCursor(g.cfg, p.startSeq.Load(), (epoch<<10|inc&0x3ff)<<30)
			if err != nil {
				return nil, err
			}
			cursors[i] = c
		}
		return cursors, nil
	}, ledgerRecordOverheadBytes)
	if err != nil {
		return nil, err
	}
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
			if kind != acklog.KindCheckpoint {
				err = rb.Record(kind, e.Record.Value)
			} else if snap, derr := decodeLedgerSnapshot(e.Record.Value); derr != nil {
				err = derr
			} else {
				err = rb.Checkpoint(acklog.Checkpoint{States: snap.states, Counts: snap.counts})
			}
			if err != nil {
				return nil, fmt.Errorf("group %s: %v record %d: %w", g.name, kind, e.Seq, err)
			}
		}
		from = entries[len(entries)-1].Seq + 1
	}
	l.log = acklog.New[func(*wire.Error)](acklog.Config{
		RecordOverheadBytes: ledgerRecordOverheadBytes,
		RecordBytesMax:      g.node.cfg.RecordBytesMax,
		EncodeCheckpoint: func(cp acklog.Checkpoint) []byte {
			return encodeLedgerSnapshot(ledgerSnapshot{states: cp.States, counts: cp.Counts})
		},
		Mutations: g.node.cfg.Mutations.AckLog,
	}, rb.RecordBytes())
	return rb.Cursors(), nil
}

// flush hands the kernel what happened since the last flush (completed
// records, the coordinator's state, batched acks, counts and replies) and
// carries out its decisions: answer, propose, then start or retry the
// dead letters whose record completed. An ACK_OK waits for its record's
// commit.
func (l *replicatedLedger) flush() {
	g := l.g
	l.mu.Lock()
	done := l.done
	l.done = nil
	l.mu.Unlock()
	dead := make([]acklog.Key, len(g.deadPending))
	for i, k := range g.deadPending {
		dead[i] = acklog.Key{Partition: k.partition, Seq: k.seq}
	}
	eff := l.log.Flush(acklog.Input[func(*wire.Error)]{Done: done, Degraded: l.coordinatorDegraded(),
		Acks: g.ledgerBatch, Counts: g.countBatch, Dead: dead, Replies: g.replies,
		CompactBytes: g.ledgerCompactBytes.Load(), Cursors: g.cursors})
	g.ledgerBatch, g.countBatch, g.deadPending = nil, nil, nil
	g.replies = g.replies[:0]
	for _, a := range eff.Answers {
		var werr *wire.Error
		switch a.Outcome {
		case acklog.NotCommitted:
			g.node.log.Debug("ack record not committed", "group", g.name, "topic", g.topic.cfg.Name, "err", a.Err)
			werr = l.p0.replicationError(a.Err)
		case acklog.QuorumLost:
			werr = wire.Errorf(wire.CodeQuorumLost, "topic %q: the coordinator lost its quorum; acks are not durable", g.topic.cfg.Name)
		case acklog.Superseded:
			werr = wire.Errorf(wire.CodeUnavailable, "ack not durable: the group's coordinator changed; retry")
		}
		g.answer(a.Replies, werr)
	}
	if eff.CheckpointTooLargeBytes > 0 {
		g.node.log.Warn("group checkpoint too large; partition 0 keeps the group's ack records", "group", g.name,
			"topic", g.topic.cfg.Name, "bytes", eff.CheckpointTooLargeBytes)
	}
	for _, prop := range eff.Propose {
		id := prop.ID
		l.p0.repl.ProposeFunc(groupRecord(prop.Kind, g.name, prop.Value), func(_, _ uint64, err error) {
			l.mu.Lock()
			l.done = append(l.done, acklog.Completion{ID: id, Err: err})
			l.mu.Unlock()
			g.poke()
		})
	}
	for _, k := range eff.DeadReady {
		g.deadReady = append(g.deadReady, ackKey{k.Partition, k.Seq})
	}
	if len(eff.DeadRetry) > 0 {
		// A lost retry count costs at most one extra delivery should the
		// coordinator change.
		now := g.node.nowMs()
		for _, r := range eff.DeadRetry {
			g.retryDeadLetter(now, ackKey{r.Key.Partition, r.Key.Seq}, fmt.Errorf("record not committed: %w", r.Err), true)
		}
	}
	if eff.FloorsDurable {
		for i, c := range g.cursors {
			g.floors[i].Store(c.AckFloor())
		}
	}
}

// holdMs holds the group's records while partition 0's leader (this
// node) hands leadership over (replica.ErrTransferring): a checkpoint
// proposed then fails at once and would be proposed again at once,
// forever. The hand-off ends within an election timeout — this node no
// longer coordinates (stillCoordinates retires the group), or it leads
// on and flushes.
func (l *replicatedLedger) holdMs() int64 {
	if st := l.p0.repl.Status(); st.Role == replica.Leader && st.TransferTo != 0 {
		return transferHoldMs
	}
	return 0
}

// transferHoldMs is how often a group whose coordinator is handing over
// looks again.
const transferHoldMs = 10

// coordinatorDegraded reports whether partition 0's leader (this node) is
// READ_ONLY_DEGRADED: ack records cannot commit.
func (l *replicatedLedger) coordinatorDegraded() bool {
	st := l.p0.repl.Status()
	return st.Role == replica.Leader && st.ReadOnly
}

// close: the log is partition 0's, which outlives the group.
func (l *replicatedLedger) close() {}

func (g *groupRunner) answer(replies []func(*wire.Error), failed *wire.Error) {
	for _, r := range replies {
		r(failed)
	}
}

// stillCoordinates reports whether this node still leads partition 0. A
// group that lost it ends its subscriptions with NOT_LEADER (clients move
// to the new coordinator) and retires.
func (l *replicatedLedger) stillCoordinates() bool {
	g := l.g
	// A leader again in a later epoch is a new coordinator: this group's
	// cursors are from before, so it retires and reloads.
	if st := l.p0.repl.Status(); st.Role == replica.Leader && st.Hard.Promised == l.epoch {
		return true
	}
	info := l.p0.info()
	werr := wire.Errorf(wire.CodeNotLeader, "the groups of topic %q moved to the leader of its partition 0: %s at %s",
		g.topic.cfg.Name, info.Leader, info.LeaderAddr)
	for _, s := range g.subs {
		s.ended.Store(true)
		s.sink.End(werr)
	}
	g.subs = nil
	g.answer(l.log.Retire(), werr)
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
