package sim

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// dedupSnapshotBytes is the nodes' node.Config.DedupSnapshotBytes (a
// single node's too): a snapshot every few records, so restarts start
// from them under every fault.
const dedupSnapshotBytes = 512

// syncedMarkMs is the nodes' node.Config.SyncedMarkMs: a partition with
// no other replica marks its synced tail after 50 ms idle, so marks are
// written (and read by every start and repair, DurableTailNotTorn) under
// every fault.
const syncedMarkMs = 50

// ClusterOptions configure a cluster run: Nodes complete nodes — the real
// server.Protocol, node, replog members and metadata log, each over its own
// crashable MemFS — over a simulated peer network, in Manual mode on the
// simulator's goroutine, driven by clients that speak the client frames.
type ClusterOptions struct {
	Seed  uint64
	Nodes int // cluster members (default 3)
	// Replicas is the replication factor of the workloads' topics and
	// buckets (0: Nodes, every node a replica of every partition). Below
	// Nodes, each partition lives on some nodes only: the others route,
	// forward and refuse for it (5 nodes with 3 replicas, the usual
	// production layout).
	Replicas            uint8
	Steps               int    // events in the fault phase (default 20,000)
	Producers           int    // default 3, each on its own partition
	MessagesPerProducer int    // default 300
	Consumers           int    // group members (default 2)
	Partitions          uint32 // default 3
	Faults              ClusterFaults
	Mutations           node.Mutations
	// NoDedupSnapshots: the nodes keep no dedup snapshot, so a restart
	// rebuilds every partition's dedup table from its retained log (by
	// default they write one every dedupSnapshotBytes of records).
	NoDedupSnapshots bool
	// PubBatch makes the producers send what they publish together as
	// one PUB_BATCH (protocol v2), a retry of one message as a PUB.
	PubBatch bool
	// SyncAll makes the topic sync_all: a record is acknowledged once
	// every replica fsynced it (default sync_quorum).
	SyncAll bool
	// Retention, when set, gives the topic a retention and the nodes small
	// segments, so replicated logs compact within a scripted run (zero: no
	// retention).
	Retention ClusterRetention
	// LedgerCompactBytes is the nodes' node.Config.LedgerCompactBytes
	// (0: the simulator's 1024, so groups checkpoint often; < 0: never).
	LedgerCompactBytes int64
	KeepTrace          bool
	// NoLeaderRebalance turns off the hand-back of partitions to their
	// preferred leaders (node.ClusterConfig.NoLeaderRebalance).
	NoLeaderRebalance bool
	// Members makes the consumers group members (JOIN, heartbeats,
	// notices; members.go) with ExclusiveDelivery checked on every
	// message; a client fault may also crash a member. Shared makes them
	// members of a shared group: every member competes for every
	// partition (liveness and the other checks; no ExclusiveDelivery).
	Members bool
	Shared  bool
	// DeadLetters makes the consumers subscribe with max_deliver
	// deadLetterMaxDeliver and NACK every poison message: those go to the
	// group's dead-letter topic under every fault, watched at every node
	// (deadletter.go: DeadLetterOnce, NoDeadLetterOfAnAck,
	// DeadLetterIsTheRecord). Not with GroupDeletes (each incarnation
	// dead-letters anew).
	DeadLetters bool
	// Logs, when set, receives every node's log lines (slog text, with
	// virtual time and the node's id): what the nodes said, beside the
	// trace of what happened.
	Logs io.Writer
	// Schedules adds the scheduled-delivery workload (sched.go): this many
	// messages scheduled into their own topic, each due within 3 s, with
	// NeverEarly and ExactlyOnce checked (0: none).
	Schedules int
	// SchedCancels, with Schedules, cancels this many acknowledged
	// schedules at random moments of the fault phase (schedcancel.go:
	// CancelledNeverPublished; 0: none).
	SchedCancels int
	// LanePauses, with Schedules, pauses a destination's lane this many
	// times at random moments of the fault phase and resumes it a while
	// later (lanepause.go: PauseHolds; 0: none).
	LanePauses int
	// LaneRetire makes the last of the LanePauses a RETIRE, never
	// resumed (lanepause.go).
	LaneRetire bool
	// LaneRecreate makes half the LanePauses a re-creation of the
	// destination — deleted, declared again, its lanes resumed
	// (lanerecreate.go: LaneFiresOnlyIntoItsIncarnation).
	LaneRecreate bool
	// KV adds the KV workload (kv.go): 3 clients run this many operations
	// each (put, get, CAS, delete) on 5 keys of a bucket replicated on
	// every node, and the history is checked for linearizability; a
	// watcher follows the bucket from revision 1 (kvwatch.go) (0: none).
	KV int
	// TopicChurn adds the topic churn (topicchurn.go): a client deletes
	// and re-declares a topic of its own this many times, with
	// DeletedNeverResurrected and DeletedDataRemoved checked (0: none).
	TopicChurn int
	// NoHeirFault turns the heir fault off (coordcheck.go: with crash
	// faults, topic churn or group deletes, the metadata leader killed as
	// it applies an entry of theirs no follower applied): the run is then
	// as it was before that fault existed.
	NoHeirFault bool
	// GroupDeletes deletes the consumers' group this many times, at
	// random moments of the fault phase, the consumers coming back as its
	// next incarnation (groupdelete.go; with force when not Members; not
	// with Shared; 0: none).
	GroupDeletes int
	// GroupUpdates sets the consumers' group's ack wait with a group
	// update this many times, at random moments of the fault phase
	// (groupupdate.go; not with GroupDeletes; 0: none).
	GroupUpdates int

	// SchedOutageMsMax bounds a destination outage of the scheduled
	// workload (ClusterFaults.Outage, schedghost.go; 0: 2,500 ms). Longer
	// ones outlast the scheduler's evidence (5 s).
	SchedOutageMsMax int64
}

// ClusterRetention is a cluster run's retention: the topic's
// RetentionBytes per partition, and the node settings that make it bite
// in a short run (zeros take the node defaults). Records below a
// partition's start are then gone on purpose: the checker requires them
// neither delivered nor read back.
type ClusterRetention struct {
	Bytes int64 // the topic's RetentionBytes (0: no retention)
	// AgeMs is the topic's RetentionMs (0: none); with Bytes only. Records
	// then also expire by age, an idle partition's last ones included
	// (IdleLogExpires: its active segment is sealed).
	AgeMs            int64
	SegmentBytesMax  int64 // node.Config.SegmentBytesMax
	RetentionCheckMs int64 // node.Config.RetentionCheckMs
	// ReservationMs is how long a leader keeps the log a silent follower
	// needs (node.ClusterConfig.Reservation).
	ReservationMs int64
	// ChaseMs is the leader's tail-chase window (node.ClusterConfig.
	// ChaseWindow; 0: the reservation).
	ChaseMs int64
	// Updates changes the topic's retention this many times under the
	// faults, with topic updates (retentionupdate.go).
	Updates int
}

