package sim

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The operator of a cluster whose workload topic has one replica
// (--replicas 1 under bit flips, flipLoneReplica): no healthy copy of a
// damaged partition is left, so its node refuses the damage until
// `nereus repair`, as a single node does (OPERATIONS: "A partition with
// one replica in a cluster"). The operator watches every node's WARN
// and ERROR lines; when one asks for a repair it stops that node, runs
// `nereus repair --salvage` on its data directory and starts it again.
// What a repair drops, and what a torn tail cut took of committed
// records, goes to the checker: loss in a damaged partition, expected;
// anything lost silently, or served damaged, is a violation.

// watchLoneRepairs makes the operator watch every node.
func (s *sim) watchLoneRepairs() {
	s.repaired = map[string]int{}
	s.nodeLines = map[string]int{}
	s.durable = map[uint32]uint64{}
	s.loneRepairDue = map[string]bool{}
	for _, b := range s.nodes {
		b.onLog = func(r slog.Record) {
			s.nodeLines[r.Message]++
			switch {
			case r.Message == tornTailMessage && logAttrString(r, "topic") == simTopic:
				s.loneTornTailCut(uint32(logAttrUint(r, "partition")), tornTailOf(r))
			case r.Message == node.PartitionCorruptMessage && logAttrString(r, "topic") == simTopic:
				s.loneDamageSaid(uint32(logAttrUint(r, "partition")), logAttrUint(r, "first_seq"), logAttrUint(r, "last_seq"))
			case r.Message == tornTailMessage && logAttrString(r, "topic") == meta.MetaTopic:
				s.metaCut(logAttrUint(r, "first_seq"))
			case r.Message == tornTailMessage && logAttrString(r, "topic") == wire.KVTopic(kvBucket) && s.kv != nil:
				t := tornTailOf(r)
				if s.kv.watcher.next > t.FirstSeq {
					s.repaired["bucket torn tails a watcher went past"]++
				}
				var loss kvLoss
				loss.cut(t)
				s.kv.lose(loss)
			case r.Message == node.KVRebuiltMessage && logAttrString(r, "bucket") == kvBucket && s.kv != nil:
				s.kv.watcher.covered(logAttrUint(r, "base"))
			}
			if strings.Contains(r.Message, "nereus repair") {
				s.askLoneRepair(b, r.Message)
			}
		}
		b.beforeStart = func() { s.readLoneDurablePoints(b) }
	}
}

// readLoneDurablePoints reads the durable point (dedup snapshot, synced
// mark) of each partition whose only replica node b holds, as b reads
// them before it opens its logs and as a repair does.
func (s *sim) readLoneDurablePoints(b *broker) {
	for p := range s.opts.Partitions {
		dir := partitionDir(p)
		if names, _ := b.fs.List(dir); len(names) == 0 {
			continue
		}
		if point := node.DurablePoint(b.fs, dir); point > 0 {
			s.durable[p] = point
		} else {
			delete(s.durable, p)
		}
	}
}

// loneTornTailCut takes in a torn tail cut of partition p's only replica
// from seq first on (at its open, or by a repair), against the highest
// commit any node incarnation reported (cutCommitted). The cut of
// committed records a flip makes look torn must be said (the node's WARN
// line, which this hears): the checker forgets them, and the acks the
// partition's log held there.
func (s *sim) loneTornTailCut(p uint32, t storage.TornTail) {
	first := t.FirstSeq
	var committed uint64
	for k, c := range s.chk.maxCommit {
		if k.partition == p {
			committed = max(committed, c)
		}
	}
	if !s.cutCommitted(p, t, committed) {
		return
	}
	s.w.tracef("checker: partition %d's seqs %d-%d were cut (a bit flip into its last batches looks like a torn write); kept through %d, seen again as new above", p, first, committed, t.LastSeq)
	s.repaired["committed records cut as a torn tail"]++
	s.ghosts[p].Forget(first, committed)
	s.loneAcksDropped(p, []storage.SeqRange{{First: first, Last: committed}})
	delete(s.ledgerFlips, partitionDir(p)) // answered: the cut took the flipped batch
}

// metaCut takes in a torn tail cut of a one-node cluster's metadata log
// from seq first on, said by the node's WARN line: entries above what
// meta.json applied (MetaNotCutBelowApplied keeps the rest), answered to
// no client; the checker forgets them, and new entries take their seqs.
func (s *sim) metaCut(first uint64) {
	if last := s.metaGhost.CommittedLen(); first <= last {
		s.w.tracef("checker: the metadata log's seqs %d-%d were cut as a torn tail: seen again as new", first, last)
		s.repaired["metadata entries cut as a torn tail"]++
		s.metaGhost.Forget(first, last)
	}
}

// loneDamageSaid takes in the node's word that seqs first-last of
// partition p are damaged. Its only replica keeps serving the
// rest, and its apply steps over them: a group that rebuilds its cursor
// from that log meanwhile misses the acks they held, as the repair that
// drops them will (loneAcksDropped). A range not located (no seqs) is
// refused whole and changes nothing yet.
func (s *sim) loneDamageSaid(p uint32, first, last uint64) {
	if !s.chk.damaged[p] || first == 0 || last < first {
		return
	}
	s.loneAcksDropped(p, []storage.SeqRange{{First: first, Last: last}})
}

