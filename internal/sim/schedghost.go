package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The scheduled-delivery workload's ghost (ClusterOptions.Schedules): the
// destination outage fault, and the checks of the scheduler's invariants
// the simulator verifies from its global view of the cluster.
//
// A destination outage (ClusterFaults.Outage) makes one of the two
// destination topics unreachable for 300 ms to 2.5 s
// (ClusterOptions.SchedOutageMsMax): every replication
// frame of that topic's replica groups, and every publish forwarded to
// one of its leaders, is lost on the simulated peer network. Its leaders
// lose their quorum (a publish to one times out, QUORUM_LOST or
// READ_ONLY_DEGRADED) and its followers cannot elect; a forwarded publish
// is answered UNAVAILABLE after the forward timeout. It is what a topic
// placed on machines the rest of the cluster cannot reach looks like to
// the shard owners — with three nodes every topic has a replica on every
// node, so the cut is drawn per topic instead of per machine. Everything
// else crosses as usual: the metadata log, the shards, the other topic,
// client connections.
//
// The checks:
//   - NoPublishWithoutBothGates, at the instant of every publish of a due
//     message (node.Config.SchedPublishObserver): the publishing node's
//     replica of the shard leads it in the epoch the publish claims, with
//     its lease not run out on its clock (replog.Log.LeaseLeft: what its
//     lease guard must close on, even while the member is held up); and
//     no node has taken office for the shard in a later
//     epoch — now, or ever before in the run (the ghost keeps the highest
//     epoch any node was seen leading the shard in, crashed ones too).
//     The ghost cannot see the Source Assignment apart from the lease: in
//     a cluster it is the shard's placement, and a node without a replica
//     of the shard has no runner (checked: the replica exists).
//   - NoPublishBeforeIntent, FireSeqNeverReused and
//     NoPublishOnStaleEvidence at the same instant (see
//     publishedAfterIntent and publishedOnFreshEvidence).
//   - BlockedLaneIsolated (and its plain form, ScheduledOnTime): an
//     acknowledged schedule is published (its message committed and read
//     at some node) no later than schedLateMsMax (1 s) after the latest
//     of: its due time by its owner's clock (deliver_at plus the owner's
//     backward clock skew); the start of the current quiet stretch of its
//     shard and lane; and, when the lane's last publish before the
//     stretch was sent before its trouble ended (it may have been lost),
//     that publish's instant plus the forward timeout (2 s), after which
//     the owner sends it again. A quiet stretch is: no fault active but
//     the outage of another destination (quietCluster), one node's
//     replica of the shard leads it with its lease and its owner is
//     ACTIVE, and every partition of its destination has a leader with
//     its lease that is not read-only. It is
//     named BlockedLaneIsolated while the shard's other lane is BLOCKED at
//     its owner or its destination is out.
//   - IntakeNeverBlocked: a SCHEDULE sent to the shard's ACTIVE owner (its
//     replica leads with its lease, hence a quorum) while the cluster is
//     quiet is answered SCHEDULE_OK within schedIntakeMsMax — whatever any
//     lane's state — unless the quiet stretch or that owner's office ends
//     first, or the client's connection breaks.
const (
	// schedLateMsMax covers a probe, an intent committed and a publish
	// committed.
	schedLateMsMax = 1000
	// schedLostPublishMs: a publish that may have been lost in flight (to
	// a destination leader that died or was cut off) is answered only by
	// the forward timeout (node.ClusterConfig.DeclareTimeout) before its
	// owner sends it again.
	schedLostPublishMs = int64(clusterDeclareTimeout / time.Millisecond)
	schedIntakeMsMax   = 1000
	// schedClockSettleMs: after a clock jump of d ms the cluster is not
	// quiet for |d| + this (the node's wall-clock work — due times, its
	// runners' timers — shifts by d; its replication ticks and leases run
	// on its monotonic clock, which does not jump).
	schedClockSettleMs = 2000
	// schedEvidenceMs is how long the shell trusts a probe's answer
	// (node's schedEvidenceMs): a READY certificate's validity.
	schedEvidenceMs = 5000
	// schedOutageMsMaxDefault bounds a destination outage
	// (ClusterOptions.SchedOutageMsMax).
	schedOutageMsMaxDefault = 2500
)

