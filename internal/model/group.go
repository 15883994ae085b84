package model

// The consumer-group model: the real group kernel (internal/group) —
// the metadata log's group commands, the coordinator's notices, the
// partition leaders' PULL and ACK checks — with members that join,
// leave, crash, are fenced while still running (slow), lose and
// duplicate notices and CONTROL_ACKs, and partition leaders that apply
// the metadata log at their own pace and change hosts. The metadata log
// itself is one linear sequence here (its replication is the replica
// model's business); a command is committed when its action runs.
//
// Group deletes (GroupConfig.Deletes): a group without members is deleted
// through the metadata log (meta.State.DecideGroupDelete, applyGroup):
// its State is dropped and the next JOIN starts the group's next
// incarnation, which numbers its notices and assignment epochs from the
// start again. What is in flight stays in flight: notices, and
// CONTROL_ACKs, which name the acking member's incarnation as the node
// shell fills it in (node.GroupRequest) — an ack decided for a deleted
// incarnation's notice may apply after the rejoin, to a notice of the
// same id. Each group incarnation has its own records in the partitions
// (meta.GroupKeyOf): its own fences and acks, starting empty
// (GroupIncarnationStartsEmpty); a partition leader that applied the
// delete refuses the deleted incarnation's PULLs and ACKs (its runner
// stopped; its delivery ids are no one's), and one that has not applied
// a member's group incarnation yet makes it wait.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/wire"
)

// GroupConfig bounds a group exploration. Budgets limit how often an
// action kind may occur along one path.
type GroupConfig struct {
	Members    int // member ids m1..mN, all subscribed to topic t
	Partitions int // partitions of t
	Messages   int // messages in each partition
	Nodes      int // hosts of partition leaders, each applying the metadata log at its own pace
	Joins      int // JOINs (a member's first, or a restart's)
	Leaves     int // graceful LEAVEs (the member acks what it holds first)
	Crashes    int // a member stops and forgets everything
	// Fences: the coordinator fences a member — its session or rebalance
	// timeout ran out. The member may be alive and merely slow: it keeps
	// pulling and acking with what it holds until refused.
	Fences int
	// Deletes: the group is deleted while it has no members (after
	// LEAVEs, fences, crashes fenced); members JOIN its next incarnation.
	Deletes    int
	Moves      int // a partition's leadership moves to another node
	Resends    int // the coordinator sends a pending notice again
	Drops      int // notices or CONTROL_ACKs lost
	Dups       int // notices or CONTROL_ACKs duplicated
	NetworkMax int
	DepthMax   int
	StatesMax  int
	// Prefix: actions taken first, in order, each of which must be
	// enabled; the exploration starts at the state they reach (within
	// the budgets they leave). A trace found includes them.
	Prefix    []string
	Mutations group.Mutations
	// AnswerCopyEarly breaks the member (not the kernel): a copy of a
	// REVOKE that arrives while the member is still releasing is answered
	// at once, freeing the partitions it still holds.
	AnswerCopyEarly bool
}

// GroupResult is the outcome of a group exploration.
type GroupResult struct {
	Outcome
	// What the exploration reached (distinct states entered that way).
	Deliveries   int // a partition leader delivered a message
	Redeliveries int // a message delivered to a second member
	Refused      int // a stale PULL or ACK was refused
	Revokes      int // a member answered a REVOKE
	ZombieFenced int // a member was fenced while it held deliveries
	Deletes      int // the group was deleted
	Rejoins      int // a member joined a group incarnation after the first
	// StaleAcks: a CONTROL_ACK of an earlier group incarnation's notice
	// met the current incarnation's notice of the same id and member.
	StaleAcks int
}

const (
	gbJoins = iota
	gbLeaves
	gbCrashes
	gbFences
	gbDeletes
	gbMoves
	gbResends
	gbDrops
	gbDups
	gbudgets
)

func (c *GroupConfig) budget(i int) int {
	return [gbudgets]int{c.Joins, c.Leaves, c.Crashes, c.Fences, c.Deletes, c.Moves, c.Resends, c.Drops, c.Dups}[i]
}

