package group

import (
	"maps"
	"math"
	"slices"
)

// Coordinator is the group coordinator's soft state, kept on the metadata
// leader and never logged: when each member was last heard from, when
// each pending notice was sent. Tick turns elapsed time into effects:
// fence commands for members silent past their session timeout or slow
// past their rebalance timeout to answer a REVOKE, and NOTICE frames to
// (re)send. A new coordinator starts with every member freshly heard
// (a full session timeout of grace) and every notice unsent. Time is
// the caller's, in milliseconds.
type Coordinator struct {
	// RetransmitMs: a notice not acknowledged within it is sent again,
	// and a fence not applied within it is proposed again.
	RetransmitMs int64

	heard    map[memberKey]int64
	sent     map[noticeKey]sentAt
	fencedAt map[memberKey]int64
}

type memberKey struct {
	group, member string
	incarnation   uint64
}

// noticeKey names a notice by its member's incarnation too: a group
// deleted and joined again between two ticks numbers its notices from 1
// again, and without it the new incarnation's notice would inherit the
// old one's send times — held back until the old one's resend, and a
// REVOKE's rebalance timeout counted from the old one's first send. A
// member incarnation (the metadata seq of its JOIN) is never reused.
type noticeKey struct {
	group       string
	id          uint64
	incarnation uint64
}

type sentAt struct{ first, last int64 }

// Send is a NOTICE to deliver to its member.
type Send struct {
	Group  string
	Notice *Notice
}

// Effects are what a Tick asks the shell to do.
type Effects struct {
	Propose []Command // fences, for the metadata log
	Send    []Send
}

// NewCoordinator returns a coordinator that resends after retransmitMs.
func NewCoordinator(retransmitMs int64) *Coordinator {
	return &Coordinator{RetransmitMs: retransmitMs, heard: map[memberKey]int64{}, sent: map[noticeKey]sentAt{}, fencedAt: map[memberKey]int64{}}
}

// Heard records a heartbeat (or any frame) from a member's incarnation.
func (c *Coordinator) Heard(group, member string, incarnation uint64, now int64) {
	c.heard[memberKey{group, member, incarnation}] = now
}

// Tick checks every group's members and notices at now.
func (c *Coordinator) Tick(now int64, groups []*State) Effects {
	var eff Effects
	liveMembers := map[memberKey]bool{}
	liveNotices := map[noticeKey]bool{}
	for _, g := range groups {
		for _, id := range slices.Sorted(maps.Keys(g.Members)) {
			m := g.Members[id]
			k := memberKey{g.Name, id, m.Incarnation}
			liveMembers[k] = true
			last, ok := c.heard[k]
			if !ok {
				c.heard[k], last = now, now
			}
			if now-last > m.SessionTimeoutMs {
				c.fence(&eff, g.Name, id, m.Incarnation, now)
			}
		}
		for _, n := range g.PendingNotices() {
			k := noticeKey{g.Name, n.ID, n.Incarnation}
			liveNotices[k] = true
			s, ok := c.sent[k]
			if m := g.Members[n.Member]; ok && n.Kind == NoticeRevoke && m != nil && now-s.first > m.RebalanceTimeoutMs {
				c.fence(&eff, g.Name, n.Member, n.Incarnation, now)
			}
			switch {
			case !ok:
				s = sentAt{now, now}
			case now-s.last >= c.RetransmitMs:
				s.last = now
			default:
				continue
			}
			c.sent[k] = s
			eff.Send = append(eff.Send, Send{Group: g.Name, Notice: n})
		}
	}
	maps.DeleteFunc(c.heard, func(k memberKey, _ int64) bool { return !liveMembers[k] })
	maps.DeleteFunc(c.fencedAt, func(k memberKey, _ int64) bool { return !liveMembers[k] })
	maps.DeleteFunc(c.sent, func(k noticeKey, _ sentAt) bool { return !liveNotices[k] })
	return eff
}

// Due makes every pending notice of group due at the next Tick: a member
// just joined here, and a notice produced before the shell could deliver
// it (its sink was not registered yet) must not wait for RetransmitMs. The
// time of a notice's first send, which the rebalance timeout counts
// from, is kept.
func (c *Coordinator) Due(group string) {
	for k, s := range c.sent {
		if k.group == group {
			s.last = math.MinInt64 / 2
			c.sent[k] = s
		}
	}
}

// fence proposes removing a member's incarnation, once per RetransmitMs.
func (c *Coordinator) fence(eff *Effects, group, member string, incarnation uint64, now int64) {
	k := memberKey{group, member, incarnation}
	if at, ok := c.fencedAt[k]; ok && now-at < c.RetransmitMs {
		return
	}
	c.fencedAt[k] = now
	eff.Propose = append(eff.Propose, Command{Op: OpFence, Group: group, Member: member, Incarnation: incarnation})
}
