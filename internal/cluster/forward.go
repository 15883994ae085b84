package cluster

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
	reply func(wire.PubOK, *wire.Error)
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

// ForwardPublish sends pub to node to and arranges for reply to be called
// exactly once: with its answer, or UNAVAILABLE when it cannot be sent or
// no answer comes within DeclareTimeout. incarnation, when not 0, binds
// it to that incarnation of its topic (wire.PeerPublish).
func (c *Cluster) ForwardPublish(to replica.NodeID, pub *wire.Pub, incarnation uint64, reply func(wire.PubOK, *wire.Error)) {
	id := c.reqID.Add(1)
	fp := &c.pubForwards
	f := &forwardedPub{reply: reply}
	fp.mu.Lock()
	if fp.pending == nil {
		fp.pending = map[uint64]*forwardedPub{}
	}
	fp.pending[id] = f
	f.timer = c.opts.Env.Clock.AfterFunc(c.cfg.DeclareTimeout, func() {
		if f := fp.take(id); f != nil {
			f.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: leader %s did not answer in %v; retry",
				pub.Topic, pub.Partition, c.Name(to), c.cfg.DeclareTimeout))
		}
	})
	fp.mu.Unlock()
	if !c.tr.Send(uint32(to), &wire.PeerPublish{ReqID: id, Incarnation: incarnation, Pub: *pub}) {
		if f := fp.take(id); f != nil {
			f.reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: leader %s unreachable; retry",
				pub.Topic, pub.Partition, c.Name(to)))
		}
	}
}

// servePublish publishes a forwarded PUB here and sends the answer back.
// It does not forward again: a node that no longer leads answers
// NOT_LEADER and the sender retries with its newer view.
func (c *Cluster) servePublish(from uint32, f *wire.PeerPublish) {
	publish := func() {
		c.host.PublishLocal(&f.Pub, f.Incarnation, func(ok wire.PubOK, err *wire.Error) {
			answer := &wire.PeerPublishOK{ReqID: f.ReqID, OK: ok}
			if err != nil {
				answer.Code, answer.Message = err.Code, err.Message
			}
			c.tr.Send(from, answer)
		})
	}
	if c.opts.Manual {
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
func (c *Cluster) publishAnswered(f *wire.PeerPublishOK) {
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
func (c *Cluster) failForwardedPublishes() {
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
