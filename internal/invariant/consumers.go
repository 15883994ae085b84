package invariant

import (
	"encoding/binary"
	"maps"
	"slices"
)

// The consumer-group invariants (DESIGN §4, CB1–CB4).
const (
	// ExclusiveDelivery (CB1): in exclusive mode no partition is owned by
	// two members in one assignment epoch, and no two members are
	// delivered the same partition at once — a partition is delivered to
	// a new owner only once its previous owner released it (acked what
	// it processed and answered its REVOKE) or was fenced, and never
	// again to an owner older than one already served.
	ExclusiveDelivery = "ExclusiveDelivery"
	// MinimalRebalance (CB2): a rebalance moves only the partitions that
	// must move to balance the group.
	MinimalRebalance = "MinimalRebalance"
	// EventuallyOwned (CB3): while members are live every partition they
	// subscribe to has an owner or is on its way to one (a pending
	// notice the coordinator resends or times out).
	EventuallyOwned = "EventuallyOwned"
	// AckFromCurrentOwner (CB4's fence): once a partition was delivered
	// under an assignment epoch, acks at an older epoch are refused, so
	// a fenced member cannot move the ack floor under its successor.
	AckFromCurrentOwner = "AckFromCurrentOwner"
)

// Violated returns a Violation of the named invariant (for callers that
// check a structural condition themselves).
func Violated(inv, format string, args ...any) *Violation { return violation(inv, format, args...) }

// Consumers is the ghost state of a group's deliveries: per partition,
// the highest assignment epoch a delivery was made under.
type Consumers struct {
	served map[string]uint64
}

// NewConsumers returns an empty ghost.
func NewConsumers() *Consumers { return &Consumers{served: map[string]uint64{}} }

// Delivered checks a delivery of partition to member at epoch; holders are
// the other members that still hold unacked deliveries of the partition
// and were neither fenced nor left (a fenced member's deliveries are the
// documented redelivery).
func (c *Consumers) Delivered(partition, member string, epoch uint64, holders []string) *Violation {
	if s := c.served[partition]; epoch < s {
		return violation(ExclusiveDelivery, "%s delivered to %s at epoch %d after a delivery at epoch %d", partition, member, epoch, s)
	}
	for _, h := range holders {
		if h != member {
			return violation(ExclusiveDelivery, "%s delivered to %s at epoch %d while %s still holds unacked deliveries of it", partition, member, epoch, h)
		}
	}
	c.served[partition] = epoch
	return nil
}

// Acked checks an ack recorded for partition from member at epoch.
func (c *Consumers) Acked(partition, member string, epoch uint64) *Violation {
	if s := c.served[partition]; epoch < s {
		return violation(AckFromCurrentOwner, "%s: ack from %s at epoch %d recorded after a delivery at epoch %d", partition, member, epoch, s)
	}
	return nil
}

// Clone returns a copy.
func (c *Consumers) Clone() *Consumers { return &Consumers{served: maps.Clone(c.served)} }

// AppendKey appends the ghost's state for hashing.
func (c *Consumers) AppendKey(b []byte) []byte {
	for _, p := range slices.Sorted(maps.Keys(c.served)) {
		b = append(b, p...)
		b = binary.AppendUvarint(b, c.served[p])
	}
	return b
}
