package node

import (
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
)

// A replicated partition's log is compacted no further than each consumer
// group's latest checkpoint (acklog.Needs). While retention would compact
// past it, the group's runner on the partition's leader checkpoints at
// the log's tail (acklog.Input.Pinned) — but a group with no runner
// delivering the partition there (its members gone, and the leader
// restarted or moved since) writes nothing, and would pin the log for
// good. For such a group the leader folds the group's records, from its
// latest checkpoint on, into a carry (acklog.KindCarry): the checkpoint
// re-stated at the tail, which counts only if no record of the group
// came between what it folded and itself (CarryAtItsBase). The fold reads
// a chunk of the log a pass of the partition's loop.

// GroupCheckpointSpanBytesDefault is Config.GroupCheckpointSpanBytes's
// default: a new leader reads at most about 64 MiB (plus a segment) of a
// partition's log to rebuild a group that acks on.
const GroupCheckpointSpanBytesDefault = 64 << 20

// groupCarryRetryMs is how long a group waits for its next carry after
// one was proposed (its carry commits well within it; one that did not
// hold is tried again then).
const groupCarryRetryMs = 1000

// A fold reads at most this much a pass of the partition's loop, which
// also serves the partition's publishes: a cold read of 1 MiB holds them
// up for a few milliseconds at most.
const (
	groupCarryChunkRecords = 1024
	groupCarryChunkBytes   = 1 << 20
)

// groupCarryFold is a carry being folded.
type groupCarryFold struct {
	group string
	rb    *acklog.Rebuild
	next  uint64 // the next seq to read
	base  uint64 // the last seq read: the carry's base
}

// groupCarryCursor is the configuration of the cursors a carry is folded
// into: no count reaches MaxDeliver, so the counts are carried as
// recorded and the group's own configuration judges them.
var groupCarryCursor = delivery.Config{AckWaitMs: 1, MaxDeliver: math.MaxUint32, InflightMax: 1}

// deliversHere reports whether the group's runner on this node delivers
// the partition (groupRunner.delivering).
func (p *replicaStore) deliversHere(group string) bool {
	t := p.topic
	t.groupsMu.Lock()
	defer t.groupsMu.Unlock()
	return slices.ContainsFunc(t.groups, func(g *groupRunner) bool { return g.key == group && g.delivering[p.id].Load() })
}

// pins reports whether the group's latest checkpoint (or first record)
// is due again on this leader: retention would compact past it, or a new
// leader would read more than Config.GroupCheckpointSpanBytes after it.
func (p *replicaStore) pins(group string) bool {
	want := p.checkpointWant.Load()
	snap := p.groupsFrom.Load()
	if want == 0 || snap == nil {
		return false
	}
	from, ok := snap.from[group]
	return ok && from <= want
}

// checkRetention runs every carryCheckMs on a leader in office: where
// retention would compact to, and where the groups' checkpoints are due
// for their runners (pins); then the dedup carry and a group carry
// retention may call for.
func (p *replicaStore) checkRetention() {
	if p.groupFold != nil {
		p.foldGroupCarry()
	}
	// The checks' schedule and the carries' retries are waits, on the
	// monotonic clock (CarryChecksAreMonotonic); retention's ages are
	// dates, on the wall clock.
	mono := p.node.monoMs()
	if mono < p.carryCheckAtMs {
		return
	}
	p.carryCheckAtMs = mono + carryCheckMs
	if _, ok := p.tookOffice(); !ok {
		p.checkpointWant.Store(0)
		return
	}
	l := p.repl.ReadLog()
	want := l.RetentionPoint(p.node.nowMs(), p.retainLimit())
	p.checkpointWant.Store(max(want, l.SpanPoint(p.node.cfg.GroupCheckpointSpanBytes)))
	if want == 0 {
		return
	}
	p.proposeCarry(want)
	p.startGroupCarry(mono, want)
}

// startGroupCarry starts folding a carry of the group that holds
// retention back furthest, among those no runner delivers here.
func (p *replicaStore) startGroupCarry(now int64, want uint64) {
	if p.groupFold != nil || p.groupCarrying.Load() || p.node.cfg.Mutations.NoGroupCarry {
		return
	}
	maps.DeleteFunc(p.groupCarryAtMs, func(_ string, at int64) bool { return at <= now })
	group, from := "", uint64(0)
	for g, f := range p.kernel.GroupsFrom() {
		if f > want || now < p.groupCarryAtMs[g] || p.deliversHere(g) {
			continue
		}
		if group == "" || f < from || f == from && g < group {
			group, from = g, f
		}
	}
	if group == "" {
		return
	}
	start := p.startSeq.Load()
	rb, err := acklog.NewRebuild(func() ([]*delivery.Cursor, error) {
		c, err := delivery.NewCursor(groupCarryCursor, start, 0)
		scope := make([]*delivery.Cursor, p.id+1)
		scope[p.id] = c
		return scope, err
	}, ledgerRecordOverheadBytes)
	if err != nil {
		p.node.logRepeatedError(p.subject()+"/group-carry", "group carry not started", "group", group, "err", err)
		return
	}
	if p.groupCarryAtMs == nil {
		p.groupCarryAtMs = map[string]int64{}
	}
	p.groupCarryAtMs[group] = now + groupCarryRetryMs
	from = max(from, start)
	p.groupFold = &groupCarryFold{group: group, rb: rb, next: from, base: from - 1}
	p.foldGroupCarry()
}

// foldGroupCarry reads the next chunk of the carry's fold, and proposes
// the carry once the fold reached the commit point. A leader that lost
// its office, or a log compacted under the fold, abandons it.
func (p *replicaStore) foldGroupCarry() {
	f := p.groupFold
	if _, ok := p.tookOffice(); !ok {
		p.groupFold = nil
		return
	}
	entries, err := p.read(f.next, groupCarryChunkRecords, groupCarryChunkBytes)
	if err == nil && len(entries) > 0 {
		err = foldGroupRecords(f.rb, f.group, entries)
	}
	if err != nil {
		p.groupFold = nil
		p.node.logRepeatedError(p.subject()+"/group-carry", "group carry abandoned", "group", f.group, "err", err)
		return
	}
	if len(entries) > 0 {
		f.base = entries[len(entries)-1].Seq
		f.next = f.base + 1
		p.poke() // the next chunk in the next pass
		return
	}
	p.groupFold = nil
	cp := acklog.CheckpointOf(f.rb.Cursors())
	cp.Fence = f.rb.Fence()
	value := acklog.CarryRecord(f.base, encodeCheckpoint(cp))
	if len(value) > p.node.cfg.RecordBytesMax {
		p.node.logRepeatedError(p.subject()+"/group-carry", "group carry too large; the partition keeps the group's records",
			"group", f.group, "bytes", len(value))
		return
	}
	p.groupCarrying.Store(true)
	p.repl.ProposeFunc(groupRecord(acklog.KindCarry, f.group, value), func(_, _ uint64, err error) {
		p.groupCarrying.Store(false)
		if err == nil {
			p.node.metrics.groupCarries.WithLabelValues(p.topic.cfg.Name, strconv.FormatUint(uint64(p.id), 10)).Inc()
			p.poke()
		}
	})
}
