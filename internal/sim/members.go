package sim

import (
	"cmp"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A consumer of a ClusterOptions.Members run is a group member, as the
// SDK's is: it JOINs the coordinator on a connection of its own (moving on
// from a node that answers NOT_LEADER), heartbeats, applies NOTICEs
// through group.View, and pulls with its member id and incarnation on each
// of its lanes (workload.go: one connection per node; a node delivers what
// it runs the group's delivery for). On a REVOKE it acks what it holds of
// those partitions, each on the lane that delivered it, and answers
// CONTROL_ACK once every one of those acks is answered (or its connection
// is gone); fenced (STALE_ASSIGNMENT), it drops what it holds and joins
// again as a new incarnation. A client fault may crash it: it forgets
// everything and joins again.
//
// ExclusiveDelivery is checked on every message a member accepts: when the
// delivering node counts the member a member, no other member it counts
// may hold unacked deliveries of the partition. A member it no longer
// counts (fenced, or left) is a zombie: what it holds or still receives is
// the documented redelivery.

const (
	memberSessionMs   = 1000
	memberHeartbeatMs = 300
)

type simMember struct {
	shared   bool  // a shared group: no assignment, every partition taken
	mc       *conn // to the coordinator
	mat      int   // the node it tries for the coordinator
	joinID   uint64
	joinCorr uint64
	inc      uint64 // incarnation (0: not joined)
	view     *group.View
	// held: accepted deliveries not yet acked, nacked or given up.
	held map[position]heldMsg
	// revokes: a REVOKE notice being released → the ACKs (corrs, on any
	// lane) it waits for: those of its release and those already in flight
	// with entries of its partitions. It is answered once every one of
	// them is answered (or its connection is gone).
	revokes map[uint64]map[uint64]bool
	// releasing: REVOKE notices whose release is under way; a copy of one
	// (a resend) is answered by the release, not at once — answering it
	// early would free the partition while this member still holds it.
	releasing map[uint64]bool
	beating   bool
}

// newSimMember is consumer i's membership, not joined yet.
func newSimMember(shared bool, i int) *simMember {
	return &simMember{shared: shared, mat: i, joinID: uint64(i+1) << 32, view: group.NewView(), held: map[position]heldMsg{},
		revokes: map[uint64]map[uint64]bool{}, releasing: map[uint64]bool{}}
}

// heldMsg is an accepted delivery: its id and the lane (node) that
// delivered it, where its ack goes.
type heldMsg struct {
	id   uint64
	lane int
}

func (c *consumer) memberName() string { return c.name() }

// joinGroup (re)connects the membership connection and JOINs.
func (c *consumer) joinGroup() {
	m := c.m
	m.mc = c.s.dial(memberConn{c}, m.mat)
	if !m.mc.open {
		return
	}
	m.mc.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: c.name() + "/member"})
	c.nextCorr++
	m.joinCorr = c.nextCorr
	mode := wire.GroupExclusive
	if m.shared {
		mode = wire.GroupShared
	}
	m.mc.send(m.joinCorr, &wire.Join{Group: simGroup, Member: c.memberName(), Topics: []string{simTopic}, Mode: mode,
		SessionTimeoutMs: memberSessionMs, RebalanceTimeoutMs: memberSessionMs, JoinID: m.joinID})
	if !m.beating {
		m.beating = true
		c.s.w.after(memberHeartbeatMs, c.heartbeat)
	}
}

func (c *consumer) heartbeat() {
	m := c.m
	if m.mc != nil && m.mc.open && m.inc != 0 {
		c.nextCorr++
		m.mc.send(c.nextCorr, &wire.Heartbeat{MemberRef: c.ref()})
	}
	c.s.w.after(memberHeartbeatMs, c.heartbeat)
}

func (c *consumer) ref() wire.MemberRef {
	return wire.MemberRef{Group: simGroup, Member: c.memberName(), Incarnation: c.m.inc}
}

// memberConn is the member's coordinator connection as a sim client.
type memberConn struct{ c *consumer }

func (mc memberConn) name() string { return mc.c.name() }

func (mc memberConn) onClose(cn *conn) {
	m := mc.c.m
	if cn != m.mc {
		return
	}
	m.mat++ // the coordinator may be elsewhere now
	mc.c.s.w.after(mc.c.s.w.between(5, 100), mc.c.joinGroup)
}