// RetentionPreset is an aggressive retention for soaks (`nereus sim
// --nodes N --retention`) and the scripted retention scenarios: the
// workload's topic keeps 4 KiB in 1 KiB segments, checked every 20 ms, and
// a leader keeps what a silent follower needs for 200 ms. Compaction then
// passes producers' records all the time (dedup carries), and lagging
// replicas rebuild from the leader's snapshot point.
var RetentionPreset = ClusterRetention{Bytes: 4096, SegmentBytesMax: 1024, RetentionCheckMs: 20, ReservationMs: 200}

// retentionFlags is the sim command's flags for r ("" when it has none).
func retentionFlags(r ClusterRetention) (string, bool) {
	age, updates := r.AgeMs, r.Updates
	r.AgeMs, r.Updates = 0, 0
	switch {
	case r == (ClusterRetention{}) && age == 0 && updates == 0:
		return "", true
	case r != RetentionPreset:
		return "", false
	}
	flags := " --retention"
	if age > 0 {
		flags += fmt.Sprintf(" --retention-age %d", age)
	}
	if updates > 0 {
		flags += fmt.Sprintf(" --retention-updates %d", updates)
	}
	return flags, true
}

func (o *ClusterOptions) setDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Replicas == 0 {
		o.Replicas = uint8(min(o.Nodes, 255))
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
	"skip-install-gate": {Partition: partition.Mutations{SkipInstallGate: true}},
	"skip-dedup-seal":   {Partition: partition.Mutations{SkipDedupSeal: true}},
	// A log compacted past producers' latest mentions, no dedup carry.
	// With --retention (seed 15; TestCompactForgetsProducersCaughtWithRetention):
	// NoDuplicateFromReplay, a retry appended again by a replica whose
	// dedup table was built from the kept log. With --members --pub-batch
	// --schedules 30 (seeds 11027, 11101): ExactlyOnce, a retried
	// SCHEDULE admitted again by such an owner.
	"compact-forgets-producers": {Partition: partition.Mutations{CompactForgetsProducers: true}},
	"ack-before-commit":         {AckLog: acklog.Mutations{AckBeforeCommit: true}},
	// A re-ack of a seq whose record is in flight needs no record of its
	// own (the ack log before the consume model found it).
	"re-ack-waits-for-any-record": {AckLog: acklog.Mutations{ReAckWaitsForAnyRecord: true}},
	"coordinate-before-install":   {CoordinateBeforeInstall: true},
	// The metadata leader decides and reads as coordinator before it took
	// office (CoordinatorTookOffice; the cluster package's
	// TestCoordinatorDecidesOnceItTookOffice catches it).
	"coordinate-before-office": {CoordinateBeforeOffice: true},
	// The metadata leader decides and reads as coordinator without its
	// lease (CoordinatorHoldsLease): a deposed leader answers stale.
	"coordinate-without-lease": {CoordinateWithoutLease: true},
	// A member's meta.json forgets the deleted group incarnations: after
	// a restart its applied metadata differs from the others'
	// (MetadataAgrees).
	"meta-state-forgets-group-deletes": {MetaStateForgetsGroupDeletes: true},
	// With --group-updates: a runner started after a group update takes
	// its consumers' PULL settings (GroupSettingsOnEveryNode).
	"group-settings-per-node": {GroupSettingsPerNode: true},
	// With --replicas 1 and bit flips: a partition's only replica cuts a
	// flipped last batch as a torn tail in silence; its acknowledged
	// records come back as others (CommittedPrefixAgreement, seed 6 of
	// crash,bitflip; TestLoneReplicaDamageIsRepaired).
	"lone-torn-tail-silent": {LoneTornTailSilent: true},
	// With --replicas 1 and bit flips: a partition's only replica replays
	// its group's acks only up to the first record a repair dropped; the
	// acks after it are forgotten and their messages delivered again
	// (AckFloorNeverRedelivered; TestLoneRepairForgetsOnlyWhatItDropped).
	"group-replay-stops-at-lost": {GroupReplayStopsAtLost: true},
	// With --replicas 1 --kv N and bit flips: a bucket's only replica cuts
	// a flipped last batch as a torn tail and hands its seqs out again; a
	// watcher that went past them is never told (LossExpiresEveryCursor;
	// TestLoneBucketLossesAreSaid).
	"torn-seqs-reused": {TornSeqsReused: true},
	// With --replicas 1 --kv N and bit flips: a bucket starts watches
	// before the fence after a repair's gap; a watcher past the gap goes
	// on (LossExpiresEveryCursor; TestLoneBucketLossesAreSaid).
	"kv-watch-before-fence": {KVWatchBeforeFence: true},
	// With --nodes 1 (or --replicas 1) and bit flips: an ACK entry of a
	// partition whose only replica, here, is restarting is answered
	// NOT_LEADER; the ack was durable, the consumer waits for a
	// redelivery that never comes (Liveness; with ack-ignores-office,
	// TestOneNodeClusterAcksAwaitOffice).
	"lone-ack-redirected": {LoneAckRedirected: true},
	// With --dead-letters: dead letters published without their producer
	// identity; one published again is appended twice (DeadLetterOnce).
	"dead-letter-not-idempotent": {DeadLetterNotIdempotent: true},
	"dead-on-last-delivery":      {DeadOnLastDelivery: true},
	"dead-letter-of-next-record": {DeadLetterOfTheNextRecord: true},
	"send-before-persist":        {SendBeforePersist: true},
	"commit-on-leader-fsync":     {Replica: replica.Mutations{CommitOnLeaderFlushAlone: true}},
	"trust-uncertain-grants":     {Replica: replica.Mutations{TrustUncertainGrants: true}},
	"rebuilding-promotable":      {Replica: replica.Mutations{RebuildingPromotable: true}},
	// With --nodes 1 --faults crash: an ACK naming a partition whose only
	// replica is taking office again is answered STALE_DELIVERY at once;
	// the rebuild then finds it durable and never redelivers it, and the
	// consumer's ack stays unconfirmed (Liveness).
	"ack-ignores-office":              {AckIgnoresOffice: true},
	"sched-forwards-to-first-replica": {SchedForwardsToFirstReplica: true},
	// With --lane-pauses: a SCHEDULE to a closed lane is refused at
	// admission, a retry of one admitted before included
	// (RefusedNeverPublished: the client hears "refused" of a schedule
	// that fires once the lane opens).
	"sched-retry-refused-on-closed-lane": {SchedRetryRefusedOnClosedLane: true},
	// With --lane-pauses: a new SCHEDULE to a CLOSED lane is refused
	// with nothing written; another send of it on its way is taken as
	// new once the lane opens (RefusalIsFinal).
	"sched-refusal-not-recorded": {SchedRefusalNotRecorded: true},
	"accept-stale-flushed":       {Replica: replica.Mutations{AcceptStaleFlushed: true}},
	// With --nodes 5 --policy all: a replica whose promise is lost
	// answers no PROMISE_QUERY (as before PROMISE_UNKNOWN); two such of
	// five wait for each other for good, and so does every write
	// (Liveness, in TestTwoLostPromisesOfFiveAtNodeLevel).
	"lost-peer-silent": {Replica: replica.Mutations{LostPeerSilent: true}},
	// With --schedules: a leader's lease dated from its answers' arrival
	// (NoPublishWithoutBothGates: a paused owner publishes after another
	// took office).
	"lease-from-receipt": {Replica: replica.Mutations{LeaseFromReceipt: true}},
	// With --members: a moving partition assigned before its REVOKE is
	// answered (ExclusiveDelivery).
	"assign-before-revoke": {Group: group.Mutations{AssignBeforeRevoke: true}},
	// With --members: the assignment ignores the previous one
	// (MinimalRebalance, checked as each node applies each group entry:
	// TestRebalancesAreMinimalAtNodeLevel).
	"group-non-sticky": {Group: group.Mutations{NonSticky: true}},
	// With --members: every assignment step gives the unmoved partitions
	// to their owners again, at a new epoch (CheckQuiet: members whose
	// partitions do not move hear nothing).
	"group-reassign-unmoved": {Group: group.Mutations{ReassignUnmoved: true}},
	// With --pub-batch --topic-churn 5 --retention (seed 51003): a
	// partition's leader delivers with its lease run out, not degraded
	// (AckFloorNeverRedelivered: woken from a pause, a deposed leader
	// hands out a message whose ack a later leader had confirmed).
	"deliver-without-lease": {DeliverWithoutLease: true},
	// A group no runner serves on a partition's leader is never carried
	// (TestGroupKeptAcrossRetentionAtNodeLevel: the log never compacts
	// past the checkpoint of a group whose consumers went away).
	"no-group-carry": {NoGroupCarry: true},
	// A group's runners name its records by its bare name, whatever its
	// incarnation (TestGroupDeletedAtNodeLevel: the group used again after
	// a delete shares its records with the deleted one).
	"group-key-ignores-incarnation": {GroupKeyIgnoresIncarnation: true},
	// With --group-deletes and no --members: a forced group delete removes
	// whatever incarnation is current when it applies, not the one it was
	// decided against (GroupDeleteNamesItsIncarnation: the copies an
	// episode asked delete the next incarnation too).
	"group-delete-ignores-incarnation": {Group: group.Mutations{DeleteIgnoresIncarnation: true}},
	// With --group-deletes and no --members: the coordinator decides a
	// forced DELETE naming an incarnation already deleted against the
	// current one (GroupDeleteNamesItsIncarnation: an episode's retries,
	// asked after a node applied its delete, delete the next incarnation;
	// meta's guard is GroupDeleteRetryDeletesOnce).
	"group-delete-retry-deletes-again": {Group: group.Mutations{DeleteRetryIgnoresIncarnation: true}},
	// With --kv: a bucket's leader answers reads without its lease
	// (KVLinearizable: an ex-leader's stale read).
	"kv-read-without-lease": {KVReadWithoutLease: true},
	// With --kv: a bucket's leader takes its lease from the lease ticks
	// its partition last published, not from the lease's end on the clock
	// (KVLinearizable, in TestKVHeldUpLeaderReadsFenced: a leader whose
	// member is held up serves stale reads).
	"kv-lease-from-ticks": {KVLeaseFromTicks: true},
	// With --kv: a bucket's log compacted through what its runner
	// applied, not its latest checkpoint (KVReplicasAgree: a replica
	// whose log starts there cannot rebuild the bucket).
	"kv-compact-past-checkpoint": {KVCompactPastCheckpoint: true},
	// With --kv: a bucket's leader refuses a CAS against its applied
	// state without its lease (KVLinearizable: a leader whose members are
	// stalled answers a stale REVISION_MISMATCH).
	"kv-refuse-without-lease": {KV: kv.Mutations{RefuseWithoutLease: true}},
	// With --kv: a checkpoint counted wherever it lands
	// (CheckpointBaseIsPrecedingSeq; the kernel's tests and the model
	// catch it, the simulator not in 40 seeds of --kv 30).
	"kv-checkpoint-any-base": {KV: kv.Mutations{CheckpointAnyBase: true}},
	// With --replicas 1 --kv and bit flips (kvloss.go): the guards of a
	// bucket of one replica that loses records to a repair
	// (TestLoneBucketLossesAreSaid).
	// Its runner skips the lost records a member alone's repair fills
	// dropped seqs with (LossExpiresEveryCursor: a watcher that saw a
	// lost write is never told).
	"kv-lost-record-skipped": {KVLostRecordSkipped: true},
	// A fence raises no floor (LossExpiresEveryCursor).
	"kv-fence-keeps-floor": {KV: kv.Mutations{FenceKeepsFloor: true}},
	// A fence answers every gap before it, one a later repair made too
	// (LossExpiresEveryCursor).
	"kv-fence-answers-any-gap": {KVFenceAnswersAnyGap: true},
	// A gap read before any creation record is stepped over (the bucket
	// answers NOT_FOUND for good: Liveness).
	"kv-lost-creation-skipped": {KVLostCreationSkipped: true},
	// With --schedules: the scheduler's owner and applied state
	// (sched_mutation_test.go).
	"sched-publish-without-lease": {Sched: sched.Mutations{PublishWithoutLease: true}},
	"sched-publish-before-intent": {Sched: sched.Mutations{PublishBeforeIntent: true}},
	"sched-fenced-still-fires":    {Sched: sched.Mutations{FencedStillFires: true}},
	"sched-ready-not-revalidated": {Sched: sched.Mutations{ReadyNotRevalidated: true}},
	// With --lane-pauses --lane-recreate: a lane publishes into its
	// destination declared again, no operator asked.
	"sched-follows-recreated-destination": {Sched: sched.Mutations{FollowsRecreatedDestination: true}},
	// With --lane-pauses --lane-recreate: a schedule admitted for the
	// destination declared again is claimed for the deleted one (its
	// lane learns of the re-creation late), then resolved UNKNOWN.
	"sched-later-incarnation-admitted": {SchedState: sched.StateMutations{LaterIncarnationAdmitted: true}},
	"sched-claims-before-due":          {Sched: sched.Mutations{ClaimsBeforeDue: true}},
	// With --lane-pauses: a PAUSED lane claims and publishes as an OPEN
	// one (PauseHolds).
	"sched-pause-ignored": {Sched: sched.Mutations{PauseIgnored: true}},
	// With --lane-pauses: a publish decided before a pause applied in
	// the same pass is still sent (PauseHolds, at the pause's answer).
	"sched-gate-not-rechecked-at-take": {Sched: sched.Mutations{GateNotRecheckedAtTake: true}},
	// With --sched-cancels: a cancel takes a FIRING schedule too
	// (CancelledNeverPublished: its publish was on its way).
	"sched-cancel-firing": {SchedState: sched.StateMutations{CancelFiring: true}},
	// With --lane-pauses --lane-retire: a retried RETIRE is refused as
	// the lane is RETIRED (Liveness: the operator asks it for good).
	"sched-retire-retried-refused": {SchedState: sched.StateMutations{RetireRetriedRefused: true}},
	"sched-reuse-fire-seq":         {SchedState: sched.StateMutations{ReuseFireSeq: true}},
	// With --schedules: a shard owner's lease guard taken from the lease
	// ticks its replica last published, not from the lease's end on the
	// clock (NoPublishWithoutBothGates, in TestSchedHeldUpOwnerFenced: an
	// owner whose member is held up publishes after its lease ran out).
	"sched-guard-from-ticks": {SchedGuardFromTicks: true},
}

