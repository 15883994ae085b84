package node

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are one node's Prometheus metrics, in a registry of their own (no
// global state, so tests can run several nodes in one process).
type Metrics struct {
	Registry *prometheus.Registry

	publishes    *prometheus.CounterVec
	publishBytes *prometheus.CounterVec
	fsyncSeconds *prometheus.HistogramVec
	// replicationSeconds: a replicated proposal, from its member taking it
	// to its commit.
	replicationSeconds prometheus.Histogram
	commitBatch        prometheus.Histogram
	deliveries         *prometheus.CounterVec
	redeliveries       *prometheus.CounterVec
	acks               *prometheus.CounterVec
	deadLetters        *prometheus.CounterVec
	scrubBytes         prometheus.Counter
	scrubDamage        prometheus.Counter
	// dedupCarries: dedup carries committed by this node as a partition's
	// leader (dedupcarry.go).
	dedupCarries *prometheus.CounterVec
	// groupCarries: consumer groups' checkpoints this node re-stated at
	// a partition's tail as its leader (groupcarry.go).
	groupCarries *prometheus.CounterVec
	// The scheduler's publishes, counted by the shard owner that made
	// them: acknowledged by the destination (a deduplicated retry too),
	// recorded UNKNOWN, and how late an acknowledged one was.
	schedPublished *prometheus.CounterVec
	schedUnknown   *prometheus.CounterVec
	schedLateness  prometheus.Histogram
	// KV buckets: writes acknowledged, watches ended CURSOR_EXPIRED,
	// checkpoints the leader wrote, and rebuilds of a replica's bucket from
	// a checkpoint in its log.
	kvWrites      *prometheus.CounterVec
	kvExpired     *prometheus.CounterVec
	kvCheckpoints *prometheus.CounterVec
	kvRebuilds    *prometheus.CounterVec
	// Connections, ConnectionsRefused and AuthFailures are maintained by
	// the server.
	Connections        prometheus.Gauge
	ConnectionsRefused prometheus.Counter
	AuthFailures       prometheus.Counter
}

func newMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_publish_records_total", Help: "Records appended, made durable and acknowledged."}, []string{"topic"}),
		publishBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_publish_bytes_total", Help: "Key and value bytes of acknowledged records."}, []string{"topic"}),
		fsyncSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nereus_fsync_seconds", Help: "Latency of fsync calls by file kind (log: a single-replica partition's, ledger, replica: a replica group member's log).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)}, []string{"kind"}),
		replicationSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nereus_replication_seconds", Help: "Replicated records on their leader, from the replica group member taking the proposal to its commit (a quorum fsynced it).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)}),
		scrubBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nereus_scrub_bytes_total", Help: "Bytes of sealed log segments the scrubber re-verified."}),
		scrubDamage: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nereus_scrub_damage_found_total", Help: "Damaged ranges the scrubber found."}),
		dedupCarries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_dedup_carries_total", Help: "Dedup carries this node committed as a replicated partition's leader: control records that keep producers in the log when compaction would remove their last records (cluster only)."}, []string{"topic", "partition"}),
		groupCarries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_group_carries_total", Help: "Consumer groups' checkpoints this node re-stated at a replicated partition's tail as its leader, for groups no runner delivers there, so that they do not hold retention back (cluster only)."}, []string{"topic", "partition"}),
		commitBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nereus_group_commit_records", Help: "Records made durable by one partition log fsync.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_deliveries_total", Help: "MSG frames sent to consumers."}, []string{"topic", "group"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_redeliveries_total", Help: "Deliveries after the first of the same record."}, []string{"topic", "group"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_acks_total", Help: "Acks recorded in group ledgers."}, []string{"topic", "group"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_dead_letters_total", Help: "Records moved to a dead-letter topic after max deliveries."}, []string{"topic", "group"}),
		schedPublished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_sched_published_total", Help: "Scheduled messages their destination acknowledged, counted by the shard owner that published them (a retry the destination deduplicated counts again)."}, []string{"topic"}),
		schedUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_sched_unknown_total", Help: "Scheduled publishes whose outcome the destination could no longer prove (its dedup window moved past them): recorded UNKNOWN."}, []string{"topic"}),
		schedLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nereus_sched_lateness_seconds", Help: "How long after its deliver_at a scheduled message was acknowledged by its destination.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 22)}),
		kvWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_kv_writes_total", Help: "KV writes (put, delete, CAS) this node acknowledged as the bucket's leader."}, []string{"bucket"}),
		kvExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_kv_watch_expired_total", Help: "KV watches this node ended CURSOR_EXPIRED (their next revision below the floor: purged, lost to a repair, or of a deleted bucket)."}, []string{"bucket"}),
		kvCheckpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_kv_checkpoints_total", Help: "Checkpoints of a bucket this node wrote into its log as the leader (the log is truncated through them)."}, []string{"bucket"}),
		kvRebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nereus_kv_rebuilds_total", Help: "Times this node's replica of a bucket was rebuilt from a checkpoint in its log."}, []string{"bucket"}),
		Connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nereus_client_connections", Help: "Open client connections."}),
		ConnectionsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nereus_client_connections_refused_total", Help: "Client connections refused because the node had its maximum open."}),
		AuthFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nereus_auth_failures_total", Help: "Connections rejected with AUTH_FAILED."}),
	}
	m.Registry.MustRegister(m.scrubBytes, m.scrubDamage, m.dedupCarries, m.groupCarries, m.publishes, m.publishBytes, m.fsyncSeconds, m.replicationSeconds, m.commitBatch, m.deliveries,
		m.redeliveries, m.acks, m.deadLetters, m.schedPublished, m.schedUnknown, m.schedLateness,
		m.kvWrites, m.kvExpired, m.kvCheckpoints, m.kvRebuilds, m.Connections, m.ConnectionsRefused, m.AuthFailures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) registerNode(n *Node) {
	m.Registry.MustRegister(&stateCollector{n: n})
}

