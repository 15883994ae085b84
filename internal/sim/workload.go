package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/wire"
)

const simTopic = "t"
const simGroup = "g"

// producer publishes messagesMax values with idempotent retries: a message
// keeps its producer_seq across resends, reconnects and broker restarts.
type producer struct {
	s           *sim
	id          uint64
	window      int
	messagesMax uint64
	nextSeq     uint64            // next producer_seq to hand out
	inflight    map[uint64]string // producer_seq → value, not yet PUB_OK'd
	c           *conn
	ready       bool // HELLO_OK and DECLARE_OK received on c
	backoffMs   int64
	// partition it publishes to (wire.PartitionAuto on a single node); at
	// is the node it tries (cluster runs move on when it does not lead).
	partition int32
	at        int
}

func (p *producer) name() string { return fmt.Sprintf("p%d", p.id) }

func (p *producer) done() bool { return p.nextSeq > p.messagesMax && len(p.inflight) == 0 }

func (p *producer) connect() {
	p.ready = false
	p.c = p.s.dial(p, p.at)
	if p.c.open {
		p.c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: p.name()})
		p.c.send(0, &wire.Declare{Topic: p.s.topicConfig()})
	}
}

func (p *producer) onClose(c *conn) {
	if c != p.c {
		return
	}
	p.ready = false
	p.at++ // a cluster's next node (a single node's only one)
	p.backoffMs = min(max(p.backoffMs*2, 10), 500)
	p.s.w.after(p.s.w.between(1, p.backoffMs), p.connect)
}

func (p *producer) onFrame(c *conn, corr uint64, f wire.Frame) {
	if c != p.c {
		return
	}
	switch f := f.(type) {
	case *wire.HelloOK:
	case *wire.DeclareOK:
		p.ready, p.backoffMs = true, 0
		// Resend everything unacknowledged, in order, with the same seqs.
		seqs := make([]uint64, 0, len(p.inflight))
		for s := range p.inflight {
			seqs = append(seqs, s)
		}
		slices.Sort(seqs)
		for _, s := range seqs {
			p.sendPub(s)
		}
		p.fill()
	case *wire.PubOK:
		value, ok := p.inflight[corr]
		if !ok {
			return // an answer to a resend of something already acknowledged
		}
		delete(p.inflight, corr)
		p.s.w.tracef("%s PUB_OK pseq=%d -> %d/%d epoch=%d dup=%v", p.name(), corr, f.Partition, f.Seq, f.Epoch, f.Duplicate)
		p.s.chk.publishAcked(p.id, corr, value, f)
		p.fill()
	case *wire.Err:
		p.s.w.tracef("%s ERR %s corr=%d", p.name(), f.Code, corr)
		if _, ok := p.inflight[corr]; ok {
			p.s.pubErrors[f.Code]++
		}
		if corr == 0 && !p.ready {
			c.breakConn("declare failed") // start over, on the next node
			return
		}
		if _, ok := p.inflight[corr]; ok && movesOn(f.Code) {
			c.breakConn("not the leader") // try the next node
			return
		}
		if _, ok := p.inflight[corr]; ok && f.Code.Retryable() {
			p.s.w.after(p.s.w.between(5, 50), func() {
				if _, still := p.inflight[corr]; still && p.ready && p.c == c {
					p.sendPub(corr)
				}
			})
			return
		}
		if _, ok := p.inflight[corr]; ok {
			// A partition whose log took a bit flip may refuse writes
			// until repaired: that is the right answer, not a failure.
			// With a retention, a retry whose seq fell below the dedup
			// window once the records around it were compacted gets
			// PRODUCER_SEQ_TOO_OLD: its outcome is unknowable by then (a
			// documented gap), so it is given up, not a violation.
			damaged := f.Code == wire.CodeDataCorrupt && p.s.chk.anyDamaged()
			tooOld := f.Code == wire.CodeProducerSeqTooOld && p.s.retentionBytes > 0
			if !damaged && !tooOld {
				p.s.chk.violate("PublishAnswered", "%s: PUB pseq=%d failed permanently: %s", p.name(), corr, f.AsError())
			}
			delete(p.inflight, corr)
			p.fill()
		}
	}
}

