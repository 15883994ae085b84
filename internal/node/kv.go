package node

// KV buckets (issue 15), the shell of internal/kv.
//
// A bucket B is the one-partition topic "__kv.B" (wire.KVTopic), declared
// like any topic (through __meta in a cluster), so its placement,
// replication, elections and restart are a partition's. Its log holds:
//
//   - config records (first header kvConfigHeader, a JSON kvBucketConf):
//     the first one after the start (or after a delete) creates the
//     bucket with its history and tombstone TTL; later ones are ignored,
//     except a delete ({"deleted":true}), which drops the bucket. The
//     configuration thus lives in the replicated log: every replica reads
//     the same one at the same position, and a restart rebuilds it with
//     the bucket;
//   - the kv kernel's records (puts, deletes, CAS, compactions,
//     checkpoint chunks) and the replication's install entries, which
//     kv.Bucket skips.
//
// Checkpoints (internal/kv checkpoint.go) carry the bucket's state, its
// configuration included, in the log itself: the leader writes one once
// the log since the last one outgrows max(Config.KVCheckpointMinBytes,
// the state), the partition's log is compacted through the latest
// complete one (kvCompactLimit; a bucket of one replica, through the one
// before), and a runner whose log starts after what
// it applied (a restart after truncation, a follower reset to its
// leader's snapshot point) reads on from the log's start to the first
// complete checkpoint, loads the bucket from it and applies what follows.
// A delete record is such a point too: after it there is no bucket,
// whatever came before. So a deleted bucket's log is compacted up to its
// latest delete record (DeletedBucketKeepsNoLog), and a runner rebuilding
// stops at a delete as at a checkpoint.
//
// Every node holding the partition runs a kvRunner: one goroutine (in
// Manual mode none: Node.Step runs it, see step) that applies the
// committed records, in order, to its kv.Bucket (the bucket and its
// applied seq advance together) and, while the partition's leader has
// taken office, runs kv.Leader for writes, answers reads and serves
// watches from its bucket, and proposes compaction records.

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// kvConfigHeader marks a bucket's config record (not a kv record:
	// kv.Bucket applies it as NotRevision).
	kvConfigHeader = "nereus-kv-config"
	// kvTick is how often a runner looks at its leadership and, every
	// kvCompactEveryTicks ticks, whether a compaction is due.
	kvTick              = 100 * time.Millisecond
	kvCompactEveryTicks = 10
	// kvTombstoneTTLMsDefault is a bucket's tombstone TTL when its
	// creator names none.
	kvTombstoneTTLMsDefault = int64(24 * time.Hour / time.Millisecond)
	// Bounds of the leader kernel and of a runner's reads.
	kvInflightWritesMax   = 1024 // < PublishQueueMax: enqueue never blocks the runner
	kvParkedWritesMax     = 1024
	kvWatchScanMax        = 4096
	kvApplyBatchMax       = 1024
	kvApplyBatchBytesMax  = 16 << 20
	kvWatchCreditMax      = 1 << 20
	kvValueBytesMaxLimit  = wire.KVValueBytesMax
	kvRecordOverheadBytes = 256
	// kvCheckpointDrainMs bounds how long a leader holds new writes back
	// so that what is in flight commits and a due checkpoint lands right
	// after it; past it, they go and the checkpoint waits for a lull.
	kvCheckpointDrainMs = 1000
)

// kvBucketConf is a config record's body. Only History and
// TombstoneTTLMs shape the applied state; they are what every replica
// must agree on.
type kvBucketConf struct {
	History        int   `json:"history"`
	TombstoneTTLMs int64 `json:"tombstone_ttl_ms"`
	Deleted        bool  `json:"deleted,omitempty"`
}

func (c kvBucketConf) record() storage.Record {
	b, _ := json.Marshal(c) // a struct of numbers and a bool: cannot fail
	return storage.Record{Headers: []storage.Header{{Key: kvConfigHeader, Value: b}}}
}

// kvRegistry holds the runners of the buckets this node holds.
type kvRegistry struct {
	mu      sync.Mutex
	runners map[string]*kvRunner // by bucket name
}

// startKVRunner starts the runner of a bucket's topic this node holds
// (startTopic calls it; callers hold n.mu or own n). A Manual node starts
// no goroutine: Node.Step runs the runner (step).
func (n *Node) startKVRunner(t *topic) {
	if len(t.partitions) != 1 || !t.partitions[0].held() {
		return
	}
	bucket := strings.TrimPrefix(t.cfg.Name, wire.KVTopicPrefix)
	n.kv.mu.Lock()
	defer n.kv.mu.Unlock()
	if n.kv.runners == nil {
		n.kv.runners = map[string]*kvRunner{}
	}
	if _, ok := n.kv.runners[bucket]; ok {
		return
	}
	r := &kvRunner{n: n, bucket: bucket, t: t, p: t.partitions[0], wake: make(chan struct{}, 1),
		writes: map[uint64]func(uint64, error){}, results: map[uint64]kv.ApplyResult{},
		watches: map[*KVWatch]*kvWatchState{}, written: n.metrics.kvWrites.WithLabelValues(bucket)}
	wake := r.poke
	t.kvWake.Store(&wake)
	n.kv.runners[bucket] = r
	if n.cfg.Manual {
		r.poke() // Step runs its first round
		return
	}
	go r.run()
}

// kvRunners are the runners of the buckets this node holds, by bucket
// name (Step runs them in this order: a simulated run replays bit for
// bit).
func (n *Node) kvRunners() []*kvRunner {
	n.kv.mu.Lock()
	defer n.kv.mu.Unlock()
	out := make([]*kvRunner, 0, len(n.kv.runners))
	for _, name := range slices.Sorted(maps.Keys(n.kv.runners)) {
		out = append(out, n.kv.runners[name])
	}
	return out
}

// kvRunner is one bucket on this node. Requests and completions reach it
// as closures (post); everything below inMu is owned by its goroutine.
type kvRunner struct {
	n      *Node
	bucket string
	t      *topic
	p      *partitionRunner
	wake   chan struct{}

	inMu  sync.Mutex
	inbox []func()

	// Owned by run.
	conf    *kvBucketConf // the applied configuration (nil: none yet)
	confSeq uint64        // the seq of the config record that created the bucket
	state   *kv.Bucket    // nil: no bucket (never created, or deleted)
	applied uint64        // last seq applied (bucket or not)
	broken  error         // a record that cannot be applied: the runner stops applying
	// unreadable, while set, is why the committed log could not be read
	// to its end the last time: the bucket answers nothing (ready), its
	// state may miss acknowledged writes (KVAnswersOnlyWhenCaughtUp).
	unreadable *wire.Error
	// seekLost, while a rebuild is under way (seeker), says that a
	// repair's gap cut the checkpoint it was reading: once the seeker has
	// read the whole log without another, the bucket cannot be rebuilt
	// (ready says so; only a delete of the bucket is taken).
	seekLost *wire.Error
	// seekCreation: the rebuild under way follows a gap that may have held
	// the bucket's creation (stepOverGap), so a creation record ends it
	// too.
	seekCreation bool
	// dropped: a repair's gap was stepped over (kv.Bucket.Drop), so the
	// state may miss the dropped writes, and the next complete checkpoint
	// gives the bucket instead of being checked against it.
	dropped bool
	// lost: seqs a repair dropped that this runner stepped over
	// (stepOverGap) and that no fence applied since names, nor a
	// checkpoint the bucket was rebuilt from holds; the leader proposes a
	// fence naming them (maybeFence), fencing while it is in flight.
	lost    []kv.Span
	fencing bool
	// seeker, when set, rebuilds the bucket: the log starts after what
	// this runner applied, so it reads on to the first complete
	// checkpoint (no bucket until then).
	seeker *kv.Seeker
	// checkpointBase is the highest base of a complete checkpoint applied
	// (published as the partition's kvCompactLimit); voidChunks counts
	// the checkpoint chunks applied that counted toward none (tests).
	checkpointBase uint64
	// prevCheckpointBase is the base of the complete checkpoint before
	// that one (0: none applied since the runner started).
	prevCheckpointBase uint64
	// deleteSeq is the seq of the latest delete record applied: the log
	// before it holds nothing anyone needs (DeletedBucketKeepsNoLog).
	deleteSeq  uint64
	voidChunks int
	rebuilds   int // buckets loaded from a checkpoint
	resets     int // startSeeking with something applied

	// Leadership of the partition: leading once the leader took office
	// in epoch (its install entry, at reignStart, is applied here); lease
	// while no other replica can take office (replog.Log.HoldsLease: the
	// lease's end on the clock), as of the start of the round.
	leading    bool
	epoch      uint64
	reignStart uint64
	lease      bool

	leader     *kv.Leader // this reign's overlay; nil when not leading or no bucket
	nextID     uint64
	writes     map[uint64]func(uint64, error) // writes answered by the leader kernel, by id
	results    map[uint64]kv.ApplyResult      // applied seqs not yet claimed by their completion
	waits      []kvWait                       // work waiting for a seq to be applied
	watches    map[*KVWatch]*kvWatchState
	listings   kvListings         // open KV_LIST_PAGE listings (kvlist.go)
	written    prometheus.Counter // nereus_kv_writes_total of this bucket
	compacting bool
	// proposing counts this runner's proposals not yet answered by the
	// partition. checkpointing: a checkpoint's chunks are among them.
	// drainSinceMs, when not 0, is when (Node.monoMs) a due checkpoint
	// started holding back the leader kernel's proposals (held, in order)
	// for what is in flight to commit.
	proposing     int
	checkpointing bool
	drainSinceMs  int64
	held          []kv.Proposal
	// checkpointRetryMs (Node.monoMs): after a checkpoint's proposal
	// failed (a leader the partition no longer lets propose, read-only),
	// none is tried before it — proposing again at once, at the same
	// instant, would spin.
	checkpointRetryMs int64
	ticks             int
	// nextTickMs: when a Manual runner's next tick is due (step).
	nextTickMs int64
	stopped    bool // a Manual runner shut down (step)
}