var (
	lagDesc = prometheus.NewDesc("nereus_consumer_lag_records",
		"Visible records a group has not acknowledged (commit_seq - ack_floor + 1).",
		[]string{"topic", "group", "partition"}, nil)
	commitDesc = prometheus.NewDesc("nereus_partition_commit_seq",
		"Last visible seq of a partition.", []string{"topic", "partition"}, nil)
	startDesc = prometheus.NewDesc("nereus_partition_start_seq",
		"Oldest retained seq of a partition.", []string{"topic", "partition"}, nil)
	epochDesc = prometheus.NewDesc("nereus_partition_epoch",
		"Leader epoch of a partition as this node knows it.", []string{"topic", "partition"}, nil)
	leaderDesc = prometheus.NewDesc("nereus_partition_leader",
		"1 when this node leads the partition's replica group (cluster only).", []string{"topic", "partition"}, nil)
	corruptDesc = prometheus.NewDesc("nereus_partition_corrupt",
		"1 when this node found damage in the partition's log: it refuses publishes until `nereus repair`.", []string{"topic", "partition"}, nil)
	readOnlyDesc = prometheus.NewDesc("nereus_partition_read_only",
		"1 when this node leads the partition and is READ_ONLY_DEGRADED (cluster only).", []string{"topic", "partition"}, nil)
	droppedDesc = prometheus.NewDesc("nereus_replication_dropped_messages_total",
		"Replication messages this node's replica dropped because its inbound queue was full (cluster only).", []string{"topic", "partition"}, nil)
	uncertainDesc = prometheus.NewDesc("nereus_replica_uncertain",
		"1 while this node's replica may lack entries it acknowledged (it cut an invalid last batch nothing proved torn): its election votes count for less until a newer leader has made it whole (cluster only).", []string{"topic", "partition"}, nil)
	promiseLostDesc = prometheus.NewDesc("nereus_replica_promise_lost",
		"1 while this node's replica, whose hard state was damaged, waits for every other replica's promise: it takes no part in the group meanwhile (cluster only).", []string{"topic", "partition"}, nil)
	groupMembersDesc = prometheus.NewDesc("nereus_group_members",
		"JOINed members of a consumer group, as this node has applied the metadata.", []string{"group"}, nil)
	groupMembershipEpochDesc = prometheus.NewDesc("nereus_group_membership_epoch",
		"Membership changes of a consumer group (joins, leaves, fences).", []string{"group"}, nil)
	groupAssignmentEpochDesc = prometheus.NewDesc("nereus_group_assignment_epoch",
		"Assignment steps of a consumer group that gave partitions new owners.", []string{"group"}, nil)
	groupPendingDesc = prometheus.NewDesc("nereus_group_pending_notices",
		"NOTICEs of a consumer group its members have not acknowledged yet (a rebalance in progress).", []string{"group"}, nil)
	schedPendingDesc = prometheus.NewDesc("nereus_sched_pending",
		"Schedules not yet fired in a scheduler shard this node owns (ACTIVE), spilled ones included.", []string{"shard"}, nil)
	schedLanesDesc = prometheus.NewDesc("nereus_sched_lanes",
		"Destination lanes of the scheduler shards this node owns, by admission gate and runtime readiness.", []string{"gate", "readiness"}, nil)
	rebuildsDesc = prometheus.NewDesc("nereus_replication_rebuilds_total",
		"Times this node's replica rebuilt from its leader's snapshot point because the entries it needed were compacted (cluster only).", []string{"topic", "partition"}, nil)
)

