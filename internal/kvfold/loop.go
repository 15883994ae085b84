// Package kvfold is the SDK's applied loop as a pure kernel: it folds a KV
// bucket's watch stream into a user's store with cursor authority — the
// store's contents and its cursor advance together, in one atomic apply —
// and repairs an expired cursor by resyncing from a listing (DESIGN §2 "KV
// bucket", §4 "Cursor authority").
//
// The loop is single-threaded and does no I/O: the shell hands it events
// (Step) and carries out the effects it returns, in order.
package kvfold

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Config configures a loop; zero fields take their defaults.
type Config struct {
	// StoreFailuresMax consecutive failed store operations stop the loop
	// (default 16): a store that keeps failing would otherwise grow the
	// re-queued backlog without bound.
	StoreFailuresMax int
	// BatchOpsMax pending ops trigger an apply without waiting for Flush
	// (default 256).
	BatchOpsMax int
	// PendingOpsMax bounds the ops held while the store is busy or
	// failing (default 4096): at the bound the loop stops taking the
	// watch's records and resumes it once an apply took them (the server
	// sends them again).
	PendingOpsMax int
	// Mutations break guards on purpose (tests and the model checker only).
	Mutations Mutations
}

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a unit test and a model must fail with it on.
type Mutations struct {
	// DropFailedBatch: a failed apply's batch is dropped instead of
	// re-queued, so the next apply moves the cursor over a hole.
	DropFailedBatch bool
	// ResumeFromMemApplied: a restart resumes from the revision the loop
	// had reached in memory (a cursor cached outside the store) instead of
	// the store's persisted cursor, which may lag it after failed applies.
	ResumeFromMemApplied bool
	// NoAckBarrier: a resync applies the re-listed puts and the resumed
	// watch's records at once and the synthetic deletes whenever the
	// store's keys are read, after them.
	NoAckBarrier bool
	// UnguardedLiveWatch: a delivery that jumps the cursor is folded
	// without checking the floor (the periodic probe still runs).
	UnguardedLiveWatch bool
}

const (
	defaultStoreFailuresMax = 16
	defaultBatchOpsMax      = 256
	defaultPendingOpsMax    = 4096
)

// ErrStoreFailing: StoreFailuresMax consecutive store operations failed.
var ErrStoreFailing = errors.New("kvfold: the store keeps failing")

// ErrListing: a resync's listing failed. It is fatal: folding on without
// the listing would keep keys the bucket deleted, with nothing to say so.
var ErrListing = errors.New("kvfold: resync listing failed")

// Phase is where the loop is.
type Phase uint8

const (
	// Idle: no Restart yet.
	Idle Phase = iota
	// Watching: folding a watch's deliveries.
	Watching
	// Resyncing: the cursor expired; waiting for the bucket's listing.
	Resyncing
	// Barrier: the listing arrived and the watch resumed after it;
	// nothing is applied until the store's keys are read and the
	// synthetic deletes are queued ahead of every re-listed put.
	Barrier
	// Failed: stopped with an error until a Restart.
	Failed
)