// fill keeps the window full.
func (p *producer) fill() {
	for p.ready && len(p.inflight) < p.window && p.nextSeq <= p.messagesMax {
		s := p.nextSeq
		p.nextSeq++
		p.inflight[s] = fmt.Sprintf("%s-%d", p.name(), s)
		p.s.chk.sent[p.inflight[s]] = true
		p.sendPub(s)
	}
}

// sendPub publishes producer_seq s; its correlation id is s, so replies map
// straight back.
func (p *producer) sendPub(s uint64) {
	p.c.send(s, &wire.Pub{Topic: simTopic, Partition: p.partition, ProducerID: p.id, ProducerSeq: s,
		Value: []byte(p.inflight[s])})
}

// consumer is a group member: pulls with credit, acks most messages, nacks
// some and sits on others until the broker redelivers them.
type consumer struct {
	s        *sim
	id       int
	credit   uint32
	c        *conn
	subCorr  uint64
	nextCorr uint64
	pending  map[uint64][]wire.AckEntry // ACK corr → entries
	// unanswered holds acks sent without an answer yet; they are resent on
	// the next connection (acks are idempotent, and a stale one is refused).
	unanswered map[position]wire.AckEntry
	unreturned uint32
	polite     bool       // liveness phase: ack everything at once
	at         int        // the node it tries (cluster runs move on from one that does not coordinate)
	m          *simMember // group membership (ClusterOptions.Members; members.go)
}

func (c *consumer) name() string { return fmt.Sprintf("c%d", c.id) }

func (c *consumer) connect() {
	c.c = c.s.dial(c, c.at)
	if c.c.open {
		c.c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: c.name()})
		c.c.send(0, &wire.Declare{Topic: c.s.topicConfig()})
		if c.m == nil || c.m.inc != 0 {
			c.subscribe() // a member subscribes once it has joined
		}
	}
}

// subscribe sends the subscription's first PULL (a member's names its
// incarnation).
func (c *consumer) subscribe() {
	if c.c == nil || !c.c.open {
		return
	}
	c.nextCorr++
	c.subCorr = c.nextCorr
	c.unreturned = 0
	pull := &wire.Pull{Topic: simTopic, Group: simGroup, Credit: c.credit, AckWaitMs: uint32(c.s.opts.AckWaitMs), MaxDeliver: 1000}
	if c.m != nil {
		pull.Member, pull.Incarnation = c.memberName(), c.m.inc
	}
	c.c.send(c.subCorr, pull)
	// Acks whose answers were lost go again, after the PULL that makes the
	// group run on this node (acks are idempotent; a stale one is refused).
	if len(c.unanswered) > 0 {
		var entries []wire.AckEntry
		for _, e := range c.unanswered {
			entries = append(entries, e)
		}
		slices.SortFunc(entries, func(a, b wire.AckEntry) int {
			return cmp.Compare(uint64(a.Partition)<<48|a.Seq, uint64(b.Partition)<<48|b.Seq)
		})
		c.nextCorr++
		c.pending[c.nextCorr] = entries
		c.c.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
	}
}

func (c *consumer) onClose(cn *conn) {
	if cn != c.c {
		return
	}
	if c.m != nil {
		for _, corr := range slices.Sorted(maps.Keys(c.m.revokes)) {
			c.revokeAnswered(corr) // those acks are lost: the partitions are given up
		}
	}
	c.pending = map[uint64][]wire.AckEntry{}
	c.at++ // a cluster's next node (a single node's only one)
	c.s.w.after(c.s.w.between(5, 100), c.connect)
}