type schedGhost struct {
	// restored: runners whose state a checkpoint loaded (compacted).
	restored    map[schedRestored]bool
	s           *sim
	sc          *schedClient
	outageMsMax int64 // ClusterOptions.SchedOutageMsMax
	// office: by shard, the highest epoch any node was seen leading the
	// shard in.
	office [node.SchedShards]uint64
	// owner: by shard, the node (index+1, 0: none) whose owner is ACTIVE
	// with its replica leading and its lease open, and its epoch; ownerGen
	// counts its changes.
	owner      [node.SchedShards]schedOffice
	ownerGen   [node.SchedShards]int
	ownerViews [node.SchedShards]node.SchedShardView // the owner's, as last observed
	// quiet: no fault is active but a destination outage; quietGen counts
	// the quiet stretches. skews are the nodes' clock skews last seen, and
	// settleUntil ends the last clock jump's disturbance.
	quiet       bool
	quietGen    int
	skews       []int64
	settleUntil int64
	// onTimeFrom: by schedule, when its shard and lane became quiet (the
	// current stretch); absent when they are not.
	onTimeFrom map[int]int64
	intake     map[int]intakeProbe
	// fires: which schedule each producer identity's fire sequence was
	// published for.
	fires map[schedFire]uint64
	// readiness: each (shard, lane)'s readiness at its current owner, to
	// count its changes.
	readiness map[schedLane]sched.Readiness
	// writableAt: by node and destination, when (by that node's clock)
	// its view last showed every partition of the destination with a
	// leader, not read-only and not corrupt — what a probe there answers
	// Writable on.
	writableAt map[schedView]int64
	// lanePubMs: each lane's last publish; troubleMs: when each
	// destination was last unhealthy or the cluster not quiet.
	lanePubMs map[schedLane]int64
	troubleMs map[string]int64
	stats     map[string]int
}

type schedView struct {
	node  int
	topic string
}

type schedLane struct {
	shard uint32
	topic string
}

type schedOffice struct {
	node  int
	epoch uint64
}

// intakeProbe is a SCHEDULE sent to its shard's active owner while the
// cluster was quiet.
type intakeProbe struct {
	at        int
	attempt   uint32 // the send it is (schedClient.attempts)
	sentMs    int64
	quietGen  int
	ownerGen  int
	duringOut bool
}

// schedRestored is a shard's runner in one incarnation of a node.
type schedRestored struct {
	b           *broker
	shard       uint32
	incarnation int
}

// compacted counts what a runner saw of its shard's compaction
// (node.Config.SchedCompactObserver) and notes the runners whose state
// was restored from a checkpoint: their publishes are counted apart.
func (g *schedGhost) compacted(b *broker, shard uint32, ev string) {
	g.stats["shard "+ev]++
	if ev == "restored" || ev == "rebuilt" {
		g.restored[schedRestored{b, shard, b.started}] = true
	}
}

func newSchedGhost(s *sim, sc *schedClient) *schedGhost {
	return &schedGhost{s: s, sc: sc, skews: make([]int64, len(s.nodes)), onTimeFrom: map[int]int64{}, intake: map[int]intakeProbe{},
		fires: map[schedFire]uint64{}, readiness: map[schedLane]sched.Readiness{}, writableAt: map[schedView]int64{},
		lanePubMs: map[schedLane]int64{}, troubleMs: map[string]int64{}, stats: map[string]int{}, restored: map[schedRestored]bool{}}
}

// destinationOutage cuts one destination topic off (see above) for a
// while; one at a time.
func (g *schedGhost) destinationOutage() {
	if g.s.net.outTopic != "" {
		return
	}
	t := schedDestTopics[g.s.w.rng.IntN(len(schedDestTopics))]
	g.s.net.outTopic = t
	g.stats["destination outages"]++
	g.s.w.tracef("fault destination %s unreachable", t)
	g.s.w.after(g.s.w.between(300, cmp.Or(g.outageMsMax, schedOutageMsMaxDefault)), func() {
		if g.s.net.outTopic == t {
			g.s.net.outTopic = ""
			g.s.w.tracef("heal destination %s", t)
		}
	})
}