type gmember struct {
	up          bool   // joined and running (a fenced member still runs)
	joinID      uint64 // its current incarnation's JOIN
	incarnation uint64 // metadata seq of that JOIN (0: not joined)
	group       uint64 // the group incarnation it joined (0: not joined)
	// view: the partitions it holds, from its notices (the SDK's logic);
	// inflight, per partition, the messages delivered to it and not yet
	// acked (a bitmask).
	view     *group.View
	inflight []uint64
	// releasing: REVOKEs being carried out (their acks not yet sent): a
	// member finishes one as a separate action, then answers it.
	releasing []release
}

// release is a REVOKE a member is carrying out.
type release struct {
	notice uint64
	parts  []group.Held
}

func (cfg *GroupConfig) newMember(incarnation, ginc uint64) gmember {
	return gmember{incarnation: incarnation, group: ginc, view: group.NewView(), inflight: make([]uint64, cfg.Partitions)}
}

func (m gmember) clone() gmember {
	m.view, m.inflight, m.releasing = m.view.Clone(), slices.Clone(m.inflight), slices.Clone(m.releasing)
	return m
}

func (m *gmember) isReleasing(notice uint64) bool {
	return slices.ContainsFunc(m.releasing, func(r release) bool { return r.notice == notice })
}

func (m *gmember) epoch(p int) uint64 { return m.view.Epoch(gpart(p)) }

// gmsg is a NOTICE to a member or a CONTROL_ACK to the coordinator.
type gmsg struct {
	member int
	// ack: CONTROL_ACK of notice.ID from member's incarnation
	// notice.Incarnation (the one that answers, as the node shell names it).
	ack    bool
	notice group.Notice
}

// gsent names a notice sent: by its member's incarnation too, as the
// coordinator's noticeKey does (a group's next incarnation numbers its
// notices from 1 again).
type gsent struct{ id, incarnation uint64 }

// opDelete is the metadata's group delete (meta.OpGroupDelete) in the
// model's log.
const opDelete group.Op = "delete"

type gstate struct {
	log     []group.Command
	applied []*group.State // applied[i]: the group after i commands (immutable, shared)
	views   []int          // per node: commands applied
	leader  []int          // per partition: the node leading it
	// Per group incarnation and partition ([(incarnation-1)*Partitions +
	// p]): the highest epoch the partition's log recorded a delivery
	// under, and the acked messages (a bitmask). Each incarnation has its
	// own records (meta.GroupKeyOf) and starts with none.
	fence    []uint64
	acked    []uint64
	inc      uint64 // the group's current incarnation (1 + deletes applied)
	members  []gmember
	net      []gmsg
	sent     []gsent // notices sent at least once
	used     [gbudgets]int
	ghost    *invariant.Consumers
	lastJoin uint64
	events   gevent
}

type gevent uint8

const (
	geDelivery gevent = 1 << iota
	geRedelivery
	geRefused
	geRevoke
	geZombieFenced
	geDelete
	geRejoin
	geStaleAck
)

func (s *gstate) clone() *gstate {
	c := *s
	c.log, c.applied, c.views, c.leader = slices.Clone(s.log), slices.Clone(s.applied), slices.Clone(s.views), slices.Clone(s.leader)
	c.fence, c.acked, c.net, c.sent = slices.Clone(s.fence), slices.Clone(s.acked), slices.Clone(s.net), slices.Clone(s.sent)
	c.members = make([]gmember, len(s.members))
	for i, m := range s.members {
		c.members[i] = m.clone()
	}
	c.ghost = s.ghost.Clone()
	c.events = 0
	return &c
}

func (s *gstate) latest() *group.State { return s.applied[len(s.applied)-1] }

// incAt is the group incarnation after the first v commands.
func (s *gstate) incAt(v int) uint64 {
	inc := uint64(1)
	for _, c := range s.log[:v] {
		if c.Op == opDelete {
			inc++
		}
	}
	return inc
}

// rec indexes fence and acked: partition p of group incarnation inc.
func (cfg *GroupConfig) rec(inc uint64, p int) int { return int(inc-1)*cfg.Partitions + p }

// ghostPart names partition p of group incarnation inc for the ghost: each
// incarnation is a group of its own (the bare name for the first, as
// meta.GroupKeyOf).
func ghostPart(p int, inc uint64) string {
	if inc == 1 {
		return gpart(p).String()
	}
	return fmt.Sprintf("%v@%d", gpart(p), inc)
}