// stateCollector reads partition and group positions at scrape time.
type stateCollector struct{ n *Node }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- commitDesc
	ch <- startDesc
	ch <- epochDesc
	ch <- leaderDesc
	ch <- readOnlyDesc
	ch <- corruptDesc
	ch <- droppedDesc
	ch <- rebuildsDesc
	ch <- uncertainDesc
	ch <- promiseLostDesc
	ch <- groupMembersDesc
	ch <- groupMembershipEpochDesc
	ch <- groupAssignmentEpochDesc
	ch <- groupPendingDesc
	ch <- schedPendingDesc
	ch <- schedLanesDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.n.members != nil {
		for _, g := range c.n.GroupStates() {
			ch <- prometheus.MustNewConstMetric(groupMembersDesc, prometheus.GaugeValue, float64(len(g.Members)), g.Name)
			ch <- prometheus.MustNewConstMetric(groupMembershipEpochDesc, prometheus.GaugeValue, float64(g.MembershipEpoch), g.Name)
			ch <- prometheus.MustNewConstMetric(groupAssignmentEpochDesc, prometheus.GaugeValue, float64(g.AssignmentEpoch), g.Name)
			ch <- prometheus.MustNewConstMetric(groupPendingDesc, prometheus.GaugeValue, float64(len(g.Notices)), g.Name)
		}
	}
	c.n.collectSched(ch)
	c.n.mu.RLock()
	defer c.n.mu.RUnlock()
	for name, t := range c.n.topics {
		for _, p := range t.partitions {
			part := itoa(p.id)
			ch <- prometheus.MustNewConstMetric(commitDesc, prometheus.GaugeValue, float64(p.commitSeq.Load()), name, part)
			ch <- prometheus.MustNewConstMetric(startDesc, prometheus.GaugeValue, float64(p.startSeq.Load()), name, part)
			ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(p.epoch.Load()), name, part)
			ch <- prometheus.MustNewConstMetric(corruptDesc, prometheus.GaugeValue, boolGauge(p.damage.Load() != nil), name, part)
			p.store.collect(ch, name, part)
		}
	}
	for key, g := range c.n.groups {
		for i, p := range g.topic.partitions {
			if !g.delivering[i].Load() {
				continue // another node's (a cluster's leader of it)
			}
			commit, floor := p.commitSeq.Load(), g.floors[i].Load()
			lag := 0.0
			if commit+1 > floor {
				lag = float64(commit + 1 - floor)
			}
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, key.topic, key.group, itoa(uint32(i)))
		}
	}
}

func itoa(v uint32) string {
	const digits = "0123456789"
	if v == 0 {
		return "0"
	}
	var b [10]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = digits[v%10]
		v /= 10
	}
	return string(b[i:])
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// PartitionValue is what a scrape of the registry reports for the gauge or
// counter name of (topic, partition), or -1 when it reports none — one
// number read the way an operator's dashboard reads it (tests use it).
func (m *Metrics) PartitionValue(name, topic string, partition uint32) (float64, error) {
	return m.Value(name, map[string]string{"topic": topic, "partition": strconv.FormatUint(uint64(partition), 10)})
}

// Value is what a scrape of the registry reports for the gauge or counter
// name whose labels include want, or -1 when it reports none.
func (m *Metrics) Value(name string, want map[string]string) (float64, error) {
	families, err := m.Registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			if g := metric.GetGauge(); g != nil {
				return g.GetValue(), nil
			}
			return metric.GetCounter().GetValue(), nil
		}
	}
	return -1, nil
}
