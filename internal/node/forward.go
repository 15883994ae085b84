package node

import (
	"github.com/nereus-broker/nereus/internal/wire"
)

// publishToLeader publishes pub (a fixed partition) on this node if it
// leads that partition, else forwards it to the leader it knows of. A
// partition this node does not host goes to one of its replicas, the
// attempt-th in turn, so that retries reach the leader without a hint.
// incarnation, when not 0, is the only incarnation of the topic pub may
// land in (publishInto), here or at the leader.
func (n *Node) publishToLeader(pub *wire.Pub, incarnation uint64, attempt int, reply PubReply) {
	t, err := n.topic(pub.Topic)
	if err != nil || pub.Partition < 0 || int(pub.Partition) >= len(t.partitions) {
		n.publishInto(pub, incarnation, reply, nil) // answers with the error
		return
	}
	target, ok := t.partitions[pub.Partition].store.forwardTo(attempt)
	if !ok {
		n.publishInto(pub, incarnation, reply, nil) // this node answers: it leads, is alone, or knows no leader
		return
	}
	n.cluster.ForwardPublish(target, pub, incarnation, reply)
}
