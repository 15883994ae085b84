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
	// batch: the producer sends what it publishes together as one
	// PUB_BATCH (protocol v2) instead of a PUB each; a retry of one
	// message is a PUB (ClusterOptions.PubBatch, Options.PubBatch).
	batch bool
	// fillQueued: a batch producer's refill is queued for when the answers
	// that arrived at this instant are all handled.
	fillQueued bool
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
		if p.batch && len(seqs) > 0 {
			p.sendBatch(seqs)
		} else {
			for _, s := range seqs {
				p.sendPub(s)
			}
		}
		p.fill()
	case *wire.PubBatchOK:
		for i := range f.Results { // each record's answer, as its PUB's
			p.onFrame(c, f.Results[i].Corr, f.Results[i].Result())
		}
	case *wire.PubOK:
		value, ok := p.inflight[corr]
		if !ok {
			return // an answer to a resend of something already acknowledged
		}
		delete(p.inflight, corr)
		p.s.w.tracef("%s PUB_OK pseq=%d -> %d/%d epoch=%d dup=%v", p.name(), corr, f.Partition, f.Seq, f.Epoch, f.Duplicate)
		p.s.chk.publishAcked(p.id, corr, value, f)
		p.refill()
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
			// A partition whose files took a bit flip may refuse writes
			// until repaired: that is the right answer, not a failure.
			// With a retention (ever: an update may lift it since), a
			// retry whose seq fell below the dedup
			// window once the records around it were compacted gets
			// PRODUCER_SEQ_TOO_OLD: its outcome is unknowable by then (a
			// documented gap), so it is given up, not a violation.
			damaged := f.Code == wire.CodeDataCorrupt && p.s.chk.mayRefuse()
			tooOld := f.Code == wire.CodeProducerSeqTooOld && p.s.retention.Bytes > 0 && p.s.tooOldExcused(p.id, corr)
			if !damaged && !tooOld {
				p.s.chk.violate("PublishAnswered", "%s: PUB pseq=%d failed permanently: %s", p.name(), corr, f.AsError())
			}
			delete(p.inflight, corr)
			p.refill()
		}
	}
}

// refill fills the window after an answer: at once for a producer of
// PUBs; for a batch producer once the answers that arrived at this instant
// are all handled, so that the slots they free go out as one PUB_BATCH.
func (p *producer) refill() {
	if !p.batch {
		p.fill()
		return
	}
	if !p.fillQueued {
		p.fillQueued = true
		p.s.w.after(0, func() {
			p.fillQueued = false
			p.fill()
		})
	}
}

// fill keeps the window full.
func (p *producer) fill() {
	var seqs []uint64
	for p.ready && len(p.inflight) < p.window && p.nextSeq <= p.messagesMax {
		s := p.nextSeq
		p.nextSeq++
		p.inflight[s] = fmt.Sprintf("%s-%d", p.name(), s)
		p.s.chk.sent[p.inflight[s]] = true
		if p.batch {
			seqs = append(seqs, s)
		} else {
			p.sendPub(s)
		}
	}
	if len(seqs) > 0 {
		p.sendBatch(seqs)
	}
}

// sendBatch publishes the producer_seqs seqs in one PUB_BATCH, each record
// under its seq as correlation id.
func (p *producer) sendBatch(seqs []uint64) {
	b := &wire.PubBatch{Topic: simTopic, Partition: p.partition, ProducerID: p.id}
	for _, s := range seqs {
		b.Records = append(b.Records, wire.PubRecord{Corr: s, ProducerSeq: s, Value: []byte(p.inflight[s])})
	}
	if len(seqs) > 1 {
		p.s.pubBatches++
	}
	p.c.send(0, b)
}

// sendPub publishes producer_seq s; its correlation id is s, so replies map
// straight back.
func (p *producer) sendPub(s uint64) {
	p.c.send(s, &wire.Pub{Topic: simTopic, Partition: p.partition, ProducerID: p.id, ProducerSeq: s,
		Value: []byte(p.inflight[s])})
}

// consumer is a group's consumer: it subscribes on every node of the
// cluster (a lane per node; a single node has one), pulls with credit on
// each, acks most messages on the lane that delivered them, nacks some and
// sits on others until the broker redelivers them. A node delivers what it
// runs the group's delivery for (today: every partition at the leader of
// partition 0, the coordinator; with delivery at each partition's leader,
// the partitions it leads); a PULL refused with NOT_LEADER or UNAVAILABLE
// is sent again on the same connection after a while, so a lane waits on
// its node instead of moving elsewhere.
type consumer struct {
	s        *sim
	id       int
	credit   uint32 // each lane's credit
	nextCorr uint64 // correlation ids, unique across the consumer's lanes
	lanes    []*lane
	// orphans are acks whose answer was lost and whose node then no longer
	// took them (it stopped running the delivery of their partition): the
	// ack may be durable at the partition's new deliverer, which will not
	// redeliver it. They are asked again on every lane until one answers
	// OK, or until the message is delivered again (multi-node runs only).
	orphans       map[position]wire.AckEntry
	askingOrphans bool       // an askOrphans is scheduled
	polite        bool       // liveness phase: ack everything at once
	m             *simMember // group membership (ClusterOptions.Members; members.go)
}