func memberID(i int) string { return fmt.Sprintf("m%d", i+1) }

func gpart(p int) group.Partition { return group.Partition{Topic: "t", Index: uint32(p)} }

func (cfg *GroupConfig) topics(t string) int {
	if t == "t" {
		return cfg.Partitions
	}
	return 0
}

// commit appends a command to the metadata log and checks the group's
// invariants on the result.
func (cfg *GroupConfig) commit(s *gstate, c group.Command) string {
	c.Group = "g"
	before := s.latest()
	var next *group.State
	if c.Op == opDelete {
		// meta applyGroup: the State is dropped (the action is taken only
		// without members, so the entry applies); the group's next JOIN
		// starts the next incarnation with no records in the partitions.
		if len(before.Members) > 0 {
			return fmt.Sprintf("model: a delete of group g with members %v", slices.Sorted(maps.Keys(before.Members)))
		}
		next = group.NewState("g", group.Exclusive)
		s.inc++
		s.fence = append(s.fence, make([]uint64, cfg.Partitions)...)
		s.acked = append(s.acked, make([]uint64, cfg.Partitions)...)
	} else {
		next = before.Clone()
		if _, err := next.Apply(uint64(len(s.log)+1), c, cfg.topics, cfg.Mutations); err != nil {
			return err.Error()
		}
	}
	s.log = append(s.log, c)
	s.applied = append(s.applied, next)
	if v := next.Check(cfg.topics); v != nil {
		return v.Error()
	}
	if v := next.CheckRebalance(before, cfg.topics); v != nil {
		return v.Error()
	}
	if v := next.CheckQuiet(before); v != nil {
		return v.Error()
	}
	return ""
}

// current reports whether member i's incarnation is still a member in the
// committed metadata (not fenced, not left).
func (s *gstate) current(i int) bool {
	m := s.latest().Members[memberID(i)]
	return m != nil && s.members[i].incarnation != 0 && m.Incarnation == s.members[i].incarnation
}

// leaderView is how partition p's leader takes a request of member i: the
// group as the leader applied it. gone: the leader applied the delete of
// the member's group incarnation — that incarnation's runner stopped and
// its delivery ids are no one's: refused (node.groupDeleted,
// groupDeletedError). early: the leader has not applied the member's
// group incarnation yet — it waits (node membership.notMember:
// UNAVAILABLE for an incarnation above what it applied).
func (s *gstate) leaderView(i, p int) (view *group.State, gone, early bool) {
	v := s.views[s.leader[p]]
	inc := s.incAt(v)
	return s.applied[v], s.members[i].group < inc, s.members[i].group > inc
}

// pull: member i pulls partition p from its leader.
func (cfg *GroupConfig) pull(s *gstate, i, p int) (string, bool) {
	m := &s.members[i]
	view, gone, early := s.leaderView(i, p)
	if early {
		return "", false
	}
	var res group.Pull
	var err error
	if gone {
		err = wire.Errorf(wire.CodeNotFound, "group g incarnation %d was deleted", m.group)
	} else {
		res, err = view.CheckPull(gpart(p), memberID(i), m.epoch(p), s.fence[cfg.rec(m.group, p)], cfg.Mutations)
	}
	if err != nil {
		if e, ok := err.(*wire.Error); ok && e.Code == wire.CodeUnavailable {
			return "", false // the leader has not applied the epoch yet: nothing happens
		}
		m.view.Drop(gpart(p)) // STALE_ASSIGNMENT: the member drops the partition
		m.inflight[p] = 0
		s.events |= geRefused
		return "", true
	}
	if res != group.PullOK {
		return "", false
	}
	r := cfg.rec(m.group, p)
	msg := -1
	for k := range cfg.Messages {
		if s.acked[r]&(1<<k) == 0 && m.inflight[p]&(1<<k) == 0 {
			msg = k
			break
		}
	}
	if msg < 0 {
		return "", false
	}
	var holders []string
	for j := range s.members {
		if s.members[j].group != m.group {
			continue // another incarnation of the group: a group of its own
		}
		if j != i && s.members[j].up && s.current(j) && s.members[j].inflight[p] != 0 {
			holders = append(holders, memberID(j))
		}
		if s.members[j].inflight[p]&(1<<msg) != 0 {
			s.events |= geRedelivery
		}
	}
	if v := s.ghost.Delivered(ghostPart(p, m.group), memberID(i), m.epoch(p), holders); v != nil {
		return v.Error(), true
	}
	s.fence[r] = max(s.fence[r], m.epoch(p))
	m.inflight[p] |= 1 << msg
	s.events |= geDelivery
	return "", true
}

