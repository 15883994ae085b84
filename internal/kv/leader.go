package kv

import (
	"errors"
	"fmt"
	"slices"
)

// Errors of a write at the leader.
var (
	// ErrRevisionMismatch: a CAS whose expected revision is not the key's
	// latest (REVISION_MISMATCH); the *MismatchError carries the current.
	ErrRevisionMismatch = errors.New("kv: REVISION_MISMATCH")
	// ErrLeadershipLost: the leader lost its office before the write
	// committed. A write that was proposed may still commit under the
	// next leader (its condition is checked again when applied); a parked
	// one was never written. Either way the client reads and retries.
	ErrLeadershipLost = errors.New("kv: leadership lost before commit")
	// ErrNotCommitted: the write's record failed (the shell's error is
	// wrapped with it).
	ErrNotCommitted = errors.New("kv: write not committed")
	// ErrBusy: too many writes in flight or parked.
	ErrBusy = errors.New("kv: too many writes in flight")
	// ErrBadWrite: a write that is not a put or a delete.
	ErrBadWrite = errors.New("kv: not a put or delete")
	// ErrLeaderNotReady: the leader has not applied its reign's first
	// entry yet, so its committed state may miss writes that committed
	// under the previous leader (and were acknowledged to clients).
	ErrLeaderNotReady = errors.New("kv: leader has not applied its reign's start")
	// ErrLeaseLapsed: a CAS that the committed state refuses, asked while
	// the leader does not hold its lease. The refusal would be a read of
	// that state, and without the lease another replica may have taken
	// office and committed writes this one has not applied.
	ErrLeaseLapsed = errors.New("kv: the leader's lease lapsed")
)

// MismatchError is a refused CAS: Current is the key's latest revision
// (0: absent) in the committed state the refusal was decided against.
type MismatchError struct {
	Key               string
	Expected, Current uint64
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v: %q expected revision %d, current %d", ErrRevisionMismatch, e.Key, e.Expected, e.Current)
}

func (e *MismatchError) Unwrap() error { return ErrRevisionMismatch }

// Request is a client's write: ID is the shell's (unique among the
// requests not answered yet); Write's Op is OpPut or OpDelete.
type Request struct {
	ID    uint64
	Write Write
}

// Proposal is a record to append to the bucket's log, in the order
// returned; the shell reports its end with Leader.Applied or Leader.Failed.
type Proposal struct {
	ID     uint64
	Record Record
}

// Reply answers a request: Revision when Err is nil.
type Reply struct {
	ID       uint64
	Revision uint64
	Err      error
}

// LeaderEffects are a Leader call's decisions. The shell appends Propose
// in order (log order must be proposal order: the overlay assumes it),
// then sends Replies.
type LeaderEffects struct {
	Propose []Proposal
	Replies []Reply
}

// Leader decides, at the bucket's leader, which writes to propose. It
// keeps an overlay: the writes proposed and not yet applied, in log
// order. A CAS is checked against the committed Bucket plus the overlay:
//
//   - no write in flight on its key: decided against the committed
//     state — proposed, or refused with REVISION_MISMATCH at once;
//   - a write in flight on its key whose effect makes the condition hold
//     (a create after a delete): proposed behind it;
//   - otherwise parked behind the key's last write in flight and decided
//     again when that write is applied or fails. A refusal is thus only
//     ever decided against committed state, never against a value that
//     may not commit.
//
// A refusal reads that state, so it is decided only while the leader
// holds its lease (SetLease), as the shell serves reads: otherwise it
// answers ErrLeaseLapsed and nothing is written (RefusalUnderLease).
//
// Success is decided at apply: Bucket.Apply checks the condition again
// against the committed state on every replica, so a CAS proposed behind
// a write that is later truncated or refused before its append is applied
// as a refusal. On leadership loss the overlay is discarded and every
// write in flight or parked answers ErrLeadershipLost.
//
// Not safe for concurrent use; the shell owns it with the Bucket.
type Leader struct {
	cfg Config
	// reignStartSeq is the seq of this reign's first entry (its install
	// entry): once the bucket applied it, every write acknowledged by an
	// earlier leader is in the committed state.
	reignStartSeq uint64
	inflight      []inflightWrite // proposed, not applied or failed, log order
	parked        []parkedWrite   // arrival order
	lease         bool            // SetLease's
}