// published is node b's SchedPublishObserver: NoPublishWithoutBothGates
// and the other publish-instant checks, as b publishes schedule p of
// shard.
func (g *schedGhost) published(b *broker, shard uint32, p sched.Publish) {
	g.stats["publishes"]++
	if g.restored[schedRestored{b, shard, b.started}] {
		g.stats["publishes from a state restored from a checkpoint"]++
	}
	g.lanePubMs[schedLane{shard, p.Topic}] = g.s.w.nowMs
	if g.s.chk.violation != nil {
		return
	}
	v, ok := b.node.Replica(wire.SchedTopic, shard)
	switch {
	case !ok:
		g.s.chk.violate("NoPublishWithoutBothGates", "%s published schedule %d of shard %d with no replica of the shard", b.id, p.ID, shard)
	case v.Status.Role != replica.Leader || v.Status.Hard.Promised != p.Epoch:
		g.s.chk.violate("NoPublishWithoutBothGates", "%s published schedule %d of shard %d for epoch %d, but its replica is %v in epoch %d",
			b.id, p.ID, shard, p.Epoch, v.Status.Role, v.Status.Hard.Promised)
	case v.LeaseLeft <= 0:
		g.s.chk.violate("NoPublishWithoutBothGates", "%s published schedule %d of shard %d in epoch %d with its lease run out on its clock (lease guard closed; its clock skew %d ms)",
			b.id, p.ID, shard, p.Epoch, b.skewMs)
	default:
		g.observeOffices()
		if later := g.office[shard]; later > p.Epoch {
			g.s.chk.violate("NoPublishWithoutBothGates", "%s published schedule %d of shard %d in epoch %d after a node took office in epoch %d",
				b.id, p.ID, shard, p.Epoch, later)
			return
		}
		g.publishedAfterIntent(b, shard, p)
		g.publishedOnFreshEvidence(b, shard, p)
		g.sc.pauser.published(b, shard, p.ID, p.Topic)
		g.sc.pauser.publishedInto(b, shard, p.ID, p.Topic, p.Incarnation)
	}
}

// publishedOnFreshEvidence is NoPublishOnStaleEvidence at the instant
// node b publishes schedule p of shard: b's view showed the destination
// writable less than schedEvidenceMs ago by b's clock. A READY
// certificate comes from a probe that found it writable and lasts
// schedEvidenceMs, so a publish later than that after the view last
// showed it writable used an expired certificate. (The view is sampled
// at each shard's active owner after every event, and at each publish: a
// view writable only inside one event, or while its node was not an
// active owner by the ghost's reckoning, is missed — a probe then would be
// flagged wrongly; it has not happened.)
func (g *schedGhost) publishedOnFreshEvidence(b *broker, shard uint32, p sched.Publish) {
	ni := slices.Index(g.s.nodes, b)
	g.sampleWritable(ni, b)
	at, ok := g.writableAt[schedView{ni, p.Topic}]
	if now := b.w.nowMs + b.skewMs; !ok || now-at >= schedEvidenceMs {
		g.s.chk.violate("NoPublishOnStaleEvidence", "%s published schedule %d of shard %d to %s, which its view has not shown writable for %d ms (evidence lasts %d ms)",
			b.id, p.ID, shard, p.Topic, now-at, schedEvidenceMs)
	}
}

// sampleWritable notes which destinations node ni's view shows writable
// now (as node.schedRunner.evidence judges it).
func (g *schedGhost) sampleWritable(ni int, b *broker) {
	for _, t := range b.node.Metadata(schedDestTopics[:]) {
		writable := len(t.Partitions) > 0
		for _, p := range t.Partitions {
			writable = writable && p.State != wire.PartitionStateCorrupt && !p.ReadOnly && p.Leader != ""
		}
		if writable {
			g.writableAt[schedView{ni, t.Config.Name}] = b.w.nowMs + b.skewMs
		}
	}
}

