package sim

import (
	"crypto/sha256"
	"encoding/json"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/meta"
)

// MetadataAgrees: every node applies the committed metadata log to the
// same state. Two nodes that applied it through the same seq hold the same
// topics, placements, incarnations and groups, whatever their restarts
// in between (a node reloads its saved state and applies the rest); and
// every group of an applied state keeps its own invariants, reported
// under their names
// (group.State.Check: each owned partition one that a live member
// subscribes to and owns at an epoch of the group, a REVOKE pending only
// of what its member holds). CommittedPrefixAgreement says the entries
// agree; this says what each node made of them does — a map's order
// leaking into an apply, or a saved state reloaded short of a field,
// would break it.
const MetadataAgrees = "MetadataAgrees"

// metaChecker follows every node's applied metadata for MetadataAgrees.
type metaChecker struct {
	s *sim
	// states is the digest of the first state seen applied through each
	// seq; every later one through that seq must match it.
	states map[uint64][sha256.Size]byte
	// last is the seq each node's state was last checked at, and the
	// incarnation of the node it was (a restart checks again).
	last map[*broker][2]uint64
	// checked counts the states compared against one seen before.
	checked int
}

func newMetaChecker(s *sim) *metaChecker {
	return &metaChecker{s: s, states: map[uint64][sha256.Size]byte{}, last: map[*broker][2]uint64{}}
}

// observe, after every event: each node up whose applied metadata moved
// since it was last seen.
func (m *metaChecker) observe() {
	for _, b := range m.s.nodes {
		if !b.up || b.node == nil || m.s.chk.violation != nil {
			continue
		}
		b.node.ReadMetadata(func(st *meta.State) {
			if st == nil || st.Applied == 0 {
				return
			}
			at := [2]uint64{st.Applied, uint64(b.started)}
			if m.last[b] == at {
				return
			}
			m.last[b] = at
			m.check(b, st)
		})
	}
}

// check judges node b's applied state st.
func (m *metaChecker) check(b *broker, st *meta.State) {
	partitions := func(topic string) int { return int(st.Topics[topic].Config.Partitions) }
	for _, name := range slices.Sorted(maps.Keys(st.Groups)) {
		if v := st.Groups[name].Check(partitions); v != nil {
			// Named by the group's own invariant (ExclusiveDelivery,
			// EventuallyOwned).
			m.s.chk.violate(v.Invariant, "%s, metadata applied through %d: %s", b.id, st.Applied, v.Detail)
			return
		}
	}
	b2, err := json.Marshal(st)
	if err != nil {
		m.s.chk.violate(MetadataAgrees, "%s, metadata applied through %d: %v", b.id, st.Applied, err)
		return
	}
	sum := sha256.Sum256(b2)
	first, seen := m.states[st.Applied]
	if !seen {
		m.states[st.Applied] = sum
		return
	}
	m.checked++
	if first != sum {
		m.s.chk.violate(MetadataAgrees, "%s applied the metadata through %d to a state unlike another node's through the same seq: %s", b.id, st.Applied, b2)
	}
}

// groupApplied checks MinimalRebalance (CB2) as node b applies each
// consumer-group entry of the metadata log, from the group before it to
// the group after: with identical subscriptions, exactly MinimalMoves
// partitions leave members still present (group.State.CheckRebalance, as
// the model checker does after every command). The states the checker
// samples after each event would not do: two entries applied in one
// event merge two rebalances, whose sum need not be minimal.
func (s *sim) groupApplied(b *broker, seq uint64, before, after *group.State, parts group.Topics) {
	if s.chk.violation != nil || after == nil {
		return
	}
	if before == nil {
		before = group.NewState(after.Name, after.Mode)
	}
	v := after.CheckRebalance(before, parts)
	if v == nil {
		v = after.CheckQuiet(before)
	}
	if v != nil {
		s.chk.violate(v.Invariant, "%s, metadata entry %d: %s", b.id, seq, v.Detail)
		return
	}
	s.memberEvents["rebalances checked"]++
}