// ClusterReproduce is the command that runs o again.
func ClusterReproduce(o ClusterOptions) string {
	o.setDefaults()
	cmd := fmt.Sprintf("go run ./cmd/nereus sim --nodes %d --faults %s --steps %d --seed %d", o.Nodes, o.Faults, o.Steps, o.Seed)
	if int(o.Replicas) != o.Nodes {
		cmd += fmt.Sprintf(" --replicas %d", o.Replicas)
	}
	if o.SyncAll {
		cmd += " --policy all"
	}
	if o.Members {
		cmd += " --members"
	}
	if o.DeadLetters {
		cmd += " --dead-letters"
	}
	if o.PubBatch {
		cmd += " --pub-batch"
	}
	if o.Schedules > 0 {
		cmd += fmt.Sprintf(" --schedules %d", o.Schedules)
	}
	if o.LanePauses > 0 {
		cmd += fmt.Sprintf(" --lane-pauses %d", o.LanePauses)
	}
	if o.LaneRetire {
		cmd += " --lane-retire"
	}
	if o.LaneRecreate {
		cmd += " --lane-recreate"
	}
	if o.SchedCancels > 0 {
		cmd += fmt.Sprintf(" --sched-cancels %d", o.SchedCancels)
	}
	if o.KV > 0 {
		cmd += fmt.Sprintf(" --kv %d", o.KV)
	}
	if o.TopicChurn > 0 {
		cmd += fmt.Sprintf(" --topic-churn %d", o.TopicChurn)
	}
	if o.GroupDeletes > 0 {
		cmd += fmt.Sprintf(" --group-deletes %d", o.GroupDeletes)
	}
	if o.GroupUpdates > 0 {
		cmd += fmt.Sprintf(" --group-updates %d", o.GroupUpdates)
	}
	if o.Shared {
		cmd += " # with ClusterOptions.Shared (no CLI flag: run it from a test)"
	}
	if o.NoHeirFault && (o.TopicChurn > 0 || o.GroupDeletes > 0) {
		cmd += " # with ClusterOptions.NoHeirFault (no CLI flag: run it from a test)"
	}
	if o.SchedOutageMsMax != 0 {
		cmd += fmt.Sprintf(" # with ClusterOptions.SchedOutageMsMax %d (no CLI flag: run it from a test)", o.SchedOutageMsMax)
	}
	if flags, ok := retentionFlags(o.Retention); ok {
		cmd += flags
	} else {
		cmd += fmt.Sprintf(" # with ClusterOptions.Retention %+v (no CLI flag: run it from a test)", o.Retention)
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
	if err := o.Validate(); err != nil {
		panic(err) // the CLI validates first; a test's options are its own bug
	}
	s := newClusterSim(o)
	if s.clusterFaults != (ClusterFaults{}) {
		s.w.after(s.w.between(50, 200), s.injectClusterFault)
	}
	return s.runPhases()
}

// Validate reports options no run can honour: a topic's replication
// factor is 1, 3 or 5 and at most the cluster's size (meta.Normalize).
func (o ClusterOptions) Validate() error {
	o.setDefaults()
	switch {
	case o.Nodes < 1:
		return fmt.Errorf("a cluster run needs at least one node, not %d", o.Nodes)
	case o.Replicas != 1 && o.Replicas != 3 && o.Replicas != 5:
		return fmt.Errorf("the topics' replicas (default: the number of nodes) must be 1, 3 or 5, not %d", o.Replicas)
	case int(o.Replicas) > o.Nodes:
		return fmt.Errorf("%d replicas need at least as many nodes, not %d", o.Replicas, o.Nodes)
	case (o.LanePauses > 0 || o.SchedCancels > 0) && o.Schedules == 0:
		return fmt.Errorf("lane pauses and schedule cancels need the scheduled workload (--schedules)")
	case o.LaneRetire && o.LanePauses == 0:
		return fmt.Errorf("a lane retire is the last of the lane pauses (--lane-pauses)")
	case o.LaneRecreate && o.LanePauses == 0:
		return fmt.Errorf("a destination re-creation is one of the lane pauses (--lane-pauses)")
	case o.GroupUpdates > 0 && o.GroupDeletes > 0:
		return fmt.Errorf("group updates and group deletes cannot be combined: a delete drops the settings the updates gave")
	}
	return nil
}

// newClusterSim builds a cluster run with its nodes started and its
// workload scheduled, but no fault yet.
func newClusterSim(o ClusterOptions) *sim {
	o.setDefaults()
	w := newWorld(o.Seed, o.KeepTrace)
	w.logs = o.Logs
	chk := newChecker(w, map[uint32]bool{})
	chk.perIncarnation = true
	if o.Retention.Bytes > 0 {
		chk.retained = map[uint32]uint64{}
	}
	s := &sim{opts: Options{Seed: o.Seed, Steps: o.Steps, Producers: o.Producers, MessagesPerProducer: o.MessagesPerProducer,
		Consumers: o.Consumers, Partitions: o.Partitions, KeepTrace: o.KeepTrace, DeadLetters: o.DeadLetters && o.GroupDeletes == 0},
		w: w, chk: chk, partitioned: map[string]bool{}, net: newPeerNet(w), replicas: o.Replicas, syncAll: o.SyncAll,
		retention: o.Retention, retentionBytes: o.Retention.Bytes, retentionMs: o.Retention.AgeMs,
		clusterFaults: o.Faults, pubErrors: map[wire.Code]int{}, ackErrors: map[wire.Code]int{}, ackEntryCodes: map[wire.Code]int{}, memberEvents: map[string]int{},
		ledgerFlips: map[string]*ledgerFlip{}, acksForgotten: map[string]int{}}
	s.opts.setDefaults()
	if o.Retention.Bytes > 0 {
		s.replays = newReplayWatch(chk)
	}
	var members []node.Member
	for i := 1; i <= o.Nodes; i++ {
		members = append(members, node.Member{ID: fmt.Sprintf("n%d", i), PeerAddr: fmt.Sprintf("n%d", i)})
	}
	for i := 1; i <= o.Nodes; i++ {
		b := newBroker(w, chk, o.Mutations)
		b.id, b.peers = members[i-1].ID, s.net
		b.cluster = &node.ClusterConfig{Members: members, Tick: clusterTick, DeclareTimeout: clusterDeclareTimeout,
			Reservation: time.Duration(o.Retention.ReservationMs) * time.Millisecond, NoLeaderRebalance: o.NoLeaderRebalance,
			ChaseWindow: time.Duration(o.Retention.ChaseMs) * time.Millisecond}
		if o.KV > 0 && o.Retention.ReservationMs == 0 {
			// A follower silent this long is left behind by the bucket's
			// truncation: it is reset to the leader's snapshot point and
			// rebuilds from the checkpoint in the log.
			b.cluster.Reservation = kvReservation
		}
		b.segmentBytesMax, b.retentionCheckMs = o.Retention.SegmentBytesMax, o.Retention.RetentionCheckMs
		if o.KV > 0 {
			// The bucket checkpoints every few hundred bytes of log and
			// drops whole 2 KiB segments behind its checkpoints, so
			// followers rebuild from checkpoints in the log under the
			// faults (kv.go).
			b.kvCheckpointMinBytes = kvCheckpointMinBytes
			b.segmentBytesMax = cmp.Or(b.segmentBytesMax, kvSegmentBytesMax)
			b.retentionCheckMs = cmp.Or(b.retentionCheckMs, kvRetentionCheckMs)
		}
		if o.LedgerCompactBytes != 0 {
			b.ledgerCompactBytes = o.LedgerCompactBytes
		}
		b.dedupSnapshotBytes = dedupSnapshotBytes
		if o.NoDedupSnapshots {
			b.dedupSnapshotBytes = -1
		}
		if o.Schedules > 0 {
			b.schedPublish = func(shard uint32, p sched.Publish) {
				s.sched.ghost.published(b, shard, p)
				if s.schedPublished != nil {
					s.schedPublished(b, shard, p)
				}
			}
			b.schedCompact = true
			b.schedCompacted = func(shard uint32, ev string) { s.sched.ghost.compacted(b, shard, ev) }
			if b.retentionCheckMs == 0 {
				b.retentionCheckMs = schedCompactEveryMs
			}
		}
		id := uint32(i)
		b.onCrash = func() {
			if l := s.net.members[id]; l != nil {
				l.closed = true
			}
			// What it synced in the event it died in (a FLUSHED it sent
			// then may still count) is durable: seen before it is gone.
			s.recordViews(b)
			if s.kv != nil && b.node != nil {
				s.kv.countRebuilds(b.node)
			}
		}
		s.net.brokers[id] = b
		s.nodes = append(s.nodes, b)
	}
	s.b = s.nodes[0]
	s.ghosts = make([]*invariant.Group, o.Partitions)
	for p := range s.ghosts {
		s.ghosts[p] = invariant.NewGroup(int(o.Replicas), o.SyncAll)
	}
	s.observed = map[commitKey]uint64{}
	s.replicaViews = map[replicaKey]node.ReplicaView{}
	s.flipped = map[string]bool{}
	s.heldBeforeDrop = map[replicaKey][]node.ReplicaView{}
	s.lostPromises = map[string]uint64{}
	s.replicaStates = map[string]int{}
	s.lagging, s.recoveries = map[replicaKey]lagEpisode{}, map[string]int{}
	s.metaGhost = invariant.NewGroup(o.Nodes, false)
	s.metaViews = map[string]node.ReplicaView{}
	s.w.tracef("cluster run seed=%d nodes=%d faults=%s", o.Seed, o.Nodes, o.Faults)
	for _, b := range s.nodes {
		b.replicaDrop = func(topic string, p uint32, st replica.Status, synced uint64) { s.beforeDrop(b, topic, p, st, synced) }
		b.groupApply = func(seq uint64, before, after *group.State, parts group.Topics) {
			s.groupApplied(b, seq, before, after, parts)
		}
	}
	if o.Replicas == 1 && o.Faults.BitFlip {
		s.watchLoneRepairs()
	}
	for _, b := range s.nodes {
		b.start()
	}
	for i := 0; i < s.opts.Producers; i++ {
		p := &producer{s: s, id: uint64(1000 + i), window: 8, messagesMax: uint64(s.opts.MessagesPerProducer),
			nextSeq: 1, inflight: map[uint64]string{}, partition: int32(uint32(i) % s.opts.Partitions), at: i,
			batch: o.PubBatch}
		s.producers = append(s.producers, p)
		s.w.after(s.w.between(0, 10), p.connect)
	}
	for i := 0; i < s.opts.Consumers; i++ {
		c := newConsumer(s, i+1, 8)
		s.consumers = append(s.consumers, c)
		s.w.after(s.w.between(0, 10), c.connect)
		if o.Members || o.Shared {
			c.m = newSimMember(o.Shared, i)
			s.w.after(s.w.between(0, 10), c.joinGroup)
		}
	}
	if o.Schedules > 0 {
		sc := &schedClient{s: s, total: o.Schedules, window: 8, due: make([]int64, o.Schedules),
			laneSinceMs: map[schedLane]int64{}, seenIn: map[string]uint64{}, inflight: map[int]bool{}, sentTo: map[int]int{}, attempts: map[int]uint32{},
			acked: map[string]int64{}, conns: make([]*conn, len(s.nodes)), ready: make([]bool, len(s.nodes)), seen: map[string]bool{},
			unseen: map[int]bool{}, ids: map[int]schedID{}, refused: map[int]bool{}, mayRefuse: map[int]bool{}, declared: make([]int, len(s.nodes))}
		sc.ghost = newSchedGhost(s, sc)
		sc.ghost.outageMsMax = o.SchedOutageMsMax
		for shard := range sc.shardAt {
			sc.shardAt[shard] = shard % len(s.nodes)
		}
		s.sched = sc
		for at := range s.nodes {
			s.w.after(s.w.between(0, 10), func() { sc.connect(at) })
		}
		if o.LanePauses > 0 {
			sc.pauser = newLanePauser(s, o.LanePauses, o.LaneRetire, o.LaneRecreate)
		}
		if o.SchedCancels > 0 {
			sc.canceler = newSchedCanceller(s, sc, o.SchedCancels)
		}
	}
	if o.KV > 0 {
		s.kv = newKVWorkload(s, o.KV)
	}
	if o.TopicChurn > 0 {
		s.churn = &churnClient{s: s, rounds: o.TopicChurn, at: 1}
		s.w.after(s.w.between(0, 100), s.churn.connect)
	}
	if o.GroupDeletes > 0 && !o.Shared {
		s.groupDel = newGroupDeleter(s, o.GroupDeletes, !o.Members)
	}
	if o.Retention.Updates > 0 && o.Retention.Bytes > 0 {
		s.retentionUpd = newRetentionUpdater(s, o.Retention.Updates)
	}
	if o.GroupUpdates > 0 {
		s.groupUpd = newGroupUpdater(s, o.GroupUpdates)
	}
	s.meta = newMetaChecker(s)
	if s.opts.DeadLetters {
		s.deadLetters = newDeadLetterWatch(s)
	}
	if s.churn != nil || s.groupDel != nil {
		s.coord = newCoordChecker(s)
		s.coord.heirFaults = s.clusterFaults.Crash && !o.NoHeirFault
	}
	s.w.after(tickMs, s.tick)
	return s
}

// runPhases runs the fault phase, heals (liveness), and ends with a power
// loss and a full read-back.
func (s *sim) runPhases() Result {
	s.safetyPhase()
	if s.chk.violation == nil {
		s.livenessPhase()
	}
	if s.chk.violation == nil {
		s.clusterFinalPhase()
	}
	r := s.result()
	r.Faults = s.faultsInjected
	r.ReplicaStates, r.Recoveries = s.replicaStates, s.recoveries
	for p := range s.opts.Partitions {
		hosts := 0
		for _, b := range s.nodes {
			if names, _ := b.fs.List(partitionDir(p)); len(names) > 0 {
				hosts++
			}
		}
		r.PartitionHosts = append(r.PartitionHosts, hosts)
	}
	r.MinorityPromiseLosses = s.minorityPromiseLosses
	r.PubErrors = s.pubErrors
	r.AckEntryCodes = s.ackEntryCodes
	r.PubBatches = s.pubBatches
	r.Members = s.memberEvents
	if s.sched != nil {
		r.Scheduled, r.SchedPublished = len(s.sched.acked), len(s.sched.seen)
		r.SchedStats = s.sched.ghost.stats
		if p := s.sched.pauser; p != nil {
			r.SchedStats["lane pauses answered"] = p.pauses
			r.SchedStats["of which closes"] = p.closed
			if p.retired != "" {
				r.SchedStats["lane retired"] = 1
			}
			r.SchedStats["schedules refused by a closed lane"] = len(s.sched.refused)
			r.SchedStats["schedules due on a paused lane"] = p.heldBack
			p.recreateStats(r.SchedStats)
		}
		if c := s.sched.canceler; c != nil {
			for o, n := range c.counts() {
				r.SchedStats["cancels "+o.String()] = n
			}
		}
	}
	if s.churn != nil {
		r.TopicDeletes, r.TopicDeclares = s.churn.deletes, s.churn.declares
	}
	if s.groupDel != nil {
		r.GroupDeletes = s.groupDel.deletes
	}
	if s.retentionUpd != nil {
		r.RetentionUpdates = s.retentionUpd.answered
	}
	if s.groupUpd != nil {
		r.GroupUpdates, r.GroupRunnersChecked = s.groupUpd.answered, s.groupUpd.checked
	}
	if s.coord != nil {
		r.Coordinator = s.coord.counts
	}
	r.MetadataCompared = s.meta.checked
	if s.kv != nil {
		r.KVOps, r.KVUnknown, r.KVWatches, r.KVExpired = len(s.kv.history), s.kv.unknown, s.kv.watcher.resumes, s.kv.watcher.expired
		r.KVLogStartMax, r.KVCheckpointMax, r.KVRebuilds, r.KVResets = s.kv.logStartMax, s.kv.checkpointMax, s.kv.rebuilds, s.kv.resets
	}
	r.Restarts = 0
	for _, b := range s.nodes {
		r.Restarts += max(b.started-1, 0)
	}
	return r
}

// observeReplication checks, after every event, what each node says of
// each partition: one leader per epoch, elected on a quorum of durable
// promises (the members' hard-state files), and committed entries that
// never disagree across nodes or change (invariant.Group) — with a
// retention, nor commit one producer_seq at two seqs (s.replays).
func (s *sim) observeReplication() {
	for _, b := range s.nodes {
		if b.up {
			s.recordViews(b)
		}
	}
	for ni, b := range s.nodes {
		if !b.up || s.chk.violation != nil {
			continue
		}
		s.observeMetaLeader(ni, b)
		s.observeMetaCommits(ni, b)
		for _, t := range b.node.Metadata([]string{simTopic}) {
			for _, p := range t.Partitions {
				s.observePartition(ni, b, p)
			}
		}
	}
}

func (s *sim) observePartition(ni int, b *broker, p wire.PartitionInfo) {
	if v, ok := s.replicaViews[replicaKey{b.id, p.Partition}]; ok && v.Status.Anomalies > 0 {
		s.chk.violate(KernelAssertion, "%s's member of partition %d refused %d impossible messages (a second leader of an epoch, or a rewrite of a committed entry)",
			b.id, p.Partition, v.Status.Anomalies)
		return
	}
	g := s.ghosts[p.Partition]
	if p.Leader == b.id {
		for _, r := range p.Replicas {
			if r.State != "" {
				s.replicaStates[r.State]++
			}
			s.trackRecovery(replicaKey{r.Node, p.Partition}, r.State)
		}
	} else {
		for _, r := range p.Replicas {
			if r.Node == b.id && r.State != "" {
				s.replicaStates[r.State+" (self)"]++ // a follower's own Rebuilding or Uncertain
			}
		}
	}
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
		if errors.Is(err, storage.ErrOutOfRange) && from < p.StartSeq {
			s.observed[k] = p.StartSeq - 1 // compacted by retention: checked from the start on
			from = p.StartSeq
			continue
		}
		if err != nil || len(entries) == 0 {
			return // retention, or not applied yet: looked at again later
		}
		for _, e := range entries {
			if e.Seq > p.CommitSeq {
				break
			}
			ge := invariant.Entry{Epoch: e.Epoch, Value: string(e.Record.Value)}
			holders := 0
			for _, o := range s.nodes {
				if s.holds(o, p.Partition, e.Seq, e.Epoch) {
					holders++
				}
			}
			if v := g.Visible(uint32(ni+1), e.Seq, ge, holders); v != nil {
				s.chk.violate(v.Invariant, "partition %d: %s", p.Partition, v.Detail)
				return
			}
			if s.replays != nil && !s.replays.committed(p.Partition, &e, b.id, p.StartSeq, false) {
				return
			}
			s.observed[k] = e.Seq
		}
		from = s.observed[k] + 1
	}
}

