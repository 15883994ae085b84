package sim

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Faults selects the fault kinds a run injects.
type Faults struct {
	Crash      bool // kill -9 at an event boundary; unsynced writes lost, last write maybe torn
	KillPoint  bool // kill -9 just before a chosen disk write or fsync
	Disconnect bool // a client connection breaks; frames in flight are lost
	Partition  bool // a client cannot reach the broker for a while
	OneWay     bool // a connection loses everything the broker sends, then times out
	Fsync      bool // bursts of failing fsyncs
	WriteErr   bool // bursts of failing writes (EIO); the write does not happen
	Clock      bool // the broker's wall clock jumps forward or back
	BitFlip    bool // a bit of a log segment flips on the medium
}

// FaultNames lists the names ParseFaults accepts, in order.
var FaultNames = []string{"crash", "killpoint", "disconnect", "partition", "oneway", "fsync", "writeerr", "clock", "bitflip"}

// AllFaults enables every fault kind.
var AllFaults = Faults{Crash: true, KillPoint: true, Disconnect: true, Partition: true, OneWay: true, Fsync: true, WriteErr: true, Clock: true, BitFlip: true}

// ParseFaults reads "all", "none" or a comma-separated list of FaultNames.
func ParseFaults(list string) (Faults, error) {
	var f Faults
	return f, parseFaultList(list, FaultNames, f.flags(), AllFaults.flags())
}

// flags are f's switches in the order of FaultNames.
func (f *Faults) flags() []*bool {
	return []*bool{&f.Crash, &f.KillPoint, &f.Disconnect, &f.Partition, &f.OneWay, &f.Fsync, &f.WriteErr, &f.Clock, &f.BitFlip}
}

// String is the comma-separated form ParseFaults reads back.
func (f Faults) String() string { return faultListString(FaultNames, f.flags()) }

// parseFaultList sets flags (in the order of names) from "all", "none" or
// a comma-separated list of names; all are the flags of "all".
func parseFaultList(list string, names []string, flags, all []*bool) error {
	switch list {
	case "all":
		for i := range flags {
			*flags[i] = *all[i]
		}
		return nil
	case "none", "":
		return nil
	}
	for _, name := range strings.Split(list, ",") {
		i := slices.Index(names, strings.TrimSpace(name))
		if i < 0 {
			return fmt.Errorf("unknown fault %q (know: all, none, %s)", name, strings.Join(names, ", "))
		}
		*flags[i] = true
	}
	return nil
}