type inflightWrite struct {
	id       uint64
	key      string
	op       Op
	expected uint64 // a CAS's, for its MismatchError
}

type parkedWrite struct {
	req    Request
	behind uint64 // the id of the write in flight it waits for
}

// NewLeader returns the leader kernel of a bucket this node now leads,
// from reignStartSeq (the seq of its epoch's install entry) on.
func NewLeader(cfg Config, reignStartSeq uint64) (*Leader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Leader{cfg: cfg, reignStartSeq: reignStartSeq}, nil
}

// SetLease tells the kernel whether this node holds its lease (the
// shell's reading of the clock, as it takes for reads); a new Leader holds
// none until told.
func (l *Leader) SetLease(held bool) { l.lease = held }

// Inflight and Parked count the writes proposed and waiting.
func (l *Leader) Inflight() int { return len(l.inflight) }
func (l *Leader) Parked() int   { return len(l.parked) }

// Submit takes a client's write, stamped with the leader's nowMs.
func (l *Leader) Submit(b *Bucket, req Request, nowMs int64) LeaderEffects {
	var eff LeaderEffects
	if err := l.check(req.Write); err != nil {
		eff.Replies = append(eff.Replies, Reply{ID: req.ID, Err: err})
		return eff
	}
	// A refusal against committed state is linearizable only if that
	// state holds every write an earlier reign acknowledged.
	if b.Applied() < l.reignStartSeq && !l.cfg.Mutations.SubmitBeforeReignStart {
		eff.Replies = append(eff.Replies, Reply{ID: req.ID, Err: fmt.Errorf("%w: applied %d, reign starts at %d", ErrLeaderNotReady, b.Applied(), l.reignStartSeq)})
		return eff
	}
	if len(l.inflight) >= l.cfg.InflightWritesMax {
		eff.Replies = append(eff.Replies, Reply{ID: req.ID, Err: fmt.Errorf("%w: %d", ErrBusy, len(l.inflight))})
		return eff
	}
	req.Write.TimestampMs = nowMs
	l.decide(b, req, &eff, true)
	return eff
}

func (l *Leader) check(w Write) error {
	if w.Op != OpPut && w.Op != OpDelete {
		return fmt.Errorf("%w: %v", ErrBadWrite, w.Op)
	}
	if err := checkKey(w.Key, l.cfg.KeyBytesMax); err != nil {
		return err
	}
	if w.Op == OpDelete && len(w.Value) > 0 {
		return fmt.Errorf("%w: a delete with a value", ErrBadWrite)
	}
	if len(w.Value) > l.cfg.ValueBytesMax {
		return fmt.Errorf("%w: %d bytes, max %d", ErrValueTooLarge, len(w.Value), l.cfg.ValueBytesMax)
	}
	return nil
}

// decide proposes, refuses or parks req. bounded: a new request (a parked
// one decided again may exceed InflightWritesMax by at most
// ParkedWritesMax, and is never refused for it).
func (l *Leader) decide(b *Bucket, req Request, eff *LeaderEffects, bounded bool) {
	w, key := req.Write, string(req.Write.Key)
	if w.Conditional {
		pending := l.lastInflight(key)
		// The overlay: a CAS sees the writes in flight before it, so two
		// CASes of one expected revision cannot both be proposed.
		if l.cfg.Mutations.CASAgainstCommittedOnly {
			pending = nil
		}
		switch {
		case pending == nil && !conditionHolds(b.latest(key), w.Expected) && !l.lease && !l.cfg.Mutations.RefuseWithoutLease:
			eff.Replies = append(eff.Replies, Reply{ID: req.ID, Err: fmt.Errorf("%w: a refusal of a CAS would read the committed state", ErrLeaseLapsed)})
			return
		case pending == nil && !conditionHolds(b.latest(key), w.Expected):
			eff.Replies = append(eff.Replies, Reply{ID: req.ID,
				Err: &MismatchError{Key: key, Expected: w.Expected, Current: b.latestSeq(key)}})
			return
		case pending != nil && !(w.Expected == 0 && pending.op == OpDelete):
			// The condition fails against a write that may not commit:
			// wait for it rather than refuse against it.
			if bounded && len(l.parked) >= l.cfg.ParkedWritesMax {
				eff.Replies = append(eff.Replies, Reply{ID: req.ID, Err: fmt.Errorf("%w: %d parked", ErrBusy, len(l.parked))})
				return
			}
			l.parked = append(l.parked, parkedWrite{req: req, behind: pending.id})
			return
		}
	}
	l.inflight = append(l.inflight, inflightWrite{id: req.ID, key: key, op: w.Op, expected: w.Expected})
	eff.Propose = append(eff.Propose, Proposal{ID: req.ID, Record: EncodeRecord(w)})
}