func (p Phase) String() string {
	switch p {
	case Idle:
		return "Idle"
	case Watching:
		return "Watching"
	case Resyncing:
		return "Resyncing"
	case Barrier:
		return "Barrier"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// Loop is the applied loop of one bucket. It is not safe for concurrent
// use; Clone and AppendKey serve the model checker.
type Loop struct {
	cfg   Config
	phase Phase
	err   error
	// frontier is the highest revision taken into the stream: pending, in
	// flight or applied. Deliveries continue from frontier+1.
	frontier Revision
	// persisted is the store's cursor as last reported (Restart) or
	// acknowledged (Applied).
	persisted Revision
	// pending are ops not yet sent to the store, in stream order; with
	// what is in flight and applied they reach frontier.
	pending     []Op
	inflight    *Apply
	failures    int    // consecutive failed store operations
	watch       uint64 // the current watch's id (0: none)
	paused      bool   // pending reached PendingOpsMax: the watch was dropped, to resume after frontier
	listRequest uint64
	keysRequest uint64
	listing     *Listing // held from its arrival until the store's keys are read
	lastID      uint64   // ids of watches, requests and batches; never reused
	out         []Effect
}

// New returns an Idle loop; its first event must be a Restart.
func New(cfg Config) *Loop {
	if cfg.StoreFailuresMax <= 0 {
		cfg.StoreFailuresMax = defaultStoreFailuresMax
	}
	if cfg.BatchOpsMax <= 0 {
		cfg.BatchOpsMax = defaultBatchOpsMax
	}
	if cfg.PendingOpsMax <= 0 {
		cfg.PendingOpsMax = defaultPendingOpsMax
	}
	return &Loop{cfg: cfg}
}

// Phase reports where the loop is.
func (l *Loop) Phase() Phase { return l.phase }

// Err is why the loop failed (nil unless Failed).
func (l *Loop) Err() error { return l.err }

// Frontier is the highest revision taken into the stream.
func (l *Loop) Frontier() Revision { return l.frontier }

// Persisted is the store's cursor as the loop last heard of it.
func (l *Loop) Persisted() Revision { return l.persisted }

// Watch is the current watch's id (0: none).
func (l *Loop) Watch() uint64 { return l.watch }

// Paused reports whether the loop stopped taking the watch's records at
// PendingOpsMax.
func (l *Loop) Paused() bool { return l.paused }

// PendingOps is the number of ops waiting for an apply.
func (l *Loop) PendingOps() int { return len(l.pending) }

// Step handles one event in any phase and returns the effects to carry
// out, in order. The returned slice is the caller's.
func (l *Loop) Step(ev Event) []Effect {
	l.out = nil
	if r, ok := ev.(Restart); ok {
		l.restart(r)
		return l.out
	}
	if l.phase == Idle || l.phase == Failed {
		return nil
	}
	switch ev := ev.(type) {
	case Delivery:
		l.deliver(ev)
	case CursorExpired:
		if ev.Watch == l.watch && l.watch != 0 {
			l.resync()
		}
	case Listing:
		l.listed(ev)
	case StoreKeys:
		l.storeKeys(ev)
	case Applied:
		l.applied(ev)
	case Probe:
		// An idle watch gets no delivery to check in band: the probe is
		// its only evidence that the floor passed its cursor. (A probe
		// racing a resume only resumes once more.)
		if (l.phase == Watching || l.phase == Barrier) && ev.Floor > l.frontier+1 {
			l.resume()
		}
	case Flush:
		l.flush()
	}
	if l.paused && len(l.pending) < l.cfg.PendingOpsMax && (l.phase == Watching || l.phase == Barrier) {
		l.resume()
	}
	return l.out
}

func (l *Loop) newID() uint64 {
	l.lastID++
	return l.lastID
}

// restart forgets everything but the id counter (so no answer to the
// previous incarnation is taken for one to this) and resumes from the
// store's persisted cursor: what was pending or in flight is gone, and
// only the store says how far its contents reach.
func (l *Loop) restart(r Restart) {
	mem := l.frontier
	*l = Loop{cfg: l.cfg, lastID: l.lastID, phase: Watching, persisted: r.Persisted, frontier: r.Persisted}
	if l.cfg.Mutations.ResumeFromMemApplied && mem > r.Persisted {
		l.frontier = mem
	}
	l.resume()
}

// resume restarts the watch after the frontier. When the floor has passed
// it, the server answers CURSOR_EXPIRED and the loop resyncs.
func (l *Loop) resume() {
	l.paused = false
	l.watch = l.newID()
	l.out = append(l.out, Watch{ID: l.watch, From: l.frontier + 1})
}

func (l *Loop) deliver(d Delivery) {
	if d.Watch != l.watch || l.watch == 0 || d.Revision <= l.frontier {
		return // an earlier watch's, or a duplicate
	}
	if len(l.pending) >= l.cfg.PendingOpsMax {
		l.watch, l.paused = 0, true // not taken: the resumed watch sends it again
		return
	}
	// The floor guard: a jump over frontier+1 is benign only if the
	// bucket still keeps frontier+1 (the revisions skipped were compacted
	// overwrites, or other keys' under a prefix watch). If the floor
	// passed it, records — delete markers too — were evicted unseen:
	// folding on would diverge silently and for good. An unreported
	// floor proves nothing, so it trips too.
	if d.Revision > l.frontier+1 && !l.cfg.Mutations.UnguardedLiveWatch {
		if d.Floor == 0 || d.Floor > l.frontier+1 {
			l.resume()
			return
		}
	}
	l.pending = append(l.pending, Op{Key: d.Key, Value: d.Value, Delete: d.Delete})
	l.frontier = d.Revision
	if len(l.pending) >= l.cfg.BatchOpsMax {
		l.flush()
	}
}

// resync drops what the expired watch queued (the listing supersedes it)
// and lists the bucket.
func (l *Loop) resync() {
	l.pending, l.watch, l.paused = nil, 0, false
	l.listing, l.keysRequest = nil, 0
	l.phase = Resyncing
	l.listRequest = l.newID()
	l.out = append(l.out, List{Request: l.listRequest})
}

func (l *Loop) listed(ev Listing) {
	if l.phase != Resyncing || ev.Request != l.listRequest {
		return
	}
	l.listRequest = 0
	if ev.Err != nil {
		l.fail(fmt.Errorf("%w: %w", ErrListing, ev.Err))
		return
	}
	l.frontier = ev.Revision
	l.watch = l.newID()
	l.out = append(l.out, Watch{ID: l.watch, From: ev.Revision + 1})
	l.listing = &ev
	if l.cfg.Mutations.NoAckBarrier {
		l.phase = Watching
		l.pending = puts(ev.Entries)
		l.readKeys()
		return
	}
	l.phase = Barrier
	if l.inflight == nil {
		l.readKeys()
	}
}

// readKeys asks for the store's keys. Guarded, nothing is in flight and
// nothing is applied until they are answered, so they are the keys the
// resync's deletes will meet.
func (l *Loop) readKeys() {
	l.keysRequest = l.newID()
	l.out = append(l.out, ReadKeys{Request: l.keysRequest})
}

func (l *Loop) storeKeys(ev StoreKeys) {
	if ev.Request != l.keysRequest || l.keysRequest == 0 || l.listing == nil {
		return
	}
	l.keysRequest = 0
	if ev.Err != nil {
		if l.storeFailed() {
			l.readKeys()
		}
		return
	}
	l.failures = 0
	listed := make(map[string]bool, len(l.listing.Entries))
	for _, e := range l.listing.Entries {
		listed[e.Key] = true
	}
	var deletes []Op
	for _, k := range ev.Keys {
		if !listed[k] {
			deletes = append(deletes, Op{Key: k, Delete: true})
		}
	}
	if l.cfg.Mutations.NoAckBarrier {
		l.pending = append(l.pending, deletes...)
		l.listing = nil
		return
	}
	// The ack barrier: the synthetic deletes go strictly before the first
	// re-listed put, and both before anything the resumed watch queued. A
	// key deleted before the listing and recreated after it is then
	// deleted first and put back by the watch, never the other way round.
	// Queued at the head of the stream, the order survives failed applies
	// (they re-queue in stream order).
	l.pending = slices.Concat(deletes, puts(l.listing.Entries), l.pending)
	l.listing = nil
	l.phase = Watching
	l.flush()
}

func puts(entries []Entry) []Op {
	ops := make([]Op, len(entries))
	for i, e := range entries {
		ops[i] = Op{Key: e.Key, Value: e.Value}
	}
	return ops
}

func (l *Loop) applied(ev Applied) {
	if l.inflight == nil || ev.Batch != l.inflight.ID {
		return
	}
	b := l.inflight
	l.inflight = nil
	if ev.Err == nil {
		l.failures = 0
		l.persisted = b.Cursor
	} else if l.storeFailed() {
		switch {
		case l.phase == Resyncing || l.phase == Barrier:
			// Superseded: the resync's batch brings the store to the
			// listing whatever it holds.
		case l.cfg.Mutations.DropFailedBatch:
		default:
			// Cursor authority: the batch goes back, ahead of what came
			// after it, so the next apply commits cumulatively and the
			// cursor never passes an op that is not in the store.
			l.pending = slices.Concat(b.Ops, l.pending)
		}
	} else {
		return
	}
	if l.phase == Barrier && l.keysRequest == 0 {
		l.readKeys()
	}
}

// storeFailed counts a failed store operation and stops the loop at
// StoreFailuresMax in a row; it reports whether the loop goes on.
func (l *Loop) storeFailed() bool {
	l.failures++
	if l.failures >= l.cfg.StoreFailuresMax {
		l.fail(fmt.Errorf("%w: %d consecutive failures", ErrStoreFailing, l.failures))
		return false
	}
	return true
}

// flush sends what is pending as one batch reaching the frontier. Never
// during a resync before its deletes are queued (the barrier), and one
// batch at a time: a later batch must not commit before an earlier one.
// A batch with no ops still moves the store's cursor (a resync that found
// nothing to change), else every restart would resync again.
func (l *Loop) flush() {
	if l.phase != Watching || l.inflight != nil || (len(l.pending) == 0 && l.frontier <= l.persisted) {
		return
	}
	l.inflight = &Apply{ID: l.newID(), Ops: l.pending, Cursor: l.frontier}
	l.pending = nil
	l.out = append(l.out, *l.inflight)
}

func (l *Loop) fail(err error) {
	l.phase, l.err = Failed, err
	l.watch, l.pending, l.inflight, l.listing = 0, nil, nil, nil
	l.out = append(l.out, Fail{Err: err})
}

// Clone returns an independent copy (ops' values are shared: they are
// never modified).
func (l *Loop) Clone() *Loop {
	c := *l
	c.pending = slices.Clone(l.pending)
	if l.inflight != nil {
		b := *l.inflight
		c.inflight = &b
	}
	c.out = nil
	return &c
}

// AppendKey appends an encoding of the loop's state (for hashing).
func (l *Loop) AppendKey(b []byte) []byte {
	b = append(b, byte(l.phase), boolByte(l.paused))
	for _, x := range []uint64{uint64(l.frontier), uint64(l.persisted), uint64(l.failures), l.watch, l.listRequest, l.keysRequest, l.lastID} {
		b = binary.AppendUvarint(b, x)
	}
	b = appendOps(append(b, 'p'), l.pending)
	if l.inflight != nil {
		b = binary.AppendUvarint(append(b, 'i'), l.inflight.ID)
		b = appendOps(binary.AppendUvarint(b, uint64(l.inflight.Cursor)), l.inflight.Ops)
	}
	if l.listing != nil {
		b = binary.AppendUvarint(append(b, 'l'), uint64(l.listing.Revision))
		b = appendOps(b, puts(l.listing.Entries))
	}
	if l.err != nil {
		b = append(append(b, 'e'), l.err.Error()...)
	}
	return b
}

func appendOps(b []byte, ops []Op) []byte {
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, op := range ops {
		if op.Delete {
			b = append(b, 'd')
		}
		b = append(append(b, op.Key...), 0)
		b = append(append(b, op.Value...), 0)
	}
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