// faultListString is the comma-separated form parseFaultList reads back.
func faultListString(names []string, flags []*bool) string {
	var on []string
	for i, v := range flags {
		if *v {
			on = append(on, names[i])
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

// Options configure one run. Zero fields take the defaults.
type Options struct {
	Seed                uint64
	Steps               int // events in the fault (safety) phase
	Faults              Faults
	Producers           int
	MessagesPerProducer int
	Consumers           int
	Partitions          uint32
	AckWaitMs           int64
	// PubBatch makes the producers send what they publish together as
	// one PUB_BATCH (protocol v2), as ClusterOptions.PubBatch does; a
	// retry of one message is a PUB.
	PubBatch bool
	// Mutations break the broker on purpose (mutation tests).
	Mutations node.Mutations
	// KeepTrace keeps every trace line in the result (golden traces).
	KeepTrace bool
	// Logs, when set, receives the node's log lines (as ClusterOptions.Logs).
	Logs io.Writer
	// Members makes the consumers group members (JOIN, heartbeats,
	// NOTICEs: members.go), as ClusterOptions.Members does: the node
	// keeps the group's membership in groups.json, which bit flips then
	// hit too.
	Members bool
	// DeadLetters makes the consumers subscribe with max_deliver
	// deadLetterMaxDeliver and NACK every poison message, so those go to
	// the group's dead-letter topic, which is watched (deadletter.go), as
	// ClusterOptions.DeadLetters does.
	DeadLetters bool
	// Retention, when set, gives the topic a retention and the node small
	// segments and a short retention check (RetentionPreset: `nereus sim
	// --retention`; ReservationMs is a cluster's), and the producers 300
	// messages each by default, so retention deletes records all the time,
	// every producer's among them. Records below a partition's start are
	// then gone on purpose (as in a cluster run); the committed log is
	// watched as it grows, so a retry appended again after its first copy
	// was deleted still breaks NoDuplicateFromReplay (retention.go).
	Retention ClusterRetention
}

func (o *Options) setDefaults() {
	if o.Steps == 0 {
		o.Steps = 20_000
	}
	if o.Producers == 0 {
		o.Producers = 3
	}
	if o.MessagesPerProducer == 0 && o.Retention.Bytes > 0 {
		o.MessagesPerProducer = retentionMessagesPerProducer
	}
	if o.MessagesPerProducer == 0 {
		o.MessagesPerProducer = 60
	}
	if o.Consumers == 0 {
		o.Consumers = 2
	}
	if o.Partitions == 0 {
		o.Partitions = 3
	}
	if o.AckWaitMs == 0 {
		o.AckWaitMs = 300
	}
}

// Reproduce is the command that runs o again.
func Reproduce(o Options) string {
	o.setDefaults()
	cmd := fmt.Sprintf("go run ./cmd/nereus sim --seed %d --steps %d --faults %s", o.Seed, o.Steps, o.Faults)
	if o.PubBatch {
		cmd += " --pub-batch"
	}
	if o.Members {
		cmd += " --members"
	}
	if o.DeadLetters {
		cmd += " --dead-letters"
	}
	if flags, ok := retentionFlags(o.Retention); ok {
		cmd += flags
	} else {
		cmd += fmt.Sprintf(" # with Options.Retention %+v (no CLI flag: run it from a test)", o.Retention)
	}
	for _, name := range slices.Sorted(maps.Keys(NodeMutations)) {
		if NodeMutations[name] == o.Mutations {
			cmd += " --mutation " + name
		}
	}
	if o.Mutations != (node.Mutations{}) && !strings.Contains(cmd, "--mutation") {
		cmd += fmt.Sprintf(" # with Options.Mutations %+v (no CLI name: run it from a test)", o.Mutations)
	}
	return cmd
}

// Result is what a run did and whether an invariant broke.
type Result struct {
	Seed       uint64
	Events     int
	VirtualMs  int64
	TraceHash  string   // hash of every trace line: equal seeds give equal hashes
	Trace      []string // every line, with Options.KeepTrace
	Tail       []string // the last lines of the trace
	Violation  *Violation
	Acked      int // PUB_OKs received
	PubBatches int // PUB_BATCH frames of more than one record sent (Options.PubBatch, ClusterOptions.PubBatch)
	Deliveries int // MSG frames received
	Restarts   int // broker incarnations after the first
	Faults     int // faults injected (cluster runs)
	// Scheduled and SchedPublished: schedules acknowledged, and scheduled
	// messages seen published (ClusterOptions.Schedules).
	Scheduled, SchedPublished int
	// KVOps and KVUnknown: KV operations in the checked history, and
	// writes among them whose outcome is unknown; KVWatches and
	// KVExpired: watches the KV watcher started, and those that ended
	// CURSOR_EXPIRED (ClusterOptions.KV).
	KVOps, KVUnknown, KVWatches, KVExpired int
	// TopicDeletes and TopicDeclares: the topic churn's answered deletes
	// and declares (ClusterOptions.TopicChurn).
	TopicDeletes, TopicDeclares int
	// GroupDeletes: the group incarnations a node applied the delete of
	// (ClusterOptions.GroupDeletes).
	GroupDeletes int
	// RetentionUpdates: the topic's retention updates a node answered
	// (ClusterRetention.Updates).
	RetentionUpdates int
	// GroupUpdates: the group updates a node answered; GroupRunnersChecked
	// the runners of the group the final check found holding the last.
	GroupUpdates, GroupRunnersChecked int
	// Coordinator counts what CoordinatorAnswersCurrent saw (runs with
	// topic churn or group deletes; coordcheck.go): "heir faults",
	// "windows" (events after which the newest metadata leader had applied
	// less than another node), "windows in office" (of them, those where
	// it read as in office), "probes" and "judged" (answers judged),
	// "deposed probes" (of the probes, those at a deposed leader).
	Coordinator map[string]int
	// MetadataCompared: the nodes' applied metadata states MetadataAgrees
	// compared with another node's through the same seq (cluster runs).
	MetadataCompared int
	// MinorityPromiseLosses: the times one replica group's hard states
	// were lost on more than one node at once (five nodes, BitFlip:
	// loseMinorityPromises).
	MinorityPromiseLosses int
	// KVLogStartMax and KVCheckpointMax: the highest start of a bucket
	// replica's log and the highest checkpoint base any replica applied
	// at the end; KVRebuilds: the times a replica's bucket was rebuilt
	// from a checkpoint in its log, KVResets those of a replica running
	// when its log came to start after what it applied (reset to its
	// leader's snapshot point) (ClusterOptions.KV).
	KVLogStartMax, KVCheckpointMax uint64
	KVRebuilds, KVResets           int
	// SchedStats counts what the scheduler ghost saw (destination
	// outages, publishes checked, lanes blocked, intake probes).
	SchedStats map[string]int
	// PartitionHosts counts, for each partition of the workload's topic,
	// the nodes whose disk holds a replica of it at the end (cluster
	// runs): ClusterOptions.Replicas each.
	PartitionHosts []int
	// ReplicaStates counts the replica states partition leaders reported
	// after events (cluster runs): InSync, CatchingUp, Unreachable, ...;
	// and followers of themselves, suffixed " (self)": Rebuilding,
	// Uncertain.
	ReplicaStates map[string]int
	// Recoveries counts lagging replicas that became InSync again, as
	// their leaders saw it (cluster runs), by how: RecoveredFromLog,
	// RecoveredBySnapshot, and the same with the replica restarted
	// meanwhile (S4/S13, S9/S14, S16, S17 at node level).
	Recoveries map[string]int
	// PubErrors counts the errors producers got for their publishes, by
	// code (cluster runs).
	PubErrors map[wire.Code]int
	// AckEntryCodes counts the ACK entries answered other than OK in an
	// ACK_OK, by code (cluster runs).
	AckEntryCodes map[wire.Code]int
	// Members counts what group members went through (ClusterOptions.
	// Members): "joins", "assigns", "revokes", "fenced", "crashes",
	// "dropped" (a message of a partition not held).
	Members map[string]int
	// DeadLetters: the messages seen dead-lettered (Options.DeadLetters,
	// ClusterOptions.DeadLetters).
	DeadLetters int
	// A single node's bit flips into its state files, by kind (file
	// name, or "ledger segment"); the repairs its operator ran (the final
	// one included) and what they did; the node's WARN and ERROR lines
	// and failed starts, by message; how often the checker forgot
	// confirmed acks, by cause ("cut tail", "dropped seqs", "ledger
	// snapshot", "unknown damage": a repair dropped seqs no flip showed).
	StateFlips    map[string]int
	Repairs       int
	Repaired      map[string]int
	NodeLines     map[string]int
	AcksForgotten map[string]int
}

// liveness phase bounds, after faults heal.
const (
	livenessMsMax     = 120_000
	livenessEventsMax = 400_000
	tickMs            = 5
)

// sim is one run in progress.
type sim struct {
	opts     Options
	w        *World
	b        *broker   // nodes[0]
	nodes    []*broker // a cluster's members (one for a single node)
	net      *peerNet  // a cluster's peer network (nil on a single node)
	replicas uint8     // the topic's replication factor (0: the default)
	syncAll  bool      // the topic is sync_all (cluster runs)
	// retention is the run's retention as configured (Options.Retention,
	// ClusterOptions.Retention): an update may change the topic's since.
	retention ClusterRetention
	// retentionBytes and retentionMs are the topic's RetentionBytes and
	// RetentionMs (0: none).
	retentionBytes, retentionMs int64
	// logWatch follows a single node's committed log with a retention
	// (retention.go; nil: none).
	logWatch *logWatcher
	// replays is where each producer_seq was committed, with a
	// retention: fed by the logWatcher on a single node, by
	// observePartition in a cluster (nil: no retention).
	replays *replayWatch
	// durable is each partition's dedup snapshot point as the node's
	// last start (or the last repair) found it: the log held every seq up
	// to it durably, and no torn tail cut may start at or below it
	// (DurableTailNotTorn).
	durable map[uint32]uint64
	// ledgerDurable is each ack ledger directory's synced mark as the
	// node's last start (or the last repair) found it: no torn tail cut
	// of that ledger may start at or below it (DurableTailNotTorn).
	ledgerDurable map[string]uint64
	// retentionLost: a single node's repair rebuilt topics.json, and the
	// topic's retention with it went back to none, until the operator's
	// TOPIC_UPDATE sets it again (restoreRetention): the clients declare
	// it so meanwhile, or every DECLARE would get TOPIC_CONFLICT.
	retentionLost bool
	// settingsUnchecked: a repair ran (perhaps killed before it said what
	// it did) since the operator last saw the topic's settings as
	// declared; only then may they differ (SettingsKept).
	settingsUnchecked, restoreDue bool
	// doubleFlips decides which bit flips of topics.json hit its copy too.
	doubleFlips *rand.Rand
	// A cluster's faults, and its replication checks (cluster.go): the
	// ghost state of each partition, and the last committed seq checked
	// per (partition, node incarnation).
	clusterFaults ClusterFaults
	// schedPublished, set by scripted scenarios, sees every scheduled
	// publish after the scheduler ghost did.
	schedPublished        func(b *broker, shard uint32, p sched.Publish)
	faultsInjected        int
	ghosts                []*invariant.Group
	observed              map[commitKey]uint64
	replicaViews          map[replicaKey]node.ReplicaView   // each member as last seen up, or as it died
	flipped               map[string]bool                   // nodes whose disks took a bit flip
	heldBeforeDrop        map[replicaKey][]node.ReplicaView // a flipped node's members as they were before each drop (holds)
	lostPromises          map[string]uint64                 // "node:file": the promise a hard state held when a bit flip hit it
	minorityPromiseLosses int                               // Result.MinorityPromiseLosses
	metaGhost             *invariant.Group                  // the metadata log's leaders and committed prefix
	metaViews             map[string]node.ReplicaView       // each node's metadata member, likewise
	replicaStates         map[string]int                    // replica states leaders reported, and how often
	lagging               map[replicaKey]lagEpisode         // replicas a leader last saw behind
	recoveries            map[string]int                    // Result.Recoveries
	chk                   *checker
	producers             []*producer
	consumers             []*consumer
	partitioned           map[string]bool
	healed                bool
	// What clients heard (scripted scenarios assert on it): ERR codes
	// answering a PUB or an ACK, and acks confirmed (ACK_OK results OK).
	pubErrors, ackErrors map[wire.Code]int
	ackEntryCodes        map[wire.Code]int
	pubBatches           int            // Result.PubBatches
	memberEvents         map[string]int // Result.Members
	acksConfirmed        int
	// scriptSteps counts a scripted scenario's steps still to come: the
	// liveness phase does not end before they ran.
	scriptSteps int
	// sched is the scheduled-delivery workload (ClusterOptions.Schedules;
	// nil without).
	sched *schedClient
	// kv is the KV workload (ClusterOptions.KV; nil without).
	kv *kvWorkload
	// churn deletes and re-declares a topic (topicchurn.go; nil: none).
	churn    *churnClient
	groupDel *groupDeleter // ClusterOptions.GroupDeletes (nil: none)
	// retentionUpd changes the topic's retention (ClusterRetention.Updates;
	// nil: none).
	retentionUpd *retentionUpdater
	groupUpd     *groupUpdater // ClusterOptions.GroupUpdates (nil: none)
	// coord judges the metadata leader's answers (coordcheck.go; nil
	// without topic churn or group deletes).
	coord *coordChecker
	// meta checks MetadataAgrees (cluster runs).
	meta *metaChecker
	// deadLetters follows the dead-letter topic (Options.DeadLetters).
	deadLetters *deadLetterWatch
	// The single node's operator (operator.go): a repair is due, the
	// repairs run, what they did, and the WARN and ERROR lines and
	// failed starts it saw; stateFlips counts the state files bit flips
	// hit, by kind; ledgerFlips: what the flips into ack ledgers' segments
	// hit, by ledger directory, until a cut tail or a repair answers them.
	repairDue bool
	// loneRepairDue: a cluster node the operator is due to repair
	// (clusterrepair.go).
	loneRepairDue map[string]bool
	repairs       int
	repaired      map[string]int
	nodeLines     map[string]int
	stateFlips    map[string]int
	ledgerFlips   map[string]*ledgerFlip
	// acksForgotten counts the checker's forgetting by cause
	// (Result.AcksForgotten).
	acksForgotten map[string]int
}

// Run executes one seed and returns its result. It never panics on a broken
// invariant; it reports it.
func Run(opts Options) Result {
	opts.setDefaults()
	s := newSim(opts)
	s.startWorkload()
	s.safetyPhase()
	if s.chk.violation == nil {
		s.livenessPhase()
	}
	if s.chk.violation == nil {
		s.finalPhase()
	}
	return s.result()
}

func newSim(opts Options) *sim {
	w := newWorld(opts.Seed, opts.KeepTrace)
	w.logs = opts.Logs
	damaged := map[uint32]bool{}
	chk := newChecker(w, damaged)
	b := newBroker(w, chk, opts.Mutations)
	b.damaged = damaged
	b.dedupSnapshotBytes = dedupSnapshotBytes // restarts start from dedup snapshots, as a cluster's nodes do
	s := &sim{opts: opts, w: w, b: b, nodes: []*broker{b}, chk: chk, partitioned: map[string]bool{},
		pubErrors: map[wire.Code]int{}, ackErrors: map[wire.Code]int{}, ackEntryCodes: map[wire.Code]int{},
		repaired: map[string]int{}, nodeLines: map[string]int{}, stateFlips: map[string]int{}, ledgerFlips: map[string]*ledgerFlip{}, acksForgotten: map[string]int{},
		memberEvents: map[string]int{}, doubleFlips: rand.New(rand.NewPCG(opts.Seed, 0x746f70696373)), durable: map[uint32]uint64{}}
	s.watchForRepair()
	if opts.Retention.Bytes > 0 {
		s.retention = opts.Retention
		s.retentionBytes, s.retentionMs = opts.Retention.Bytes, opts.Retention.AgeMs
		chk.retained = map[uint32]uint64{}
		b.segmentBytesMax, b.retentionCheckMs = opts.Retention.SegmentBytesMax, opts.Retention.RetentionCheckMs
		s.watchCommittedLog()
		if opts.Retention.Updates > 0 {
			s.retentionUpd = newRetentionUpdater(s, opts.Retention.Updates)
		}
	}
	if opts.DeadLetters {
		s.deadLetters = newDeadLetterWatch(s)
	}
	return s
}

// dial connects a client to the node at index at (modulo the nodes).
func (s *sim) dial(cl client, at int) *conn {
	return s.nodes[at%len(s.nodes)].dial(cl, s.partitioned[cl.name()])
}

func (s *sim) topicConfig() wire.TopicConfig {
	tc := wire.TopicConfig{Name: simTopic, Partitions: s.opts.Partitions, Replicas: s.replicas, RetentionBytes: s.retentionBytes, RetentionMs: s.retentionMs}
	if s.retentionLost {
		tc.RetentionBytes, tc.RetentionMs = 0, 0
	}
	if s.syncAll {
		tc.Ack = wire.AckAll
	}
	return tc
}

func (s *sim) startWorkload() {
	s.w.tracef("run seed=%d faults=%s", s.opts.Seed, s.opts.Faults)
	s.b.start()
	for i := 0; i < s.opts.Producers; i++ {
		p := &producer{s: s, id: uint64(1000 + i), window: 8, messagesMax: uint64(s.opts.MessagesPerProducer),
			nextSeq: 1, inflight: map[uint64]string{}, partition: wire.PartitionAuto, batch: s.opts.PubBatch}
		s.producers = append(s.producers, p)
		s.w.after(s.w.between(0, 10), p.connect)
	}
	for i := 0; i < s.opts.Consumers; i++ {
		c := newConsumer(s, i+1, 8)
		s.consumers = append(s.consumers, c)
		s.w.after(s.w.between(0, 10), c.connect)
		if s.opts.Members {
			c.m = newSimMember(false, i)
			s.w.after(s.w.between(0, 10), c.joinGroup)
		}
	}
	s.w.after(tickMs, s.tick)
	if s.opts.Faults != (Faults{}) {
		s.w.after(s.w.between(20, 300), s.injectFault)
	}
}

// tick advances the broker's timers (redelivery, retention) in virtual time.
func (s *sim) tick() {
	if s.sched != nil && s.w.events%4 == 0 {
		s.sched.observe()
	}
	s.w.after(tickMs, s.tick)
}

// step runs one event and then the broker's due work and the checks.
func (s *sim) step() bool {
	if !s.w.next() {
		return false
	}
	for _, b := range s.nodes {
		b.step()
		s.chk.afterEvent(b)
	}
	if s.net != nil {
		s.observeReplication()
	}
	if s.sched != nil {
		s.sched.ghost.watch()
	}
	if s.churn != nil {
		s.observeChurn()
	}
	if s.groupDel != nil {
		s.observeGroupDeletes()
	}
	if s.coord != nil {
		s.coord.observe()
	}
	if s.meta != nil {
		s.meta.observe()
	}
	if s.deadLetters != nil {
		s.deadLetters.observe()
	}
	if s.logWatch != nil {
		s.logWatch.observe()
	}
	return true
}

func (s *sim) producersDone() bool {
	for _, p := range s.producers {
		if !p.done() {
			return false
		}
	}
	return true
}

// safetyPhase runs the workload under faults until it is done (the
// producers, and the KV clients' operations) or Steps events ran.
func (s *sim) safetyPhase() {
	for s.w.events < s.opts.Steps && s.chk.violation == nil && (!s.producersDone() || s.kv != nil && !s.kv.opsDone()) && s.step() {
	}
}

// livenessPhase heals every fault and requires the workload to finish: all
// messages acknowledged, and every acknowledged message acked by the group.
func (s *sim) livenessPhase() {
	s.healed = true
	for _, b := range s.nodes {
		b.fsyncErrorP, b.writeErrorP = 0, 0
		b.killOnDisk = nil
		b.skewMs = 0 // cluster members' wall clocks agree again
	}
	if s.net != nil {
		s.net.heal()
	}
	clear(s.partitioned)
	if s.groupDel != nil {
		s.groupDel.healed()
	}
	for _, c := range s.consumers {
		c.polite = true
	}
	s.w.tracef("heal: faults off")
	deadline := s.w.nowMs + livenessMsMax
	for events := 0; s.chk.violation == nil; events++ {
		if s.producersDone() && len(s.chk.undelivered()) == 0 && s.scriptSteps == 0 && (s.sched == nil || s.sched.done()) && (s.kv == nil || s.kv.done()) {
			return
		}
		if s.w.nowMs > deadline || events > livenessEventsMax || !s.step() {
			missing := s.chk.undelivered()
			unacked := 0
			for _, p := range s.producers {
				unacked += len(p.inflight) + int(p.messagesMax+1-min(p.nextSeq, p.messagesMax+1))
			}
			first := "none"
			if len(missing) > 0 {
				first = missing[0].String()
			}
			schedMissing, schedFirst := 0, "none"
			if s.sched != nil {
				schedMissing, schedFirst = s.sched.missing()
			}
			kvMissing := 0
			if s.kv != nil {
				kvMissing = s.kv.missing()
			}
			s.chk.violate(Liveness, "%d acknowledged records not acked by the group (first %s), %d messages never acknowledged, %d schedules not answered or not published (first %s), %d KV operations not run, %dms after healing",
				len(missing), first, unacked, schedMissing, schedFirst, kvMissing, s.w.nowMs-(deadline-livenessMsMax))
			return
		}
	}
}

// finalPhase kills the broker once more, restarts it and reads its whole
// log back against the reference model.
//
// When a bit flip hit any of its files, the operator's repair runs first
// (`nereus repair --salvage` on the stopped node, operator.go): afterwards
// the node must start, no partition may be corrupt, and the read-back
// steps over the recorded gaps.
func (s *sim) finalPhase() {
	s.b.stopRestarts = true
	s.b.crash()
	s.b.stopRestarts = false
	if s.chk.mayRefuse() {
		if err := s.repair(); err != nil {
			s.chk.violate(RepairRestores, "repair failed: %v", err)
			return
		}
	}
	s.b.start()
	s.b.step()
	s.chk.afterEvent(s.b)
	if s.chk.mayRefuse() && s.b.up {
		for _, p := range s.b.node.Metadata([]string{simTopic})[0].Partitions {
			if p.State == wire.PartitionStateCorrupt {
				s.chk.violate(RepairRestores, "partition %d still corrupt after a salvage repair", p.Partition)
				return
			}
		}
	}
	if s.logWatch != nil {
		s.logWatch.observe()
	}
	if s.retentionUpd != nil && s.chk.violation == nil {
		s.retentionUpd.final(s.w.nowMs + 30_000)
	}
	s.chk.finalChecks(func(uint32) *broker { return s.b }, s.opts.Partitions)
	s.w.tracef("end: acked=%d deliveries=%d restarts=%d", len(s.chk.acked), s.chk.deliveries, s.b.started-1)
}

func (s *sim) result() Result {
	r := Result{Seed: s.opts.Seed, Events: s.w.events, VirtualMs: s.w.nowMs - epochMs,
		TraceHash: s.w.trace.sum(), Trace: s.w.trace.all, Tail: s.w.trace.lastLines(),
		Violation: s.chk.violation, Acked: len(s.chk.acked), Deliveries: s.chk.deliveries,
		Restarts: max(s.b.started-1, 0), PubBatches: s.pubBatches,
		StateFlips: s.stateFlips, Repairs: s.repairs, Repaired: s.repaired, NodeLines: s.nodeLines,
		AcksForgotten: s.acksForgotten, Members: s.memberEvents, DeadLetters: s.deadLetters.count()}
	if s.retentionUpd != nil {
		r.RetentionUpdates = s.retentionUpd.answered
	}
	return r
}

// injectFault applies one randomly chosen enabled fault, then schedules the
// next. Faults stop when the run heals.
func (s *sim) injectFault() {
	if s.healed {
		return
	}
	defer s.w.after(s.w.between(20, 300), s.injectFault)
	f := s.opts.Faults
	var kinds []func()
	add := func(on bool, weight int, fn func()) {
		for i := 0; on && i < weight; i++ {
			kinds = append(kinds, fn)
		}
	}
	add(f.Crash, 3, s.b.crash)
	add(f.KillPoint, 3, s.armKillPoint)
	add(f.Disconnect, 3, s.disconnectClient)
	add(f.Partition, 2, s.partitionClient)
	add(f.OneWay, 2, s.oneWayPartition)
	add(f.Fsync, 2, s.fsyncBurst)
	add(f.WriteErr, 2, s.writeErrorBurst)
	add(f.Clock, 2, s.clockJump)
	add(f.BitFlip, 1, s.flipBit)
	add(f.BitFlip, 1, s.flipStateBit)
	kinds[s.w.rng.IntN(len(kinds))]()
}

func (s *sim) armKillPoint() {
	ops := []vfs.Op{vfs.OpWrite, vfs.OpSync}
	op := ops[s.w.rng.IntN(len(ops))]
	prefix := []string{"topics/", "groups/"}[s.w.rng.IntN(2)]
	s.w.tracef("fault arm kill -9 before next %s under %s", op, prefix)
	s.b.killOnDisk = func(o vfs.Op, name string) bool { return o == op && strings.HasPrefix(name, prefix) }
}

func (s *sim) clients() []client {
	var out []client
	for _, p := range s.producers {
		out = append(out, p)
	}
	for _, c := range s.consumers {
		out = append(out, c)
	}
	if s.kv != nil {
		for _, c := range s.kv.clients {
			out = append(out, c)
		}
		out = append(out, s.kv.watcher)
	}
	return out
}

// connOf returns a client's connection: a producer's one, or one of a
// consumer's lanes (a single node's only one).
func (s *sim) connOf(cl client) *conn {
	switch v := cl.(type) {
	case *producer:
		return v.c
	case *consumer:
		if len(v.lanes) == 1 {
			return v.lanes[0].c
		}
		return v.lanes[s.w.rng.IntN(len(v.lanes))].c
	case *kvClient:
		return v.conns[v.at]
	case *kvWatcher:
		return v.conns[v.at]
	}
	return nil
}

func (s *sim) disconnectClient() {
	cl := s.clients()[s.w.rng.IntN(len(s.clients()))]
	if co, ok := cl.(*consumer); ok && co.m != nil && s.w.chance(0.3) {
		co.crash()
		return
	}
	if c := s.connOf(cl); c != nil && c.open {
		c.breakConn("fault disconnect")
	}
}

func (s *sim) partitionClient() {
	cl := s.clients()[s.w.rng.IntN(len(s.clients()))]
	name := cl.name()
	if s.partitioned[name] {
		return
	}
	s.partitioned[name] = true
	s.w.tracef("fault partition %s", name)
	if co, ok := cl.(*consumer); ok {
		for _, c := range co.conns() { // cut off from every node
			c.breakConn("fault partition")
		}
	} else if c := s.connOf(cl); c != nil && c.open {
		c.breakConn("fault partition")
	}
	s.w.after(s.w.between(50, 800), func() {
		if s.partitioned[name] {
			delete(s.partitioned, name)
			s.w.tracef("heal partition %s", name)
		}
	})
}

// oneWayPartition drops everything the broker sends on one connection
// (requests still arrive and take effect) until the client gives up on it.
func (s *sim) oneWayPartition() {
	cl := s.clients()[s.w.rng.IntN(len(s.clients()))]
	c := s.connOf(cl)
	if c == nil || !c.open || c.repliesLost {
		return
	}
	c.repliesLost = true
	s.w.tracef("fault one-way partition: %s hears nothing on conn #%d", cl.name(), c.id)
	s.w.after(s.w.between(20, 400), func() { c.breakConn("one-way partition timed out") })
}

func (s *sim) fsyncBurst() {
	s.b.fsyncErrorP = 0.5
	s.w.tracef("fault fsync errors on")
	s.w.after(s.w.between(10, 100), func() {
		s.b.fsyncErrorP = 0
		s.w.tracef("fault fsync errors off")
	})
}

func (s *sim) writeErrorBurst() {
	s.b.writeErrorP = 0.3
	s.w.tracef("fault write errors on")
	s.w.after(s.w.between(10, 100), func() {
		s.b.writeErrorP = 0
		s.w.tracef("fault write errors off")
	})
}

func (s *sim) clockJump() {
	jump := s.w.between(-2_000, 5_000)
	s.w.skewMs += jump
	s.w.tracef("fault broker clock jumps %+dms", jump)
}

// flipBit flips one bit of a random segment of a random partition. Loss in
// that partition is then expected (one node, one copy), but serving the
// corrupt record never is.
func (s *sim) flipBit() {
	p := uint32(s.w.rng.IntN(int(s.opts.Partitions)))
	files := segmentFiles(s.b.fs, p)
	if len(files) == 0 {
		return
	}
	file := files[s.w.rng.IntN(len(files))]
	size, err := s.b.fs.Stat(file)
	if err != nil || size == 0 {
		return
	}
	off := s.w.rng.Int64N(size)
	if err := s.b.fs.FlipBit(file, off, uint(s.w.rng.IntN(8))); err == nil {
		s.b.damaged[p] = true
		s.w.tracef("fault bit flip %s@%d", strings.TrimPrefix(file, dataDir+"/"), off)
	}
}
