package acklog

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// Config configures a group's ack log; the shell builds it once.
type Config struct {
	// RecordOverheadBytes approximates the storage framing of one record,
	// counted with its value toward CompactBytes.
	RecordOverheadBytes int64
	// RecordBytesMax is the largest record value the log takes: a larger
	// checkpoint is not proposed (the group keeps its ack records and
	// tries again once they grew by another CompactBytes).
	RecordBytesMax int
	// EncodeCheckpoint lays a checkpoint out as a record value.
	EncodeCheckpoint func(Checkpoint) []byte
	// Mutations break guards on purpose (tests only).
	Mutations Mutations
}

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a test must fail with it on.
type Mutations struct {
	// AckBeforeCommit answers acks when their record is proposed, not when
	// it commits (and a re-ack does not wait for the record in flight).
	AckBeforeCommit bool
	// ReAckWaitsForAnyRecord: a re-ack of a seq whose record is in flight
	// needs no record of its own; its reply waits for whichever record is
	// last in flight (or none).
	ReAckWaitsForAnyRecord bool
	// CheckpointDropsCounts writes checkpoints without the cursors'
	// delivery counts.
	CheckpointDropsCounts bool
}

// Proposal is a record the shell proposes to the partition's log, in the
// order returned. It reports how it ended with a Completion of its ID.
type Proposal struct {
	ID    uint64
	Kind  Kind
	Value []byte
}

// Completion reports a proposal's end: Err nil when it committed, else why
// it did not (quorum lost, leadership moved, superseded).
type Completion struct {
	ID  uint64
	Err error
}

// Outcome is how a group of replies is answered.
type Outcome uint8

const (
	// Durable: the records the replies waited for committed (ACK_OK).
	Durable Outcome = iota
	// NotCommitted: their record failed; Answer.Err says why.
	NotCommitted
	// QuorumLost: the leader lost its quorum; the record stays in
	// flight and may still commit, its acks are not durable for now.
	QuorumLost
	// Superseded: the record belongs to an earlier generation (the group
	// retired since it was proposed).
	Superseded
)

