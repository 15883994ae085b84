package acklog

import "maps"

// Needs tracks what the groups whose records a partition's log holds still
// need from it: each group's latest checkpoint, or its first record when it
// has none. Every replica of the partition applies the committed log to it,
// so each one compacts no further than any group could rebuild from.
//
// The zero value is ready to use.
type Needs struct {
	from    map[string]uint64 // group → first seq it needs
	version uint64            // bumped whenever from changes
}

// Applied notes a committed record of group at seq.
func (n *Needs) Applied(group string, seq uint64, kind Kind) {
	if n.from == nil {
		n.from = map[string]uint64{}
	}
	if kind == KindCheckpoint || n.from[group] == 0 {
		n.from[group] = seq
		n.version++
	}
}

// Version changes whenever what some group needs changed.
func (n *Needs) Version() uint64 { return n.version }

// From returns a copy of where each group's records start (its latest
// checkpoint, or its first record): a new leader rebuilds a group from
// there, and a group absent has no record in what was applied.
func (n *Needs) From() map[string]uint64 { return maps.Clone(n.from) }

// Limit is the last seq that may be compacted: at most applied, and below
// every group's need.
func (n *Needs) Limit(applied uint64) uint64 {
	limit := applied
	for _, from := range n.from {
		limit = min(limit, from-1)
	}
	return limit
}

// Reset forgets every group (the log's start moved past what was applied:
// the records are applied again from the new start).
func (n *Needs) Reset() { n.from = nil; n.version++ }

// Restore replaces what is known with from (a snapshot of From taken
// earlier on this replica): the records up to that point need not be
// applied again.
func (n *Needs) Restore(from map[string]uint64) { n.from = maps.Clone(from); n.version++ }
