package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/wire"
)

// ClusterConfig makes a node a member of a cluster (cluster.Config).
type ClusterConfig = cluster.Config

// Member is one node of the initial cluster.
type Member = cluster.Member

// ReplicaView is what a node's member of a replica group says of itself
// (for checkers).
type ReplicaView = cluster.ReplicaView

// openCluster joins the cluster and starts the topics its metadata names.
func (n *Node) openCluster() error {
	c, err := cluster.New(clusterHost{n}, *n.cfg.Cluster, cluster.Options{
		NodeID: n.cfg.NodeID, DataDir: n.cfg.DataDir, ClientAddr: n.cfg.ClientAddr, Env: n.cfg.Env, Logger: n.log,
		Manual: n.cfg.Manual, SegmentBytesMax: n.cfg.SegmentBytesMax, RecordBytesMax: n.cfg.RecordBytesMax,
		RetentionCheckMs: n.cfg.RetentionCheckMs, Replica: n.cfg.Mutations.Replica, SendBeforePersist: n.cfg.Mutations.SendBeforePersist,
		Group: n.cfg.Mutations.Group, DecideBeforeOffice: n.cfg.Mutations.CoordinateBeforeOffice, AnswerWithoutLease: n.cfg.Mutations.CoordinateWithoutLease,
		SaveStateWithoutGroupDeletes: n.cfg.Mutations.MetaStateForgetsGroupDeletes, LoneTornTailSilent: n.cfg.Mutations.LoneTornTailSilent,
		BeforeDrop: n.cfg.ReplicaDropObserver, ObserveGroupApply: n.cfg.GroupApplyObserver,
		ObserveSync: observeSeconds(n.metrics.fsyncSeconds.WithLabelValues("replica")), ObserveCommit: observeSeconds(n.metrics.replicationSeconds)})
	if err != nil {
		return err
	}
	n.cluster = c // partitions open their replica groups through it
	// What a delete left behind when the node stopped midway: meta.json
	// says deleted, so it goes before anything starts.
	c.ReadGroups(func(st *meta.State) {
		n.removeDeletedData(st.DeletedKey)
		n.finishGroupDeletes(st)
	})
	return c.Start()
}

// Replica returns this node's member of a partition's replica group — or
// of the metadata log, for topic meta.MetaTopic — if it hosts one.
func (n *Node) Replica(topic string, partition uint32) (ReplicaView, bool) {
	if n.cluster == nil {
		return ReplicaView{}, false
	}
	return n.cluster.Replica(n.replicaGroup(topic), partition)
}

// HoldUpReplica holds up this node's member of a partition's replica
// group until its monotonic clock reads untilMs (ms), while the rest of
// the node runs (cluster.Cluster.HoldUp: a Manual node, the simulator's
// model of a hung fsync). False: no such member here.
func (n *Node) HoldUpReplica(topic string, partition uint32, untilMs int64) bool {
	if n.cluster == nil {
		return false
	}
	return n.cluster.HoldUp(n.replicaGroup(topic), partition, untilMs)
}

// HoldUpReplicas holds up every member of a replica group this node
// hosts until its monotonic clock reads untilMs
// (cluster.Cluster.HoldUpAll: a Manual node, the simulator's model of a
// hung disk). It returns how many it held up.
func (n *Node) HoldUpReplicas(untilMs int64) int {
	if n.cluster == nil {
		return 0
	}
	return n.cluster.HoldUpAll(untilMs)
}

// replicaGroup is the replica group's name of a topic's partitions: its
// incarnation's key (the metadata log's own name for it).
func (n *Node) replicaGroup(topic string) string {
	if topic != meta.MetaTopic {
		n.mu.RLock()
		if t, ok := n.topics[topic]; ok {
			topic = t.key() // its incarnation's replica group
		}
		n.mu.RUnlock()
	}
	return topic
}

// clusterHost is the node as its cluster.Cluster sees it.
type clusterHost struct{ n *Node }

func (h clusterHost) StartTopic(mt meta.Topic) (bool, error) {
	n := h.n
	tc := mt.Config
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.topics[tc.Name]; ok {
		return false, nil
	}
	t, err := n.startTopic(tc, mt.Placement, mt.Incarnation)
	if err != nil {
		return false, err
	}
	if tc.Name == wire.SchedTopic {
		// Every replica of a shard runs its scheduler (the leader's owns
		// it), from the moment the metadata names the shards.
		if err := n.startSched(t); err != nil {
			return false, err
		}
	}
	return true, nil
}

func (h clusterHost) StopTopic(name string, incarnation uint64, removeData bool) {
	h.n.stopTopic(name, incarnation, removeData)
}

func (h clusterHost) GroupDeleted(name string, incarnation uint64, removeData bool) {
	h.n.groupDeleted(name, incarnation, removeData)
}

func (h clusterHost) TopicUpdated(t meta.Topic) { h.n.topicUpdated(t.Config, t.Incarnation) }

func (h clusterHost) GroupSettingsUpdated(st meta.GroupSettings) { h.n.groupSettingsUpdated(st.Group) }

func (h clusterHost) PublishLocal(pub *wire.Pub, incarnation uint64, reply func(wire.PubOK, *wire.Error)) {
	h.n.publishInto(pub, incarnation, reply, nil)
}

func (h clusterHost) LogRepeatedError(subject, msg string, args ...any) {
	h.n.logRepeatedError(subject, msg, args...)
}

func (h clusterHost) MetadataApplied() {
	if m := h.n.members; m != nil {
		m.changes.Add(1)
	}
	h.n.pokeGroups()
}

// observeSeconds is a histogram as a duration observer.
func observeSeconds(h prometheus.Observer) func(time.Duration) {
	return func(d time.Duration) { h.Observe(d.Seconds()) }
}