func (mc memberConn) onFrame(cn *conn, corr uint64, f wire.Frame) {
	c, m := mc.c, mc.c.m
	if cn != m.mc {
		return
	}
	switch f := f.(type) {
	case *wire.JoinOK:
		c.s.w.tracef("%s JOIN_OK inc=%d epoch=%d", c.name(), f.Incarnation, f.MembershipEpoch)
		c.s.memberEvents["joins"]++
		if f.Incarnation != m.inc {
			if m.inc != 0 {
				// The old incarnation was fenced while this one was away
				// (the JOIN, same join id, made a new one): what it held
				// is the broker's to redeliver now.
				c.fenced()
			}
			m.inc, m.view = f.Incarnation, group.NewView()
			c.subscribe() // a new incarnation's subscription
		}
	case *wire.Notice:
		c.notice(f)
	case *wire.GroupOK:
	case *wire.Err:
		c.s.w.tracef("%s member ERR %s corr=%d", c.name(), f.Code, corr)
		switch {
		case f.Code == wire.CodeStaleAssignment:
			c.fenced()
			cn.breakConn("fenced: join again")
		case corr == m.joinCorr || movesOn(f.Code) || f.Code.Retryable():
			cn.breakConn("join failed or not the coordinator")
		}
	}
}

// fenced drops what the member holds; it joins again as a new incarnation.
func (c *consumer) fenced() {
	m := c.m
	c.s.w.tracef("%s fenced (incarnation %d): drops %d held", c.name(), m.inc, len(m.held))
	c.s.memberEvents["fenced"]++
	m.joinID++
	m.inc, m.view = 0, group.NewView()
	clear(m.held)
	clear(m.revokes)
	clear(m.releasing)
}

// crash is a consumer process dying: it restarts with nothing (a member
// joins again).
func (c *consumer) crash() {
	c.s.w.tracef("fault consumer crash %s", c.name())
	if c.m != nil {
		c.s.memberEvents["crashes"]++
		c.fenced()
		if c.m.mc != nil && c.m.mc.open {
			c.m.mc.breakConn("member crashed")
		}
	}
	for _, cn := range c.conns() {
		cn.breakConn("consumer crashed")
	}
}

func (c *consumer) notice(f *wire.Notice) {
	m := c.m
	if f.Incarnation != m.inc || m.inc == 0 {
		return
	}
	if m.releasing[f.NoticeID] {
		return // its release answers it
	}
	n := &group.Notice{ID: f.NoticeID, Kind: group.NoticeKind(f.Kind), Incarnation: f.Incarnation}
	for _, p := range f.Partitions {
		n.Partitions = append(n.Partitions, group.Held{Partition: group.Partition{Topic: p.Topic, Index: p.Partition}, Epoch: p.Epoch})
	}
	assigned, revoked := m.view.Notice(n)
	c.s.w.tracef("%s NOTICE #%d %v %v: assigned %v revoked %v", c.name(), f.NoticeID, n.Kind, f.Partitions, len(assigned), len(revoked))
	c.s.memberEvents["assigns"] += len(assigned)
	c.s.memberEvents["revokes"] += len(revoked)
	if len(revoked) == 0 {
		c.controlAck(f.NoticeID)
		return
	}
	// Finishing the work in progress takes a while; meanwhile it still
	// holds those deliveries (the partitions are not fetched any more).
	inc := m.inc
	m.releasing[f.NoticeID] = true
	c.s.w.after(c.s.w.between(20, 300), func() {
		if m.inc == inc {
			delete(m.releasing, f.NoticeID)
			c.release(f.NoticeID, revoked)
		}
	})
}