// lane is a consumer's subscription at one node: its connection, the
// subscription's PULL corr, credit not yet returned, and the acks sent on
// it. An ack or nack goes on the lane whose node delivered the message.
type lane struct {
	node    int // index into sim.nodes
	c       *conn
	subCorr uint64
	// subCorrs are the corrs of every subscribing PULL sent on the
	// connection: an ERR answering one ended a subscription (or refused
	// it), whichever PULL created it.
	subCorrs   map[uint64]bool
	repulling  bool // a PULL after a refusal is due
	unreturned uint32
	pending    map[uint64][]wire.AckEntry // ACK corr → entries
	// unanswered holds acks sent without an answer yet; they are resent on
	// this node's next connection (acks are idempotent, and a stale one is
	// refused).
	unanswered map[position]wire.AckEntry
}

func newConsumer(s *sim, id int, credit uint32) *consumer {
	c := &consumer{s: s, id: id, credit: credit, orphans: map[position]wire.AckEntry{}}
	for i := range s.nodes {
		c.lanes = append(c.lanes, &lane{node: i, pending: map[uint64][]wire.AckEntry{}, unanswered: map[position]wire.AckEntry{}})
	}
	return c
}

func (c *consumer) name() string { return fmt.Sprintf("c%d", c.id) }

// connect opens every lane.
func (c *consumer) connect() {
	for _, l := range c.lanes {
		c.connectLane(l)
	}
}

func (c *consumer) connectLane(l *lane) {
	l.c = c.s.dial(c, l.node)
	l.subCorrs, l.repulling = map[uint64]bool{}, false
	if l.c.open {
		l.c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: c.name()})
		l.c.send(0, &wire.Declare{Topic: c.s.topicConfig()})
		if c.m == nil || c.m.inc != 0 {
			c.subscribeLane(l) // a member subscribes once it has joined
		}
	}
}

// laneOf returns the lane whose current connection is cn (nil: an old
// connection).
func (c *consumer) laneOf(cn *conn) *lane {
	for _, l := range c.lanes {
		if l.c == cn {
			return l
		}
	}
	return nil
}

// conns returns the lanes' open connections, in node order.
func (c *consumer) conns() []*conn {
	var out []*conn
	for _, l := range c.lanes {
		if l.c != nil && l.c.open {
			out = append(out, l.c)
		}
	}
	return out
}

// subscribe subscribes on every lane (a member's new incarnation).
func (c *consumer) subscribe() {
	for _, l := range c.lanes {
		c.subscribeLane(l)
	}
}

// subscribeLane sends the lane's subscribing PULL, then the acks whose
// answers were lost (after the PULL that makes the group run on the node;
// acks are idempotent, a stale one is refused).
func (c *consumer) subscribeLane(l *lane) {
	if l.c == nil || !l.c.open {
		return
	}
	c.pull(l)
	if len(l.unanswered) > 0 {
		var entries []wire.AckEntry
		for _, e := range l.unanswered {
			entries = append(entries, e)
		}
		slices.SortFunc(entries, func(a, b wire.AckEntry) int {
			return cmp.Compare(uint64(a.Partition)<<48|a.Seq, uint64(b.Partition)<<48|b.Seq)
		})
		c.nextCorr++
		l.pending[c.nextCorr] = entries
		l.c.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
	}
}

// pull sends the subscription's first PULL on the lane, with the lane's
// whole credit (a member's names its incarnation).
func (c *consumer) pull(l *lane) {
	c.nextCorr++
	l.subCorr = c.nextCorr
	l.subCorrs[l.subCorr] = true
	l.repulling = false
	l.unreturned = 0
	pull := &wire.Pull{Topic: simTopic, Group: simGroup, Credit: c.credit, AckWaitMs: uint32(c.s.opts.AckWaitMs), MaxDeliver: consumersMaxDeliver(c.s.opts)}
	if c.m != nil {
		pull.Member, pull.Incarnation = c.memberName(), c.m.inc
	}
	l.c.send(l.subCorr, pull)
}

