package group

import (
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Mode is how a group shares its partitions.
type Mode uint8

const (
	// Exclusive: one owner per partition at a time (per-key order kept).
	Exclusive Mode = iota
	// Shared: every member competes for every partition (work queues).
	Shared
)

func (m Mode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// Member is a joined member of a group.
type Member struct {
	Topics             []string `json:"topics"`
	SessionTimeoutMs   int64    `json:"session_timeout_ms"`
	RebalanceTimeoutMs int64    `json:"rebalance_timeout_ms"`
	// JoinID tells a retried JOIN (same id: answered, not applied again)
	// from a restarted member (new id: a new incarnation).
	JoinID uint64 `json:"join_id"`
	// Incarnation is the metadata seq that applied the JOIN: a fence
	// names it, so a fence meant for an earlier incarnation of the same
	// member id changes nothing.
	Incarnation uint64 `json:"incarnation"`
}

// Owner is who holds a partition, since which assignment epoch, and the
// REVOKE notice taking it away (0: none).
type Owner struct {
	Member   string `json:"member"`
	Epoch    uint64 `json:"epoch"`
	Revoking uint64 `json:"revoking,omitempty"`
}

// NoticeKind is what a NOTICE tells its member.
type NoticeKind uint8

const (
	// NoticeAssign: start fetching these partitions at these epochs.
	NoticeAssign NoticeKind = 1
	// NoticeRevoke: stop fetching these partitions, ack what was
	// processed, then answer CONTROL_ACK.
	NoticeRevoke NoticeKind = 2
)

func (k NoticeKind) String() string {
	if k == NoticeRevoke {
		return "REVOKE"
	}
	return "ASSIGN"
}

// Held is one partition of a notice with the epoch it is held at.
type Held struct {
	Partition Partition `json:"partition"`
	Epoch     uint64    `json:"epoch"`
}

// Notice is a pending NOTICE: sent (and resent) to its member until the
// member's CONTROL_ACK is applied, or the member leaves or is fenced.
type Notice struct {
	ID          uint64     `json:"id"`
	Kind        NoticeKind `json:"kind"`
	Member      string     `json:"member"`
	Incarnation uint64     `json:"incarnation"`
	Partitions  []Held     `json:"partitions"`
}

// State is one group as applied from the metadata log. Every node applies
// the same commands in the same order and reaches the same State.
type State struct {
	Name string `json:"name"`
	Mode Mode   `json:"mode"`
	// MembershipEpoch counts membership changes (joins, leaves, fences).
	MembershipEpoch uint64 `json:"membership_epoch"`
	// AssignmentEpoch counts assignment steps that gave partitions new
	// owners; each such partition is held at the epoch of its step.
	AssignmentEpoch uint64             `json:"assignment_epoch"`
	LastNotice      uint64             `json:"last_notice"`
	Members         map[string]*Member `json:"members"`
	// Owners: partitions with an owner. A partition of a subscribed topic
	// without one has no member subscribed to it (CB3).
	Owners map[Partition]*Owner `json:"owners"`
	// Target is Assign's last answer: where each partition is going.
	Target  map[Partition]string `json:"target"`
	Notices map[uint64]*Notice   `json:"notices"`
}

// Mutations are deliberate bugs for the model checker: each must produce
// a counterexample (DESIGN §3).
type Mutations struct {
	// AssignBeforeRevoke: a moving partition goes to its new owner at
	// once, without waiting for its old owner's CONTROL_ACK.
	AssignBeforeRevoke bool
	// NoEpochFencing: CheckPull and CheckAck accept any member.
	NoEpochFencing bool
	// NonSticky: the assignment ignores the previous one.
	NonSticky bool
	// ReassignUnmoved: each assignment step gives every partition whose
	// owner is its target to that owner again, at the new epoch, with a
	// notice (CheckQuiet: unaffected members hear nothing).
	ReassignUnmoved bool
	// StaleAckAccepted: CheckAck accepts acks at any epoch.
	StaleAckAccepted bool
	// DeleteIgnoresIncarnation: the metadata applies a group delete to
	// the group's current incarnation, whichever it was decided against
	// (meta: GroupDeleteNamesItsIncarnation).
	DeleteIgnoresIncarnation bool
	// DeleteRetryIgnoresIncarnation: the coordinator decides a group
	// delete naming an incarnation already deleted against the current
	// one (meta: GroupDeleteRetryDeletesOnce).
	DeleteRetryIgnoresIncarnation bool
	// AckIgnoresIncarnation: Apply takes a CONTROL_ACK naming one member
	// incarnation as an ack of the notice of that id and member whatever
	// its incarnation — an ack decided for a deleted group incarnation's
	// notice acks the next incarnation's notice of the same id.
	AckIgnoresIncarnation bool
}

// NewState returns an empty group.
func NewState(name string, mode Mode) *State {
	return &State{Name: name, Mode: mode, Members: map[string]*Member{}, Owners: map[Partition]*Owner{},
		Target: map[Partition]string{}, Notices: map[uint64]*Notice{}}
}

// Clone returns a deep copy.
func (g *State) Clone() *State {
	c := *g
	c.Members = make(map[string]*Member, len(g.Members))
	for id, m := range g.Members {
		mm := *m
		mm.Topics = slices.Clone(m.Topics)
		c.Members[id] = &mm
	}
	c.Owners = make(map[Partition]*Owner, len(g.Owners))
	for p, o := range g.Owners {
		oo := *o
		c.Owners[p] = &oo
	}
	c.Target = maps.Clone(g.Target)
	c.Notices = make(map[uint64]*Notice, len(g.Notices))
	for id, n := range g.Notices {
		nn := *n
		nn.Partitions = slices.Clone(n.Partitions)
		c.Notices[id] = &nn
	}
	return &c
}

// Op is a group command of the metadata log.
type Op string

const (
	OpJoin  Op = "join"
	OpLeave Op = "leave"
	// OpFence removes a member the coordinator stopped hearing from
	// (session timeout) or that did not answer a REVOKE in time.
	OpFence Op = "fence"
	// OpControlAck records a member's CONTROL_ACK of a notice.
	OpControlAck Op = "control_ack"
)

// Command is one group change, proposed to the metadata log.
type Command struct {
	Op     Op     `json:"op"`
	Group  string `json:"group"`
	Member string `json:"member"`
	// Join.
	Topics             []string `json:"topics,omitempty"`
	Mode               Mode     `json:"mode,omitempty"`
	SessionTimeoutMs   int64    `json:"session_timeout_ms,omitempty"`
	RebalanceTimeoutMs int64    `json:"rebalance_timeout_ms,omitempty"`
	JoinID             uint64   `json:"join_id,omitempty"`
	// Leave and fence: the incarnation meant (0: any, for LEAVE).
	// ControlAck: the incarnation acking (0: any; a notice id is reused
	// by a group's next incarnation).
	Incarnation uint64 `json:"incarnation,omitempty"`
	// ControlAck: the notice acknowledged.
	Notice uint64 `json:"notice,omitempty"`
}

// Topics reports how many partitions a declared topic has (0: none yet).
type Topics func(topic string) int

// Outcome is what applying a command did.
type Outcome uint8

const (
	Applied   Outcome = iota
	Duplicate         // a repeat of a command already applied: nothing changed
	Ignored           // meant for a member, incarnation or notice that is gone
)

// Apply applies a committed command at metadata seq. It changes the
// state only through the command's meaning; a repeated JOIN or
// CONTROL_ACK is answered as a Duplicate and changes nothing.
func (g *State) Apply(seq uint64, c Command, topics Topics, mut Mutations) (Outcome, error) {
	switch c.Op {
	case OpJoin:
		if m, ok := g.Members[c.Member]; ok {
			if m.JoinID == c.JoinID {
				return Duplicate, nil
			}
			g.remove(c.Member) // a restarted member: its old incarnation is gone
		}
		g.Members[c.Member] = &Member{Topics: sortedSet(c.Topics), SessionTimeoutMs: c.SessionTimeoutMs,
			RebalanceTimeoutMs: c.RebalanceTimeoutMs, JoinID: c.JoinID, Incarnation: seq}
		g.MembershipEpoch++
	case OpLeave, OpFence:
		m, ok := g.Members[c.Member]
		if !ok || (c.Incarnation != 0 && c.Incarnation != m.Incarnation) {
			return Ignored, nil
		}
		g.remove(c.Member)
		g.MembershipEpoch++
	case OpControlAck:
		n, ok := g.Notices[c.Notice]
		if !ok || n.Member != c.Member {
			return Duplicate, nil
		}
		if c.Incarnation != 0 && c.Incarnation != n.Incarnation && !mut.AckIgnoresIncarnation {
			// An ack of an earlier incarnation's notice of the same id: the
			// group was deleted and joined again, numbering its notices
			// from 1 again, between the ack's decision and its apply.
			return Ignored, nil
		}
		delete(g.Notices, n.ID)
		if n.Kind == NoticeRevoke {
			for _, h := range n.Partitions {
				delete(g.Owners, h.Partition) // Check: it was n's member's, revoking by n
			}
		}
	default:
		return Ignored, fmt.Errorf("group %s: unknown op %q", g.Name, c.Op)
	}
	g.Rebalance(topics, mut)
	return Applied, nil
}

// remove forgets a member, its notices and its partitions (a leaving
// member stopped fetching them; a fenced one is refused by epoch).
func (g *State) remove(id string) {
	delete(g.Members, id)
	for nid, n := range g.Notices {
		if n.Member == id {
			delete(g.Notices, nid)
		}
	}
	for p, o := range g.Owners {
		if o.Member == id {
			delete(g.Owners, p)
		}
	}
}

// Rebalance recomputes the target and takes one incremental step toward
// it: a partition whose owner is not its target is REVOKEd (one notice
// per owner); a partition without an owner goes to its target at once,
// all of them at a new assignment epoch (one ASSIGN notice per member).
// Members whose partitions do not move hear nothing. Callers apply it
// after every command and when a subscribed topic is declared.
func (g *State) Rebalance(topics Topics, mut Mutations) {
	// A member subscribes to the same topics for its whole incarnation,
	// and a deleted topic's partitions leave the state first (DropTopic):
	// every owned partition stays in parts.
	parts := g.partitions(topics)
	prev := g.Target
	if mut.NonSticky {
		prev = nil
	}
	g.Target = Assign(g.subscribers(), parts, prev)
	if g.Mode == Shared {
		return // every member may fetch every partition: no owners
	}
	revoke := map[string][]Held{}
	assign := map[string][]Held{}
	for _, p := range parts {
		o, target := g.Owners[p], g.Target[p]
		switch {
		case o != nil && o.Member != target && o.Revoking == 0:
			revoke[o.Member] = append(revoke[o.Member], Held{Partition: p, Epoch: o.Epoch})
			if mut.AssignBeforeRevoke && target != "" {
				assign[target] = append(assign[target], Held{Partition: p})
			}
		case o == nil && target != "":
			assign[target] = append(assign[target], Held{Partition: p})
		case mut.ReassignUnmoved && o != nil && o.Member == target && o.Revoking == 0:
			assign[target] = append(assign[target], Held{Partition: p})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(revoke)) {
		n := g.notice(NoticeRevoke, id, revoke[id])
		for _, h := range n.Partitions {
			g.Owners[h.Partition].Revoking = n.ID
		}
	}
	if len(assign) > 0 {
		g.AssignmentEpoch++
	}
	for _, id := range slices.Sorted(maps.Keys(assign)) {
		hs := assign[id]
		for i := range hs {
			hs[i].Epoch = g.AssignmentEpoch
			g.Owners[hs[i].Partition] = &Owner{Member: id, Epoch: g.AssignmentEpoch}
		}
		g.notice(NoticeAssign, id, hs)
	}
}

// DropTopic forgets every partition of a deleted topic: its owners and
// targets, and its place in pending notices (a notice left with none is
// dropped). No member owns a partition of a deleted topic
// (GroupsOwnNoDeletedPartition); its members stay subscribed to the name
// and are given the partitions of the topic declared again. The caller
// rebalances afterwards.
func (g *State) DropTopic(topic string) {
	for p := range g.Owners {
		if p.Topic == topic {
			delete(g.Owners, p)
		}
	}
	for p := range g.Target {
		if p.Topic == topic {
			delete(g.Target, p)
		}
	}
	for id, n := range g.Notices {
		n.Partitions = slices.DeleteFunc(n.Partitions, func(h Held) bool { return h.Partition.Topic == topic })
		if len(n.Partitions) == 0 {
			delete(g.Notices, id)
		}
	}
}

func (g *State) notice(kind NoticeKind, member string, hs []Held) *Notice {
	g.LastNotice++
	n := &Notice{ID: g.LastNotice, Kind: kind, Member: member, Incarnation: g.Members[member].Incarnation, Partitions: hs}
	g.Notices[n.ID] = n
	return n
}

// partitions lists the partitions of every subscribed, declared topic.
func (g *State) partitions(topics Topics) []Partition {
	var ts []string
	for _, m := range g.Members {
		ts = append(ts, m.Topics...)
	}
	var out []Partition
	for _, t := range sortedSet(ts) {
		for i := range topics(t) {
			out = append(out, Partition{Topic: t, Index: uint32(i)})
		}
	}
	return out
}

func (g *State) subscribers() []Subscriber {
	out := make([]Subscriber, 0, len(g.Members))
	for id, m := range g.Members {
		out = append(out, Subscriber{ID: id, Topics: m.Topics})
	}
	return out
}

func sortedSet(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// Pull is a partition leader's answer to a member's PULL.
type Pull uint8

const (
	// PullRefused: not the partition's current owner at this epoch.
	PullRefused Pull = iota
	// PullWait: the member holds the partition but its REVOKE is in
	// flight: no new deliveries, acks still count.
	PullWait
	// PullOK: deliver.
	PullOK
)

// CheckPull decides a PULL of partition p by member at epoch. fence is
// the highest assignment epoch the partition's own log has recorded a
// delivery under (a later leader may have applied less of the metadata
// log than an earlier one did: the fence keeps it from serving an owner
// the group has replaced). A PULL at an epoch above fence must record the
// epoch in the partition's log before the first delivery.
func (g *State) CheckPull(p Partition, member string, epoch, fence uint64, mut Mutations) (Pull, error) {
	if mut.NoEpochFencing {
		return PullOK, nil
	}
	if g.Mode == Shared {
		if _, ok := g.Members[member]; !ok {
			return PullRefused, wire.Errorf(wire.CodeStaleAssignment, "group %s has no member %q (left or fenced): join again", g.Name, member)
		}
		return PullOK, nil
	}
	if err := g.holds(p, member, epoch, fence); err != nil {
		return PullRefused, err
	}
	if g.Owners[p].Revoking != 0 {
		return PullWait, nil
	}
	return PullOK, nil
}

// CheckAck decides an ACK or NACK of partition p by member at epoch: only
// the partition's owner at its current epoch, revoking or not, may ack;
// a fenced or replaced member's acks are refused.
func (g *State) CheckAck(p Partition, member string, epoch, fence uint64, mut Mutations) error {
	if mut.NoEpochFencing || mut.StaleAckAccepted {
		return nil
	}
	if g.Mode == Shared {
		if _, ok := g.Members[member]; !ok {
			return wire.Errorf(wire.CodeStaleAssignment, "group %s has no member %q (left or fenced)", g.Name, member)
		}
		return nil
	}
	return g.holds(p, member, epoch, fence)
}

func (g *State) holds(p Partition, member string, epoch, fence uint64) error {
	o := g.Owners[p]
	switch {
	case epoch > g.AssignmentEpoch || fence > g.AssignmentEpoch:
		// The member, or the partition's log, knows of an epoch this node
		// has not applied yet: it waits. (So a node behind the fence never
		// judges by an assignment the group has replaced: in every view
		// where a replaced owner still holds the partition, the epoch is
		// below the one it was replaced at.)
		return wire.Errorf(wire.CodeUnavailable, "group %s: assignment epoch %d not applied here yet (at %d); retry", g.Name, max(epoch, fence), g.AssignmentEpoch)
	case o == nil || o.Member != member:
		return wire.Errorf(wire.CodeStaleAssignment, "group %s: member %q does not hold %v", g.Name, member, p)
	case o.Epoch != epoch:
		return wire.Errorf(wire.CodeStaleAssignment, "group %s: member %q holds %v at epoch %d, not %d", g.Name, member, p, o.Epoch, epoch)
	}
	return nil
}

// Assigned lists member's partitions, sorted, with their epochs.
func (g *State) Assigned(member string) []Held {
	var out []Held
	for p, o := range g.Owners {
		if o.Member == member {
			out = append(out, Held{Partition: p, Epoch: o.Epoch})
		}
	}
	slices.SortFunc(out, func(a, b Held) int { return a.Partition.Compare(b.Partition) })
	return out
}

// PendingNotices lists the pending notices by id.
func (g *State) PendingNotices() []*Notice {
	out := make([]*Notice, 0, len(g.Notices))
	for _, id := range slices.Sorted(maps.Keys(g.Notices)) {
		out = append(out, g.Notices[id])
	}
	return out
}
