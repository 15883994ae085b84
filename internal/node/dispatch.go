package node

// A group's dispatch: records handed to its subscriptions while they have
// credit, read ahead from the partitions' logs.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// dispatch sends due deliveries to subscriptions with credit, round-robin
// over subscriptions and partitions. Only visible records are sent.
func (g *groupRunner) dispatch(now int64) {
	for i, p := range g.topic.partitions {
		if g.cursors[i] == nil {
			continue
		}
		if start := p.startSeq.Load(); start > g.cursors[i].AckFloor() {
			g.cursors[i].Truncated(start)
		}
		g.skipNonMessagesAtFloor(i)
	}
	g.refreshAssignment(now)
	g.leasedNow = g.leasedNow[:0]
	for i, c := range g.cursors {
		g.leasedNow = append(g.leasedNow, c != nil && g.ledger.leased(i))
	}
	m := g.node.metrics
	for {
		sub := g.nextSubWithCredit()
		if sub == nil {
			return
		}
		sent := false
		for k := 0; k < len(g.cursors) && !sent; k++ {
			pi := (g.partRR + k) % len(g.cursors)
			if !g.leasedNow[pi] || !g.mayDeliver(sub, pi) {
				continue
			}
			p := g.topic.partitions[pi]
			d, ok := g.cursors[pi].Next(now, p.commitSeq.Load(), sub.id)
			if !ok {
				continue
			}
			e, err := g.fetch(pi, d.Seq)
			if gap := (*storage.GapError)(nil); errors.As(err, &gap) {
				// A seq a repair dropped (logged by the repair): not a
				// message; done at once, derivable from the log.
				g.cursors[pi].Ack(d.Seq, d.DeliveryID)
				k--
				continue
			}
			if err != nil {
				// The delivery stays in flight and is retried after its ack
				// wait; a corrupt record is never sent (a replica of a
				// cluster rebuilds the range meanwhile: partitionRunner.read).
				g.node.logRepeatedError(g.name+"/"+g.topic.cfg.Name, "read for delivery failed", "topic", g.topic.cfg.Name, "partition", pi, "seq", d.Seq, "err", err)
				continue
			}
			if replog.IsControl(&e.Record) {
				// An epoch's install entry: not a message. Done at once
				// (derivable, so not written to the ledger).
				g.cursors[pi].Ack(d.Seq, d.DeliveryID)
				k--
				continue
			}
			sub.sink.SendMsg(&wire.Msg{Topic: g.topic.cfg.Name, Partition: uint32(pi), Seq: d.Seq,
				DeliveryID: d.DeliveryID, DeliveryCount: d.Count, TimestampMs: e.Record.TimestampMs,
				Key: e.Record.Key, Value: e.Record.Value, Headers: toWireHeaders(e.Record.Headers)})
			sub.credit--
			g.partRR = pi + 1
			sent = true
			m.deliveries.WithLabelValues(g.topic.cfg.Name, g.name).Inc()
			if d.Count > 1 {
				m.redeliveries.WithLabelValues(g.topic.cfg.Name, g.name).Inc()
			}
		}
		if !sent {
			sub.idle = true // nothing for it this pass; the others may have some
		}
	}
}

// skipNonMessagesAtFloor marks done the records at partition pi's floor
// that are no messages (the group's own records after its last ack, an
// install entry), while nothing from the floor on was handed out: an
// idle group, or one whose subscriptions have no credit, would else keep
// its floor below them and report a lag it does not have. Derivable, so
// never recorded (as dispatch does when a subscription reads them).
func (g *groupRunner) skipNonMessagesAtFloor(pi int) {
	c := g.cursors[pi]
	commit := g.topic.partitions[pi].commitSeq.Load()
	for c.Untouched() && c.AckFloor() <= commit {
		e, err := g.fetch(pi, c.AckFloor())
		if err != nil || !replog.IsControl(&e.Record) {
			return
		}
		c.ReplayAck(e.Seq)
	}
}

// nextSubWithCredit returns the next subscription with credit that has
// not come up empty in this dispatch pass.
func (g *groupRunner) nextSubWithCredit() *Subscription {
	for k := 0; k < len(g.subs); k++ {
		s := g.subs[(g.subRR+k)%len(g.subs)]
		if s.credit > 0 && !s.idle {
			g.subRR = (g.subRR + k + 1) % len(g.subs)
			return s
		}
	}
	for _, s := range g.subs {
		s.idle = false
	}
	return nil
}

