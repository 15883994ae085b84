package node

import (
	"strconv"

	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
)

// A replicated partition's log is compacted no further than every known
// producer's latest mention (partition.Member.CompactLimit), so that a
// replica rebuilding its dedup table from the kept log forgets no
// producer. When that is what holds compaction back, the leader proposes
// a dedup carry: a control record that re-states the producers mentioned
// longest ago (internal/partition/carry.go).

// dedupCarryKind names a dedup carry (the control header's value).
const dedupCarryKind = "dedup-carry"

// carryCheckMs is how often a leader asks whether a carry is due (a walk
// over the log's segments).
const carryCheckMs = 50

// proposeCarry proposes a dedup carry when none is in flight and
// retention (or a checkpoint's limit) would compact through want, past a
// producer's latest mention (checkRetention calls it on a leader).
func (p *replicaStore) proposeCarry(want uint64) {
	if p.carrying.Load() {
		return
	}
	value, ok := p.kernel.AppendCarry(nil, want)
	if !ok {
		return
	}
	p.carrying.Store(true)
	rec := storage.Record{Value: value, Headers: []storage.Header{{Key: replog.ControlHeader, Value: []byte(dedupCarryKind)}}}
	p.repl.ProposeFunc(rec, func(_, _ uint64, err error) {
		p.carrying.Store(false)
		if err == nil {
			p.node.metrics.dedupCarries.WithLabelValues(p.topic.cfg.Name, strconv.FormatUint(uint64(p.id), 10)).Inc()
			p.poke() // the next carry, if more producers hold compaction back
		}
	})
}

// isDedupCarry reports whether r is a dedup carry.
func isDedupCarry(r *storage.Record) bool {
	return len(r.Headers) == 1 && string(r.Headers[0].Value) == dedupCarryKind && replog.IsControl(r)
}
