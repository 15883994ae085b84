package node

import (
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

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
		if st.Role == replica.Leader || st.Leader == 0 || st.Leader == c.Self() {
			n.publish(pub, reply, nil) // leads, or no leader known: its answer says so
			return
		}
		target = st.Leader
	} else {
		group := t.placement[p.id]
		target = replica.NodeID(group[attempt%len(group)])
	}
	c.ForwardPublish(target, pub, reply)
}