func (l *Leader) lastInflight(key string) *inflightWrite {
	for i := len(l.inflight) - 1; i >= 0; i-- {
		if l.inflight[i].key == key {
			return &l.inflight[i]
		}
	}
	return nil
}

// Applied reports that proposal id committed at seq and was applied to b
// with result res (Bucket.Apply's). It answers the write and decides
// again the writes parked behind it.
func (l *Leader) Applied(b *Bucket, id, seq uint64, res ApplyResult) LeaderEffects {
	var eff LeaderEffects
	w, ok := l.remove(id)
	if !ok {
		return eff // not ours: proposed before a leadership loss
	}
	switch res.Outcome {
	case Written:
		eff.Replies = append(eff.Replies, Reply{ID: id, Revision: seq})
	case Refused:
		eff.Replies = append(eff.Replies, Reply{ID: id, Err: &MismatchError{Key: w.key, Expected: w.expected, Current: res.Current}})
	default:
		eff.Replies = append(eff.Replies, Reply{ID: id, Err: fmt.Errorf("%w: applied as %v", ErrNotCommitted, res.Outcome)})
	}
	l.unpark(b, id, &eff)
	return eff
}

// Failed reports that proposal id did not commit (refused before its
// append, say). Writes proposed after it stay in flight: if they commit,
// Apply checks their conditions against what did commit.
func (l *Leader) Failed(b *Bucket, id uint64, err error) LeaderEffects {
	var eff LeaderEffects
	if _, ok := l.remove(id); !ok {
		return eff
	}
	eff.Replies = append(eff.Replies, Reply{ID: id, Err: fmt.Errorf("%w: %w", ErrNotCommitted, err)})
	l.unpark(b, id, &eff)
	return eff
}

// LeadershipLost discards the overlay: every write in flight or parked
// answers ErrLeadershipLost, in flight first (log order), then parked.
func (l *Leader) LeadershipLost() LeaderEffects {
	var eff LeaderEffects
	for _, w := range l.inflight {
		eff.Replies = append(eff.Replies, Reply{ID: w.id, Err: ErrLeadershipLost})
	}
	for _, p := range l.parked {
		eff.Replies = append(eff.Replies, Reply{ID: p.req.ID, Err: ErrLeadershipLost})
	}
	l.inflight, l.parked = nil, nil
	return eff
}

func (l *Leader) remove(id uint64) (inflightWrite, bool) {
	i := slices.IndexFunc(l.inflight, func(w inflightWrite) bool { return w.id == id })
	if i < 0 {
		return inflightWrite{}, false
	}
	w := l.inflight[i]
	l.inflight = slices.Delete(l.inflight, i, i+1)
	return w, true
}

// unpark decides again, in arrival order, the writes parked behind id.
func (l *Leader) unpark(b *Bucket, id uint64, eff *LeaderEffects) {
	var ready []Request
	l.parked = slices.DeleteFunc(l.parked, func(p parkedWrite) bool {
		if p.behind == id {
			ready = append(ready, p.req)
			return true
		}
		return false
	})
	for _, req := range ready {
		l.decide(b, req, eff, false)
	}
}