// publishedAfterIntent is NoPublishBeforeIntent and FireSeqNeverReused at
// the instant node b publishes schedule p of shard: b's runner has
// applied (so the shard committed) an intent for p with its fire
// sequence; and no other schedule of the run was ever published with the
// same producer identity (shard, topic, partition) and fire sequence.
func (g *schedGhost) publishedAfterIntent(b *broker, shard uint32, p sched.Publish) {
	e, ok := b.node.SchedEntry(shard, p.ID)
	if !ok || e.Status != sched.StatusFiring || e.FireSeq != p.FireSeq || e.Topic != p.Topic || e.Partition != p.Partition {
		g.s.chk.violate("NoPublishBeforeIntent", "%s published schedule %d of shard %d to %s/%d with fire sequence %d, but its applied state holds no such committed intent (%+v)",
			b.id, p.ID, shard, p.Topic, p.Partition, p.FireSeq, e)
		return
	}
	k := schedFire{shard, p.Topic, p.Partition, p.FireSeq}
	if id, ok := g.fires[k]; ok && id != p.ID {
		g.s.chk.violate("FireSeqNeverReused", "%s published schedule %d of shard %d to %s/%d with fire sequence %d, which schedule %d was published with",
			b.id, p.ID, shard, p.Topic, p.Partition, p.FireSeq, id)
		return
	}
	g.fires[k] = p.ID
}

// schedFire is a producer identity of the scheduler, (shard, topic,
// partition), and a fire sequence.
type schedFire struct {
	shard     uint32
	topic     string
	partition uint32
	seq       uint64
}

// observeOffices keeps the highest epoch any node led each shard in, and
// each shard's current active owner.
func (g *schedGhost) observeOffices() {
	var owners [node.SchedShards]schedOffice
	for ni, b := range g.s.nodes {
		if !b.up {
			continue
		}
		var views []node.SchedShardView // read only for a leader with its lease
		for shard := range g.office {
			v, ok := b.node.Replica(wire.SchedTopic, uint32(shard))
			if !ok || v.Status.Role != replica.Leader {
				continue
			}
			g.office[shard] = max(g.office[shard], v.Status.Hard.Promised)
			if v.LeaseLeft <= 0 || v.Status.ReadOnly || b.paused() {
				continue
			}
			if views == nil {
				views = b.node.SchedViews()
			}
			for _, sv := range views {
				if sv.Shard == uint32(shard) && sv.Lifecycle == sched.Active && sv.Epoch == v.Status.Hard.Promised {
					owners[shard] = schedOffice{node: ni + 1, epoch: sv.Epoch}
					g.ownerViews[shard] = sv
				}
			}
		}
	}
	for shard := range owners {
		if owners[shard] != g.owner[shard] {
			g.owner[shard] = owners[shard]
			g.ownerGen[shard]++
		}
	}
}

// quietCluster reports whether no fault is active but a destination
// outage: every node up and running, no link cut, no lossy network, no
// failing or stalled disk, no clock jump settling. (An armed kill point is not a
// fault until it fires; a client fault does not touch the scheduler's
// publishes, and voids an intake probe on the broken connection.)
func (g *schedGhost) quietCluster() bool {
	s := g.s
	for i, b := range s.nodes {
		if b.skewMs != g.skews[i] {
			g.settleUntil = max(g.settleUntil, s.w.nowMs+abs(b.skewMs-g.skews[i])+schedClockSettleMs)
			g.skews[i] = b.skewMs
		}
	}
	if s.w.nowMs < g.settleUntil || s.net.anyCut() || s.net.dropP > 0 || s.net.dupP > 0 || s.net.delayP > 0 {
		return false
	}
	for _, b := range s.nodes {
		if !b.up || b.paused() || b.stalled() || b.fsyncErrorP > 0 || b.writeErrorP > 0 {
			return false
		}
	}
	return true
}