// holds reports whether node b's member of partition p durably holds the
// entry (seq, epoch): its log synced through seq, the entry there of that
// epoch; or compacted into its snapshot point (only committed entries
// are). A node that is down holds what it had synced as it died (a crash
// keeps synced writes; recordViews).
func (s *sim) holds(b *broker, p uint32, seq, epoch uint64) bool {
	k := replicaKey{b.id, p}
	v, ok := s.replicaViews[k]
	return viewHolds(v, ok, seq, epoch) || s.heldBeforeDamage(k, seq, epoch)
}

// heldBeforeDamage reports whether a member on a damaged disk held the
// entry (seq, epoch) before it dropped a range (its damaged range and
// what follows, which it then rebuilds): the entry counts where it was
// when it became visible. Any other member holds only what it holds now.
// (Before, a flipped node counted as holding everything: a leader that
// counted a damaged member's FLUSHED for entries it never held would
// have passed.)
func (s *sim) heldBeforeDamage(k replicaKey, seq, epoch uint64) bool {
	for _, v := range s.heldBeforeDrop[k] {
		if viewHolds(v, true, seq, epoch) {
			return true
		}
	}
	return false
}

// viewHolds reports whether a member seen as v (ok: seen at all) durably
// holds the entry (seq, epoch).
func viewHolds(v node.ReplicaView, ok bool, seq, epoch uint64) bool {
	switch {
	case !ok:
		return false
	case seq <= v.Status.SnapSeq:
		return true
	case seq > v.Synced:
		return false
	}
	return epochOf(v.Status, seq) == epoch
}