func (c *consumer) onFrame(cn *conn, corr uint64, f wire.Frame) {
	if cn != c.c {
		return
	}
	switch f := f.(type) {
	case *wire.Msg:
		c.s.w.tracef("%s MSG %d/%d id=%d n=%d", c.name(), f.Partition, f.Seq, f.DeliveryID, f.DeliveryCount)
		c.s.chk.delivered(c.name(), f)
		entry := wire.AckEntry{Partition: f.Partition, Seq: f.Seq, DeliveryID: f.DeliveryID}
		roll := c.s.w.rng.Float64()
		switch {
		case c.m != nil && !c.accept(cn, f):
			// Not held (any more): the broker redelivers it to its holder.
		case c.polite || roll < 0.85:
			c.s.w.after(c.processMs(), func() { c.ack(cn, entry, false) })
		case roll < 0.93:
			c.s.w.after(c.processMs(), func() { c.ack(cn, entry, true) })
		default:
			// Stall: never ack; the broker must redeliver after the ack wait.
		}
		c.unreturned++
		if c.unreturned >= c.credit/2 || c.polite {
			pull := &wire.Pull{Topic: simTopic, Group: simGroup, Credit: c.unreturned}
			if c.m != nil {
				pull.Member, pull.Incarnation = c.memberName(), c.m.inc
			}
			cn.send(c.subCorr, pull)
			c.unreturned = 0
		}
	case *wire.AckOK:
		c.s.w.tracef("%s ACK_OK %v", c.name(), f.Results)
		entries := c.pending[corr]
		delete(c.pending, corr)
		for i, e := range entries {
			pos := position{e.Partition, e.Seq}
			if u, ok := c.unanswered[pos]; ok && u.DeliveryID == e.DeliveryID {
				delete(c.unanswered, pos)
			}
			if i < len(f.Results) && f.Results[i] == wire.CodeOK {
				c.s.acksConfirmed++
				c.s.chk.groupAcked(c.name(), e)
			}
		}
		c.revokeAnswered(corr)
	case *wire.Err:
		c.s.w.tracef("%s ERR %s corr=%d", c.name(), f.Code, corr)
		if corr == c.subCorr || corr == 0 {
			// The subscription failed (e.g. the group's ledger could not be
			// opened): start over on a new connection, which resubscribes
			// and resends unanswered acks.
			cn.breakConn("subscribe failed")
			return
		}
		entries, ok := c.pending[corr]
		delete(c.pending, corr)
		if ok {
			c.s.ackErrors[f.Code]++
		}
		c.revokeAnswered(corr)
		if ok && movesOn(f.Code) {
			cn.breakConn("not the coordinator") // try the next node; the acks are resent there
			return
		}
		if ok && f.Code.Retryable() {
			// The ack may or may not be durable: ask again (acks are
			// idempotent; a stale one is refused and the broker redelivers).
			c.s.w.after(c.s.w.between(5, 50), func() {
				if cn != c.c || !cn.open {
					return
				}
				c.nextCorr++
				c.pending[c.nextCorr] = entries
				cn.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
			})
		}
	}
}

// processMs is how long a consumer works on a message before its ack:
// members take longer, so a rebalance often finds them holding some.
func (c *consumer) processMs() int64 {
	if c.m != nil && !c.polite {
		return c.s.w.between(10, 150)
	}
	return c.s.w.between(0, 20)
}

func (c *consumer) ack(cn *conn, e wire.AckEntry, nack bool) {
	if cn != c.c || !cn.open {
		return
	}
	if c.m != nil {
		pos := position{e.Partition, e.Seq}
		if c.m.held[pos] != e.DeliveryID {
			return // given up (revoked or fenced) meanwhile
		}
		delete(c.m.held, pos)
	}
	c.nextCorr++
	if nack {
		cn.send(c.nextCorr, &wire.Nack{Topic: simTopic, Group: simGroup, DelayMs: uint32(c.s.w.between(0, 50)), Entries: []wire.AckEntry{e}})
		return
	}
	c.pending[c.nextCorr] = []wire.AckEntry{e}
	c.unanswered[position{e.Partition, e.Seq}] = e
	cn.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: []wire.AckEntry{e}})
}

// movesOn reports whether a client should try another node of a cluster:
// this one does not lead (or coordinate) what it asked for.
func movesOn(code wire.Code) bool { return code == wire.CodeNotLeader }
