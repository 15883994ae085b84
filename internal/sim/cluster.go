package sim

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// ClusterOptions configure a cluster run: Nodes complete nodes — the real
// server.Protocol, node, replog members and metadata log, each over its own
// crashable MemFS — over a simulated peer network, in Manual mode on the
// simulator's goroutine, driven by clients that speak the client frames.
type ClusterOptions struct {
	Seed                uint64
	Nodes               int    // cluster members (default 3)
	Steps               int    // events in the fault phase (default 20,000)
	Producers           int    // default 3, each on its own partition
	MessagesPerProducer int    // default 300
	Consumers           int    // group members (default 2)
	Partitions          uint32 // default 3
	Faults              ClusterFaults
	Mutations           node.Mutations
	// SyncAll makes the topic sync_all: a record is acknowledged once
	// every replica fsynced it (default sync_quorum).
	SyncAll   bool
	KeepTrace bool
}

// ClusterFaults selects the faults a cluster run injects.
type ClusterFaults struct {
	Crash     bool // kill -9 of one node: its unsynced writes lost, the last maybe torn
	PowerLoss bool // every node loses its unsynced writes at once
	KillPoint bool // kill -9 of one node just before a chosen disk write or fsync
	Partition bool // a node cut off from its peers, both ways or one way
	Network   bool // peer frames dropped and duplicated for a while
	Fsync     bool // bursts of failing fsyncs on one node
	Clients   bool // client connections broken
	Clock     bool // one node's clock jumps forward or back
	Pause     bool // one node stops (SIGSTOP, a VM pause) and resumes where it was
}

// ClusterFaultNames lists the names ParseClusterFaults accepts.
var ClusterFaultNames = []string{"crash", "powerloss", "killpoint", "partition", "network", "fsync", "clients", "clock", "pause"}

// AllClusterFaults enables every cluster fault.
var AllClusterFaults = ClusterFaults{Crash: true, PowerLoss: true, KillPoint: true, Partition: true, Network: true, Fsync: true, Clients: true,
	Clock: true, Pause: true}

// ParseClusterFaults reads "all", "none" or a comma-separated list of
// ClusterFaultNames.
func ParseClusterFaults(list string) (ClusterFaults, error) {
	switch list {
	case "all":
		return AllClusterFaults, nil
	case "none", "":
		return ClusterFaults{}, nil
	}
	var f ClusterFaults
	for _, name := range strings.Split(list, ",") {
		switch strings.TrimSpace(name) {
		case "crash":
			f.Crash = true
		case "powerloss":
			f.PowerLoss = true
		case "killpoint":
			f.KillPoint = true
		case "partition":
			f.Partition = true
		case "network":
			f.Network = true
		case "fsync":
			f.Fsync = true
		case "clients":
			f.Clients = true
		case "clock":
			f.Clock = true
		case "pause":
			f.Pause = true
		default:
			return f, fmt.Errorf("unknown cluster fault %q (know %s)", name, strings.Join(ClusterFaultNames, ", "))
		}
	}
	return f, nil
}