type replicaKey struct {
	node      string
	partition uint32
}

// observeMetaLeader checks OneLeaderPerEpoch and InstallNeedsQuorumPromise
// for the metadata log, as node ni reports leading it.
func (s *sim) observeMetaLeader(ni int, b *broker) {
	v, ok := b.node.Replica(meta.MetaTopic, 0)
	if ok && v.Status.Anomalies > 0 {
		s.chk.violate(KernelAssertion, "%s's %s member refused %d impossible messages", b.id, meta.MetaTopic, v.Status.Anomalies)
		return
	}
	if !ok || v.Status.Role != replica.Leader || s.metaGhost.Leader(v.Status.Hard.Promised) == uint32(ni+1) {
		return
	}
	epoch, promised := v.Status.Hard.Promised, 0
	for _, o := range s.nodes {
		if s.promiseOf(o, path.Join(dataDir, "meta", "hardstate")) >= epoch {
			promised++
		}
	}
	if v := s.metaGhost.TookOffice(uint32(ni+1), epoch, promised); v != nil {
		s.chk.violate(v.Invariant, "%s: %s", meta.MetaTopic, v.Detail)
		return
	}
	s.w.tracef("%s leads %s in epoch %d", b.id, meta.MetaTopic, epoch)
}

// recordViews keeps what b's members hold (replicaViews, metaViews): after
// every event while it is up, and as it dies (the kill unwound every lock
// its code held; its logs' synced seqs are what survives).
func (s *sim) recordViews(b *broker) {
	if b.node == nil {
		return
	}
	for p := range s.opts.Partitions {
		if v, ok := b.node.Replica(simTopic, p); ok {
			k := replicaKey{b.id, p}
			s.keepHeldBeforeDrop(k, s.replicaViews[k], v)
			s.replicaViews[k] = v
		}
	}
	if v, ok := b.node.Replica(meta.MetaTopic, 0); ok {
		s.keepHeldBeforeDrop(replicaKey{b.id, metaPartition}, s.metaViews[b.id], v)
		s.metaViews[b.id] = v
	}
}