func (c *consumer) onClose(cn *conn) {
	l := c.laneOf(cn)
	if l == nil {
		return
	}
	if c.m != nil {
		for _, corr := range slices.Sorted(maps.Keys(l.pending)) {
			c.revokeAnswered(corr) // those acks are lost: the partitions are given up
		}
	}
	l.pending = map[uint64][]wire.AckEntry{}
	// The same node again, after a backoff (it may be down a while).
	c.s.w.after(c.s.w.between(5, 100), func() {
		if l.c == cn {
			c.connectLane(l)
		}
	})
}

func (c *consumer) onFrame(cn *conn, corr uint64, f wire.Frame) {
	l := c.laneOf(cn)
	if l == nil {
		return
	}
	switch f := f.(type) {
	case *wire.Msg:
		c.s.w.tracef("%s MSG %d/%d id=%d n=%d", c.name(), f.Partition, f.Seq, f.DeliveryID, f.DeliveryCount)
		c.s.chk.delivered(c.name(), f)
		entry := wire.AckEntry{Partition: f.Partition, Seq: f.Seq, DeliveryID: f.DeliveryID}
		if o, ok := c.orphans[position{f.Partition, f.Seq}]; ok && f.DeliveryID > o.DeliveryID {
			delete(c.orphans, position{f.Partition, f.Seq}) // delivered again: not acked after all
		}
		roll := c.s.w.rng.Float64()
		switch {
		case c.m != nil && !c.accept(l, cn, f):
			// Not held (any more): the broker redelivers it to its holder.
		case c.s.opts.DeadLetters && poison(f.Seq):
			c.s.w.after(c.processMs(), func() { c.ack(cn, entry, true) }) // until it is dead-lettered
		case c.polite || roll < 0.85:
			c.s.w.after(c.processMs(), func() { c.ack(cn, entry, false) })
		case roll < 0.93:
			c.s.w.after(c.processMs(), func() { c.ack(cn, entry, true) })
		default:
			// Stall: never ack; the broker must redeliver after the ack wait.
		}
		l.unreturned++
		if l.unreturned >= c.credit/2 || c.polite {
			pull := &wire.Pull{Topic: simTopic, Group: simGroup, Credit: l.unreturned}
			if c.m != nil {
				pull.Member, pull.Incarnation = c.memberName(), c.m.inc
			}
			cn.send(l.subCorr, pull)
			l.unreturned = 0
		}
	case *wire.AckOK:
		c.s.w.tracef("%s ACK_OK %v", c.name(), f.Results)
		entries := l.pending[corr]
		delete(l.pending, corr)
		inc, tagged := cn.ackOKInc[corr]
		delete(cn.ackOKInc, corr)
		confirms := !tagged || c.s.chk.ackConfirms(inc)
		if !confirms {
			c.s.w.tracef("%s ACK_OK of the group's deleted incarnation %d: confirms nothing", c.name(), inc)
		}
		for i, e := range entries {
			pos := position{e.Partition, e.Seq}
			if i < len(f.Results) && f.Results[i] != wire.CodeOK {
				c.s.ackEntryCodes[f.Results[i]]++
			}
			if i < len(f.Results) && slices.Contains([]wire.Code{wire.CodeStaleDelivery, wire.CodeNotLeader, wire.CodeDataCorrupt, wire.CodeUnavailable}, f.Results[i]) {
				// Stale here, or this node did not deliver the partition
				// when it got the ack: not acked here, maybe acked where
				// it is delivered now (or once this node took office, or
				// once its only replica, here, delivers again or was
				// repaired).
				c.orphan(l, e, f.Results[i])
			}
			if u, ok := l.unanswered[pos]; ok && u.DeliveryID == e.DeliveryID {
				delete(l.unanswered, pos)
			}
			if i < len(f.Results) && f.Results[i] == wire.CodeOK {
				delete(c.orphans, pos)
				if confirms {
					c.s.acksConfirmed++
					c.s.chk.groupAcked(c.name(), e)
				}
			}
		}
		c.revokeAnswered(corr)
	case *wire.Err:
		c.s.w.tracef("%s ERR %s corr=%d", c.name(), f.Code, corr)
		sub := l.subCorrs[corr]
		if sub && (f.Code == wire.CodeNotLeader || f.Code == wire.CodeUnavailable) {
			// This node does not run the group's delivery (yet, or any
			// more), or not yet for this member: subscribe again here a
			// little later (the subscription ended; the next PULL starts a
			// new one).
			if !l.repulling {
				l.repulling = true
				c.s.w.after(c.s.w.between(50, 300), func() {
					if l.c == cn && cn.open && l.repulling && (c.m == nil || c.m.inc != 0) {
						c.pull(l)
					}
				})
			}
			return
		}
		if sub || corr == 0 {
			// The subscription failed otherwise (e.g. the group's ledger
			// could not be opened, or the member is fenced): start over on
			// a new connection to the node, which resubscribes and resends
			// unanswered acks.
			cn.breakConn("subscribe failed")
			return
		}
		entries, ok := l.pending[corr]
		delete(l.pending, corr)
		if ok {
			c.s.ackErrors[f.Code]++
		}
		c.revokeAnswered(corr)
		if ok && f.Code.Retryable() && f.Code != wire.CodeNotLeader {
			// The ack may or may not be durable: ask again (acks are
			// idempotent; a stale one is refused and the broker redelivers).
			c.s.w.after(c.s.w.between(5, 50), func() {
				if l.c != cn || !cn.open {
					return
				}
				c.nextCorr++
				l.pending[c.nextCorr] = entries
				cn.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
			})
		}
		if ok && (f.Code == wire.CodeNotLeader || f.Code == wire.CodeNotFound) {
			// The node no longer runs the delivery of these messages (or
			// never did): a message not acked is redelivered, one acked
			// before its node lost it is asked after elsewhere.
			for _, e := range entries {
				c.orphan(l, e, f.Code)
			}
		}
	}
}

