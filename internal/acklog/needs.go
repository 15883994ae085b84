package acklog

import (
	"encoding/binary"
	"maps"
	"slices"
)

// Needs tracks what the groups whose records a partition's log holds still
// need from it: each group's latest checkpoint, or its first record when it
// has none. Every replica of the partition applies the committed log to it,
// so each one compacts no further than any group could rebuild from.
//
// The zero value is ready to use.
type Needs struct {
	from map[string]uint64 // group → first seq it needs
	// last: group → the seq of its latest record applied (at least: after
	// Restore, the snapshot's point), which judges its carries.
	last    map[string]uint64
	version uint64 // bumped whenever from changes
}

// Applied notes a committed record of group at seq of kind; base is a
// carry's (KindCarry), 0 for the other kinds. A carry that does not hold
// (CarryHolds) is no record of the group.
func (n *Needs) Applied(group string, seq uint64, kind Kind, base uint64) {
	if kind == KindCarry && !CarryHolds(n.last[group], base) {
		return
	}
	if n.from == nil {
		n.from, n.last = map[string]uint64{}, map[string]uint64{}
	}
	n.last[group] = seq
	if kind == KindCheckpoint || kind == KindCarry || n.from[group] == 0 {
		n.from[group] = seq
		n.version++
	}
}

// CarryHolds reports whether a carry folded from its group's records up to
// base holds, the group's latest record before it being at last
// (CarryAtItsBase): a record after base — an ack its leader's group
// proposed while the carry was being folded — is not in the carry, and a
// carry taken as the group's checkpoint would drop it.
func CarryHolds(last, base uint64) bool { return last <= base }

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

// Forget drops every group gone says is gone (a deleted group's
// incarnation, DeletedGroupPinsNothing): it needs nothing of the log.
func (n *Needs) Forget(gone func(group string) bool) {
	for g := range n.from {
		if gone(g) {
			delete(n.from, g)
			delete(n.last, g)
			n.version++
		}
	}
}

// Reset forgets every group (the log's start moved past what was applied:
// the records are applied again from the new start).
func (n *Needs) Reset() { n.from, n.last = nil, nil; n.version++ }

// Restore replaces what is known with from (a snapshot of From taken
// earlier on this replica, as of applied): the records up to that point
// need not be applied again. Each group's latest record is taken to be at
// applied (the snapshot does not say), so a carry based before it does
// not hold here: this replica keeps more of its log than the others until
// the group's next checkpoint or carry, never less.
func (n *Needs) Restore(from map[string]uint64, applied uint64) {
	n.from, n.last = maps.Clone(from), make(map[string]uint64, len(from))
	for g := range from {
		n.last[g] = applied
	}
	n.version++
}

// Clone returns an independent copy (the model checker explores from
// copies).
func (n *Needs) Clone() Needs {
	return Needs{from: maps.Clone(n.from), last: maps.Clone(n.last), version: n.version}
}

// AppendDigest appends a canonical encoding of what the groups need to b
// (groups in name order): equal states encode equally. The version is
// left out: it only counts changes.
func (n *Needs) AppendDigest(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(n.from)))
	for _, g := range slices.Sorted(maps.Keys(n.from)) {
		b = binary.BigEndian.AppendUint64(b, uint64(len(g)))
		b = append(b, g...)
		b = binary.BigEndian.AppendUint64(b, n.from[g])
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(n.last)))
	for _, g := range slices.Sorted(maps.Keys(n.last)) {
		b = binary.BigEndian.AppendUint64(b, uint64(len(g)))
		b = append(b, g...)
		b = binary.BigEndian.AppendUint64(b, n.last[g])
	}
	return b
}