func abs(v int64) int64 { return max(v, -v) }

// healthy reports whether every partition of destination topic t has a
// leader holding its lease and not read-only, and t is not out.
func (g *schedGhost) healthy(t string) bool {
	if t == g.s.net.outTopic {
		return false
	}
	for p := range uint32(2) {
		led := false
		for _, b := range g.s.nodes {
			if !b.up {
				continue
			}
			v, ok := b.node.Replica(t, p)
			led = led || ok && v.Status.Role == replica.Leader && v.LeaseLeft > 0 && !v.Status.ReadOnly
		}
		if !led {
			return false
		}
	}
	return true
}

// watch runs after every event of a cluster run with schedules.
func (g *schedGhost) watch() {
	s := g.s
	if s.chk.violation != nil {
		return
	}
	g.observeOffices()
	g.sc.pauser.watchIncarnations()
	for _, o := range g.owner {
		// Only an active owner probes: one that becomes active is
		// sampled from the event it activated in (and at its publishes).
		if o.node != 0 {
			g.sampleWritable(o.node-1, s.nodes[o.node-1])
		}
	}
	quiet := g.quietCluster()
	if quiet && !g.quiet {
		g.quietGen++
	}
	g.quiet = quiet
	if quiet {
		g.stats["quiet events"]++
	}
	g.stats["events"]++
	g.countBlocked()
	g.checkIntake()
	g.checkOnTime()
}

// countBlocked counts the lanes' changes of readiness at their shard's
// active owner (Result.SchedStats): BLOCKED while its destination was out
// or not, and READY again after it.
func (g *schedGhost) countBlocked() {
	for shard, o := range g.owner {
		if o.node == 0 {
			continue
		}
		for _, v := range g.ownerViews[shard : shard+1] {
			for _, t := range slices.Sorted(maps.Keys(v.Lanes)) {
				k, r := schedLane{v.Shard, t}, v.Lanes[t]
				was := g.readiness[k] // RECOVERING_EVIDENCE when new
				g.readiness[k] = r
				switch {
				case was == r:
				case r == sched.Blocked:
					g.stats["lanes BLOCKED"]++
					if t == g.s.net.outTopic {
						g.stats["lanes BLOCKED while their destination was out"]++
					}
				case r == sched.Ready && was == sched.Blocked:
					g.stats["lanes READY again after BLOCKED"]++
				}
			}
		}
	}
}

// checkOnTime is BlockedLaneIsolated and ScheduledOnTime (see above).
func (g *schedGhost) checkOnTime() {
	s, sc := g.s, g.sc
	var health = map[string]bool{}
	for _, t := range schedDestTopics {
		health[t] = g.healthy(t) && !g.sc.pauser.held(t)
		if !health[t] || !g.quiet {
			g.troubleMs[t] = s.w.nowMs
		}
	}
	for _, i := range slices.Sorted(maps.Keys(sc.unseen)) {
		shard := sc.shardOf(i)
		o := g.owner[shard]
		if !g.quiet || o.node == 0 || !health[schedTopic(i)] {
			delete(g.onTimeFrom, i)
			continue
		}
		from, ok := g.onTimeFrom[i]
		if !ok {
			from = s.w.nowMs
			if at, ok := g.lanePubMs[schedLane{uint32(shard), schedTopic(i)}]; ok && at <= g.troubleMs[schedTopic(i)] {
				from = max(from, at+schedLostPublishMs) // it may have been lost
			}
			g.onTimeFrom[i] = from
		}
		dueMs := sc.due[i] + max(0, -s.nodes[o.node-1].skewMs)
		late := s.w.nowMs - max(dueMs, from)
		if late <= schedLateMsMax {
			continue
		}
		sc.observe() // what is visible now
		if sc.seen[schedValue(i)] || s.chk.violation != nil {
			delete(g.onTimeFrom, i)
			continue
		}
		name, other := "ScheduledOnTime", ""
		for _, t := range schedDestTopics {
			if t == schedTopic(i) {
				continue
			}
			if r, ok := g.readiness[schedLane{uint32(shard), t}]; t == g.s.net.outTopic || ok && r == sched.Blocked {
				name, other = "BlockedLaneIsolated", fmt.Sprintf(" while lane %s is BLOCKED or its destination out (out: %q)", t, g.s.net.outTopic)
			}
		}
		s.chk.violate(name, "schedule %s (shard %d, lane %s, due %d) not published %d ms after it fell due with its shard owned by n%d (epoch %d), its destination healthy and no other fault%s (bound %d ms)",
			schedValue(i), shard, schedTopic(i), sc.due[i]-epochMs, late, o.node, o.epoch, other, schedLateMsMax)
		return
	}
}