func (f ClusterFaults) String() string {
	var on []string
	for i, b := range []bool{f.Crash, f.PowerLoss, f.KillPoint, f.Partition, f.Network, f.Fsync, f.Clients, f.Clock, f.Pause} {
		if b {
			on = append(on, ClusterFaultNames[i])
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

func (o *ClusterOptions) setDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Steps == 0 {
		o.Steps = 20_000
	}
	if o.Producers == 0 {
		o.Producers = 3
	}
	if o.MessagesPerProducer == 0 {
		o.MessagesPerProducer = 300
	}
	if o.Consumers == 0 {
		o.Consumers = 2
	}
	if o.Partitions == 0 {
		o.Partitions = 3
	}
}

// ClusterMutations name the deliberate bugs a cluster run can carry
// (`nereus sim --nodes N --mutation NAME`); each is a guard of the node or
// its kernels removed.
var ClusterMutations = map[string]node.Mutations{
	"skip-install-gate":         {Partition: partition.Mutations{SkipInstallGate: true}},
	"skip-dedup-seal":           {Partition: partition.Mutations{SkipDedupSeal: true}},
	"ack-before-commit":         {AckLog: acklog.Mutations{AckBeforeCommit: true}},
	"coordinate-before-install": {CoordinateBeforeInstall: true},
}

// ClusterReproduce is the command that runs o again.
func ClusterReproduce(o ClusterOptions) string {
	o.setDefaults()
	cmd := fmt.Sprintf("go run ./cmd/nereus sim --nodes %d --faults %s --steps %d --seed %d", o.Nodes, o.Faults, o.Steps, o.Seed)
	if o.SyncAll {
		cmd += " --policy all"
	}
	for name, m := range ClusterMutations {
		if m == o.Mutations {
			cmd += " --mutation " + name
		}
	}
	return cmd
}

// Cluster timing: the nodes' replication tick, and how long a DECLARE may
// take (short, so a DECLARE caught by a fault is retried soon).
const (
	clusterTick           = 10 * time.Millisecond
	clusterDeclareTimeout = 2 * time.Second
)

// RunCluster runs one seed of a cluster and returns its result. It never
// panics on a broken invariant; it reports it.
func RunCluster(o ClusterOptions) Result {
	o.setDefaults()
	w := newWorld(o.Seed, o.KeepTrace)
	chk := newChecker(w, map[uint32]bool{})
	chk.perIncarnation = true
	s := &sim{opts: Options{Seed: o.Seed, Steps: o.Steps, Producers: o.Producers, MessagesPerProducer: o.MessagesPerProducer,
		Consumers: o.Consumers, Partitions: o.Partitions, KeepTrace: o.KeepTrace},
		w: w, chk: chk, partitioned: map[string]bool{}, net: newPeerNet(w), replicas: uint8(o.Nodes), syncAll: o.SyncAll}
	s.opts.setDefaults()
	var members []node.Member
	for i := 1; i <= o.Nodes; i++ {
		members = append(members, node.Member{ID: fmt.Sprintf("n%d", i), PeerAddr: fmt.Sprintf("n%d", i)})
	}
	for i := 1; i <= o.Nodes; i++ {
		b := newBroker(w, chk, o.Mutations)
		b.id, b.peers = members[i-1].ID, s.net
		b.cluster = &node.ClusterConfig{Members: members, Tick: clusterTick, DeclareTimeout: clusterDeclareTimeout}
		id := uint32(i)
		b.onCrash = func() {
			if l := s.net.members[id]; l != nil {
				l.closed = true
			}
		}
		s.net.brokers[id] = b
		s.nodes = append(s.nodes, b)
	}
	s.b = s.nodes[0]
	s.ghosts = make([]*invariant.Group, o.Partitions)
	for p := range s.ghosts {
		s.ghosts[p] = invariant.NewGroup(o.Nodes, o.SyncAll)
	}
	s.observed = map[commitKey]uint64{}
	s.w.tracef("cluster run seed=%d nodes=%d faults=%s", o.Seed, o.Nodes, o.Faults)
	for _, b := range s.nodes {
		b.start()
	}
	for i := 0; i < s.opts.Producers; i++ {
		p := &producer{s: s, id: uint64(1000 + i), window: 8, messagesMax: uint64(s.opts.MessagesPerProducer),
			nextSeq: 1, inflight: map[uint64]string{}, partition: int32(uint32(i) % s.opts.Partitions), at: i}
		s.producers = append(s.producers, p)
		s.w.after(s.w.between(0, 10), p.connect)
	}
	for i := 0; i < s.opts.Consumers; i++ {
		c := &consumer{s: s, id: i + 1, credit: 8, pending: map[uint64][]wire.AckEntry{},
			unanswered: map[position]wire.AckEntry{}, at: i}
		s.consumers = append(s.consumers, c)
		s.w.after(s.w.between(0, 10), c.connect)
	}
	s.w.after(tickMs, s.tick)
	if o.Faults != (ClusterFaults{}) {
		s.clusterFaults = o.Faults
		s.w.after(s.w.between(50, 200), s.injectClusterFault)
	}
	s.safetyPhase()
	if s.chk.violation == nil {
		s.livenessPhase()
	}
	if s.chk.violation == nil {
		s.clusterFinalPhase()
	}
	r := s.result()
	r.Faults = s.faultsInjected
	r.Restarts = 0
	for _, b := range s.nodes {
		r.Restarts += max(b.started-1, 0)
	}
	return r
}

// injectClusterFault applies one randomly chosen enabled fault, then
// schedules the next. Faults stop when the run heals.
func (s *sim) injectClusterFault() {
	if s.healed {
		return
	}
	defer s.w.after(s.w.between(50, 400), s.injectClusterFault)
	s.faultsInjected++
	f := s.clusterFaults
	var kinds []func()
	add := func(on bool, weight int, fn func()) {
		for i := 0; on && i < weight; i++ {
			kinds = append(kinds, fn)
		}
	}
	n := s.nodes[s.w.rng.IntN(len(s.nodes))]
	add(f.Crash, 3, n.crash)
	add(f.PowerLoss, 1, s.powerLoss)
	add(f.KillPoint, 2, func() { s.armNodeKillPoint(n) })
	add(f.Partition, 3, func() { s.partitionNode(n) })
	add(f.Network, 2, s.flakyNetwork)
	add(f.Fsync, 2, func() { s.nodeFsyncBurst(n) })
	add(f.Clients, 2, s.disconnectClient)
	add(f.Clock, 2, func() { s.nodeClockJump(n) })
	add(f.Pause, 2, func() { s.pauseNode(n) })
	kinds[s.w.rng.IntN(len(kinds))]()
}

// powerLoss crashes every node at once: each loses its unsynced writes
// (the fault that, coordinated, loses acknowledged writes in brokers that
// acknowledge before fsync).
func (s *sim) powerLoss() {
	s.w.tracef("fault power loss: every node")
	for _, b := range s.nodes {
		if b.up {
			b.crashNow()
		}
	}
}

func (s *sim) armNodeKillPoint(b *broker) {
	op := []vfs.Op{vfs.OpWrite, vfs.OpSync}[s.w.rng.IntN(2)]
	prefix := []string{"topics/", "meta/"}[s.w.rng.IntN(2)]
	s.w.tracef("fault %s: arm kill -9 before next %s under %s", b.id, op, prefix)
	b.killOnDisk = func(o vfs.Op, name string) bool { return o == op && strings.HasPrefix(name, prefix) }
}

// partitionNode cuts a node off from its peers (both ways, or only what
// it sends, or only what it hears) for a while. Its clients still reach
// it.
func (s *sim) partitionNode(b *broker) {
	id := uint32(slices.Index(s.nodes, b) + 1)
	from, to := true, true
	switch s.w.rng.IntN(3) {
	case 1:
		to = false // it is heard by no one
	case 2:
		from = false // it hears no one
	}
	s.w.tracef("fault partition %s (sends lost %v, receives lost %v)", b.id, from, to)
	s.net.setCut(id, from, to)
	s.w.after(s.w.between(200, 2000), func() {
		if !s.healed {
			s.net.setCut(id, false, false)
			s.w.tracef("heal partition %s", b.id)
		}
	})
}

func (s *sim) flakyNetwork() {
	s.net.dropP, s.net.dupP = 0.2, 0.1
	s.w.tracef("fault peer network drops 20%%, duplicates 10%%")
	s.w.after(s.w.between(100, 1000), func() {
		s.net.dropP, s.net.dupP = 0, 0
		s.w.tracef("peer network healthy")
	})
}

func (s *sim) nodeFsyncBurst(b *broker) {
	b.fsyncErrorP = 0.3
	s.w.tracef("fault %s fsync errors", b.id)
	s.w.after(s.w.between(50, 400), func() { b.fsyncErrorP = 0 })
}

// nodeClockJump moves one node's clock forward (its timers fire early,
// elections start) or back (no ticks until it catches up) by up to 3 s.
func (s *sim) nodeClockJump(b *broker) {
	d := s.w.between(-3000, 3000)
	b.skewMs += d
	s.w.tracef("fault %s clock jumps %+dms (skew %dms)", b.id, d, b.skewMs)
}

// pauseNode stops a node for 100 ms to 2 s: nothing it is sent is handled,
// none of its timers fire, it takes no step; then it resumes where it was
// (its peers may have moved on).
func (s *sim) pauseNode(b *broker) {
	if !b.up || b.paused() {
		return
	}
	b.pausedUntil = s.w.nowMs + s.w.between(100, 2000)
	s.w.tracef("fault %s pauses until %d", b.id, b.pausedUntil-epochMs)
}

// heal ends every network fault.
func (n *peerNet) heal() {
	clear(n.cut)
	n.dropP, n.dupP = 0, 0
}

// observeReplication checks, after every event, what each node says of
// each partition: one leader per epoch, elected on a quorum of durable
// promises (the members' hard-state files), and committed entries that
// never disagree across nodes or change (invariant.Group).
func (s *sim) observeReplication() {
	for ni, b := range s.nodes {
		if !b.up || s.chk.violation != nil {
			continue
		}
		for _, t := range b.node.Metadata([]string{simTopic}) {
			for _, p := range t.Partitions {
				s.observePartition(ni, b, p)
			}
		}
	}
}

func (s *sim) observePartition(ni int, b *broker, p wire.PartitionInfo) {
	g := s.ghosts[p.Partition]
	if p.Leader == b.id && g.Leader(p.Epoch) != uint32(ni+1) {
		promised := 0
		for _, o := range s.nodes {
			if s.durablePromise(o, p.Partition) >= p.Epoch {
				promised++
			}
		}
		if v := g.TookOffice(uint32(ni+1), p.Epoch, promised); v != nil {
			s.chk.violate(v.Invariant, "partition %d: %s", p.Partition, v.Detail)
			return
		}
		s.w.tracef("%s leads partition %d in epoch %d", b.id, p.Partition, p.Epoch)
	}
	k := commitKey{partition: p.Partition, node: b.id, incarnation: b.started}
	for from := s.observed[k] + 1; from <= p.CommitSeq; {
		entries, err := b.node.Read(simTopic, p.Partition, from, 256)
		if err != nil || len(entries) == 0 {
			return // retention, or not applied yet: looked at again later
		}
		for _, e := range entries {
			if e.Seq > p.CommitSeq {
				break
			}
			ge := invariant.Entry{Epoch: e.Epoch, Value: string(e.Record.Value)}
			if v := g.Agree(uint32(ni+1), e.Seq, ge); v != nil {
				s.chk.violate(v.Invariant, "partition %d: %s", p.Partition, v.Detail)
				return
			}
			s.observed[k] = e.Seq
		}
		from = s.observed[k] + 1
	}
}

// durablePromise is the promise a node's member of a partition holds in
// its hard-state file (between events no write is in progress, so what
// the file holds is durable).
func (s *sim) durablePromise(b *broker, partition uint32) uint64 {
	data, err := storage.ReadFileAtomic(b.fs, path.Join(dataDir, "topics", simTopic, fmt.Sprint(partition), "hardstate"))
	if err != nil || len(data) != 12 {
		return 0
	}
	return uint64(data[0])<<56 | uint64(data[1])<<48 | uint64(data[2])<<40 | uint64(data[3])<<32 |
		uint64(data[4])<<24 | uint64(data[5])<<16 | uint64(data[6])<<8 | uint64(data[7])
}

// clusterFinalPhase cuts the power to every node at once, restarts them
// all, waits until every partition has a leader that commits a new write,
// and reads each partition back from its leader against the reference
// model.
func (s *sim) clusterFinalPhase() {
	for _, b := range s.nodes {
		b.stopRestarts = true
	}
	s.powerLoss()
	for _, b := range s.nodes {
		b.stopRestarts = false
		b.start()
	}
	leaders := make([]*broker, s.opts.Partitions)
	deadline := s.w.nowMs + 30_000
	for s.chk.violation == nil {
		done := true
		for p := range leaders {
			leaders[p] = s.leaderOf(uint32(p))
			done = done && leaders[p] != nil && s.caughtUp(leaders[p], uint32(p))
		}
		if done {
			break
		}
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(Liveness, "30 s after the final power loss, not every partition has a leader holding every acknowledged record")
			return
		}
	}
	if s.chk.violation != nil {
		return
	}
	s.chk.finalChecks(func(p uint32) *broker { return leaders[p] }, s.opts.Partitions)
	s.w.tracef("end: acked=%d deliveries=%d", len(s.chk.acked), s.chk.deliveries)
}

// leaderOf is the up node that leads partition p, if any.
func (s *sim) leaderOf(p uint32) *broker {
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		for _, t := range b.node.Metadata([]string{simTopic}) {
			if int(p) < len(t.Partitions) && t.Partitions[p].Leader == b.id && !t.Partitions[p].ReadOnly {
				return b
			}
		}
	}
	return nil
}

// caughtUp reports whether b's commit of partition p covers every
// acknowledged position there.
func (s *sim) caughtUp(b *broker, p uint32) bool {
	var need uint64
	for pos := range s.chk.ackedAt {
		if pos.partition == p {
			need = max(need, pos.seq)
		}
	}
	for _, t := range b.node.Metadata([]string{simTopic}) {
		return t.Partitions[p].CommitSeq >= need
	}
	return false
}