// orphan makes an unanswered ack of lane l, answered code, an orphan,
// asked after on every lane. A single node's answer is final: nothing to
// ask elsewhere — but for DATA_CORRUPT, a partition whose only replica
// is unopened for damage, and UNAVAILABLE, one whose only replica is not
// delivering yet, either of which may hold the ack durable: asked again
// until the repair or the replica lets it tell (seed 1127 of `--nodes 1`:
// answered NOT_LEADER then, the consumer took the answer for a
// redelivery to come while the ack was durable, and waited for good;
// seed 7 of `--nodes 1`, the metadata log flipped: the same while the
// replica restarted in place).
func (c *consumer) orphan(l *lane, e wire.AckEntry, code wire.Code) {
	pos := position{e.Partition, e.Seq}
	final := len(c.lanes) == 1 && code != wire.CodeDataCorrupt && code != wire.CodeUnavailable
	if u, ok := l.unanswered[pos]; !ok || u.DeliveryID != e.DeliveryID || final {
		return
	}
	delete(l.unanswered, pos)
	if o, ok := c.orphans[pos]; !ok || o.DeliveryID < e.DeliveryID {
		c.orphans[pos] = e
	}
	if !c.askingOrphans {
		c.askingOrphans = true
		c.s.w.after(c.s.w.between(5, 50), c.askOrphans)
	}
}

// askOrphans sends the orphans on every open lane (acks are idempotent; a
// node that finds one acked answers OK, one that does not refuses it),
// and again a while later while any is left.
func (c *consumer) askOrphans() {
	if len(c.orphans) == 0 {
		c.askingOrphans = false
		return
	}
	entries := slices.SortedFunc(maps.Values(c.orphans), func(a, b wire.AckEntry) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	for _, l := range c.lanes {
		if l.c == nil || !l.c.open {
			continue
		}
		c.nextCorr++
		l.pending[c.nextCorr] = entries
		l.c.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: entries})
	}
	c.s.w.after(c.s.w.between(200, 500), c.askOrphans)
}

// processMs is how long a consumer works on a message before its ack:
// members take longer, so a rebalance often finds them holding some.
func (c *consumer) processMs() int64 {
	if c.m != nil && !c.polite {
		return c.s.w.between(10, 150)
	}
	return c.s.w.between(0, 20)
}

// ack acks (or nacks) a message on the connection that delivered it; when
// that connection is gone, the ack is given up (the broker redelivers).
func (c *consumer) ack(cn *conn, e wire.AckEntry, nack bool) {
	l := c.laneOf(cn)
	if l == nil || !cn.open {
		return
	}
	if c.m != nil {
		pos := position{e.Partition, e.Seq}
		if h, ok := c.m.held[pos]; !ok || h.id != e.DeliveryID {
			return // given up (revoked or fenced) meanwhile
		}
		delete(c.m.held, pos)
	}
	c.nextCorr++
	if nack {
		cn.send(c.nextCorr, &wire.Nack{Topic: simTopic, Group: simGroup, DelayMs: uint32(c.s.w.between(0, 50)), Entries: []wire.AckEntry{e}})
		return
	}
	l.pending[c.nextCorr] = []wire.AckEntry{e}
	l.unanswered[position{e.Partition, e.Seq}] = e
	cn.send(c.nextCorr, &wire.Ack{Topic: simTopic, Group: simGroup, Entries: []wire.AckEntry{e}})
}

// movesOn reports whether a client should try another node of a cluster:
// this one does not lead (or coordinate) what it asked for.
func movesOn(code wire.Code) bool { return code == wire.CodeNotLeader }