type kvWait struct {
	seq uint64
	fn  func()
}

func (r *kvRunner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// post runs fn on the runner's goroutine.
func (r *kvRunner) post(fn func()) {
	r.inMu.Lock()
	r.inbox = append(r.inbox, fn)
	r.inMu.Unlock()
	r.poke()
}

func (r *kvRunner) run() {
	ticker := r.n.cfg.Env.Clock.NewTicker(kvTick)
	defer ticker.Stop()
	for {
		select {
		case <-r.p.done:
			r.shutdown()
			return
		case <-r.wake:
		case <-ticker.C():
			r.ticks++
		}
		r.round()
	}
}

// step runs a Manual node's runner (Node.Step calls it, on the node's
// only goroutine, after the replication's ticks and messages): a round
// when it was poked (a request or completion posted, a commit), when its
// tick is due, or once to shut down when the partition stopped. It
// reports whether it ran. A round reads the partition's leadership and
// lease afresh before it answers any request it took in, as run does.
func (r *kvRunner) step(nowMs int64) bool {
	if r.stopped {
		return false
	}
	select {
	case <-r.p.done:
		r.stopped = true
		r.shutdown()
		return true
	default:
	}
	tickMs := kvTick.Milliseconds()
	ticked := nowMs >= r.nextTickMs || nowMs < r.nextTickMs-tickMs // due, or the clock went back
	if ticked {
		r.ticks++
		r.nextTickMs = nowMs + tickMs
	}
	select {
	case <-r.wake:
	default:
		if !ticked {
			return false
		}
	}
	r.round()
	return true
}

// round applies what committed, follows the partition's leadership, runs
// the requests and completions that arrived, and serves the watches.
// runInbox runs the requests and completions posted to the runner.
func (r *kvRunner) runInbox() {
	r.inMu.Lock()
	inbox := r.inbox
	r.inbox = nil
	r.inMu.Unlock()
	for _, fn := range inbox {
		fn()
	}
}

func (r *kvRunner) round() {
	r.catchUp()
	r.followLeadership()
	// A fence goes before the round's writes (FenceBeforeWrites): a write
	// acknowledged after the gap is then above the fence's floor, and a
	// watch from past it is not expired by it.
	r.maybeFence()
	r.runInbox()
	r.catchUp()
	r.serveWatches()
	if r.ticks >= kvCompactEveryTicks {
		r.ticks = 0
		r.maybeCompact()
	}
	r.maybeCheckpoint()
	r.maybeFence()
	if r.leader == nil || r.leader.Inflight() == 0 {
		clear(r.results)
	}
}

// shutdown answers what waits: the node is closing.
func (r *kvRunner) shutdown() {
	err := wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	r.inMu.Lock()
	inbox := r.inbox
	r.inbox = nil
	r.inMu.Unlock()
	for _, fn := range inbox {
		fn() // requests see the partition stopped and answer
	}
	if r.leader != nil {
		r.carry(r.leader.LeadershipLost())
	}
	for _, id := range slices.Sorted(maps.Keys(r.writes)) {
		r.writes[id](0, err)
	}
	clear(r.writes)
	for h, w := range r.watches {
		w.sink.End(err)
		delete(r.watches, h)
	}
}

// catchUp applies the committed records after applied, in order.
func (r *kvRunner) catchUp() {
	for r.broken == nil {
		commit := r.p.commitSeq.Load()
		if r.applied >= commit {
			break
		}
		if start := r.p.startSeq.Load(); r.applied+1 < start {
			r.startSeeking(start, "the bucket's log starts after what it applied")
		}
		entries, err := r.p.read(r.applied+1, int(min(commit-r.applied, kvApplyBatchMax)), kvApplyBatchBytesMax)
		if gap := (*storage.GapError)(nil); errors.As(err, &gap) {
			if err := r.stepOverGap(gap.Next); err != nil {
				r.fail(err)
				return
			}
			continue
		}
		if err != nil || len(entries) == 0 {
			r.cannotRead(err)
			return
		}
		for i := 0; i < len(entries); i++ {
			if replog.IsLost(&entries[i].Record) && !r.n.cfg.Mutations.KVLostRecordSkipped {
				// A member alone's repair filled dropped seqs with lost
				// records: a gap, as a single node's repair leaves one.
				j := i
				for j+1 < len(entries) && replog.IsLost(&entries[j+1].Record) {
					j++
				}
				if err := r.stepOverGap(entries[j].Seq + 1); err != nil {
					r.fail(err)
					return
				}
				i = j
				continue
			}
			apply := r.apply
			if r.seeker != nil {
				apply = r.seek
			}
			if err := apply(&entries[i]); err != nil {
				if base, ok := r.rebuildsAfterDrop(&entries[i], err); ok {
					r.startSeeking(base+1, "the bucket lost writes to a repair; rebuilding from the checkpoint that followed")
					break
				}
				r.fail(err)
				return
			}
		}
	}
	r.unreadable = nil
	if r.state != nil && r.state.LastCheckpoint() > r.checkpointBase {
		r.prevCheckpointBase, r.checkpointBase = r.checkpointBase, r.state.LastCheckpoint()
	}
	// The log may go through the latest checkpoint's base, or up to the
	// latest delete record (kept: a rebuild starts at it). A bucket of
	// one replica keeps the log from its previous checkpoint on: no other
	// copy can make a damaged chunk of the latest one whole, and the
	// previous one, with the records after it, rebuilds the bucket
	// instead (CheckpointDamageCostsNoBucket).
	limit := r.checkpointBase
	if r.t.cfg.Replicas <= 1 && !r.n.cfg.Mutations.KVLoneKeepsOneCheckpoint {
		limit = r.prevCheckpointBase
	}
	if r.deleteSeq > 0 {
		limit = max(limit, r.deleteSeq-1)
	}
	if limit > r.p.kvCompactLimit.Load() {
		r.p.kvCompactLimit.Store(limit)
	}
	if r.n.cfg.Mutations.KVCompactPastCheckpoint && r.seeker == nil {
		r.p.kvCompactLimit.Store(r.applied)
	}
	r.runWaits()
}

// cannotRead refuses every answer while the committed log cannot be read
// to its end (KVAnswersOnlyWhenCaughtUp): the state may miss writes that
// were acknowledged, so a read would answer them wrong (a key "not
// found") and a CAS be decided against them. Damage on a single node or
// a member alone is DATA_CORRUPT until a repair; elsewhere (a replica
// rebuilds a damaged range, a read raced a restart) it is to retry.
func (r *kvRunner) cannotRead(err error) {
	r.n.logRepeatedError(r.p.subject(), "kv: reading committed records failed; will retry", "from", r.applied+1, "err", err)
	if errors.Is(err, storage.ErrCorrupt) && r.p.corruptError() != nil {
		r.unreadable = wire.Errorf(wire.CodeDataCorrupt, "bucket %q: its log is damaged at seq %d (%v); it answers nothing until repaired (nereus repair, with the node stopped)", r.bucket, r.applied+1, err)
		return
	}
	r.unreadable = wire.Errorf(wire.CodeUnavailable, "bucket %q: its log could not be read at seq %d (%v); retry", r.bucket, r.applied+1, err)
}

// KVRebuiltMessage is the INFO line of a bucket loaded from a checkpoint
// in its log (its base: the seq the checkpoint's state is as of).
const KVRebuiltMessage = "kv: bucket rebuilt from its checkpoint"

// stepOverGap moves past seqs a repair dropped, up to next (exclusive;
// a gap of a single node's log, lost records of a member alone's):
// the bucket keeps what it had and raises its floor above them
// (kv.Bucket.Drop: its watchers list again); a rebuild under way starts
// over at the next complete checkpoint.
func (r *kvRunner) stepOverGap(next uint64) error {
	first := r.applied + 1
	r.n.log.Warn("kv: the bucket's log lost seqs to a repair; their writes are gone, its watchers list again", "bucket", r.bucket, "first_seq", first, "last_seq", next-1)
	if n := len(r.lost); n > 0 && r.lost[n-1].Last+1 == first {
		r.lost[n-1].Last = next - 1
	} else {
		r.lost = append(r.lost, kv.Span{First: first, Last: next - 1})
	}
	switch {
	case r.seeker != nil:
		r.seeker = kv.NewSeeker(r.n.cfg.Mutations.KV) // a checkpoint the gap cut completes nothing
		r.seekLost = wire.Errorf(wire.CodeDataCorrupt, "bucket %q lost the checkpoint it is rebuilt from to a repair (seqs %d-%d) and its log holds no later one: it cannot be rebuilt; delete the bucket and create it again", r.bucket, first, next-1)
	case r.state == nil && !r.n.cfg.Mutations.KVLostCreationSkipped:
		// No bucket in the log read so far (never created, or deleted):
		// the gap may have held its creation, and a bucket whose records
		// follow would answer NOT_FOUND for good. It is rebuilt from what
		// comes next — a checkpoint (which carries the configuration), or
		// a creation record when the gap held none — and what lies between
		// is lost: its watchers list again (LostCreationIsSaid).
		r.seeker, r.seekCreation = kv.NewSeeker(r.n.cfg.Mutations.KV), true
		r.seekLost = wire.Errorf(wire.CodeDataCorrupt, "bucket %q: its log lost seqs %d-%d to a repair where it had no bucket (they may have held its creation), and no checkpoint or creation follows: it cannot be rebuilt; delete the bucket and create it again", r.bucket, first, next-1)
	case r.state != nil:
		if err := r.state.Drop(first, next-1); err != nil {
			return err
		}
		r.dropped = true
	}
	r.applied = next - 1
	return nil
}

// rebuildsAfterDrop reports whether err is a complete checkpoint that
// does not match a bucket which lost writes to a repair (stepOverGap):
// the checkpoint holds the state as of its base, the lost writes
// included, so the bucket is rebuilt from it (its base returned) instead
// of stopping.
func (r *kvRunner) rebuildsAfterDrop(e *storage.Entry, err error) (uint64, bool) {
	if !r.dropped || !errors.Is(err, kv.ErrCheckpointMismatch) {
		return 0, false
	}
	w, derr := kv.DecodeRecord(kvRecord(&e.Record))
	if derr != nil || w.Op != kv.OpCheckpoint {
		return 0, false
	}
	r.dropped = false
	return w.Chunk.Base, true
}

// startSeeking drops the bucket and rebuilds it from the first complete
// checkpoint at or after start: the log now starts at start, after what
// this runner applied (a restart after the log was truncated, or a
// follower reset to its leader's snapshot point), so the records in
// between are gone; or (why) a checkpoint there holds what the bucket
// lost.
func (r *kvRunner) startSeeking(start uint64, why string) {
	if r.applied > 0 {
		r.resets++
		r.n.log.Info("kv: rebuilding the bucket from a checkpoint", "bucket", r.bucket, "why", why, "applied", r.applied, "from", start)
	}
	if r.leader != nil {
		r.carry(r.leader.LeadershipLost())
		r.leader = nil
	}
	r.dropHeld()
	werr := wire.Errorf(wire.CodeUnavailable, "bucket %q is rebuilding from its log; retry", r.bucket)
	for h, w := range r.watches {
		w.sink.End(werr)
		delete(r.watches, h)
	}
	r.conf, r.confSeq, r.state = nil, 0, nil
	r.listings = kvListings{} // a rebuilt bucket's confSeq is 0: its listings could not tell it from the old one
	r.applied = start - 1
	r.seeker, r.seekLost = kv.NewSeeker(r.n.cfg.Mutations.KV), nil
}

// seek takes one entry while rebuilding: records pass by until the first
// complete checkpoint, which gives the bucket and its configuration as
// of its last chunk.
func (r *kvRunner) seek(e *storage.Entry) error {
	if e.Seq != r.applied+1 {
		return fmt.Errorf("entry %d after %d applied", e.Seq, r.applied)
	}
	if rec := &e.Record; len(rec.Headers) > 0 && rec.Headers[0].Key == kvConfigHeader {
		var c kvBucketConf
		if err := json.Unmarshal(rec.Headers[0].Value, &c); err != nil {
			return fmt.Errorf("config record %d: %w", e.Seq, err)
		}
		if c.Deleted {
			// No bucket after a delete, whatever came before: rebuilt.
			r.conf, r.state, r.seeker, r.seekLost, r.seekCreation = &c, nil, nil, nil, false
			r.applied, r.deleteSeq = e.Seq, e.Seq
			r.n.log.Info("kv: bucket rebuilt from a delete record: no bucket", "bucket", r.bucket, "applied", e.Seq)
			return nil
		}
		if r.seekCreation {
			// The bucket starts here: nothing before it is its own.
			r.seeker, r.seekLost, r.seekCreation = nil, nil, false
			r.n.log.Info("kv: bucket rebuilt from its creation record", "bucket", r.bucket, "applied", e.Seq)
			return r.applyConfig(e.Seq, rec.Headers[0].Value)
		}
	}
	c, err := r.seeker.Add(e.Seq, kvRecord(&e.Record))
	if err != nil {
		return err
	}
	r.applied = e.Seq
	if c == nil {
		return nil
	}
	conf := kvBucketConf{History: c.HistoryMax, TombstoneTTLMs: c.TombstoneTTLms}
	b, err := kv.LoadCheckpoint(r.bucketConfig(conf), *c, e.Seq)
	if err != nil {
		return err
	}
	r.conf, r.state, r.seeker, r.seekLost, r.seekCreation = &conf, b, nil, nil, false
	// What gaps below its base dropped, the checkpoint holds.
	r.lost = slices.DeleteFunc(r.lost, func(sp kv.Span) bool { return sp.Last <= c.Snapshot.Applied })
	r.rebuilds++
	r.n.metrics.kvRebuilds.WithLabelValues(r.bucket).Inc()
	r.n.log.Info(KVRebuiltMessage, "bucket", r.bucket, "base", c.Snapshot.Applied, "applied", e.Seq, "keys", b.LiveKeys())
	return nil
}

func (r *kvRunner) fail(err error) {
	r.broken = err
	r.n.log.Error("kv: bucket stopped applying its log", "bucket", r.bucket, "applied", r.applied, "err", err)
}

// apply applies one committed entry; the entry must be applied+1.
func (r *kvRunner) apply(e *storage.Entry) error {
	if e.Seq != r.applied+1 {
		return fmt.Errorf("entry %d after %d applied", e.Seq, r.applied)
	}
	rec := &e.Record
	if len(rec.Headers) > 0 && rec.Headers[0].Key == kvConfigHeader {
		return r.applyConfig(e.Seq, rec.Headers[0].Value)
	}
	if r.state == nil {
		r.applied = e.Seq // no bucket: nothing to apply it to
		return nil
	}
	res, err := r.state.Apply(e.Seq, kvRecord(rec))
	if err != nil {
		return err // malformed: corruption, the cursor stays
	}
	r.applied = e.Seq
	if res.Outcome == kv.Fenced {
		r.fenced(rec)
	}
	if res.Outcome == kv.Checkpointed && !res.ChunkCounted {
		r.voidChunks++
	}
	if r.leader != nil && r.leader.Inflight() > 0 {
		r.results[e.Seq] = res
	}
	return nil
}

// applyConfig applies a config record: the first one creates the bucket
// (or the first after a delete), a delete drops it, others change nothing.
func (r *kvRunner) applyConfig(seq uint64, body []byte) error {
	var c kvBucketConf
	if err := json.Unmarshal(body, &c); err != nil {
		return fmt.Errorf("config record %d: %w", seq, err)
	}
	switch {
	case c.Deleted:
		if r.conf != nil && !r.conf.Deleted {
			r.conf, r.state = &c, nil
		}
		r.deleteSeq = seq
	case r.conf != nil && r.conf.Deleted && !r.n.cfg.Mutations.KVRecreationKeepsFloor:
		// Created again after a delete: a watcher of the deleted bucket
		// resuming with its cursor gets CURSOR_EXPIRED (the floor is above
		// every revision of that one), not the new bucket's events on top
		// of the old keys it holds.
		b, err := kv.NewBucketAfter(r.bucketConfig(c), seq)
		if err != nil {
			return fmt.Errorf("config record %d: %w", seq, err)
		}
		r.conf, r.confSeq, r.state = &c, seq, b
	case r.conf == nil || r.conf.Deleted:
		b, err := kv.NewBucket(r.bucketConfig(c))
		if err != nil {
			return fmt.Errorf("config record %d: %w", seq, err)
		}
		// The bucket's revisions start after its config record: the
		// seqs before it hold nothing it keeps. Its floor stays at 1, so
		// a first watch "from the start" (revision 1) is not expired.
		for s := uint64(1); s <= seq; s++ {
			if _, err := b.Apply(s, kv.Record{}); err != nil {
				return err
			}
		}
		r.conf, r.confSeq, r.state = &c, seq, b
	default:
		// A later config record (a second create) changes nothing, but
		// the bucket's cursor moves past it with the log's.
		if _, err := r.state.Apply(seq, kv.Record{}); err != nil {
			return err
		}
	}
	r.applied = seq
	return nil
}

// bucketConfig is the kernels' configuration of bucket configuration c,
// with the node's kv mutations (the simulator's).
func (r *kvRunner) bucketConfig(c kvBucketConf) kv.Config {
	cfg := kvConfig(c, r.n.cfg.RecordBytesMax)
	cfg.Mutations = r.n.cfg.Mutations.KV
	return cfg
}

func kvConfig(c kvBucketConf, recordBytesMax int) kv.Config {
	return kv.Config{HistoryMax: c.History, TombstoneTTLms: c.TombstoneTTLMs,
		KeyBytesMax: wire.KVKeyBytesMax, ValueBytesMax: max(0, min(kvValueBytesMaxLimit, recordBytesMax-wire.KVKeyBytesMax-kvRecordOverheadBytes)),
		WatchScanRevisionsMax: kvWatchScanMax, InflightWritesMax: kvInflightWritesMax, ParkedWritesMax: kvParkedWritesMax}
}

func kvRecord(rec *storage.Record) kv.Record {
	out := kv.Record{TimestampMs: rec.TimestampMs, Key: rec.Key, Value: rec.Value}
	if len(rec.Headers) > 0 {
		out.Headers = make([]kv.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			out.Headers[i] = kv.Header{Key: h.Key, Value: h.Value}
		}
	}
	return out
}

func storageRecord(rec kv.Record) storage.Record {
	out := storage.Record{TimestampMs: rec.TimestampMs, Key: rec.Key, Value: rec.Value}
	for _, h := range rec.Headers {
		out.Headers = append(out.Headers, storage.Header{Key: h.Key, Value: h.Value})
	}
	return out
}

// afterApplied runs fn once seq is applied (at once if it is).
func (r *kvRunner) afterApplied(seq uint64, fn func()) {
	if seq <= r.applied {
		fn()
		return
	}
	r.waits = append(r.waits, kvWait{seq: seq, fn: fn})
}

func (r *kvRunner) runWaits() {
	if len(r.waits) == 0 {
		return
	}
	var ready []kvWait
	r.waits = slices.DeleteFunc(r.waits, func(w kvWait) bool {
		if w.seq <= r.applied {
			ready = append(ready, w)
			return true
		}
		return false
	})
	for _, w := range ready {
		w.fn()
	}
}

// leadership reads the partition's: a replica leads once it took office
// (its install entry at reignStart) and holds a lease while a quorum
// answered it recently enough that no other replica can take office; a
// single node's partition always leads, with a lease.
func (r *kvRunner) leadership() (leading bool, epoch, reignStart uint64, lease bool) {
	if rs := r.p.replica(); rs != nil {
		st, v := rs.leaderView()
		lease := rs.repl.HoldsLease()
		if r.n.cfg.Mutations.KVLeaseFromTicks {
			lease = st.LeaseTicks > 0
		}
		return v.Leader && v.InstallSeq != 0, v.Epoch, v.InstallSeq, lease
	}
	held := r.p.held()
	return held, 0, 0, held
}

// followLeadership starts, ends or keeps this reign's leader kernel.
func (r *kvRunner) followLeadership() {
	leading, epoch, start, lease := r.leadership()
	changed := leading != r.leading || epoch != r.epoch
	r.leading, r.epoch, r.reignStart, r.lease = leading, epoch, start, lease
	if r.leader != nil && (changed || !leading) {
		// The overlay is this reign's: what it proposed may commit under
		// the next leader or not (OUTCOME_UNKNOWN); parked writes too are
		// answered so.
		r.carry(r.leader.LeadershipLost())
		r.leader = nil
		r.dropHeld()
		clear(r.results)
	}
	if leading && r.state != nil && r.leader == nil {
		l, err := kv.NewLeader(r.bucketConfig(*r.conf), start)
		if err != nil {
			r.fail(err)
			return
		}
		r.leader = l
	}
	if r.leader != nil {
		r.leader.SetLease(lease)
	}
}

// ready reports whether this node may answer for the bucket: it leads the
// partition and has applied its reign's first entry, so its bucket holds
// every write an earlier leader acknowledged.
func (r *kvRunner) ready() *wire.Error {
	select {
	case <-r.p.done:
		return wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	default:
	}
	if r.broken != nil {
		return wire.Errorf(wire.CodeDataCorrupt, "bucket %q stopped applying its log at seq %d: %v", r.bucket, r.applied+1, r.broken)
	}
	unreadable := r.unreadable
	if r.n.cfg.Mutations.KVAnswersBehind {
		unreadable = nil
	}
	if unreadable != nil && unreadable.Code == wire.CodeDataCorrupt {
		return unreadable // until a repair: no retry helps
	}
	if r.seeker != nil && r.seekLost != nil && r.applied >= r.p.commitSeq.Load() {
		return r.seekLost
	}
	if r.seeker != nil {
		return wire.Errorf(wire.CodeUnavailable, "bucket %q is rebuilding from the checkpoint in its log; retry", r.bucket)
	}
	if !r.leading {
		return r.notLeader() // a follower points the client on, whatever it can read
	}
	if unreadable != nil {
		return unreadable
	}
	if r.applied < r.reignStart {
		return wire.Errorf(wire.CodeUnavailable, "bucket %q: the new leader is taking office; retry", r.bucket)
	}
	return nil
}

func (r *kvRunner) notLeader() *wire.Error {
	info := r.p.info()
	leader := "unknown (an election is running)"
	if info.Leader != "" {
		leader = info.Leader + " at " + info.LeaderAddr
	}
	return wire.Errorf(wire.CodeNotLeader, "bucket %q: this node does not lead it; leader: %s", r.bucket, leader)
}

// readyBucket is ready plus a bucket to answer from.
func (r *kvRunner) readyBucket() (*kv.Bucket, *wire.Error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	if r.state == nil {
		return nil, wire.Errorf(wire.CodeNotFound, "bucket %q does not exist", r.bucket)
	}
	return r.state, nil
}

// readableBucket is readyBucket for reads and watches, which the leader
// answers from its own applied state: only while it holds its lease. A
// leader cut off from its replicas may not know yet that another one took
// office and acknowledged writes it does not have (a stale read), and a
// watch it serves would stall; its lease lapses first. (Writes need no
// lease: they are decided when they commit.)
func (r *kvRunner) readableBucket() (*kv.Bucket, *wire.Error) {
	b, err := r.readyBucket()
	if err != nil {
		return nil, err
	}
	if !r.lease && !r.n.cfg.Mutations.KVReadWithoutLease {
		return nil, wire.Errorf(wire.CodeUnavailable, "bucket %q: the leader's lease lapsed (no quorum answered it lately); retry", r.bucket)
	}
	return b, nil
}

// propose appends rec to the bucket's log through the partition's publish
// path; done gets its seq or error on the runner's goroutine. Proposals
// are enqueued from this goroutine only, so log order is proposal order
// (kv.Leader's overlay relies on it).
func (r *kvRunner) propose(rec storage.Record, done func(seq uint64, err *wire.Error)) {
	r.proposing++
	r.p.enqueue(&pubReq{rec: rec, reply: replyTo{fn: func(ok wire.PubOK, err *wire.Error) {
		r.post(func() {
			r.proposing--
			done(ok.Seq, err)
		})
	}}})
}

// carry proposes what the leader kernel decided, in order, then answers.
// While a due checkpoint drains what is in flight, the proposals wait
// (held, in order: log order stays the kernel's order).
func (r *kvRunner) carry(eff kv.LeaderEffects) {
	if r.drainSinceMs != 0 {
		r.held = append(r.held, eff.Propose...)
	} else {
		r.proposeWrites(eff.Propose)
	}
	for _, rep := range eff.Replies {
		if done, ok := r.writes[rep.ID]; ok {
			delete(r.writes, rep.ID)
			if rep.Err != nil {
				done(0, kvWireError(rep.Err))
			} else {
				done(rep.Revision, nil)
			}
		}
	}
}

// proposeWrites proposes the leader kernel's writes, in order.
func (r *kvRunner) proposeWrites(props []kv.Proposal) {
	l := r.leader
	for _, prop := range props {
		id := prop.ID
		r.propose(storageRecord(prop.Record), func(seq uint64, err *wire.Error) { r.completed(l, id, seq, err) })
	}
}

// dropHeld forgets the held writes: their overlay is gone (its
// LeadershipLost answered them).
func (r *kvRunner) dropHeld() {
	r.held, r.drainSinceMs = nil, 0
}

// maybeCheckpoint writes a checkpoint of the bucket when one is due
// (kv.Bucket.CheckpointDue). Its chunks must land right after the state
// they carry (CheckpointBaseIsPrecedingSeq; a run that does not is void
// on every replica, which costs only a retry), so the leader proposes
// them only once everything in its log is applied: it holds new writes
// back until what is in flight commits — at most kvCheckpointDrainMs,
// then lets them go and tries again at the next lull.
//
// CheckpointWaitsAreMonotonic: the drain and the retry after a refused
// checkpoint are waits held in memory, measured on Node.monoMs. On the
// wall clock a step of it either way ended a drain at once (its writes
// let go, the checkpoint put off to a lull) and let a refused checkpoint
// be proposed again before its tick. The checkpoint's own date stays on
// the wall clock.
func (r *kvRunner) maybeCheckpoint() {
	b, err := r.readyBucket()
	minBytes := r.n.cfg.KVCheckpointMinBytes
	if err != nil || r.leader == nil || r.checkpointing || minBytes < 0 || !b.CheckpointDue(minBytes) {
		r.releaseHeld()
		return
	}
	mono := r.n.monoMs()
	if mono < r.checkpointRetryMs {
		r.releaseHeld()
		return
	}
	if r.drainSinceMs == 0 {
		r.drainSinceMs = mono
	}
	if r.proposing > 0 || r.applied+1 != r.p.readLog.Load().NextSeq() {
		if mono-r.drainSinceMs >= kvCheckpointDrainMs {
			r.releaseHeld()
		}
		return
	}
	chunkBytes := max(1, min(kv.ValueBytesLimit, r.n.cfg.RecordBytesMax-kvRecordOverheadBytes))
	recs, cerr := b.CheckpointRecords(chunkBytes, r.n.nowMs())
	if cerr != nil {
		r.n.logRepeatedError(r.p.subject(), "kv: cannot write a checkpoint; the bucket's log is not truncated", "err", cerr)
		r.releaseHeld()
		return
	}
	r.checkpointing = true
	r.n.metrics.kvCheckpoints.WithLabelValues(r.bucket).Inc()
	left := len(recs)
	for _, rec := range recs {
		r.propose(storageRecord(rec), func(_ uint64, err *wire.Error) {
			if err != nil {
				r.checkpointRetryMs = r.n.monoMs() + kvTick.Milliseconds()
			}
			if left--; left == 0 {
				r.checkpointing = false
			}
		})
	}
	r.releaseHeld()
}

// releaseHeld proposes the held writes and ends the drain.
func (r *kvRunner) releaseHeld() {
	held := r.held
	r.dropHeld()
	r.proposeWrites(held)
}

// completed takes a proposal's end: failed, or committed at seq (then it
// is answered once seq is applied, with what applying it did).
func (r *kvRunner) completed(l *kv.Leader, id, seq uint64, err *wire.Error) {
	if l == nil || r.leader != l {
		return // the overlay it belonged to is gone; LeadershipLost answered it
	}
	if err != nil {
		r.carry(l.Failed(r.state, id, err))
		return
	}
	r.afterApplied(seq, func() {
		if r.leader != l {
			return
		}
		res, ok := r.results[seq]
		if !ok {
			// Applied while the overlay held nothing in flight: cannot
			// happen for a write of this overlay (it is in flight until
			// here); answer it honestly rather than guess.
			r.carry(l.Failed(r.state, id, errors.New("its apply result was not kept")))
			return
		}
		delete(r.results, seq)
		r.carry(l.Applied(r.state, id, seq, res))
	})
}

// kvWireError maps the kv kernel's write errors to protocol errors.
func kvWireError(err error) *wire.Error {
	var me *kv.MismatchError
	var we *wire.Error
	switch {
	case errors.As(err, &me):
		return wire.RevisionMismatch(me.Current, "key %q: expected revision %d, current %d", me.Key, me.Expected, me.Current)
	case errors.Is(err, kv.ErrNotCommitted), errors.Is(err, kv.ErrLeadershipLost):
		return wire.Errorf(wire.CodeOutcomeUnknown, "the write may or may not commit (read the key before retrying): %v", err)
	case errors.Is(err, kv.ErrBusy), errors.Is(err, kv.ErrLeaderNotReady), errors.Is(err, kv.ErrLeaseLapsed):
		return wire.Errorf(wire.CodeUnavailable, "%v; retry", err)
	case errors.Is(err, kv.ErrEmptyKey), errors.Is(err, kv.ErrKeyTooLarge), errors.Is(err, kv.ErrValueTooLarge), errors.Is(err, kv.ErrBadWrite):
		return wire.Errorf(wire.CodeInvalidArgument, "%v", err)
	case errors.As(err, &we):
		return we
	}
	return wire.Errorf(wire.CodeUnavailable, "%v", err)
}

// write runs a client's write through the leader kernel.
func (r *kvRunner) write(w kv.Write, done func(uint64, error)) {
	if _, err := r.readyBucket(); err != nil {
		done(0, err)
		return
	}
	if r.leader == nil {
		done(0, wire.Errorf(wire.CodeUnavailable, "bucket %q: the leader is starting; retry", r.bucket))
		return
	}
	if werr := r.p.corruptError(); werr != nil {
		// Refused here for the same reason as below: nothing is proposed.
		done(0, werr)
		return
	}
	if rs := r.p.replica(); rs != nil {
		// The partition would refuse the record; refused here, nothing
		// is proposed, so the client hears a definite refusal rather than
		// OUTCOME_UNKNOWN (a write already in flight may still commit).
		if st, _ := rs.leaderView(); st.ReadOnly {
			done(0, wire.Errorf(wire.CodeQuorumLost, "bucket %q: the leader is READ_ONLY_DEGRADED (no quorum of replicas acknowledges); nothing was written, retry", r.bucket))
			return
		}
	}
	r.nextID++
	id := r.nextID
	r.writes[id] = done
	r.carry(r.leader.Submit(r.state, kv.Request{ID: id, Write: w}, r.n.nowMs()))
}

// create proposes the bucket's config record unless the bucket exists.
func (r *kvRunner) create(c kvBucketConf, done func(created bool, err error)) {
	if err := r.ready(); err != nil {
		done(false, err)
		return
	}
	if r.conf != nil && !r.conf.Deleted {
		if *r.conf != c {
			done(false, r.conflict())
			return
		}
		done(false, nil)
		return
	}
	r.propose(c.record(), func(seq uint64, err *wire.Error) {
		if err != nil {
			done(false, err)
			return
		}
		r.afterApplied(seq, func() {
			switch {
			case r.conf == nil || r.conf.Deleted || *r.conf != c:
				done(false, r.conflict())
			default:
				done(r.confSeq == seq, nil)
			}
		})
	})
}

func (r *kvRunner) conflict() *wire.Error {
	if r.conf == nil || r.conf.Deleted {
		return wire.Errorf(wire.CodeTopicConflict, "bucket %q was deleted while it was being created; retry", r.bucket)
	}
	return wire.Errorf(wire.CodeTopicConflict, "bucket %q exists with history=%d tombstone_ttl_ms=%d", r.bucket, r.conf.History, r.conf.TombstoneTTLMs)
}

// remove proposes the record that deletes the bucket.
func (r *kvRunner) remove(done func(error)) {
	if _, err := r.readyBucket(); err != nil && (r.seeker == nil || r.seekLost == nil) {
		done(err) // a bucket that cannot be rebuilt may still be deleted
		return
	}
	r.propose(kvBucketConf{Deleted: true}.record(), func(seq uint64, err *wire.Error) {
		if err != nil {
			done(err)
			return
		}
		r.afterApplied(seq, func() { done(nil) })
	})
}

// maybeCompact proposes a compaction record when one would purge expired
// tombstones (one at a time).
func (r *kvRunner) maybeCompact() {
	b, err := r.readyBucket()
	if err != nil || r.compacting {
		return
	}
	now := r.n.nowMs()
	if !b.PurgeDue(now) {
		return
	}
	r.compacting = true
	r.propose(storageRecord(kv.CompactRecord(now)), func(uint64, *wire.Error) { r.compacting = false })
}

// maybeFence proposes a fence record after a repair's gap
// (LossExpiresEveryCursor): the floor it raises expires every watcher
// whose cursor is at or below it, so one that saw a write the repair
// dropped lists the bucket again instead of keeping that write in its
// derived state. The drop's own floor (stepOverGap) reaches only the
// watchers that had not passed the gap. The fence names the gaps it
// answers: replayed after a restart it answers those again, but not a
// gap a later repair made below it (FenceAnswersOnlyItsGaps).
func (r *kvRunner) maybeFence() {
	if len(r.lost) == 0 || r.fencing || r.leader == nil {
		return
	}
	if _, err := r.readyBucket(); err != nil {
		return
	}
	r.fencing = true
	lost := r.lost[:min(len(r.lost), kv.FenceSpansMax)]
	r.n.log.Info("kv: fencing the bucket's watchers after a repair's loss: every one lists it again", "bucket", r.bucket, "applied", r.applied, "lost", fmt.Sprint(lost))
	r.propose(storageRecord(kv.FenceRecord(lost)), func(uint64, *wire.Error) { r.fencing = false })
}

// fenced takes in the fence record rec applied: the gaps it names are
// answered.
func (r *kvRunner) fenced(rec *storage.Record) {
	w, err := kv.DecodeRecord(kvRecord(rec))
	spans, serr := kv.FenceSpans(w)
	if err != nil || serr != nil || r.n.cfg.Mutations.KVFenceAnswersAnyGap {
		r.lost = nil
		return
	}
	slices.SortFunc(spans, func(a, b kv.Span) int { return cmp.Compare(a.First, b.First) })
	r.lost = slices.DeleteFunc(r.lost, func(sp kv.Span) bool { return spansCover(spans, sp) })
}

// spansCover reports whether the union of sorted (by First) holds every
// seq of sp.
func spansCover(sorted []kv.Span, sp kv.Span) bool {
	next := sp.First
	for _, s := range sorted {
		if s.First > next {
			break
		}
		if s.Last >= next {
			if s.Last >= sp.Last {
				return true
			}
			next = s.Last + 1
		}
	}
	return false
}

// describe is what KV_BUCKET_LIST says of the bucket as this node
// applied it (nil: no bucket, or the node is stopping). It waits for the
// runner's goroutine.
func (r *kvRunner) describe() *wire.KVBucketInfo {
	ch := make(chan *wire.KVBucketInfo, 1)
	post := r.post
	if r.n.cfg.Manual {
		post = func(fn func()) { fn() } // the caller is the runner's goroutine (Step's)
	}
	post(func() {
		if r.state == nil || r.conf == nil {
			ch <- nil
			return
		}
		ch <- &wire.KVBucketInfo{
			Config:   wire.KVBucketConfig{Bucket: r.bucket, History: uint32(r.conf.History), TombstoneTTLMs: r.conf.TombstoneTTLMs, Replicas: r.t.cfg.Replicas},
			Revision: r.state.Applied(), Floor: r.state.Floor(), Keys: uint32(min(r.state.LiveKeys(), 1<<32-1)),
		}
	})
	select {
	case info := <-ch:
		return info
	case <-r.p.done:
		return nil
	}
}

// KVState is a bucket's state on this node (KVStateOf).
type KVState struct {
	// Applied is the last seq the runner applied; LogStart the first seq
	// of the partition's log here; Checkpoint the base of the latest
	// complete checkpoint applied; Rebuilds the times this runner loaded
	// the bucket from a checkpoint in its log.
	Applied, LogStart, Checkpoint uint64
	// Resets: the times the log came to start after what this runner
	// applied while it ran (a follower reset to its leader's snapshot
	// point).
	Rebuilds, Resets int
	// Snapshot is the bucket's kv.Snapshot encoding (nil: no bucket here:
	// none, deleted, or rebuilding).
	Snapshot []byte
}

// KVStateOf reads the state of this node's replica of a bucket, for the
// simulator's checks. Manual mode only: it reads the runner on the
// caller's goroutine, which is the runner's there.
func (n *Node) KVStateOf(bucket string) (KVState, bool) {
	n.kv.mu.Lock()
	r := n.kv.runners[bucket]
	n.kv.mu.Unlock()
	if r == nil || !n.cfg.Manual {
		return KVState{}, false
	}
	st := KVState{Applied: r.applied, LogStart: r.p.startSeq.Load(), Checkpoint: r.checkpointBase, Rebuilds: r.rebuilds, Resets: r.resets}
	if r.state != nil {
		st.Snapshot = kv.AppendSnapshot(nil, r.state.Snapshot())
	}
	return st, true
}

func kvEntry(rev kv.Revision) wire.KVEntry {
	op := wire.KVOpPut
	if rev.Op == kv.OpDelete {
		op = wire.KVOpDelete
	}
	return wire.KVEntry{Key: []byte(rev.Key), Revision: rev.Seq, Op: op, TimestampMs: rev.TimestampMs, Value: rev.Value}
}

// ---- watches

// KVWatchSink receives a watch's events and its end, from the bucket's
// runner goroutine. It must not block.
type KVWatchSink interface {
	SendEvent(ev *wire.KVEvent)
	// End ends the watch: CURSOR_EXPIRED (its cursor fell below the
	// floor), NOT_LEADER, NOT_FOUND, UNAVAILABLE. Nothing follows it.
	End(err *wire.Error)
}

// KVWatch is a client's watch of a bucket, served by the bucket's leader.
// Its methods are safe for concurrent use.
type KVWatch struct{ r *kvRunner }

type kvWatchState struct {
	cursor kv.Cursor
	credit int
	sink   KVWatchSink
}

// AddCredit lets the watch send credit more put/delete events.
func (h *KVWatch) AddCredit(credit uint32) {
	h.r.post(func() {
		if w, ok := h.r.watches[h]; ok {
			w.credit = min(w.credit+int(credit), kvWatchCreditMax)
		}
	})
}

// Cancel ends the watch; its sink hears nothing more.
func (h *KVWatch) Cancel() { h.r.post(func() { delete(h.r.watches, h) }) }

// serveWatches sends each watch what its credit allows, in revision
// order; a watch below the floor gets CURSOR_EXPIRED and ends.
func (r *kvRunner) serveWatches() {
	if len(r.watches) == 0 {
		return
	}
	b, err := r.readableBucket()
	for h, w := range r.watches {
		if err != nil {
			w.sink.End(err)
			delete(r.watches, h)
			continue
		}
		if !r.serveWatch(b, w) {
			delete(r.watches, h)
		}
	}
}

// serveWatch reports whether the watch goes on.
func (r *kvRunner) serveWatch(b *kv.Bucket, w *kvWatchState) bool {
	for w.credit > 0 && w.cursor.Next <= b.Applied() {
		batch := b.Watch(w.cursor, w.credit)
		for _, ev := range batch.Events {
			switch ev.Kind {
			case kv.EventPut, kv.EventDelete:
				kind := wire.KVEventPut
				if ev.Kind == kv.EventDelete {
					kind = wire.KVEventDelete
				}
				w.sink.SendEvent(&wire.KVEvent{Kind: kind, Entry: kvEntry(ev.Revision), Floor: b.Floor()})
				w.credit--
			case kv.EventSkipped:
				w.sink.SendEvent(&wire.KVEvent{Kind: wire.KVEventSkipped, From: ev.From, To: ev.To, Reasons: uint8(ev.Reasons), Floor: b.Floor()})
			case kv.EventCursorExpired:
				r.n.metrics.kvExpired.WithLabelValues(r.bucket).Inc()
				w.sink.End(wire.CursorExpired(ev.Floor, "bucket %q: the watch's next revision %d is below the floor %d (a revision it has not seen was purged, or the bucket lost writes to a repair or was created again); list the bucket and watch again", r.bucket, w.cursor.Next, ev.Floor))
				return false
			}
		}
		w.cursor.Next = batch.Next // Watch moves a cursor at or below Applied
	}
	return true
}

// ---- the node's KV API (the server calls it; answers come from the
// bucket's runner goroutine, or at once for bad input)

// kvRunnerOf finds the runner of a bucket this node holds.
func (n *Node) kvRunnerOf(bucket string) (*kvRunner, error) {
	if err := wire.ValidateBucketName(bucket); err != nil {
		return nil, err
	}
	t, err := n.topic(wire.KVTopic(bucket))
	if errors.Is(err, wire.ErrNotFound) {
		return nil, wire.Errorf(wire.CodeNotFound, "bucket %q does not exist", bucket)
	}
	if err != nil {
		return nil, err
	}
	n.kv.mu.Lock()
	r := n.kv.runners[bucket]
	n.kv.mu.Unlock()
	if r == nil {
		if werr := t.partitions[0].corruptError(); werr != nil {
			return nil, werr // its only replica, here, did not open: damaged (not "no replica")
		}
		info := t.partitions[0].info()
		return nil, wire.Errorf(wire.CodeNotLeader, "bucket %q has no replica on this node; leader: %s at %s", bucket, info.Leader, info.LeaderAddr)
	}
	return r, nil
}

// KVCreateBucket creates a bucket (its topic, then its config record), or
// confirms one with the same configuration; done gets the configuration
// with defaults filled in.
func (n *Node) KVCreateBucket(c wire.KVBucketConfig, done func(cfg wire.KVBucketConfig, created bool, err error)) {
	if err := wire.ValidateBucketName(c.Bucket); err != nil {
		done(c, false, err)
		return
	}
	if c.History == 0 {
		c.History = 1
	}
	if c.History > wire.KVHistoryMax {
		done(c, false, wire.Errorf(wire.CodeInvalidArgument, "history must be 1-%d, got %d", wire.KVHistoryMax, c.History))
		return
	}
	if c.TombstoneTTLMs < 0 {
		done(c, false, wire.Errorf(wire.CodeInvalidArgument, "tombstone TTL must not be negative, got %d ms", c.TombstoneTTLMs))
		return
	}
	if c.TombstoneTTLMs == 0 {
		c.TombstoneTTLMs = kvTombstoneTTLMsDefault
	}
	conf := kvBucketConf{History: int(c.History), TombstoneTTLMs: c.TombstoneTTLMs}
	tc := wire.TopicConfig{Name: wire.KVTopic(c.Bucket), Partitions: 1, Replicas: c.Replicas}
	n.declareAsync(tc, func(_ bool, err error) {
		if errors.Is(err, wire.ErrTopicConflict) {
			err = wire.Errorf(wire.CodeTopicConflict, "bucket %q exists with other replicas: %v", c.Bucket, err)
		}
		if err != nil {
			done(c, false, err)
			return
		}
		r, err := n.kvRunnerOf(c.Bucket)
		if err != nil {
			done(c, false, err)
			return
		}
		c.Replicas = r.t.cfg.Replicas
		r.post(func() { r.create(conf, func(created bool, err error) { done(c, created, err) }) })
	})
}

// KVDeleteBucket deletes a bucket: its keys are gone, its watches end
// (NOT_FOUND), and its name may be created again. Its topic and log stay.
func (n *Node) KVDeleteBucket(bucket string, done func(error)) {
	r, err := n.kvRunnerOf(bucket)
	if err != nil {
		done(err)
		return
	}
	r.post(func() { r.remove(done) })
}

// KVBuckets describes one bucket, or every bucket ("") this node knows.
// The configuration and revision are this node's view: a node with no
// replica of a bucket knows only its name, replicas and leader (History
// 0); so does a holder of a bucket being created.
func (n *Node) KVBuckets(bucket string) ([]wire.KVBucketInfo, error) {
	if bucket != "" {
		if err := wire.ValidateBucketName(bucket); err != nil {
			return nil, err
		}
	}
	n.mu.RLock()
	var names []string
	for name := range n.topics {
		if wire.IsKVTopic(name) && (bucket == "" || name == wire.KVTopic(bucket)) {
			names = append(names, name)
		}
	}
	n.mu.RUnlock()
	slices.Sort(names)
	var out []wire.KVBucketInfo
	for _, name := range names {
		b := strings.TrimPrefix(name, wire.KVTopicPrefix)
		t, err := n.topic(name)
		if err != nil {
			continue
		}
		info := wire.KVBucketInfo{Config: wire.KVBucketConfig{Bucket: b, Replicas: t.cfg.Replicas}}
		n.kv.mu.Lock()
		r := n.kv.runners[b]
		n.kv.mu.Unlock()
		if r != nil {
			applied := r.describe()
			if applied == nil && bucket == "" {
				continue // no bucket (yet, or any more)
			}
			if applied != nil {
				info = *applied
			}
		}
		pi := t.partitions[0].info()
		info.Leader, info.LeaderAddr = pi.Leader, pi.LeaderAddr
		out = append(out, info)
	}
	if bucket != "" && len(out) == 0 {
		return nil, wire.Errorf(wire.CodeNotFound, "bucket %q does not exist", bucket)
	}
	return out, nil
}

// KVWrite puts or deletes a key, conditionally (CAS) or not; done gets
// the write's revision once it is committed and applied. The frame's
// bytes are copied.
func (n *Node) KVWrite(f *wire.KVWrite, done func(revision uint64, err error)) {
	r, err := n.kvRunnerOf(f.Bucket)
	if err != nil {
		done(0, err)
		return
	}
	// The leader kernel checks the key, the value and a delete's empty
	// value (INVALID_ARGUMENT).
	w := kv.Write{Op: kv.OpPut, Key: slices.Clone(f.Key), Value: slices.Clone(f.Value), Conditional: f.Conditional, Expected: f.Expected}
	if f.Op == wire.KVOpDelete {
		w.Op = kv.OpDelete
	}
	r.post(func() {
		r.write(w, func(revision uint64, err error) {
			if err == nil {
				r.written.Inc()
			}
			done(revision, err)
		})
	})
}

func checkKVKey(key []byte) *wire.Error {
	if len(key) == 0 || len(key) > wire.KVKeyBytesMax {
		return wire.Errorf(wire.CodeInvalidArgument, "key must be 1-%d bytes, got %d", wire.KVKeyBytesMax, len(key))
	}
	return nil
}

// kvRead answers a read of bucket: once the bucket's runner finds itself
// the leader under its lease (readableBucket), read runs there. A refusal
// of the request itself (refused, checked after the bucket is found)
// comes first.
func kvRead[T any](n *Node, bucket string, refused *wire.Error, done func(T, error), read func(r *kvRunner, b *kv.Bucket) (T, error)) {
	var none T
	r, err := n.kvRunnerOf(bucket)
	if err != nil {
		done(none, err)
		return
	}
	if refused != nil {
		done(none, refused)
		return
	}
	r.post(func() {
		b, werr := r.readableBucket()
		if werr != nil {
			done(none, werr)
			return
		}
		done(read(r, b))
	})
}

// KVGet reads a key at the bucket's leader: its latest value, or its
// revision f.Revision (NOT_FOUND when the bucket does not keep it).
func (n *Node) KVGet(f *wire.KVGet, done func(*wire.KVGetOK, error)) {
	key, at := string(f.Key), f.Revision
	kvRead(n, f.Bucket, checkKVKey(f.Key), done, func(r *kvRunner, b *kv.Bucket) (*wire.KVGetOK, error) {
		ok := &wire.KVGetOK{BucketRevision: b.Applied()}
		if at == 0 {
			if rev, found := b.Get(key); found {
				ok.Found, ok.Entry = true, kvEntry(rev)
			}
			return ok, nil
		}
		rev, rerr := b.GetRevision(key, at)
		if rerr != nil {
			return nil, wire.Errorf(wire.CodeNotFound, "bucket %q: %v", r.bucket, rerr)
		}
		ok.Found, ok.Entry = true, kvEntry(rev)
		return ok, nil
	})
}

// KVKeys lists a page of the live keys with a prefix, at the leader.
func (n *Node) KVKeys(f *wire.KVKeys, done func(*wire.KVKeysOK, error)) {
	prefix, after := string(f.Prefix), string(f.After)
	limit := int(f.Limit)
	if limit <= 0 || limit > wire.KVKeysPageMax {
		limit = wire.KVKeysPageMax
	}
	kvRead(n, f.Bucket, nil, done, func(_ *kvRunner, b *kv.Bucket) (*wire.KVKeysOK, error) {
		ok := &wire.KVKeysOK{BucketRevision: b.Applied()}
		keys, more := b.KeysAfter(prefix, after, limit)
		for _, k := range keys {
			ok.Keys = append(ok.Keys, []byte(k))
		}
		ok.More = more
		return ok, nil
	})
}

// KVList lists every live entry with a prefix at the leader, at one
// revision, in one answer (INVALID_ARGUMENT beyond wire.KVListBytesMax or
// wire.KVListEntriesMax).
func (n *Node) KVList(f *wire.KVList, done func(*wire.KVListOK, error)) {
	prefix := string(f.Prefix)
	kvRead(n, f.Bucket, nil, done, func(r *kvRunner, b *kv.Bucket) (*wire.KVListOK, error) {
		ok := &wire.KVListOK{BucketRevision: b.Applied()}
		bytes := 0
		for _, k := range b.Keys(prefix) {
			rev, _ := b.Get(k)
			if bytes += len(k) + len(rev.Value); bytes > wire.KVListBytesMax || len(ok.Entries) == wire.KVListEntriesMax {
				return nil, wire.Errorf(wire.CodeInvalidArgument, "bucket %q: the entries with prefix %q exceed one listing (%d entries, %d bytes of keys and values)",
					r.bucket, prefix, wire.KVListEntriesMax, wire.KVListBytesMax)
			}
			ok.Entries = append(ok.Entries, kvEntry(rev))
		}
		return ok, nil
	})
}

// KVHistory returns a key's kept revisions at the leader, oldest first.
func (n *Node) KVHistory(f *wire.KVHistory, done func(*wire.KVHistoryOK, error)) {
	key := string(f.Key)
	kvRead(n, f.Bucket, checkKVKey(f.Key), done, func(_ *kvRunner, b *kv.Bucket) (*wire.KVHistoryOK, error) {
		ok := &wire.KVHistoryOK{}
		for _, rev := range b.History(key) {
			ok.Entries = append(ok.Entries, kvEntry(rev))
		}
		return ok, nil
	})
}

// KVStartWatch starts a watch at the bucket's leader; events go to sink.
// A watch that cannot start is ended through sink (on the runner's
// goroutine) or refused here.
func (n *Node) KVStartWatch(f *wire.KVWatch, sink KVWatchSink) (*KVWatch, error) {
	r, err := n.kvRunnerOf(f.Bucket)
	if err != nil {
		return nil, err
	}
	h := &KVWatch{r: r}
	w := &kvWatchState{cursor: kv.Cursor{Next: max(f.FromRevision, 1), Prefix: string(f.Prefix)}, credit: min(int(f.Credit), kvWatchCreditMax), sink: sink}
	r.post(func() {
		if _, err := r.readableBucket(); err != nil {
			sink.End(err)
			return
		}
		if len(r.lost) > 0 && !r.n.cfg.Mutations.KVWatchBeforeFence {
			// A gap stepped over and not fenced yet: a watch from past it
			// may have seen a write it lost, and would go on before the
			// fence expires it (FenceBeforeWatch).
			sink.End(wire.Errorf(wire.CodeUnavailable, "bucket %q: a repair lost writes; it is fencing its watchers (each lists it again); retry", r.bucket))
			return
		}
		if b := r.state; w.cursor.Next <= 1 && r.confSeq > 0 && b.Floor() == r.confSeq+1 {
			// "From the start" of a bucket created again, whose floor is
			// above its creation (RecreationExpiresOldCursors): the seqs
			// before it hold none of its revisions.
			sink.SendEvent(&wire.KVEvent{Kind: wire.KVEventSkipped, From: w.cursor.Next, To: r.confSeq, Reasons: uint8(kv.SkipOverwritten), Floor: b.Floor()})
			w.cursor.Next = r.confSeq + 1
		}
		r.watches[h] = w
	})
	return h, nil
}
