package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"path"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A single node with a retention (Options.Retention): the topic keeps a
// few KiB a partition, so retention deletes records all the time, every
// producer's among them, and the node's dedup across retention rests on
// its dedup snapshot and its copy (DedupSurvivesRetention,
// DedupSnapshotKeptTwice). The checker accepts that records below a
// partition's start are gone (checker.retained), and the final read-back
// can no longer see a retry appended again after its first copy was
// deleted: the logWatcher reads the committed log as it grows instead.

// retentionMessagesPerProducer is a retention run's default
// Options.MessagesPerProducer: enough that each partition's log passes
// its RetentionBytes several times over.
const retentionMessagesPerProducer = 300

// NodeMutations name the deliberate bugs a single-node run can carry
// (`nereus sim --mutation NAME`, without --nodes); each is a guard of the
// node removed. Those about retention need --retention.
var NodeMutations = map[string]node.Mutations{
	"ack-before-fsync":   {AckBeforeFsync: true},
	"skip-dedup-rebuild": {SkipDedupRebuild: true},
	"skip-ledger-fsync":  {SkipLedgerFsync: true},
	// With --retention: retention deletes records the latest dedup
	// snapshot does not stand for; a restart rebuilds the table from the
	// kept log and a retry of a producer whose records went appends again
	// (NoDuplicateFromReplay, TestSingleNodeRetentionMutationsAreCaught).
	"retention-past-dedup-snapshot": {RetentionPastDedupSnapshot: true},
	// With --retention and bit flips: the dedup snapshot is written
	// without its copy; a flip in it forgets the producers retention
	// deleted (NoDuplicateFromReplay, likewise).
	"dedup-snapshot-once": {DedupSnapshotOnce: true},
	// With bit flips: a partition log opens without its dedup snapshot's
	// point, so a flip into its last synced batches is cut as a torn write
	// (DurableTailNotTorn).
	"torn-tail-below-durable-point": {TornTailBelowDurablePoint: true},
	// With bit flips: a read that fails on damage no check located yet
	// changes nothing; a group's delivery retries the record for good and
	// nothing asks for a repair (Liveness).
	"read-damage-unverified": {ReadDamageUnverified: true},
	// With --dead-letters: dead letters published without their producer
	// identity; one published again after a restart is appended twice
	// (DeadLetterOnce).
	"dead-letter-not-idempotent": {DeadLetterNotIdempotent: true},
	"dead-letter-of-next-record": {DeadLetterOfTheNextRecord: true},
}

// logWatcher follows a single node's committed log after every event and
// hands each committed record to the run's replayWatch.
type logWatcher struct {
	s *sim
	// next is the next seq to read of each partition (those deleted
	// before they were read are skipped).
	next map[uint32]uint64
	// unreadable lists, per partition, the dedup snapshot files the
	// node's current incarnation found unreadable; startedAt is that
	// incarnation.
	unreadable map[uint32]map[string]bool
	startedAt  int
	// forgetful: partitions whose dedup table a start rebuilt from the
	// kept log with both snapshot files unreadable (bit flips into each:
	// a documented gap, ARCHITECTURE "Known gaps"); a producer whose
	// every record retention deleted is forgotten there, and its retry
	// appended again is not a violation.
	forgetful map[uint32]bool
}

// watchCommittedLog starts the logWatcher of a single node's retention
// run, and has it hear the node's warnings about its dedup snapshots.
func (s *sim) watchCommittedLog() {
	lw := &logWatcher{s: s, next: map[uint32]uint64{},
		unreadable: map[uint32]map[string]bool{}, forgetful: map[uint32]bool{}}
	s.logWatch, s.replays = lw, newReplayWatch(s.chk)
	s.replays.lost = s.chk.isLost
	operator := s.b.onLog
	s.b.onLog = func(r slog.Record) {
		operator(r)
		lw.nodeSaid(r)
	}
}

// forgetCut takes in a torn tail cut of partition p from seq first on
// (sim.tornTailCut): the watcher forgets what it saw at the cut seqs,
// which hold other records next, and a retry of one appends again.
func (lw *logWatcher) forgetCut(p uint32, first uint64) {
	if next := lw.next[p]; first < next {
		lw.s.replays.forget(p, first, next-1)
		lw.next[p] = first
	}
}

