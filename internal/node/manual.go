package node

import (
	"cmp"
	"fmt"
	"github.com/nereus-broker/nereus/internal/group"
	"slices"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
)

// Mutations are deliberate bugs behind a test-only switch. Each disables one
// guard; the simulator's mutation tests assert that a campaign finds it.
type Mutations struct {
	// AckBeforeFsync sends PUB_OK without fsyncing the partition log.
	AckBeforeFsync bool
	// SkipDedupRebuild starts a reopened partition with an empty dedup table.
	SkipDedupRebuild bool
	// PublishIgnoresIncarnation lets a publish bound to a topic's
	// incarnation (a scheduled message) land in a later incarnation of
	// the same name.
	PublishIgnoresIncarnation bool
	// DedupSnapshotUnchecked restores a partition's dedup snapshot without
	// checking it against the log (partition.SnapshotUsable): one that
	// describes another log (a repaired one, another lineage) passes.
	DedupSnapshotUnchecked bool
	// RetentionPastDedupSnapshot lets a single node's retention delete
	// records its latest dedup snapshot does not stand for: a restart
	// rebuilds the table from the kept log and forgets their producers.
	RetentionPastDedupSnapshot bool
	// DedupSnapshotOnce writes a single node's dedup snapshot without its
	// copy: a bit flip in it after retention deleted a producer's every
	// record forgets the producer.
	DedupSnapshotOnce bool
	// TornTailBelowDurablePoint opens a single node's partition log
	// without its dedup snapshot's point: a bit flip in the last synced
	// batches is cut as a torn write, and the seqs of the records it
	// held are handed out again.
	TornTailBelowDurablePoint bool
	// AckIgnoresOffice: an ACK or NACK naming a partition this node leads
	// but does not deliver yet is answered at once (STALE_DELIVERY), not
	// held until the group rebuilt its position from the log.
	AckIgnoresOffice bool
	// SchedForwardsToFirstReplica: a scheduled publish is forwarded as
	// attempt 0 every time (PublishFindsTheLeader), so a shard owner
	// without a replica of the destination partition asks its first
	// replica only, whichever leads.
	SchedForwardsToFirstReplica bool
	// LoneAckRedirected answers an ACK entry of a partition whose only
	// replica is here, not delivering yet, NOT_LEADER (as before
	// LoneAckAskedAgainHere): the client looks for a leader elsewhere.
	LoneAckRedirected bool
	// SchedRetryRefusedOnClosedLane: a SCHEDULE to a CLOSED or RETIRED
	// lane is refused at admission, a retry of one admitted before
	// included (RetryIsItsOriginal).
	SchedRetryRefusedOnClosedLane bool
	// SchedRefusalNotRecorded refuses a new SCHEDULE to a CLOSED lane
	// with nothing appended, as to a RETIRED one: another send of it
	// still on its way (the client's retry of a send whose answer was
	// late) is taken as new once the lane opens again, and fires — its
	// client was told "refused" (RefusalIsFinal).
	SchedRefusalNotRecorded bool
	// SchedRefusalForgotten answers a retried SCHEDULE from the runner's
	// recent results alone: one whose record a closed lane refused as it
	// applied, retried after a restart (or 4,096 shard seqs later), is
	// answered OK as a duplicate of a schedule that does not exist.
	SchedRefusalForgotten bool
	// SyncedMarkSkipped: a partition with no other replica never writes
	// its synced mark, so a bit flip into its idle tail before a crash is
	// cut as a torn write (the point covers only its dedup snapshot).
	SyncedMarkSkipped bool
	// ReadDamageUnverified: a single node's read that fails on damage it
	// cannot locate changes nothing (the reader gets the error, as
	// before VerifyActive).
	ReadDamageUnverified bool
	// KVAnswersBehind lets a bucket answer reads and writes while its
	// committed log could not be read to its end (a damaged record): it
	// answers from a state that may miss acknowledged writes.
	KVAnswersBehind bool
	// KVLostRecordSkipped: a bucket's runner skips the lost records a
	// member alone's repair fills dropped seqs with, as control records,
	// instead of stepping over them as a gap (its watchers never told).
	KVLostRecordSkipped bool
	// KVLoneKeepsOneCheckpoint: a bucket of one replica compacts its log
	// through its latest checkpoint, as a replicated one does, so a
	// damaged chunk of it leaves nothing to rebuild the bucket from.
	KVLoneKeepsOneCheckpoint bool
	// KVLostCreationSkipped: a gap in a bucket's log read before any
	// creation record is stepped over as if nothing were lost: a bucket
	// whose creation it held answers NOT_FOUND for good (LostCreationIsSaid).
	KVLostCreationSkipped bool
	// KVRecreationKeepsFloor: a bucket created again after a delete starts
	// with its floor at 1, so a watcher of the deleted one goes on with
	// its cursor (RecreationExpiresOldCursors).
	KVRecreationKeepsFloor bool
	// KVFenceAnswersAnyGap: a fence applied answers every gap stepped over
	// before it, a later repair's too (FenceAnswersOnlyItsGaps).
	KVFenceAnswersAnyGap bool
	// SkipLedgerFsync answers ACKs without fsyncing the group's ledger.
	SkipLedgerFsync bool
	// LedgerReplayStopsAtGap stops a single node's ledger replay at the
	// first gap a repair left: the acks recorded after the dropped range
	// are forgotten too (only the dropped range's may be).
	LedgerReplayStopsAtGap bool
	// GroupReplayStopsAtLost stops the replay of a group's acks from a
	// partition's log at the first record a repair of its only replica
	// put in place of a dropped one: the acks recorded after the dropped
	// range are forgotten too (only the dropped range's may be).
	GroupReplayStopsAtLost bool
	// Partition and AckLog break the guards of the replicated-partition
	// and ack-log kernels (install gate, dedup seal; ACK_OK before commit).
	Partition partition.Mutations
	AckLog    acklog.Mutations
	// CoordinateBeforeInstall lets a new leader of a partition deliver it
	// to groups before its install entry is applied (cursors rebuilt from
	// a commit point that may miss committed acks).
	CoordinateBeforeInstall bool
	// CoordinateBeforeOffice lets the metadata leader decide group
	// commands, topic deletes and DECLAREs, and read group incarnations,
	// before it applied its install entry (cluster.Options.
	// DecideBeforeOffice): against a state that may miss what the last
	// leader committed.
	CoordinateBeforeOffice bool
	// CoordinateWithoutLease lets the metadata leader decide and read as
	// coordinator without its lease (cluster.Options.AnswerWithoutLease):
	// a deposed leader, cut off, answers from a state that may miss what
	// the newer one committed.
	CoordinateWithoutLease bool
	// MetaStateForgetsGroupDeletes saves a cluster member's applied
	// metadata (meta.json) without its deleted group incarnations: after
	// a restart the member's state differs from the others' at the same
	// seq (MetadataAgrees).
	MetaStateForgetsGroupDeletes bool
	// KVWatchBeforeFence: a bucket starts watches while a gap it stepped
	// over awaits its fence: a watcher past the gap goes on before the
	// fence expires it (LossExpiresEveryCursor).
	KVWatchBeforeFence bool
	// TornSeqsReused: a partition with no other replica cuts a torn tail
	// and hands the seqs its headers named out again
	// (storage.Options.KeepTornSeqs off): a KV watcher past them misses
	// the new writes there.
	TornSeqsReused bool
	// LoneTornTailSilent: a replica group's only member cuts a torn tail
	// as it opens without saying so (cluster.Options.LoneTornTailSilent):
	// acknowledged records a bit flip took are gone without a trace.
	LoneTornTailSilent bool
	// DeadLetterNotIdempotent publishes dead letters without their
	// producer identity: a copy published again (after a restart, or by
	// a partition's next leader) is appended twice.
	DeadLetterNotIdempotent bool
	// DeadOnLastDelivery dead-letters a message as its last delivery
	// (the MaxDeliver-th) is sent, not once that delivery ends unacked
	// (delivery.Mutations.DeadOnLastDelivery): an acked message is
	// dead-lettered too (NoDeadLetterOfAnAck).
	DeadOnLastDelivery bool
	// DeadLetterOfTheNextRecord copies the record after the dead one into
	// the dead-letter topic (DeadLetterIsTheRecord).
	DeadLetterOfTheNextRecord bool
	// DeadLetterTooOldRetried retries a dead letter refused
	// PRODUCER_SEQ_TOO_OLD as any other failure: refused for good.
	DeadLetterTooOldRetried bool
	// GroupsOnce writes a single node's groups.json without its copy: a
	// bit flip in it stops the node until a repair, which forgets every
	// group's members (GroupsKeptTwice).
	GroupsOnce bool
	// TopicsOnce writes a single node's topics.json without its copy: a
	// bit flip in it stops the node until a repair, which forgets the
	// topics' settings (TopicsKeptTwice).
	TopicsOnce bool
	// DeliverBehindFence lets a partition's leader deliver it to an owner
	// without recording the owner's epoch in the partition's log, and with
	// a view of the group older than the epochs recorded there.
	DeliverBehindFence bool
	// DeliverWithoutLease lets a partition's leader hand out deliveries
	// while its lease has run out and it is not READ_ONLY_DEGRADED
	// (DeliverUnderLease): a leader that wakes from a pause delivers from
	// a cursor a later leader outdated.
	DeliverWithoutLease bool
	// NoGroupCarry never carries a group no runner serves on a partition's
	// leader (GroupsKeptAcrossRetention): a group whose consumers went away
	// pins the log at its latest checkpoint for good.
	NoGroupCarry bool
	// GroupKeyIgnoresIncarnation names every group runner's records and
	// directories by the group's bare name: a group deleted and used
	// again shares them with its deleted incarnation
	// (GroupIncarnationStartsEmpty).
	GroupKeyIgnoresIncarnation bool
	// GroupSettingsPerNode starts a runner with the settings its
	// settings.json or its first PULL give, not a group update's
	// (GroupSettingsOnEveryNode); runners already running still take an
	// update.
	GroupSettingsPerNode bool
	// Replica breaks the replication kernel of every replica group, and
	// SendBeforePersist the shared Ready executor (every message of a
	// Ready before its writes are durable: FLUSHED before fsync).
	Replica           replica.Mutations
	SendBeforePersist bool
	// Group breaks the consumer-group kernel as the metadata applies it
	// (e.g. a moving partition assigned before its REVOKE is answered).
	Group group.Mutations
	// Sched and SchedState break the scheduler kernel's owner and applied
	// state (e.g. a due message published before its intent commits).
	Sched      sched.Mutations
	SchedState sched.StateMutations
	// KVReadWithoutLease lets a bucket's leader answer reads (GET, KEYS,
	// LIST, HISTORY, watches) from its applied state without holding its
	// lease: an ex-leader cut off from the replicas that elected another
	// serves stale values (the simulator's KV linearizability check).
	KVReadWithoutLease bool
	// KVLeaseFromTicks lets a bucket's leader take its partition's last
	// published lease ticks for its lease, not the lease's end on the
	// clock: a leader whose member is held up (a hung fsync) keeps
	// serving reads while another replica takes office (LeaseOnTheClock).
	KVLeaseFromTicks bool
	// SchedGuardFromTicks gives a shard's owner a lease guard from its
	// replica's last published lease ticks, not from the lease's end on the
	// clock: an owner whose member is held up (a hung fsync) keeps
	// publishing after its lease ran out (LeaseOnTheClock).
	SchedGuardFromTicks bool
	// KV breaks the KV kernel's checkpoint rules as the bucket runners
	// apply and seek (e.g. a checkpoint counted wherever it sits).
	KV kv.Mutations
	// KVCompactPastCheckpoint lets a bucket's partition compact its log
	// through what its runner applied, not only through its latest
	// complete checkpoint: a replica whose log starts there finds no
	// checkpoint to rebuild the bucket from.
	KVCompactPastCheckpoint bool
}