// intakeSent notes a SCHEDULE sent to node at: a probe of
// IntakeNeverBlocked when at is its shard's active owner in a quiet
// cluster.
func (g *schedGhost) intakeSent(i, at int, attempt uint32) {
	shard := g.sc.shardOf(i)
	if !g.quiet || g.owner[shard].node != at+1 {
		delete(g.intake, i)
		return
	}
	g.stats["intake probes"]++
	g.intake[i] = intakeProbe{at: at, attempt: attempt, sentMs: g.s.w.nowMs, quietGen: g.quietGen, ownerGen: g.ownerGen[shard], duringOut: g.s.net.outTopic != ""}
}

// valid reports whether probe p of schedule i still holds: the same
// quiet stretch and owner as when it was sent.
func (g *schedGhost) valid(i int, p intakeProbe) bool {
	return g.quiet && p.quietGen == g.quietGen && p.ownerGen == g.ownerGen[g.sc.shardOf(i)]
}

// intakeAnswered checks the answer to send attempt of schedule i (err
// nil: SCHEDULE_OK). A refusal of another send says nothing
// of the probe: that send may have reached its node before the owner
// took office. A SCHEDULE_OK of another send ends the probe unjudged: the
// client hears no more of the schedule.
func (g *schedGhost) intakeAnswered(i int, attempt uint32, err *wire.Err) {
	p, ok := g.intake[i]
	if !ok {
		return
	}
	if p.attempt != attempt {
		if err == nil {
			delete(g.intake, i)
		}
		return
	}
	delete(g.intake, i)
	if !g.valid(i, p) || err != nil && err.Code == wire.CodeInvalidArgument && g.sc.mayRefuse[i] {
		return // (a closed lane refuses new schedules)
	}
	if err != nil && err.Code == wire.CodeNotFound && g.sc.pauser.recreated(schedTopic(i)) {
		return // (its destination deleted, to be declared again: no lane refused it)
	}
	if err == nil {
		g.stats["intake probes answered OK"]++
		if p.duringOut {
			g.stats["intake probes answered OK during an outage"]++
		}
		return
	}
	g.s.chk.violate("IntakeNeverBlocked", "SCHEDULE %s to the active owner of shard %d (n%d, epoch %d) refused %v in a quiet cluster (destination out: %q)",
		schedValue(i), g.sc.shardOf(i), p.at+1, g.owner[g.sc.shardOf(i)].epoch, err.AsError(), g.s.net.outTopic)
}

// checkIntake fails a probe not answered within schedIntakeMsMax.
func (g *schedGhost) checkIntake() {
	for _, i := range slices.Sorted(maps.Keys(g.intake)) {
		p := g.intake[i]
		if !g.valid(i, p) {
			delete(g.intake, i)
			continue
		}
		if g.s.w.nowMs-p.sentMs > schedIntakeMsMax {
			g.s.chk.violate("IntakeNeverBlocked", "SCHEDULE %s to the active owner of shard %d (n%d) unanswered after %d ms in a quiet cluster (destination out: %q)",
				schedValue(i), g.sc.shardOf(i), p.at+1, g.s.w.nowMs-p.sentMs, g.s.net.outTopic)
			return
		}
	}
}

// connClosed voids the probes sent on node at's connection.
func (g *schedGhost) connClosed(at int) {
	for i, p := range g.intake {
		if p.at == at {
			delete(g.intake, i)
		}
	}
}