// beforeDrop takes what a running member of node b holds just before it
// drops a damaged range (node.Config.ReplicaDropObserver) as its latest
// view: it may have flushed entries earlier in the same event, which the
// views taken after each event never saw (seed 75 of crash,bitflip: a
// rebuilding member took 225 entries and said FLUSHED, then its apply
// found damage below them and it dropped everything from there). The
// next recordViews sees the drop and keeps this view (keepHeldBeforeDrop).
// A member that drops a range as it opens held what it held as it died.
func (s *sim) beforeDrop(b *broker, topic string, p uint32, st replica.Status, synced uint64) {
	// Only a member seen before: its log (v.Log) stays the one to read.
	switch topic {
	case meta.MetaTopic:
		if v, ok := s.metaViews[b.id]; ok {
			v.Status, v.Synced = st, synced
			s.metaViews[b.id] = v
		}
	case simTopic:
		k := replicaKey{b.id, p}
		if v, ok := s.replicaViews[k]; ok {
			v.Status, v.Synced = st, synced
			s.replicaViews[k] = v
		}
	}
}

// keepHeldBeforeDrop keeps a flipped node's member view old when the
// next one, v, holds less (heldBeforeDamage).
func (s *sim) keepHeldBeforeDrop(k replicaKey, old, v node.ReplicaView) {
	if s.flipped[k.node] && v.Synced < old.Synced {
		s.heldBeforeDrop[k] = append(s.heldBeforeDrop[k], old)
	}
}