// ack: member i acks its message k of partition p, held at epoch, at p's
// leader.
func (cfg *GroupConfig) ack(s *gstate, i, p, k int, epoch uint64) (string, bool) {
	m := &s.members[i]
	view, gone, early := s.leaderView(i, p)
	if early {
		return "", false
	}
	var err error
	if gone {
		err = wire.Errorf(wire.CodeStaleDelivery, "group g incarnation %d was deleted", m.group)
	} else {
		err = view.CheckAck(gpart(p), memberID(i), epoch, s.fence[cfg.rec(m.group, p)], cfg.Mutations)
	}
	if err != nil {
		if e, ok := err.(*wire.Error); ok && e.Code == wire.CodeUnavailable {
			return "", false
		}
		m.inflight[p] &^= 1 << k // refused: the delivery is lost to this member
		s.events |= geRefused
		return "", true
	}
	if v := s.ghost.Acked(ghostPart(p, m.group), memberID(i), epoch); v != nil {
		return v.Error(), true
	}
	s.acked[cfg.rec(m.group, p)] |= 1 << k
	m.inflight[p] &^= 1 << k
	return "", true
}

// release acks everything member i holds of partition p at epoch (as a
// member does on a REVOKE or before a LEAVE); the partition is no longer
// in its view.
func (cfg *GroupConfig) release(s *gstate, i, p int, epoch uint64) string {
	m := &s.members[i]
	for k := range cfg.Messages {
		if m.inflight[p]&(1<<k) == 0 {
			continue
		}
		if err, _ := cfg.ack(s, i, p, k, epoch); err != "" {
			return err
		}
	}
	m.inflight[p] = 0
	return ""
}

// receive delivers a network message.
func (cfg *GroupConfig) receive(s *gstate, msg gmsg) string {
	if msg.ack {
		c := group.Command{Op: group.OpControlAck, Member: memberID(msg.member), Incarnation: msg.notice.Incarnation, Notice: msg.notice.ID}
		if n := s.latest().Notices[c.Notice]; n != nil && n.Member == c.Member && n.Incarnation != c.Incarnation {
			s.events |= geStaleAck
		}
		return cfg.commit(s, c)
	}
	m := &s.members[msg.member]
	if !m.up || m.incarnation != msg.notice.Incarnation {
		return "" // for an incarnation that is gone
	}
	if m.isReleasing(msg.notice.ID) && !cfg.AnswerCopyEarly {
		return "" // a copy of a REVOKE under way: its release answers it
	}
	assigned, revoked := m.view.Notice(&msg.notice)
	for _, h := range assigned {
		m.inflight[h.Partition.Index] = 0
	}
	if len(revoked) > 0 {
		// Carried out by a later action: the member still holds what it
		// was delivered of those partitions until then.
		s.events |= geRevoke
		m.releasing = append(m.releasing, release{notice: msg.notice.ID, parts: revoked})
		return ""
	}
	s.controlAck(msg.member, msg.notice.ID)
	return ""
}

// controlAck: member i answers notice id, naming its incarnation (the
// node shell fills it in, GroupRequest). The message in flight is the
// CONTROL_ACK on its way to the metadata log, across fences, a delete and
// a rejoin. The coordinator's check that the incarnation is still in the
// group before it proposes (GroupRequest: memberAt) is not modelled: an
// answer the coordinator would refuse reaches the log too (a superset of
// the product's behaviours; what it proposes may still apply after the
// incarnation is gone, which is the case that matters).
func (s *gstate) controlAck(i int, id uint64) {
	s.net = append(s.net, gmsg{member: i, ack: true, notice: group.Notice{ID: id, Incarnation: s.members[i].incarnation}})
}

