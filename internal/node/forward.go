package node

import (
	"sync"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Publishes a node makes itself (dead letters) go to the leader of their
// partition, which in a cluster may be another node: publishToLeader
// forwards them over the peer transport (PEER_PUBLISH), and the leader
// answers with the PUB_OK or the error (PEER_PUBLISH_OK). A forwarded PUB
// keeps its producer identity, so a retry after a lost answer, a timeout
// or a leader change is deduplicated by whichever node leads by then.

// forwardedPubs are the forwarded publishes waiting for an answer.
type forwardedPubs struct {
	mu      sync.Mutex
	pending map[uint64]*forwardedPub
}

type forwardedPub struct {
	reply PubReply
	timer env.Timer // answers UNAVAILABLE if the leader does not
}

// take removes and returns the forwarded publish id, or nil if it was
// answered already (each is answered exactly once).
func (fp *forwardedPubs) take(id uint64) *forwardedPub {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	f := fp.pending[id]
	delete(fp.pending, id)
	if f != nil {
		f.timer.Stop()
	}
	return f
}

// publishToLeader publishes pub (a fixed partition) on this node if it
// leads that partition, else forwards it to the leader it knows of. A
// partition this node does not host goes to one of its replicas, the
// attempt-th in turn, so that retries reach the leader without a hint.
func (n *Node) publishToLeader(pub *wire.Pub, attempt int, reply PubReply) {
	c := n.cluster
	t, err := n.topic(pub.Topic)
	if c == nil || err != nil || pub.Partition < 0 || int(pub.Partition) >= len(t.partitions) {
		n.publish(pub, reply, nil) // answers with the error, or publishes locally
		return
	}
	p := t.partitions[pub.Partition]
	var target replica.NodeID
	if p.repl != nil {
		st := p.repl.Status()
		if st.Role == replica.Leader || st.Leader == 0 || st.Leader == c.self {
			n.publish(pub, reply, nil) // leads, or no leader known: its answer says so
			return
		}
		target = st.Leader
	} else {
		group := t.placement[p.id]
		target = replica.NodeID(group[attempt%len(group)])
	}
	c.forwardPublish(target, pub, reply)
}

// forwardPublish sends pub to node to and arranges for reply to be called
// exactly once: with its answer, or UNAVAILABLE when it cannot be sent or
// no answer comes within DeclareTimeout.
func (c *cluster) forwardPublish(to replica.NodeID, pub *wire.Pub, reply PubReply) {
	id := c.reqID.Add(1)
	fp := &c.pubForwards
	f := &forwardedPub{reply: reply}
	fp.mu.Lock()
	if fp.pending == nil {
		fp.pending = map[uint64]*forwardedPub{}
	}
	fp.pending[id] = f
	f.timer = c.n.cfg.Env.Clock.AfterFunc(c.cfg.DeclareTimeout, func() {
		if f := fp.take(id); f != nil {
			f.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: leader %s did not answer in %v; retry",
				pub.Topic, pub.Partition, c.name(to), c.cfg.DeclareTimeout))
		}
	})
	fp.mu.Unlock()
	if !c.tr.Send(uint32(to), &wire.PeerPublish{ReqID: id, Pub: *pub}) {
		if f := fp.take(id); f != nil {
			f.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: leader %s unreachable; retry",
				pub.Topic, pub.Partition, c.name(to)))
		}
	}
}

// servePublish publishes a forwarded PUB here and sends the answer back.
// It does not forward again: a node that no longer leads answers
// NOT_LEADER and the sender retries with its newer view.
func (c *cluster) servePublish(from uint32, f *wire.PeerPublish) {
	publish := func() {
		c.n.publish(&f.Pub, func(ok wire.PubOK, err *wire.Error) {
			answer := &wire.PeerPublishOK{ReqID: f.ReqID, OK: ok}
			if err != nil {
				answer.Code, answer.Message = err.Code, err.Message
			}
			c.tr.Send(from, answer)
		}, nil)
	}
	if c.n.cfg.Manual {
		publish() // queues, never blocks
		return
	}
	c.wg.Add(1)
	go func() { // Publish may block while the partition's queue is full
		defer c.wg.Done()
		publish()
	}()
}

// publishAnswered completes a forwarded publish.
func (c *cluster) publishAnswered(f *wire.PeerPublishOK) {
	fwd := c.pubForwards.take(f.ReqID)
	if fwd == nil {
		return // timed out before: the sender retries, deduplicated
	}
	if f.Code != wire.CodeOK {
		fwd.reply(wire.PubOK{}, wire.Errorf(f.Code, "%s", f.Message))
		return
	}
	fwd.reply(f.OK, nil)
}

// failForwardedPublishes answers every forwarded publish still waiting
// (the node is closing).
func (c *cluster) failForwardedPublishes() {
	fp := &c.pubForwards
	fp.mu.Lock()
	ids := make([]uint64, 0, len(fp.pending))
	for id := range fp.pending {
		ids = append(ids, id)
	}
	fp.mu.Unlock()
	for _, id := range ids {
		if f := fp.take(id); f != nil {
			f.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
		}
	}
}
