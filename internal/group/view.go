package group

import (
	"encoding/binary"
	"maps"
	"slices"
)

// View is a member's own assignment as its NOTICEs built it. Notices may
// arrive late, twice or out of order (a resend overtakes the original),
// so a member applies a notice to a partition only if its epoch is newer
// than any it has heard of for that partition: a REVOKE that overtook
// the ASSIGN it revokes still wins, and the late ASSIGN changes nothing
// (without this, the member would fetch a partition the group already
// gave to another — the model checker found it).
type View struct {
	held map[Partition]uint64 // partitions held, at their epochs
	seen map[Partition]uint64 // the newest epoch heard of per partition
}

// NewView returns an empty view.
func NewView() *View { return &View{held: map[Partition]uint64{}, seen: map[Partition]uint64{}} }

// Clone returns a copy.
func (v *View) Clone() *View { return &View{held: maps.Clone(v.held), seen: maps.Clone(v.seen)} }

// Notice applies a notice and returns the partitions it starts fetching
// (ASSIGN) or must release — ack what was processed, stop fetching — before
// answering CONTROL_ACK (REVOKE). A member answers every notice of its
// incarnation with CONTROL_ACK, applied or not.
func (v *View) Notice(n *Notice) (assigned, revoked []Held) {
	for _, h := range n.Partitions {
		p := h.Partition
		switch n.Kind {
		case NoticeAssign:
			if h.Epoch > v.seen[p] {
				v.seen[p], v.held[p] = h.Epoch, h.Epoch
				assigned = append(assigned, h)
			}
		case NoticeRevoke:
			if h.Epoch >= v.seen[p] {
				v.seen[p] = h.Epoch
				if e, ok := v.held[p]; ok && e == h.Epoch {
					delete(v.held, p)
					revoked = append(revoked, h)
				}
			}
		}
	}
	return assigned, revoked
}

// Drop forgets a partition a partition leader refused (STALE_ASSIGNMENT):
// the member was fenced or the partition moved on.
func (v *View) Drop(p Partition) { delete(v.held, p) }

// Epoch returns the epoch p is held at (0: not held).
func (v *View) Epoch(p Partition) uint64 { return v.held[p] }

// Held lists the partitions held, sorted.
func (v *View) Held() []Held {
	out := make([]Held, 0, len(v.held))
	for _, p := range slices.SortedFunc(maps.Keys(v.held), Partition.Compare) {
		out = append(out, Held{Partition: p, Epoch: v.held[p]})
	}
	return out
}

// AppendKey appends the view's state for hashing (the model checker).
func (v *View) AppendKey(b []byte) []byte {
	for _, m := range []map[Partition]uint64{v.held, v.seen} {
		for _, p := range slices.SortedFunc(maps.Keys(m), Partition.Compare) {
			b = binary.AppendUvarint(append(append(b, p.Topic...), 0), uint64(p.Index))
			b = binary.AppendUvarint(b, m[p])
		}
		b = append(b, '|')
	}
	return b
}