// finishRelease acks what member i holds of the partitions of its k-th
// REVOKE under way, then answers it.
func (cfg *GroupConfig) finishRelease(s *gstate, i, k int) string {
	m := &s.members[i]
	r := m.releasing[k]
	m.releasing = slices.Delete(m.releasing, k, k+1)
	for _, h := range r.parts {
		if err := cfg.release(s, i, int(h.Partition.Index), h.Epoch); err != "" {
			return err
		}
	}
	s.controlAck(i, r.notice)
	return ""
}

type gstep = step[*gstate]

func (cfg *GroupConfig) successors(s *gstate) []gstep {
	var out []gstep
	try := func(name string, budget int, f func(t *gstate) (string, bool)) {
		if budget >= 0 && s.used[budget] >= cfg.budget(budget) {
			return
		}
		t := s.clone()
		if budget >= 0 {
			t.used[budget]++
		}
		err, ok := f(t)
		if ok || err != "" {
			out = append(out, gstep{action: name, next: t, err: err})
		}
	}
	for i := range s.members {
		m := s.members[i]
		try(fmt.Sprintf("%s joins", memberID(i)), gbJoins, func(t *gstate) (string, bool) {
			if m.up && t.current(i) {
				return "", false
			}
			t.lastJoin++
			mm := &t.members[i]
			*mm = cfg.newMember(uint64(len(t.log)+1), t.inc)
			mm.up, mm.joinID = true, t.lastJoin
			if t.inc > 1 {
				t.events |= geRejoin
			}
			return cfg.commit(t, group.Command{Op: group.OpJoin, Member: memberID(i), Topics: []string{"t"}, JoinID: t.lastJoin}), true
		})
		if !m.up {
			continue
		}
		try(fmt.Sprintf("%s leaves", memberID(i)), gbLeaves, func(t *gstate) (string, bool) {
			if !t.current(i) {
				return "", false
			}
			held := t.members[i].view.Held()
			for _, r := range t.members[i].releasing {
				held = append(held, r.parts...)
			}
			for _, h := range held {
				if err := cfg.release(t, i, int(h.Partition.Index), h.Epoch); err != "" {
					return err, true
				}
			}
			t.members[i].releasing = nil
			t.members[i].up = false
			return cfg.commit(t, group.Command{Op: group.OpLeave, Member: memberID(i), Incarnation: t.members[i].incarnation}), true
		})
		for k, r := range m.releasing {
			try(fmt.Sprintf("%s finishes releasing #%d", memberID(i), r.notice), -1, func(t *gstate) (string, bool) {
				return cfg.finishRelease(t, i, k), true
			})
		}
		try(fmt.Sprintf("%s crashes", memberID(i)), gbCrashes, func(t *gstate) (string, bool) {
			t.members[i] = cfg.newMember(t.members[i].incarnation, t.members[i].group)
			return "", true
		})
		for p := range cfg.Partitions {
			e := m.epoch(p)
			if e != 0 {
				try(fmt.Sprintf("%s pulls p%d at epoch %d", memberID(i), p, e), -1, func(t *gstate) (string, bool) { return cfg.pull(t, i, p) })
			}
			for k := range cfg.Messages {
				// (What a member is releasing is acked by the release.)
				if e != 0 && m.inflight[p]&(1<<k) != 0 {
					try(fmt.Sprintf("%s acks p%d message %d at epoch %d", memberID(i), p, k, e), -1, func(t *gstate) (string, bool) { return cfg.ack(t, i, p, k, e) })
				}
			}
		}
	}
	latest := s.latest()
	for _, id := range slices.Sorted(maps.Keys(latest.Members)) {
		mem := latest.Members[id]
		try(fmt.Sprintf("coordinator fences %s", id), gbFences, func(t *gstate) (string, bool) {
			var i int
			fmt.Sscanf(id, "m%d", &i)
			if t.members[i-1].up && t.members[i-1].incarnation == mem.Incarnation && slices.ContainsFunc(t.members[i-1].inflight, func(b uint64) bool { return b != 0 }) {
				t.events |= geZombieFenced
			}
			return cfg.commit(t, group.Command{Op: group.OpFence, Member: id, Incarnation: mem.Incarnation}), true
		})
	}
	if len(latest.Members) == 0 && latest.MembershipEpoch > 0 {
		// A group the metadata knows (joined since its last delete), with
		// no members: DecideGroupDelete proposes its delete. (A forced
		// delete of a name no member joined is not explored: it only
		// moves the incarnation of a group nobody is in.)
		try("the group is deleted", gbDeletes, func(t *gstate) (string, bool) {
			t.events |= geDelete
			return cfg.commit(t, group.Command{Op: opDelete}), true
		})
	}
	for _, n := range latest.PendingNotices() {
		sk := gsent{n.ID, n.Incarnation}
		budget := gbResends
		if !slices.Contains(s.sent, sk) {
			budget = -1
		}
		var i int
		fmt.Sscanf(n.Member, "m%d", &i)
		try(fmt.Sprintf("coordinator sends %v #%d to %s", n.Kind, n.ID, n.Member), budget, func(t *gstate) (string, bool) {
			if !slices.Contains(t.sent, sk) {
				t.sent = append(t.sent, sk)
			}
			t.net = append(t.net, gmsg{member: i - 1, notice: *n})
			return "", true
		})
	}
	for k, msg := range s.net {
		name := fmt.Sprintf("%v #%d to m%d", msg.notice.Kind, msg.notice.ID, msg.member+1)
		if msg.ack {
			name = fmt.Sprintf("CONTROL_ACK #%d from m%d (incarnation %d)", msg.notice.ID, msg.member+1, msg.notice.Incarnation)
		}
		try("deliver "+name, -1, func(t *gstate) (string, bool) {
			t.net = slices.Delete(t.net, k, k+1)
			return cfg.receive(t, msg), true
		})
		try("drop "+name, gbDrops, func(t *gstate) (string, bool) {
			t.net = slices.Delete(t.net, k, k+1)
			return "", true
		})
		try("duplicate "+name, gbDups, func(t *gstate) (string, bool) {
			t.net = append(t.net, msg)
			return "", true
		})
	}
	for n := range cfg.Nodes {
		if s.views[n] < len(s.log) {
			try(fmt.Sprintf("node %d applies metadata %d", n+1, s.views[n]+1), -1, func(t *gstate) (string, bool) {
				t.views[n]++
				return "", true
			})
		}
	}
	for p := range cfg.Partitions {
		for n := range cfg.Nodes {
			if n != s.leader[p] {
				try(fmt.Sprintf("p%d's leadership moves to node %d", p, n+1), gbMoves, func(t *gstate) (string, bool) {
					t.leader[p] = n
					return "", true
				})
			}
		}
	}
	return out
}