// loneAcksDropped: the group's acks of partition p live in its log, and
// the seqs a repair dropped or a restart cut (dropped) may
// have held some: their messages may be delivered again, at least once.
// The checker forgets the acks the flips showed there (ledgerFlipped);
// every one of p when a dropped seq is one no flip showed, or a
// checkpoint, which held them folded.
func (s *sim) loneAcksDropped(p uint32, dropped []storage.SeqRange) {
	f := s.ledgerFlips[partitionDir(p)]
	var acks []position
	for _, r := range dropped {
		for seq := r.First; seq <= r.Last; seq++ {
			held, known := f.acksAtSeq(seq)
			if !known {
				s.w.tracef("checker: every ack of partition %d forgotten: seq %d dropped, which no flip showed (or a checkpoint)", p, seq)
				s.acksForgotten["unknown damage"]++
				s.loneAcksForgotten(p)
				return
			}
			acks = append(acks, held...)
		}
	}
	s.w.tracef("checker: %d acks of partition %d forgotten with its dropped seqs", len(acks), p)
	s.acksForgotten["dropped seqs"]++
	s.chk.forgetAcks(acks)
}

// loneAcksForgotten: the group's acks of partition p live in its log,
// and what a repair or a cut took may have held any: its records may be
// delivered again, at least once.
func (s *sim) loneAcksForgotten(p uint32) {
	for pos := range s.chk.doneAtID {
		if pos.partition == p {
			delete(s.chk.doneAtID, pos)
		}
	}
}

// askLoneRepair pages the operator, who repairs node b a while later
// (once for every request made meanwhile).
func (s *sim) askLoneRepair(b *broker, msg string) {
	if s.loneRepairDue[b.id] || b.stopRestarts {
		return
	}
	s.loneRepairDue[b.id] = true
	s.w.tracef("operator asked to repair %s: %s", b.id, msg)
	s.w.after(s.w.between(50, 500), func() { s.loneRepair(b) })
}

// loneRepair stops node b, repairs its data directory and starts it
// again; a repair that failed (the disk's faults hit the tool too, or a
// kill point) is asked again, the node down meanwhile.
func (s *sim) loneRepair(b *broker) {
	s.loneRepairDue[b.id] = false
	if b.stopRestarts { // the final phase's power loss is under way
		return
	}
	b.stopRestarts = true
	b.crash()
	b.stopRestarts = false
	if err := s.repairLone(b); err != nil {
		s.askLoneRepair(b, fmt.Sprintf("the repair failed: %v", err))
		return
	}
	b.start()
}

// repairLone runs `nereus repair --salvage` on stopped node b's data
// directory, a dry run first: what it will drop goes to the checker
// before anything changes (a repair killed after the rewrite drops
// nothing when run again).
func (s *sim) repairLone(b *broker) (err error) {
	defer func() {
		if r := recover(); r != nil {
			k, ok := r.(killSignal)
			if !ok {
				panic(r)
			}
			b.fs.Crash(s.w.rng)
			s.repaired["killed, run again"]++
			err = fmt.Errorf("repair killed -9 at %s", k.at)
		}
	}()
	// A one-node cluster's metadata log has no other copy either.
	opts := node.RepairOptions{Partition: -1, Mode: storage.RepairSalvage, DryRun: true, OneNodeCluster: len(s.nodes) == 1}
	plan, err := node.Repair(b.fs, dataDir, opts)
	if err != nil {
		return err
	}
	s.readLoneDurablePoints(b)
	for _, l := range plan {
		if l.Topic == meta.MetaTopic {
			for _, r := range l.Report.Dropped {
				s.w.tracef("checker: the metadata log's seqs %d-%d were dropped by the repair (applied: what they did stays in meta.json)", r.First, r.Last)
				s.repaired["metadata entries dropped"] += int(r.Last - r.First + 1)
				s.metaGhost.Forget(r.First, r.Last)
			}
			if t := l.Report.TornTail; t != nil {
				s.metaCut(t.FirstSeq)
			}
			continue
		}
		if l.Topic == wire.KVTopic(kvBucket) && s.kv != nil {
			loss := kvLoss{dropped: l.Report.Dropped}
			if t := l.Report.TornTail; t != nil {
				loss.cut(*t)
			}
			s.kv.lose(loss)
			continue
		}
		if l.Topic != simTopic || l.Group != "" || l.Partition < 0 {
			continue
		}
		p := uint32(l.Partition)
		if len(l.Report.Dropped) > 0 {
			s.chk.dropped(p, l.Report.Dropped)
			for _, r := range l.Report.Dropped {
				s.ghosts[p].Forget(r.First, r.Last)
			}
			s.loneAcksDropped(p, l.Report.Dropped)
		}
		if t := l.Report.TornTail; t != nil {
			s.loneTornTailCut(p, *t)
		}
	}
	opts.DryRun = false
	logs, err := node.Repair(b.fs, dataDir, opts)
	if err != nil {
		return err
	}
	s.repairs++
	for _, l := range logs {
		if !l.Damaged() {
			continue
		}
		delete(s.ledgerFlips, l.Dir) // answered: the repaired log holds no flipped byte
		s.w.tracef("repair %s %s: %d damaged ranges, %d seqs dropped, torn tail %v, hard state reset %v, snapshot point reset %v",
			b.id, strings.TrimPrefix(l.Dir, dataDir+"/"), len(l.Report.Damage), l.Report.DroppedSeqs, l.Report.TornTail != nil,
			l.HardStateReset, l.SnapshotPointReset)
		for what, done := range map[string]bool{"partition ranges dropped": len(l.Report.Damage) > 0,
			"torn tail cut": l.Report.TornTail != nil, "hard state reset": l.HardStateReset, "snapshot point reset": l.SnapshotPointReset} {
			if done {
				s.repaired[what]++
			}
		}
	}
	return nil
}