// metaPartition keys the metadata log's entries in sim.observed.
const metaPartition = ^uint32(0)

// observeMetaCommits checks CommittedPrefixAgreement, VisibleMonotonic
// and VisibleImpliesQuorumFlushed for the metadata log: every entry node
// ni's member reports committed, against what any member committed there
// before, and durable on a majority of the members' logs.
func (s *sim) observeMetaCommits(ni int, b *broker) {
	v, ok := s.metaViews[b.id]
	if !ok {
		return
	}
	k := commitKey{partition: metaPartition, node: b.id, incarnation: b.started}
	for from := s.observed[k] + 1; from <= v.Status.CommitSeq; {
		if start := max(v.Log.StartSeq(), v.Status.SnapSeq+1); from < start {
			s.observed[k] = start - 1 // compacted: checked from the start on
			from = start
			continue
		}
		entries, err := v.Log.Read(from, 256, 1<<20)
		if err != nil || len(entries) == 0 {
			return // looked at again later
		}
		for _, e := range entries {
			if e.Seq > v.Status.CommitSeq {
				break
			}
			holders := 0
			for _, o := range s.nodes {
				if s.holdsMeta(o, e.Seq, e.Epoch) {
					holders++
				}
			}
			ge := invariant.Entry{Epoch: e.Epoch, Value: string(e.Record.Value)}
			if vi := s.metaGhost.Visible(uint32(ni+1), e.Seq, ge, holders); vi != nil {
				s.chk.violate(vi.Invariant, "%s: %s", meta.MetaTopic, vi.Detail)
				return
			}
			s.observed[k] = e.Seq
		}
		from = s.observed[k] + 1
	}
}