func (s *gstate) key() [16]byte {
	var b []byte
	for _, c := range s.log {
		b = append(append(append(b, c.Op...), c.Member...), 0)
		for _, x := range []uint64{c.JoinID, c.Incarnation, c.Notice} {
			b = binary.AppendUvarint(b, x)
		}
	}
	for _, xs := range [][]uint64{intsU(s.views), intsU(s.leader), s.fence, s.acked} {
		for _, x := range xs {
			b = binary.AppendUvarint(b, x)
		}
		b = append(b, 0)
	}
	for _, m := range s.members {
		b = append(b, boolByte(m.up))
		for _, x := range append([]uint64{m.joinID, m.incarnation, m.group}, m.inflight...) {
			b = binary.AppendUvarint(b, x)
		}
		for _, r := range m.releasing {
			b = binary.AppendUvarint(b, r.notice)
			for _, h := range r.parts {
				b = binary.AppendUvarint(binary.AppendUvarint(b, uint64(h.Partition.Index)), h.Epoch)
			}
		}
		b = append(m.view.AppendKey(b), ';')
	}
	msgs := make([][]byte, len(s.net))
	for i, m := range s.net {
		msgs[i] = binary.AppendUvarint(binary.AppendUvarint([]byte{byte(m.member), boolByte(m.ack)}, m.notice.ID), m.notice.Incarnation)
	}
	slices.SortFunc(msgs, bytes.Compare)
	for _, m := range msgs {
		b = append(append(b, m...), ';')
	}
	sent := slices.Clone(s.sent)
	slices.SortFunc(sent, func(a, b gsent) int {
		return cmp.Or(cmp.Compare(a.id, b.id), cmp.Compare(a.incarnation, b.incarnation))
	})
	for _, x := range sent {
		b = binary.AppendUvarint(binary.AppendUvarint(b, x.id), x.incarnation)
	}
	b = append(b, 0)
	for _, x := range s.used {
		b = binary.AppendUvarint(b, uint64(x))
	}
	b = binary.AppendUvarint(b, s.lastJoin)
	b = s.ghost.AppendKey(b)
	return stateKey(b)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func intsU(xs []int) []uint64 {
	out := make([]uint64, len(xs))
	for i, x := range xs {
		out[i] = uint64(x)
	}
	return out
}

// CheckGroup explores the group configuration depth-first and returns the
// first violation with its trace, or the counts of a clean exploration.
func CheckGroup(cfg GroupConfig) GroupResult {
	cfg.defaults()
	res := GroupResult{}
	init, taken, v := cfg.replay(cfg.initial(), cfg.Prefix)
	switch {
	case v != "":
		res.Violation, res.Trace = v, slices.Clone(cfg.Prefix[:taken])
		return res
	case taken < len(cfg.Prefix):
		res.Violation = fmt.Sprintf("model: prefix action %q is not enabled after %q", cfg.Prefix[taken], cfg.Prefix[:taken])
		return res
	}
	init.events = 0
	res.Outcome = search[*gstate]{
		successors: cfg.successors,
		key:        (*gstate).key,
		visit:      func(s *gstate) { res.count(s.events) },
		bounded:    func(s *gstate) bool { return len(s.net) > cfg.NetworkMax },
		depthMax:   cfg.DepthMax,
		statesMax:  cfg.StatesMax,
	}.run(init)
	if res.Violation != "" {
		res.Trace = append(slices.Clone(cfg.Prefix), res.Trace...)
	}
	return res
}

func (cfg *GroupConfig) defaults() {
	if cfg.Members == 0 {
		cfg.Members = 2
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 2
	}
	if cfg.Messages == 0 {
		cfg.Messages = 1
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 2
	}
	if cfg.NetworkMax == 0 {
		cfg.NetworkMax = 4
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 40
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 500_000
	}
}

func (cfg *GroupConfig) initial() *gstate {
	init := &gstate{applied: []*group.State{group.NewState("g", group.Exclusive)}, views: make([]int, cfg.Nodes),
		leader: make([]int, cfg.Partitions), fence: make([]uint64, cfg.Partitions), acked: make([]uint64, cfg.Partitions),
		inc: 1, members: make([]gmember, cfg.Members), ghost: invariant.NewConsumers()}
	for i := range init.members {
		init.members[i] = cfg.newMember(0, 0)
	}
	return init
}

// ReplayGroup follows trace, a counterexample's actions, from the initial
// state of cfg (its Prefix ignored): it returns how many of them it took
// and the violation the last one taken met ("" none). A trace stops where
// its next action is not enabled.
func ReplayGroup(cfg GroupConfig, trace []string) (taken int, violation string) {
	cfg.defaults()
	_, taken, violation = cfg.replay(cfg.initial(), trace)
	return taken, violation
}

// replay takes actions from s in order, up to the first not enabled or
// the first that breaks an invariant.
func (cfg *GroupConfig) replay(s *gstate, actions []string) (last *gstate, taken int, violation string) {
	for _, action := range actions {
		next := cfg.successors(s)
		i := slices.IndexFunc(next, func(st gstep) bool { return st.action == action })
		if i < 0 {
			break
		}
		taken++
		if next[i].err != "" {
			return s, taken, next[i].err
		}
		s = next[i].next
	}
	return s, taken, ""
}

func (res *GroupResult) count(ev gevent) {
	for _, c := range []struct {
		ev gevent
		n  *int
	}{{geDelivery, &res.Deliveries}, {geRedelivery, &res.Redeliveries}, {geRefused, &res.Refused}, {geRevoke, &res.Revokes}, {geZombieFenced, &res.ZombieFenced},
		{geDelete, &res.Deletes}, {geRejoin, &res.Rejoins}, {geStaleAck, &res.StaleAcks}} {
		if ev&c.ev != 0 {
			*c.n++
		}
	}
}
