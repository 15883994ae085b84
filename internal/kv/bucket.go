package kv

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// HistoryLimit bounds Config.HistoryMax.
const HistoryLimit = 64

// Config configures a bucket; validate it once with Validate (NewBucket
// does). The same Config must be given to every replica of a bucket: the
// applied state depends on HistoryMax and TombstoneTTLms.
type Config struct {
	// HistoryMax is N: a key keeps its last N revisions (1..HistoryLimit).
	HistoryMax int
	// TombstoneTTLms is how long a tombstone is kept after its write
	// before a compaction record may purge it (> 0).
	TombstoneTTLms int64
	// KeyBytesMax and ValueBytesMax bound a submitted write (at most the
	// format limits KeyBytesLimit, ValueBytesLimit).
	KeyBytesMax, ValueBytesMax int
	// WatchScanRevisionsMax bounds the kept revisions one Watch call looks
	// at (a prefix watcher may pass over many that do not match).
	WatchScanRevisionsMax int
	// InflightWritesMax bounds the leader's proposed, uncommitted writes;
	// ParkedWritesMax the CAS writes waiting for one of them.
	InflightWritesMax, ParkedWritesMax int
	// Mutations break guards on purpose (tests only).
	Mutations Mutations
}

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a test must fail with it on (mutations_test.go).
type Mutations struct {
	// CASAgainstCommittedOnly: the leader checks a CAS against the
	// committed state only, ignoring its writes in flight.
	CASAgainstCommittedOnly bool
	// RefuseWithoutLease: the leader refuses a CAS against its committed
	// state without holding its lease (RefusalUnderLease).
	RefuseWithoutLease bool
	// ApplyIgnoresCondition: a conditional record applies whatever the
	// key's revision when it is applied.
	ApplyIgnoresCondition bool
	// WatchJumpsFloor: a watcher below the floor is silently moved to it.
	WatchJumpsFloor bool
	// EvictLiveRevision: compaction purges an old key whose latest
	// revision is a value, not only an expired tombstone.
	EvictLiveRevision bool
	// CheckpointAnyBase: a checkpoint chunk counts wherever it sits, not
	// only at the seq its base names (CheckpointBaseIsPrecedingSeq).
	CheckpointAnyBase bool
	// CheckpointSkipsChunks: a chunk of the pending checkpoint counts
	// even when chunks before it are missing (CheckpointChunksContiguous).
	CheckpointSkipsChunks bool
	// CheckpointUnverified: a replica that has the state completes a
	// checkpoint without checking that it carries that state
	// (CheckpointMatchesState).
	CheckpointUnverified bool
	// SubmitBeforeReignStart: the leader takes writes before its bucket
	// applied its reign's first entry (no ErrLeaderNotReady), so it may
	// refuse a CAS against a state that misses a write the previous
	// leader acknowledged.
	SubmitBeforeReignStart bool
	// DropKeepsFloor: seqs a repair dropped are stepped over without
	// raising the floor, so a watcher resumes past them without knowing
	// what it missed (DroppedNeverSkippedSilently).
	DropKeepsFloor bool
	// FenceKeepsFloor: a fence record raises no floor, so a watcher that
	// saw a write a repair dropped resumes past the loss without knowing
	// (LossExpiresEveryCursor).
	FenceKeepsFloor bool
}

// ErrConfig: a Config is invalid.
var ErrConfig = errors.New("kv: invalid config")

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.HistoryMax < 1 || c.HistoryMax > HistoryLimit:
		return fmt.Errorf("%w: HistoryMax %d not in 1..%d", ErrConfig, c.HistoryMax, HistoryLimit)
	case c.TombstoneTTLms <= 0:
		return fmt.Errorf("%w: TombstoneTTLms %d must be positive", ErrConfig, c.TombstoneTTLms)
	case c.KeyBytesMax < 1 || c.KeyBytesMax > KeyBytesLimit:
		return fmt.Errorf("%w: KeyBytesMax %d not in 1..%d", ErrConfig, c.KeyBytesMax, KeyBytesLimit)
	case c.ValueBytesMax < 0 || c.ValueBytesMax > ValueBytesLimit:
		return fmt.Errorf("%w: ValueBytesMax %d not in 0..%d", ErrConfig, c.ValueBytesMax, ValueBytesLimit)
	case c.WatchScanRevisionsMax < 1:
		return fmt.Errorf("%w: WatchScanRevisionsMax %d must be positive", ErrConfig, c.WatchScanRevisionsMax)
	case c.InflightWritesMax < 1 || c.ParkedWritesMax < 0:
		return fmt.Errorf("%w: InflightWritesMax %d, ParkedWritesMax %d", ErrConfig, c.InflightWritesMax, c.ParkedWritesMax)
	}
	return nil
}