// holdsMeta is holds for node b's metadata member.
func (s *sim) holdsMeta(b *broker, seq, epoch uint64) bool {
	v, ok := s.metaViews[b.id]
	return viewHolds(v, ok, seq, epoch) || s.heldBeforeDamage(replicaKey{b.id, metaPartition}, seq, epoch) // see holds
}

// durablePromise is the promise a node's member of a partition holds in
// its hard-state file (between events no write is in progress, so what
// the file holds is durable).
func (s *sim) durablePromise(b *broker, partition uint32) uint64 {
	return s.promiseOf(b, path.Join(partitionDir(partition), "hardstate"))
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
	if s.sched != nil && s.sched.pauser != nil && s.chk.violation == nil {
		s.sched.pauser.final(deadline)
	}
	if s.sched != nil && s.chk.violation == nil {
		s.schedFinal(deadline)
	}
	if s.kv != nil && s.chk.violation == nil {
		s.kvFinal(deadline)
	}
	if s.churn != nil && s.chk.violation == nil {
		s.churnFinal()
	}
	if s.retentionUpd != nil && s.chk.violation == nil {
		s.retentionUpd.final(deadline)
	}
	if s.groupUpd != nil && s.chk.violation == nil {
		s.groupUpd.final(deadline)
	}
	s.w.tracef("end: acked=%d deliveries=%d", len(s.chk.acked), s.chk.deliveries)
}

// schedFinal waits until the nodes hold every acknowledged schedule's
// message (after the power loss; each partition at one of its replicas
// at least), then checks each is there once.
func (s *sim) schedFinal(deadline int64) {
	for s.chk.violation == nil {
		vs, complete := schedValuesOfCluster(s), true
		for v := range s.sched.acked {
			complete = complete && (vs[v] > 0 || !s.sched.required(schedIndex(v)))
		}
		if complete {
			s.sched.finalCheck()
			return
		}
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(Liveness, "30 s after the final power loss, the nodes do not hold every acknowledged schedule's message")
			return
		}
	}
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

// How a lagging replica became InSync again (Result.Recoveries).
const (
	RecoveredFromLog                = "caught up from the log"
	RecoveredBySnapshot             = "rebuilt from a snapshot"
	RecoveredFromLogAfterRestart    = "caught up from the log, restarted meanwhile"
	RecoveredBySnapshotAfterRestart = "rebuilt from a snapshot, restarted meanwhile"
)

// lagEpisode is a replica a leader saw behind: since which incarnation
// of its node, and whether it needed a snapshot.
type lagEpisode struct {
	incarnation int
	rebuild     bool
}

// trackRecovery follows what partition leaders report of a replica: from
// the first report behind (CatchingUp, NeedsRebuild, Rebuilding) to the
// next InSync is one episode, counted by how it ended.
func (s *sim) trackRecovery(k replicaKey, state string) {
	i := slices.IndexFunc(s.nodes, func(b *broker) bool { return b.id == k.node })
	if i < 0 {
		return
	}
	ep, behind := s.lagging[k]
	switch state {
	case "CatchingUp", "NeedsRebuild", "Rebuilding":
		if !behind {
			ep = lagEpisode{incarnation: s.nodes[i].started}
		}
		ep.rebuild = ep.rebuild || state != "CatchingUp"
		s.lagging[k] = ep
	case "InSync":
		if !behind {
			return
		}
		delete(s.lagging, k)
		restarted := s.nodes[i].started != ep.incarnation
		switch {
		case ep.rebuild && restarted:
			s.recoveries[RecoveredBySnapshotAfterRestart]++
		case ep.rebuild:
			s.recoveries[RecoveredBySnapshot]++
		case restarted:
			s.recoveries[RecoveredFromLogAfterRestart]++
		default:
			s.recoveries[RecoveredFromLog]++
		}
	}
}