// Step runs, on the caller's goroutine, all work of a Manual node that is
// due at the current NowMs: queued publishes (group commit per call), group
// commands, deliveries, redeliveries and retention. It repeats until nothing
// is left (a commit wakes groups; a dead letter queues a publish) and reports
// whether anything ran. Partitions run in (topic, partition) order and groups
// in (group, topic) order, so a run is deterministic.
// stepRoundsMax bounds the rounds of one Step (see Step).
const stepRoundsMax = 1_000_000

func (n *Node) Step() bool {
	if !n.cfg.Manual {
		panic("node: Step on a node that runs its own goroutines")
	}
	now := n.nowMs()
	mono := n.monoMs() // the schedules of partitions, groups and member sessions: waits
	ran := false
	for rounds := 0; ; rounds++ {
		if rounds == stepRoundsMax {
			// Work that keeps making more work at one instant (a proposal
			// refused and proposed again at once) is a livelock: in
			// production a goroutine spinning, in the simulator a run
			// that never ends. Fail loudly instead.
			panic(fmt.Sprintf("node %s: Step still making progress after %d rounds at %d ms: livelock", n.cfg.NodeID, stepRoundsMax, now))
		}
		progress := false
		if n.cluster != nil {
			progress = n.cluster.Step()
		}
		n.mu.RLock()
		topics := make([]*topic, 0, len(n.topics))
		for _, t := range n.topics {
			topics = append(topics, t)
		}
		keys := make([]groupKey, 0, len(n.groups))
		for k := range n.groups {
			keys = append(keys, k)
		}
		groups := make([]*groupRunner, 0, len(keys))
		slices.SortFunc(keys, func(a, b groupKey) int {
			return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.topic, b.topic))
		})
		for _, k := range keys {
			groups = append(groups, n.groups[k])
		}
		n.mu.RUnlock()
		slices.SortFunc(topics, func(a, b *topic) int { return cmp.Compare(a.cfg.Name, b.cfg.Name) })
		for _, t := range topics {
			for _, p := range t.partitions {
				progress = p.step(mono) || progress
			}
		}
		for _, g := range groups {
			progress = g.step(mono) || progress
		}
		n.schedMu.Lock()
		runners := n.sched
		n.schedMu.Unlock()
		for _, r := range runners {
			if r != nil {
				progress = r.step(now) || progress
			}
		}
		for _, r := range n.kvRunners() {
			progress = r.step(now) || progress
		}
		if n.members != nil {
			progress = n.members.step(mono) || progress
		}
		if !progress {
			return ran
		}
		ran = true
	}
}