// Revision is one kept write of a key: a value (OpPut) or a tombstone
// (OpDelete). Seq is the revision. Value is owned by the bucket: callers
// must not modify it.
type Revision struct {
	Seq         uint64
	Op          Op
	Key         string
	Value       []byte
	TimestampMs int64
}

// Outcome is what applying one record did.
type Outcome uint8

const (
	// Written: the record is a new revision of its key.
	Written Outcome = iota + 1
	// Refused: a CAS whose condition did not hold when applied; nothing
	// changed (the seq holds no revision).
	Refused
	// Compacted: a compaction record; expired tombstones were purged.
	Compacted
	// NotRevision: not a KV record (an install entry); nothing changed.
	NotRevision
	// Checkpointed: a checkpoint's chunk; nothing changed (LastCheckpoint
	// moves when it completes a checkpoint).
	Checkpointed
	// Fenced: a fence record; the floor rose above it.
	Fenced
)

func (o Outcome) String() string {
	switch o {
	case Written:
		return "Written"
	case Refused:
		return "Refused"
	case Compacted:
		return "Compacted"
	case Fenced:
		return "Fenced"
	case NotRevision:
		return "NotRevision"
	case Checkpointed:
		return "Checkpointed"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// ApplyResult is what Apply did with one record.
type ApplyResult struct {
	Outcome Outcome
	// Current is the key's latest revision when a CAS was refused (0: the
	// key is absent): REVISION_MISMATCH carries it.
	Current uint64
	// PurgedKeys counts the keys a compaction removed.
	PurgedKeys int
	// ChunkCounted: a checkpoint chunk that counts toward its checkpoint
	// (else it is void); CheckpointComplete: it completed one.
	ChunkCounted, CheckpointComplete bool
}

// Errors of the applied state.
var (
	// ErrOutOfOrder: Apply of a seq that is not the next one.
	ErrOutOfOrder = errors.New("kv: record applied out of order")
	// ErrRevisionNotKept: GetRevision of a revision the bucket does not
	// keep for that key.
	ErrRevisionNotKept = errors.New("kv: revision not kept")
)

// Bucket is the applied state of a bucket: every replica applies the same
// committed records to it and holds the same Bucket.
//
// Invariants (checkFloor in tests): every seq in [Floor, Applied] holds a
// kept revision, or held none (a refused CAS, a compaction, a record that
// is not KV), or held one overwritten by HistoryMax newer revisions of its
// key — never one evicted. Each key keeps at most HistoryMax revisions,
// ascending, the newest last.
type Bucket struct {
	cfg     Config
	applied uint64 // last seq applied: state and cursor advance together
	floor   uint64 // see Floor
	// keys holds each key's kept revisions, oldest first, never empty.
	keys map[string][]Revision
	// live caches the live keys, sorted, for Keys: rebuilt only after
	// a key is created, deleted, revived or purged (liveValid false), not
	// on every listing — a listing used to sort the whole bucket per page.
	live      []string
	liveValid bool
	// bySeq maps each kept revision to its key; order holds the kept
	// revisions' seqs ascending, plus dropped ones (absent from bySeq)
	// until staleInOrder makes a rebuild of order worth it.
	bySeq        map[uint64]string
	order        []uint64
	staleInOrder int
	// Checkpoints (checkpoint.go): the one whose chunks are being
	// applied, the base of the latest complete one, the log's bytes since
	// (chunks excluded), and the size of the Snapshot encoding, kept as
	// revisions come and go.
	pending        checkpointTracker
	lastCheckpoint uint64
	logBytesSince  int64
	snapshotBytes  int64
}

// NewBucket returns an empty bucket whose log starts at seq 1.
func NewBucket(cfg Config) (*Bucket, error) { return newBucketAt(cfg, 1) }

// NewBucketAfter returns an empty bucket created by the record at seq:
// seqs through it are applied, and its floor is above them, so a watcher
// whose cursor is at or below seq — one of a bucket of that name deleted
// before — gets CURSOR_EXPIRED instead of going on with what it derived
// from that one (RecreationExpiresOldCursors).
func NewBucketAfter(cfg Config, seq uint64) (*Bucket, error) { return newBucketAt(cfg, seq+1) }

// newBucketAt returns an empty bucket whose floor is startSeq.
func newBucketAt(cfg Config, startSeq uint64) (*Bucket, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if startSeq == 0 {
		return nil, fmt.Errorf("%w: start seq 0 (seqs are 1-based)", ErrConfig)
	}
	return &Bucket{cfg: cfg, applied: startSeq - 1, floor: startSeq,
		keys: map[string][]Revision{}, bySeq: map[uint64]string{}, snapshotBytes: snapshotHeaderBytes}, nil
}

// Applied is the last seq applied.
func (b *Bucket) Applied() uint64 { return b.applied }

// Floor is the first revision a watcher can resume from: no revision at
// or above it was evicted (only overwritten). It only rises.
func (b *Bucket) Floor() uint64 { return b.floor }

// LogRetainFrom is the lowest seq the partition's log must keep so that
// the record of every revision a watch may still deliver is in it: the
// floor, or the oldest kept revision if that is older (a live key's only
// revision pins the log; rewriting it forward is out of scope). The log
// alone is not enough to rebuild from, though: a CAS's outcome depends on
// the state before it, so the node truncates below
// min(LogRetainFrom(), s+1) only, s being the applied seq of a durable
// Snapshot, and rebuilds from that snapshot plus the log after it.
func (b *Bucket) LogRetainFrom() uint64 {
	from := b.floor
	for _, seq := range b.order {
		if _, kept := b.bySeq[seq]; kept {
			return min(from, seq)
		}
	}
	return from
}

// Drop moves the cursor over seqs first..last, which the log no longer
// holds: a repair dropped them, so what they held is unknown (a
// revision, a delete, a checkpoint chunk, or nothing). The state keeps
// what it had; the floor rises above them, so a watcher that has not
// seen them all gets CURSOR_EXPIRED and lists the bucket again instead
// of missing them in silence (DroppedNeverSkippedSilently). A checkpoint
// whose chunks they interrupted no longer counts: its next chunk does
// not sit where its base says (CheckpointBaseIsPrecedingSeq). first must
// be Applied()+1.
func (b *Bucket) Drop(first, last uint64) error {
	if first != b.applied+1 || last < first {
		return fmt.Errorf("%w: drop of seqs %d-%d after %d", ErrOutOfOrder, first, last, b.applied)
	}
	b.applied = last
	if !b.cfg.Mutations.DropKeepsFloor {
		b.floor = max(b.floor, last+1)
	}
	return nil
}

// Apply applies the committed record at seq, which must be Applied()+1.
// A malformed KV record is an error and is not applied (the cursor stays:
// the node treats it as corruption); a record that is not KV advances the
// cursor and changes nothing.
func (b *Bucket) Apply(seq uint64, r Record) (ApplyResult, error) {
	// Cursor authority: state and cursor advance together, one seq at a
	// time, so no record is skipped or applied twice.
	if seq != b.applied+1 {
		return ApplyResult{}, fmt.Errorf("%w: seq %d after %d", ErrOutOfOrder, seq, b.applied)
	}
	w, err := DecodeRecord(r)
	if errors.Is(err, ErrNotKV) {
		b.applied = seq
		b.logBytesSince += recordBytes(r)
		return ApplyResult{Outcome: NotRevision}, nil
	}
	if err != nil {
		return ApplyResult{}, fmt.Errorf("seq %d: %w", seq, err)
	}
	if w.Op == OpCheckpoint {
		return b.applyChunk(seq, w)
	}
	b.applied = seq
	b.logBytesSince += recordBytes(r)
	if w.Op == OpCompact {
		return ApplyResult{Outcome: Compacted, PurgedKeys: b.purge(w.TimestampMs)}, nil
	}
	if w.Op == OpFence {
		if !b.cfg.Mutations.FenceKeepsFloor {
			b.floor = max(b.floor, seq+1)
		}
		return ApplyResult{Outcome: Fenced}, nil
	}
	key := string(w.Key)
	// The condition is checked again here, against the committed state,
	// on every replica: a CAS the leader let through against a write in
	// flight that then never committed is refused, not applied against a
	// value that never existed.
	if w.Conditional && !b.cfg.Mutations.ApplyIgnoresCondition {
		if !conditionHolds(b.latest(key), w.Expected) {
			return ApplyResult{Outcome: Refused, Current: b.latestSeq(key)}, nil
		}
	}
	b.insert(Revision{Seq: seq, Op: w.Op, Key: key, Value: cloneValue(w.Value), TimestampMs: w.TimestampMs})
	return ApplyResult{Outcome: Written}, nil
}

// insert appends a revision (the newest of its key and of the bucket)
// and drops what HistoryMax overwrites.
func (b *Bucket) insert(rev Revision) {
	prev := b.keys[rev.Key]
	if len(prev) == 0 || (prev[len(prev)-1].Op == OpDelete) != (rev.Op == OpDelete) {
		b.liveValid = false // the live keys change
	}
	history := append(prev, rev)
	// A key keeps its last HistoryMax revisions: an older one has
	// HistoryMax newer ones, so dropping it is an overwrite (a benign
	// skip), not an eviction, and the floor stays.
	for len(history) > b.cfg.HistoryMax {
		b.drop(history[0])
		history = history[1:]
	}
	b.keys[rev.Key] = slices.Clip(history)
	b.bySeq[rev.Seq] = rev.Key
	b.snapshotBytes += revisionBytes(rev)
	b.order = append(b.order, rev.Seq)
	b.maybeCompactOrder()
}

// maybeCompactOrder drops the dropped seqs from order once they are most
// of it (amortized: a watcher's scan stays proportional to what is kept).
func (b *Bucket) maybeCompactOrder() {
	if b.staleInOrder > len(b.order)/2 {
		b.compactOrder()
	}
}

func (b *Bucket) drop(rev Revision) {
	delete(b.bySeq, rev.Seq)
	b.staleInOrder++
	b.snapshotBytes -= revisionBytes(rev)
}

// revisionBytes is what rev takes in a Snapshot's encoding.
func revisionBytes(rev Revision) int64 {
	return int64(revisionBytesMin + len(rev.Key) + len(rev.Value))
}

// purge removes every key whose latest revision is a tombstone expired at
// nowMs, and raises the floor above it: its revisions are evicted (a
// watcher behind them would miss the delete).
func (b *Bucket) purge(nowMs int64) int {
	purged := 0
	for key, history := range b.keys { // order-free: set removal and max
		latest := history[len(history)-1]
		// Only a tombstone with nothing newer is purged: a live key keeps
		// its latest revisions whatever their age.
		if latest.Op != OpDelete && !b.cfg.Mutations.EvictLiveRevision {
			continue
		}
		if !expired(latest.TimestampMs, nowMs, b.cfg.TombstoneTTLms) {
			continue
		}
		for _, rev := range history {
			b.drop(rev)
		}
		delete(b.keys, key)
		b.floor = max(b.floor, latest.Seq+1)
		if latest.Op != OpDelete {
			b.liveValid = false // a live key purged (EvictLiveRevision)
		}
		purged++
	}
	b.maybeCompactOrder()
	return purged
}

// expired reports whether a write at writtenMs is at least ttlMs old at
// nowMs, without overflow for any timestamps.
func expired(writtenMs, nowMs, ttlMs int64) bool {
	return writtenMs <= nowMs && uint64(nowMs)-uint64(writtenMs) >= uint64(ttlMs)
}

func (b *Bucket) compactOrder() {
	b.order = slices.DeleteFunc(b.order, func(seq uint64) bool { _, kept := b.bySeq[seq]; return !kept })
	b.staleInOrder = 0
}

// PurgeDue reports whether a compaction record proposed at nowMs would
// purge something: the leader proposes CompactRecord(nowMs) then.
func (b *Bucket) PurgeDue(nowMs int64) bool {
	for _, history := range b.keys {
		latest := history[len(history)-1]
		if latest.Op == OpDelete && expired(latest.TimestampMs, nowMs, b.cfg.TombstoneTTLms) {
			return true
		}
	}
	return false
}

func conditionHolds(latest *Revision, expected uint64) bool {
	if expected == 0 {
		return latest == nil || latest.Op == OpDelete
	}
	return latest != nil && latest.Seq == expected
}

func (b *Bucket) latest(key string) *Revision {
	history := b.keys[key]
	if len(history) == 0 {
		return nil
	}
	return &history[len(history)-1]
}

func (b *Bucket) latestSeq(key string) uint64 {
	if latest := b.latest(key); latest != nil {
		return latest.Seq
	}
	return 0
}

// Get returns the key's current value: its latest revision, if that is
// not a tombstone.
func (b *Bucket) Get(key string) (Revision, bool) {
	latest := b.latest(key)
	if latest == nil || latest.Op == OpDelete {
		return Revision{}, false
	}
	return *latest, true
}

// GetRevision returns the key's revision at seq (a value or a tombstone),
// if the bucket keeps it.
func (b *Bucket) GetRevision(key string, seq uint64) (Revision, error) {
	for _, rev := range b.keys[key] {
		if rev.Seq == seq {
			return rev, nil
		}
	}
	if seq < b.floor {
		return Revision{}, fmt.Errorf("%w: %q at %d is below the floor %d", ErrRevisionNotKept, key, seq, b.floor)
	}
	return Revision{}, fmt.Errorf("%w: %q at %d", ErrRevisionNotKept, key, seq)
}

// History returns the key's kept revisions, oldest first, tombstones
// included.
func (b *Bucket) History(key string) []Revision { return slices.Clone(b.keys[key]) }

// Keys returns the live keys (latest revision not a tombstone) that start
// with prefix, sorted.
func (b *Bucket) Keys(prefix string) []string {
	keys, _ := b.KeysAfter(prefix, "", -1)
	return keys
}

// KeysAfter returns at most limit (< 0: all) of the live keys that start
// with prefix and sort after after, in order, and whether more follow: a
// page costs what it returns, not the bucket.
func (b *Bucket) KeysAfter(prefix, after string, limit int) (keys []string, more bool) {
	live := b.liveKeys()
	i := sort.SearchStrings(live, prefix)
	if after != "" {
		i = max(i, sort.Search(len(live), func(j int) bool { return live[j] > after }))
	}
	j := i
	for j < len(live) && strings.HasPrefix(live[j], prefix) && (limit < 0 || j-i <= limit) {
		j++
	}
	if limit >= 0 && j-i > limit {
		return slices.Clone(live[i : i+limit]), true
	}
	return slices.Clone(live[i:j]), false
}

// liveKeys is the sorted live keys, rebuilt only after the key set
// changed.
func (b *Bucket) liveKeys() []string {
	if !b.liveValid {
		b.live = b.live[:0]
		for key, history := range b.keys {
			if history[len(history)-1].Op != OpDelete {
				b.live = append(b.live, key)
			}
		}
		sort.Strings(b.live)
		b.liveValid = true
	}
	return b.live
}

// LiveKeys is the number of live keys.
func (b *Bucket) LiveKeys() int { return len(b.liveKeys()) }
