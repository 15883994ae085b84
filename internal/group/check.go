package group

import (
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/invariant"
)

// Check verifies the state's own invariants: every owner is a live member
// subscribed to the partition's topic, every owned partition one that a
// member subscribes to (ExclusiveDelivery's one owner per
// partition and epoch), every partition of a subscribed topic has an
// owner, an owner that is not the target is being revoked by a pending
// notice of that owner (EventuallyOwned: the coordinator resends it or
// fences the member, and the partition moves on), and every pending
// notice is for a live member, a REVOKE only of what that member holds.
func (g *State) Check(topics Topics) *invariant.Violation {
	if g.Mode == Shared {
		return nil
	}
	owned := 0
	for _, p := range g.partitions(topics) {
		o := g.Owners[p]
		if o == nil {
			if g.Target[p] != "" {
				return invariant.Violated(invariant.EventuallyOwned, "group %s: %v has target %s but no owner and no notice", g.Name, p, g.Target[p])
			}
			continue
		}
		owned++
		m := g.Members[o.Member]
		if m == nil || !slices.Contains(m.Topics, p.Topic) {
			return invariant.Violated(invariant.ExclusiveDelivery, "group %s: %v owned by %q, not a subscribed member", g.Name, p, o.Member)
		}
		if o.Epoch == 0 || o.Epoch > g.AssignmentEpoch {
			return invariant.Violated(invariant.ExclusiveDelivery, "group %s: %v held at epoch %d (assignment epoch %d)", g.Name, p, o.Epoch, g.AssignmentEpoch)
		}
		if o.Member != g.Target[p] {
			n := g.Notices[o.Revoking]
			if n == nil || n.Kind != NoticeRevoke || n.Member != o.Member {
				return invariant.Violated(invariant.EventuallyOwned, "group %s: %v held by %s, target %q, no REVOKE pending", g.Name, p, o.Member, g.Target[p])
			}
		}
	}
	if owned < len(g.Owners) {
		// An owner outside every member's subscription: a member that left
		// or was fenced, or a deleted topic's partition, kept as owned.
		subscribed := map[Partition]bool{}
		for _, p := range g.partitions(topics) {
			subscribed[p] = true
		}
		for _, p := range slices.SortedFunc(maps.Keys(g.Owners), Partition.Compare) {
			if !subscribed[p] {
				return invariant.Violated(invariant.ExclusiveDelivery, "group %s: %v owned by %q, a partition no member subscribes to", g.Name, p, g.Owners[p].Member)
			}
		}
	}
	for _, n := range g.Notices {
		if g.Members[n.Member] == nil || g.Members[n.Member].Incarnation != n.Incarnation {
			return invariant.Violated(invariant.EventuallyOwned, "group %s: notice #%d pending for a member that is gone", g.Name, n.ID)
		}
		for _, h := range n.Partitions {
			if o := g.Owners[h.Partition]; n.Kind == NoticeRevoke && (o == nil || o.Member != n.Member || o.Revoking != n.ID || o.Epoch != h.Epoch) {
				return invariant.Violated(invariant.ExclusiveDelivery, "group %s: REVOKE #%d of %v to %s, but the partition is %+v", g.Name, n.ID, h.Partition, n.Member, o)
			}
		}
	}
	return nil
}

// CheckRebalance verifies MinimalRebalance between the state before a
// command and after it: when every member subscribes to the same topics,
// the number of partitions whose target left a member still present must
// equal MinimalMoves of what those members kept.
func (g *State) CheckRebalance(before *State, topics Topics) *invariant.Violation {
	if len(g.Members) == 0 {
		return nil
	}
	var topicsOf []string
	for _, id := range slices.Sorted(maps.Keys(g.Members)) {
		t := g.Members[id].Topics
		if topicsOf != nil && !slices.Equal(t, topicsOf) {
			return nil // mixed subscriptions: Assign's balance property is tested on its own
		}
		topicsOf = t
	}
	parts := g.partitions(topics)
	kept := map[string]int{}
	moved := 0
	for _, p := range parts {
		was := before.Target[p]
		if m, ok := g.Members[was]; ok && before.Members[was] != nil && m.Incarnation == before.Members[was].Incarnation {
			kept[was]++
			if g.Target[p] != was {
				moved++
			}
		}
	}
	var ks []int
	for id := range g.Members {
		ks = append(ks, kept[id])
	}
	if want := MinimalMoves(ks, len(parts)); moved != want {
		return invariant.Violated(invariant.MinimalRebalance, "group %s: %d partitions left members still present, %d had to", g.Name, moved, want)
	}
	return nil
}

// CheckQuiet verifies the other half of MinimalRebalance between the state
// before a command and after it: a member present in both (the same
// incarnation) that was settled before — holding all its targets and
// nothing else, none under a pending REVOKE — and keeps the same targets
// hears nothing: no new notice names it, and it holds the same
// partitions at the same epochs (incremental rebalance: unaffected
// members keep their epochs).
func (g *State) CheckQuiet(before *State) *invariant.Violation {
	if g.Mode == Shared {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(g.Members)) {
		if m, was := g.Members[id], before.Members[id]; was == nil || was.Incarnation != m.Incarnation {
			continue
		}
		held := before.heldBy(id)
		if targets := before.targetsOf(id); !maps.Equal(targets, g.targetsOf(id)) || len(held) != len(targets) || !sameKeys(held, targets) ||
			before.revoking(id) {
			continue // its partitions move, or were still moving
		}
		if now := g.heldBy(id); !maps.Equal(now, held) {
			return invariant.Violated(invariant.MinimalRebalance, "group %s: nothing of %s moves, yet it holds %v, not %v", g.Name, id, now, held)
		}
		for _, nid := range slices.Sorted(maps.Keys(g.Notices)) {
			if n := g.Notices[nid]; n.Member == id && before.Notices[nid] == nil {
				return invariant.Violated(invariant.MinimalRebalance, "group %s: nothing of %s moves, yet it got %s #%d", g.Name, id, n.Kind, nid)
			}
		}
	}
	return nil
}

// revoking reports whether a REVOKE of a partition member id owns is
// pending.
func (g *State) revoking(id string) bool {
	for _, o := range g.Owners {
		if o.Member == id && o.Revoking != 0 {
			return true
		}
	}
	return false
}

// heldBy maps the partitions member id owns to their epochs.
func (g *State) heldBy(id string) map[Partition]uint64 {
	out := map[Partition]uint64{}
	for p, o := range g.Owners {
		if o.Member == id {
			out[p] = o.Epoch
		}
	}
	return out
}

// targetsOf is the set of partitions whose target is member id.
func (g *State) targetsOf(id string) map[Partition]bool {
	out := map[Partition]bool{}
	for p, t := range g.Target {
		if t == id {
			out[p] = true
		}
	}
	return out
}

func sameKeys[V any](a map[Partition]V, b map[Partition]bool) bool {
	for p := range a {
		if !b[p] {
			return false
		}
	}
	return true
}