// nodeSaid notes a dedup snapshot file the node found unreadable; both of
// one partition in one incarnation make the partition forgetful.
func (lw *logWatcher) nodeSaid(r slog.Record) {
	if r.Message != dedupUnreadableMessage || logAttrString(r, "topic") != simTopic {
		return // another topic's (a dead-letter topic's) partition of the same number
	}
	if lw.startedAt != lw.s.b.started {
		lw.startedAt = lw.s.b.started
		clear(lw.unreadable)
	}
	p, file := uint32(logAttrUint(r, "partition")), path.Base(logAttrString(r, "file"))
	if lw.unreadable[p] == nil {
		lw.unreadable[p] = map[string]bool{}
	}
	lw.unreadable[p][file] = true
	if len(lw.unreadable[p]) == 2 && !lw.forgetful[p] {
		lw.forgetful[p] = true
		lw.s.w.tracef("checker: partition %d's dedup snapshot and its copy both unreadable: a retry of a producer retention deleted may append again", p)
	}
}

// dedupUnreadableMessage is the node's warning for a dedup snapshot file
// it cannot read (node/dedupsnap.go); tornTailMessage for a partition
// log's torn tail cut at start (node/local.go; a replica group's only
// member's, cluster.OpenGroup).
const (
	dedupUnreadableMessage = "dedup snapshot unreadable; trying its copy, else replaying the partition's log"
	tornTailMessage        = cluster.TornTailMessage
)

// logAttrString is the string value of r's attribute key ("": none).
func logAttrString(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// logAttrUint is the unsigned value of r's attribute key (0: none).
func logAttrUint(r slog.Record, key string) uint64 {
	var v uint64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			switch a.Value.Kind() {
			case slog.KindUint64:
				v = a.Value.Uint64()
			case slog.KindInt64:
				v = uint64(a.Value.Int64())
			}
			return false
		}
		return true
	})
	return v
}

// observe reads what each partition committed since the last look,
// around the damaged ranges of a partition a bit flip hit and the gaps a
// repair left: a retry of a record the repair dropped appends again on
// purpose (OPERATIONS, Corruption and repair), and any other retry
// committed again breaks NoDuplicateFromReplay there too — the repair's
// rewritten dedup snapshots still remember the producers retention
// deleted (SnapshotForgetsOnlyGoneSeqs), unless it removed them
// (forgetful).
func (lw *logWatcher) observe() {
	b, chk := lw.s.b, lw.s.chk
	if !b.up || chk.violation != nil {
		return
	}
	for _, t := range b.node.Metadata([]string{simTopic}) {
		switch {
		case lw.s.retentionKept(t.Config):
		case lw.s.retentionUpd.mayHold(t.Config):
			// An update asked and not answered yet (or answered with an
			// error: its topics.json may have been written) may hold.
		case !lw.s.settingsUnchecked:
			chk.violate(SettingsKept, "the topic's retention is %d ms, %d bytes; it was declared with %d ms, %d bytes and no repair ran since",
				t.Config.RetentionMs, t.Config.RetentionBytes, lw.s.retentionMs, lw.s.retentionBytes)
			return
		default:
			// A repair rebuilt topics.json: the operator sets the
			// retention again, and the clients declare the topic without
			// it meanwhile.
			lw.s.retentionLost = true
			lw.s.askRestoreRetention()
		}
		for _, info := range t.Partitions {
			lw.observePartition(info)
		}
	}
}