// creditFor reports whether a subscription with credit may be handed
// partition pi's deliveries (its owner's, when the group assigns; the
// partition's fence aside: a fence record's commit wakes the group).
func (g *groupRunner) creditFor(pi int) bool {
	return slices.ContainsFunc(g.subs, func(s *Subscription) bool { return s.credit > 0 && g.holds(s, pi) })
}

// holds reports whether sub holds partition pi now: any subscription of a
// group that assigns nothing, else the current incarnation of its owner
// once it acknowledged the ASSIGN and not while its REVOKE is in flight.
func (g *groupRunner) holds(sub *Subscription, pi int) bool {
	if !g.assigned {
		return true
	}
	o := g.owners[pi]
	return o.member == sub.member && o.incarnation == sub.incarnation && !o.revoking && !o.assigning
}

// mayDeliver reports whether partition pi may go to sub: never when this
// node does not deliver pi (a cluster's other leaders do); any
// subscription of a group that assigns nothing; else only the current
// incarnation of the partition's owner, once it acknowledged the ASSIGN
// and not while its REVOKE is in flight, nor past the partition's fence
// (ackLedger.fenced).
func (g *groupRunner) mayDeliver(sub *Subscription, pi int) bool {
	if g.cursors[pi] == nil || !g.holds(sub, pi) {
		return false
	}
	return !g.assigned || g.ledger.fenced(pi, g.owners[pi].epoch, g.assignEpoch)
}

// refreshAssignment re-reads the group's assignment when the group state
// changed. A partition that changed hands releases the deliveries its
// previous holders' subscriptions still have in flight at once: they are
// redelivered to the new owner, and the old delivery ids are stale — a
// fenced member's late acks are refused (AckFromCurrentOwner).
func (g *groupRunner) refreshAssignment(now int64) {
	ver := g.node.members.version()
	if ver == g.assignVer && g.owners != nil {
		return
	}
	g.assignVer = ver
	owners, epoch, assigned := g.node.members.owners(g.name, g.topic.cfg.Name, len(g.cursors))
	if owners == nil {
		owners = make([]partOwner, len(g.cursors))
	}
	for pi, o := range owners {
		if prev := g.owners; prev != nil && prev[pi].member == o.member && prev[pi].incarnation == o.incarnation {
			continue
		}
		if !assigned && !g.assigned {
			continue
		}
		for _, s := range g.subs {
			if g.cursors[pi] != nil && (s.member != o.member || s.incarnation != o.incarnation || !assigned) {
				g.cursors[pi].Release(now, s.id)
			}
		}
	}
	if assigned && !g.assigned {
		// Members joined: a competing consumer (no member) is served
		// nothing from now on; say so rather than starve it.
		werr := wire.Errorf(wire.CodeInvalidArgument, "group %s now assigns partitions to its members: JOIN it to consume", g.name)
		g.subs = slices.DeleteFunc(g.subs, func(s *Subscription) bool {
			if s.member != "" {
				return false
			}
			for _, cur := range g.cursors {
				if cur != nil {
					cur.Release(now, s.id)
				}
			}
			s.ended.Store(true)
			s.sink.End(werr)
			return true
		})
	}
	g.owners, g.assigned, g.assignEpoch = owners, assigned, epoch
}

const readAheadRecords, readAheadBytes = 512, 1 << 20

// fetch returns the visible entry at seq, reading ahead into a per-partition
// cache so sequential delivery reads the log in batches.
func (g *groupRunner) fetch(pi int, seq uint64) (storage.Entry, error) {
	c := g.cache[pi]
	// A partition that recovered (new epoch) may have lost its tail to
	// corruption and rewritten those seqs: never serve it from an old read.
	epoch := g.topic.partitions[pi].epoch.Load()
	if len(c) > 0 && g.cacheEpoch[pi] == epoch && seq >= c[0].Seq && seq <= c[len(c)-1].Seq {
		return c[seq-c[0].Seq], nil
	}
	entries, err := g.topic.partitions[pi].read(seq, readAheadRecords, readAheadBytes)
	if err != nil {
		g.cache[pi] = nil
		return storage.Entry{}, err
	}
	if len(entries) == 0 || entries[0].Seq != seq {
		g.cache[pi] = nil
		return storage.Entry{}, fmt.Errorf("seq %d not readable", seq)
	}
	g.cache[pi], g.cacheEpoch[pi] = entries, epoch
	return entries[0], nil
}

func toWireHeaders(hs []storage.Header) []wire.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]wire.Header, len(hs))
	for i, h := range hs {
		out[i] = wire.Header{Key: h.Key, Value: h.Value}
	}
	return out
}