// release acks what the member holds of revoked partitions, each on the
// lane that delivered it (one ACK per lane), then answers the REVOKE once
// all of those acks, and those of the partitions already in flight on any
// lane, are answered. What a lane without a connection holds is given up
// (the broker redelivers it).
func (c *consumer) release(notice uint64, revoked []group.Held) {
	m := c.m
	waits := map[uint64]bool{}
	for _, l := range c.lanes {
		for corr, entries := range l.pending {
			for _, e := range entries {
				if slices.ContainsFunc(revoked, func(h group.Held) bool { return h.Partition.Index == e.Partition }) {
					waits[corr] = true
				}
			}
		}
	}
	perLane := make([][]wire.AckEntry, len(c.lanes))
	for _, h := range revoked {
		for pos, held := range m.held {
			if pos.partition == h.Partition.Index {
				perLane[held.lane] = append(perLane[held.lane], wire.AckEntry{Partition: pos.partition, Seq: pos.seq, DeliveryID: held.id})
				delete(m.held, pos)
			}
		}
	}
	for i, entries := range perLane {
		l := c.lanes[i]
		if len(entries) == 0 || l.c == nil || !l.c.open {
			continue
		}
		slices.SortFunc(entries, func(a, b wire.AckEntry) int {
			return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
		})
		for _, e := range entries {
			// Resent on the node's next connection if unanswered, like any
			// ack: the broker may have made it durable while its answer
			// was lost.
			l.unanswered[position{e.Partition, e.Seq}] = e
		}
		c.nextCorr++
		l.pending[c.nextCorr] = entries
		waits[c.nextCorr] = true
		l.c.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
	}
	if len(waits) == 0 {
		c.controlAck(notice)
		return
	}
	m.revokes[notice] = waits
}

func (c *consumer) controlAck(notice uint64) {
	m := c.m
	if m.mc == nil || !m.mc.open {
		return // the coordinator resends the notice
	}
	c.nextCorr++
	c.s.w.tracef("%s CONTROL_ACK #%d", c.name(), notice)
	m.mc.send(c.nextCorr, &wire.ControlAck{MemberRef: c.ref(), NoticeID: notice})
}

// revokeAnswered notes that the ACK corr was answered (or lost); a REVOKE
// waiting for it is answered once none of its ACKs is left.
func (c *consumer) revokeAnswered(corr uint64) {
	if c.m == nil {
		return
	}
	for _, notice := range slices.Sorted(maps.Keys(c.m.revokes)) {
		waits := c.m.revokes[notice]
		if !waits[corr] {
			continue
		}
		delete(waits, corr)
		if len(waits) == 0 {
			delete(c.m.revokes, notice)
			c.controlAck(notice)
		}
	}
}

// accept reports whether a member takes a delivered message: it holds the
// partition. It checks ExclusiveDelivery against the other members.
func (c *consumer) accept(l *lane, cn *conn, f *wire.Msg) bool {
	m := c.m
	held := heldMsg{id: f.DeliveryID, lane: l.node}
	if m.shared {
		m.held[position{f.Partition, f.Seq}] = held
		return m.inc != 0
	}
	if m.inc == 0 || m.view.Epoch(group.Partition{Topic: simTopic, Index: f.Partition}) == 0 {
		c.s.w.tracef("%s drops %d/%d: partition not held", c.name(), f.Partition, f.Seq)
		c.s.memberEvents["dropped"]++
		return false
	}
	current := c.s.currentMembers(cn.b)
	if current[c.memberName()] != m.inc {
		// Delivered while this incarnation still held the partition, and
		// arrived after the node fenced it: a zombie's delivery (its acks
		// are refused, the message goes to the new owner) — the documented
		// redelivery, not two members at once.
		c.s.memberEvents["zombie"]++
		m.held[position{f.Partition, f.Seq}] = held
		return true
	}
	for _, o := range c.s.consumers {
		if o == c || o.m == nil {
			continue
		}
		for pos := range o.m.held {
			if pos.partition == f.Partition && current[o.memberName()] == o.m.inc && o.m.inc != 0 {
				c.s.chk.violate(invariant.ExclusiveDelivery, "%s accepted %d/%d from %s while %s (incarnation %d, a member there) holds %s unacked",
					c.name(), f.Partition, f.Seq, cmp.Or(cn.b.id, "the broker"), o.name(), o.m.inc, pos)
				return false
			}
		}
	}
	m.held[position{f.Partition, f.Seq}] = held
	return true
}

// currentMembers maps each member of the group to its incarnation, as
// node b has applied it.
func (s *sim) currentMembers(b *broker) map[string]uint64 {
	out := map[string]uint64{}
	if !b.up {
		return out
	}
	for _, g := range b.node.GroupStates() {
		if g.Name == simGroup {
			for id, mm := range g.Members {
				out[id] = mm.Incarnation
			}
		}
	}
	return out
}