func (o Outcome) String() string {
	switch o {
	case Durable:
		return "Durable"
	case NotCommitted:
		return "NotCommitted"
	case QuorumLost:
		return "QuorumLost"
	case Superseded:
		return "Superseded"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Answer is a group of replies to answer with one outcome.
type Answer[R any] struct {
	Replies []R
	Outcome Outcome
	Err     error // NotCommitted: the completion's error
}

// DeadRetry is a dead letter whose count record did not commit: the shell
// records it again after a backoff.
type DeadRetry struct {
	Key Key
	Err error
}

// Effects are the decisions of one Flush. The shell carries them out in
// this order: answer, propose (in order), then act on the dead letters.
type Effects[R any] struct {
	Answers []Answer[R]
	Propose []Proposal
	// DeadReady are dead letters whose count record committed: their
	// publish may start (a message is known dead durably before its copy
	// leaves).
	DeadReady []Key
	DeadRetry []DeadRetry
	// FloorsDurable: completions arrived and no ack is undurable; the
	// shell may publish the cursors' floors.
	FloorsDurable bool
	// CheckpointTooLargeBytes: a checkpoint of this size was not proposed
	// (over RecordBytesMax); 0 when none.
	CheckpointTooLargeBytes int
}

// Input is what happened since the last Flush.
type Input[R any] struct {
	// Done are the proposals that completed, in any order.
	Done []Completion
	// Degraded: the partition's leader (this node) is READ_ONLY_DEGRADED.
	Degraded bool
	// Acks is the value of an ack record to propose (empty: none); Counts
	// that of a count record, carrying the dead letters Dead. The log
	// keeps them: the shell must not modify them afterwards.
	Acks, Counts []byte
	Dead         []Key
	// Replies are those of the ACKs and NACKs handled since the last Flush
	// (not retained: the shell may reuse the slice).
	Replies []R
	// CompactBytes is the checkpoint threshold (≤ 0: no checkpoints);
	// Cursors are the group's cursors, captured by a checkpoint.
	CompactBytes int64
	Cursors      []*delivery.Cursor
	// Fence is the highest fence the shell recorded or is recording: a
	// checkpoint carries it, so compacting the fence records before the
	// checkpoint loses none.
	Fence uint64
	// Quiet: the group batched nothing for this log a while. A checkpoint
	// is then due below the threshold too: the log is compacted no
	// further than the group's latest checkpoint, and a group that went
	// idle would otherwise pin its last records forever.
	Quiet bool
	// Pinned: retention would compact the partition's log past the
	// group's latest checkpoint, or too much log follows it for a new
	// leader to read. A checkpoint at the tail is then due even with no
	// record since, so that a group that acks nothing pins nothing
	// retention would delete, and a rebuild of it reads a bounded log.
	Pinned bool
}

// Log is the ack-log kernel of one group on the leader of its partition.
//
// Invariants: a reply is answered Durable only after every record it waits
// for committed (its own, or the one in flight when it needed none); an ack
// whose record did not commit stays undurable — a repeated ack of it needs
// a record again — until a later record of it commits; at most one
// checkpoint is in flight, and one is proposed only when the cursors hold
// exactly the acks of the records before it in the log, committed or in
// flight (nothing batched — the Flush proposes its batch first — nor
// undurable). A log commits a prefix: the checkpoint commits only if they
// all did. (Only a record refused before it was appended, ErrBusy, breaks
// the prefix: its acks may then be durable through the checkpoint though
// its replies failed — an ack retried after a failure finds them done.)
// Requiring nothing in flight instead starves checkpoints under a steady
// stream of acks, and a partition is compacted no further than its
// groups' latest checkpoints.
type Log[R any] struct {
	cfg      Config
	gen      uint64         // bumped by Retire: older proposals answer Superseded
	nextID   uint64         // proposal ids
	inflight []*proposal[R] // proposed, not completed, oldest first
	// undurable holds acks applied to the cursors whose record did not
	// commit.
	undurable map[Key]bool
	// recordBytes: size of the ack and count records since the latest
	// checkpoint; retryBytes defers a checkpoint that was too large.
	recordBytes, retryBytes int64
}

type proposal[R any] struct {
	id, gen uint64
	kind    Kind
	acks    []byte // an ack record's value
	dead    []Key  // a count record's dead letters
	// recordBytesBefore: a checkpoint's recordBytes when proposed (what
	// it covers).
	recordBytesBefore int64
	replies           []R
}

// New returns the log of a group rebuilt from the committed log, whose
// records after its latest checkpoint add up to recordBytes
// (Rebuild.RecordBytes).
func New[R any](cfg Config, recordBytes int64) *Log[R] {
	if cfg.EncodeCheckpoint == nil || cfg.RecordBytesMax <= 0 {
		panic("acklog: Config needs EncodeCheckpoint and a positive RecordBytesMax")
	}
	return &Log[R]{cfg: cfg, recordBytes: recordBytes}
}

// NeedsRecord reports whether an ack must go into the next record: it is
// new to the cursor, an earlier record of it did not commit, or the
// record that holds it is still in flight (ReAckWaitsForItsOwnRecord: that
// record may yet fail — a leader that lost its quorum refuses it at once —
// and a reply attached to another record, or answered once nothing is in
// flight, would confirm an ack nothing holds). Only a re-ack pays for the
// scan, and a retried ack costs one more entry.
func (l *Log[R]) NeedsRecord(isNew bool, k Key) bool {
	return isNew || l.undurable[k] || (!l.cfg.Mutations.ReAckWaitsForAnyRecord && l.inflightHolds(k))
}

// inflightHolds reports whether an ack record in flight holds k.
func (l *Log[R]) inflightHolds(k Key) bool {
	for _, p := range l.inflight {
		held := false
		ForEachAck(p.acks, func(a Key) { held = held || a == k })
		if held {
			return true
		}
	}
	return false
}

// Flush takes in completions, the leader's state and the batched
// records and replies, and decides what to answer and propose.
func (l *Log[R]) Flush(in Input[R]) Effects[R] {
	var eff Effects[R]
	for _, c := range in.Done {
		l.complete(c, &eff)
	}
	eff.FloorsDurable = len(in.Done) > 0 && len(l.undurable) == 0
	if in.Degraded {
		// The records in flight may still commit once the quorum is back;
		// until then their acks are answered now, as not durable.
		for _, p := range l.inflight {
			l.answer(&eff, p.replies, QuorumLost, nil)
			p.replies = nil
			l.markUndurable(p.acks)
		}
	}
	if len(in.Counts) > 0 {
		// Counts need no reply; their dead letters are published once
		// this record commits.
		l.propose(&eff, &proposal[R]{kind: KindCount, dead: in.Dead}, in.Counts)
	}
	if len(in.Acks) == 0 {
		if n := len(l.inflight); n > 0 && !l.cfg.Mutations.AckBeforeCommit {
			// Acks that need no record are durable already (NeedsRecord):
			// still answered with the record last in flight, never before
			// it.
			l.inflight[n-1].replies = append(l.inflight[n-1].replies, in.Replies...)
		} else {
			l.answer(&eff, slices.Clone(in.Replies), Durable, nil) // nothing in flight to wait for
		}
	} else {
		p := &proposal[R]{kind: KindAck, acks: in.Acks, replies: slices.Clone(in.Replies)}
		if l.cfg.Mutations.AckBeforeCommit {
			l.answer(&eff, p.replies, Durable, nil)
			p.replies = nil
		}
		l.propose(&eff, p, in.Acks)
	}
	l.maybeCheckpoint(in, &eff) // after the batch's records: it covers them
	return eff
}

func (l *Log[R]) checkpointInflight() bool {
	return slices.ContainsFunc(l.inflight, func(p *proposal[R]) bool { return p.kind == KindCheckpoint })
}

func (l *Log[R]) propose(eff *Effects[R], p *proposal[R], value []byte) {
	l.nextID++
	p.id, p.gen = l.nextID, l.gen
	if p.kind != KindCheckpoint {
		l.recordBytes += l.cfg.RecordOverheadBytes + int64(len(value))
	}
	l.inflight = append(l.inflight, p)
	eff.Propose = append(eff.Propose, Proposal{ID: p.id, Kind: p.kind, Value: value})
}

func (l *Log[R]) answer(eff *Effects[R], replies []R, o Outcome, err error) {
	if len(replies) > 0 {
		eff.Answers = append(eff.Answers, Answer[R]{Replies: replies, Outcome: o, Err: err})
	}
}

// maybeCheckpoint proposes a checkpoint once the records since the last
// one pass the threshold (or the group went quiet with records since, or
// its latest checkpoint holds back retention),
// after this Flush's records, when no checkpoint is in flight and no ack
// is undurable: the cursors then hold exactly the acks of the records
// before it in the log.
func (l *Log[R]) maybeCheckpoint(in Input[R], eff *Effects[R]) {
	threshold := in.CompactBytes
	due := l.recordBytes >= max(threshold, l.retryBytes) || (in.Quiet && l.recordBytes > 0 || in.Pinned) && l.retryBytes == 0
	if threshold <= 0 || !due || l.checkpointInflight() || len(l.undurable) > 0 || in.Degraded {
		return
	}
	cp := CheckpointOf(in.Cursors)
	cp.Fence = in.Fence
	if l.cfg.Mutations.CheckpointDropsCounts {
		cp.Counts = nil
	}
	value := l.cfg.EncodeCheckpoint(cp)
	if len(value) > l.cfg.RecordBytesMax {
		eff.CheckpointTooLargeBytes = len(value)
		l.retryBytes = l.recordBytes + threshold
		return
	}
	l.propose(eff, &proposal[R]{kind: KindCheckpoint, recordBytesBefore: l.recordBytes}, value)
}

// complete answers a proposal's replies. A record that failed fails its
// acks; they stay applied to the cursors (consumers keep reading the
// visible prefix) and are undurable until a later record of them commits.
// A new leader rebuilds from the log and so redelivers them.
func (l *Log[R]) complete(c Completion, eff *Effects[R]) {
	i := slices.IndexFunc(l.inflight, func(p *proposal[R]) bool { return p.id == c.ID })
	if i < 0 {
		return // not ours (completed already)
	}
	p := l.inflight[i]
	l.inflight = slices.Delete(l.inflight, i, i+1)
	if p.kind == KindCheckpoint && c.Err == nil && p.gen == l.gen {
		// What it covers is behind it now; records proposed while it was
		// in flight count toward the next one.
		l.recordBytes, l.retryBytes = max(l.recordBytes-p.recordBytesBefore, 0), 0
	}
	if p.gen != l.gen {
		l.answer(eff, p.replies, Superseded, nil)
		return
	}
	if p.kind == KindCount {
		for _, k := range p.dead {
			if c.Err != nil {
				eff.DeadRetry = append(eff.DeadRetry, DeadRetry{Key: k, Err: c.Err})
			} else {
				eff.DeadReady = append(eff.DeadReady, k)
			}
		}
	}
	if c.Err != nil {
		l.markUndurable(p.acks)
		l.answer(eff, p.replies, NotCommitted, c.Err)
		return
	}
	ForEachAck(p.acks, func(k Key) { delete(l.undurable, k) })
	l.answer(eff, p.replies, Durable, nil)
}

func (l *Log[R]) markUndurable(acks []byte) {
	ForEachAck(acks, func(k Key) {
		if l.undurable == nil {
			l.undurable = map[Key]bool{}
		}
		l.undurable[k] = true
	})
}

// Retire ends the group's reign (this node no longer coordinates): every
// proposal in flight completes Superseded from now on, and the replies
// waiting for them are returned for the shell to answer now.
func (l *Log[R]) Retire() []R {
	l.gen++
	var replies []R
	for _, p := range l.inflight {
		replies = append(replies, p.replies...)
		p.replies = nil
	}
	return replies
}

// Undurable is the number of acks whose record did not commit.
func (l *Log[R]) Undurable() int { return len(l.undurable) }

// Inflight is the number of proposals not completed yet.
func (l *Log[R]) Inflight() int { return len(l.inflight) }

// Clone returns an independent copy of the log (the model checker
// explores from copies); replies are copied as values.
func (l *Log[R]) Clone() *Log[R] {
	d := *l
	d.inflight = make([]*proposal[R], len(l.inflight))
	for i, p := range l.inflight {
		q := *p
		q.replies = slices.Clone(p.replies)
		d.inflight[i] = &q
	}
	d.undurable = maps.Clone(l.undurable)
	return &d
}

// AppendDigest appends a canonical encoding of the log's state to b,
// each reply encoded by reply: equal logs encode equally (the model
// checker hashes states with it).
func (l *Log[R]) AppendDigest(b []byte, reply func([]byte, R) []byte) []byte {
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	u(l.gen)
	u(l.nextID)
	u(uint64(l.recordBytes))
	u(uint64(l.retryBytes))
	u(uint64(len(l.inflight)))
	for _, p := range l.inflight {
		u(p.id)
		u(p.gen)
		u(uint64(p.kind))
		u(uint64(len(p.acks)))
		b = append(b, p.acks...)
		u(uint64(len(p.dead)))
		for _, k := range p.dead {
			u(uint64(k.Partition))
			u(k.Seq)
		}
		u(uint64(p.recordBytesBefore))
		u(uint64(len(p.replies)))
		for _, r := range p.replies {
			b = reply(b, r)
		}
	}
	keys := slices.SortedFunc(maps.Keys(l.undurable), func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	u(uint64(len(keys)))
	for _, k := range keys {
		u(uint64(k.Partition))
		u(k.Seq)
	}
	return b
}