func (lw *logWatcher) observePartition(info wire.PartitionInfo) {
	p, b := info.Partition, lw.s.b
	from := max(lw.next[p], info.StartSeq, 1)
	for from <= info.CommitSeq {
		entries, err := b.node.Read(simTopic, p, from, 256)
		if errors.Is(err, storage.ErrOutOfRange) {
			return // deleted meanwhile: looked at again from the new start
		}
		if damaged := (*storage.CorruptError)(nil); errors.As(err, &damaged) && damaged.Damage.LastSeq >= from {
			from = damaged.Damage.LastSeq + 1 // refused, never served: a repair drops it
			lw.next[p] = from
			continue
		}
		if gap := (*storage.GapError)(nil); errors.As(err, &gap) && gap.Next > from {
			from = gap.Next // dropped by a repair
			lw.next[p] = from
			continue
		}
		if err != nil || len(entries) == 0 {
			return
		}
		for _, e := range entries {
			if e.Seq > info.CommitSeq {
				break
			}
			if !lw.s.replays.committed(p, &e, "", info.StartSeq, lw.forgetful[p]) {
				return
			}
			from = e.Seq + 1
		}
		lw.next[p] = from
	}
}

// replayWatch is where each producer_seq was first seen committed, so
// that the same producer_seq committed again at another seq breaks
// NoDuplicateFromReplay even when retention deleted the first copy
// before the final read-back could see it. A single node's logWatcher
// feeds it its node's committed records; a cluster's replication
// observer (observePartition) every node's, each after CommittedPrefixAgreement
// found it the record every node committed at that seq — so a damaged
// minority's log can add nothing the healthy nodes did not commit.
type replayWatch struct {
	chk    *checker
	stored map[prodKey]position
	// lost (a single node): a first copy a repair dropped may be
	// committed again — the retry of a lost record appends it again.
	lost func(position) bool
}

func newReplayWatch(chk *checker) *replayWatch {
	return &replayWatch{chk: chk, stored: map[prodKey]position{}}
}

// committed takes in e, committed at partition p as read at node at
// ("": a single node) in a log starting at start. Only producers' records
// count: control records (dedup and group carries, acks, install entries)
// and non-idempotent publishes are not deduplicated by producer_seq. It
// reports false when e's producer_seq was committed at another seq before,
// unless excused (a gap the caller documents: the later seq is then the
// one remembered).
func (rw *replayWatch) committed(p uint32, e *storage.Entry, at string, start uint64, excused bool) bool {
	k, ok := producerOf(&e.Record)
	if !ok {
		return true
	}
	pos := position{p, e.Seq}
	if prev, dup := rw.stored[k]; dup && prev != pos && !excused && (rw.lost == nil || !rw.lost(prev)) {
		where := fmt.Sprintf("log start %d", start)
		if at != "" {
			where = fmt.Sprintf("read at %s, its log starting at %d", at, start)
		}
		rw.chk.violate(NoDuplicateFromReplay, "producer %d seq %d committed at %s and again at %s (%s)",
			k.producerID, k.producerSeq, prev, pos, where)
		return false
	}
	rw.stored[k] = pos
	return true
}

// forget drops what was seen committed at partition p's seqs from..to:
// they were cut, and will hold other records.
func (rw *replayWatch) forget(p uint32, from, to uint64) {
	for k, pos := range rw.stored {
		if pos.partition == p && from <= pos.seq && pos.seq <= to {
			delete(rw.stored, k)
		}
	}
	rw.chk.w.tracef("checker: partition %d's seqs %d-%d were cut (a bit flip into its last batches looks like a torn write): seen again as new", p, from, to)
}

// producerOf is the producer_seq a record was published under, if it was
// an idempotent producer's: what the partition kernel deduplicates
// (node.kernelEntry).
func producerOf(r *storage.Record) (prodKey, bool) {
	if r.ProducerID == 0 || replog.IsControl(r) {
		return prodKey{}, false
	}
	return prodKey{r.ProducerID, r.ProducerSeq}, true
}

// tooOldExcused reports whether a retry of producer_seq pseq of producer
// id answered PRODUCER_SEQ_TOO_OLD under a retention is the documented
// gap, not a failure: in a cluster (compaction past the dedup window);
// on a single node only in a partition whose dedup table lost its
// snapshots (bit flips into both, or a repair that dropped damaged
// ranges) — its snapshot otherwise holds every producer's whole window
// across retention.
func (s *sim) tooOldExcused(id, pseq uint64) bool {
	if s.logWatch == nil {
		return true
	}
	p := wire.PartitionForProducer(id, pseq, s.opts.Partitions)
	return s.chk.damaged[p] || s.logWatch.forgetful[p]
}
