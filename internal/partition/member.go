package partition

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/acklog"
)

// Member is the kernel of one replica of a replicated partition: what the
// node's shell (internal/node/replicated.go) decides for it, as events in
// and decisions out. It applies committed entries to the dedup table (so a
// new leader knows what its predecessors appended and a producer's retry
// gets its original PUB_OK), keeps the applied position, seals the dedup
// table after the log's start moved, gates publishes on the leader's
// install entry, keeps proposals in flight by producer identity (a retry of
// one in flight waits for it instead of appending twice), answers them
// when they complete or the leader degrades, and computes how far the log
// may be compacted.
//
// R is the shell's reply handle (a callback); the kernel only stores and
// returns it.
//
// Invariants: a publish is proposed only by a leader that is not degraded
// and has applied its own epoch's install entry, and after the dedup table
// was sealed if the log's start moved past what it knows; a producer
// identity has at most one proposal in flight; a reply is answered OK only
// once its entry is applied (so the dedup table answers its retries).
type Member[R any] struct {
	cfg       Config
	mutations Mutations
	producers *Producers
	applied   uint64 // last committed entry applied
	// truncated: the entries before the log's start are gone (retention,
	// or a rebuild from the leader's snapshot point), so the dedup table
	// knows only what came after; sealedEpoch is the epoch it was last
	// sealed for (it is sealed before this member takes publishes).
	truncated   bool
	sealedEpoch uint64
	// groups: the partition's log may hold consumer groups' ack records
	// (partition 0): what they still need bounds compaction.
	groups acklog.Needs
	// groupGone says which group records belong to a deleted group
	// incarnation (GroupsDeleted): they bound no compaction.
	groupGone func(group string) bool
	inflight  map[ProposalKey][]R // the replies waiting on each proposal (none once Degraded answered them)
	// unapplied: idempotent proposals that committed (at the seq named)
	// but were answered NotApplied — this member has not applied them
	// yet. Their retries are refused until then (CommittedNotAppliedRefused):
	// neither in flight nor in the table, a retry would append again.
	unapplied map[ProposalKey]uint64
	anon      uint64 // key space of non-idempotent publishes
	// singles is the block the one-reply slices of inflight are cut
	// from (single).
	singles []R
}

// singlesBlock is how many one-reply slices single cuts from a block.
const singlesBlock = 256

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a test must fail with it on.
type Mutations struct {
	// SkipInstallGate lets a new leader take publishes before its install
	// entry is applied (its dedup table may miss its predecessors' appends).
	SkipInstallGate bool
	// SkipDedupSeal takes publishes after the log's start moved without
	// sealing the dedup table (an old retry passes as new).
	SkipDedupSeal bool
	// CompactForgetsProducers lets the log be compacted past producers'
	// latest mentions (ProducersKeptInLog): a replica that rebuilds its
	// table from the kept log forgets them, and their retries pass as new.
	CompactForgetsProducers bool
	// CarryIgnoresInflight carries producers that have a publish in
	// flight (CarryHoldsWhatItNames).
	CarryIgnoresInflight bool
	// NotAppliedForgetsInflight drops a proposal answered NotApplied from
	// every record (CommittedNotAppliedRefused).
	NotAppliedForgetsInflight bool
	// OutOfOrderMovesMention: an append of a producer_seq below the
	// producer's highest moves its latest mention, so compaction may drop
	// the highest one's entry (HighestSeqKeptInLog).
	OutOfOrderMovesMention bool
	// SealAtLowest seals a rebuilt window at its lowest remembered
	// producer_seq, not its highest (SealHistory).
	SealAtLowest bool
}

// newProducers is the member's table, with its mutations.
func (m *Member[R]) newProducers() *Producers {
	p := NewProducers(m.cfg.DedupWindowMax, m.cfg.ProducersMax)
	p.outOfOrderMoves, p.sealAtLowest = m.mutations.OutOfOrderMovesMention, m.mutations.SealAtLowest
	return p
}

// ProposalKey names a proposal in flight: the producer identity of an
// idempotent publish, or a number of the kernel's (ProducerID 0).
type ProposalKey struct{ ProducerID, ProducerSeq uint64 }

// NewMember returns the kernel of a replica whose log starts at startSeq:
// nothing is applied yet, and the dedup table is sealed before publishes
// when entries before startSeq are gone.
func NewMember[R any](cfg Config, startSeq uint64, m Mutations) *Member[R] {
	if startSeq == 0 {
		panic("partition: seqs are 1-based; startSeq must be ≥ 1")
	}
	mem := &Member[R]{cfg: cfg, mutations: m, applied: startSeq - 1, truncated: startSeq > 1, inflight: map[ProposalKey][]R{}}
	mem.producers = mem.newProducers()
	return mem
}

// View is the replica's replication state when a publish arrives.
type View struct {
	Leader   bool
	ReadOnly bool   // READ_ONLY_DEGRADED
	Epoch    uint64 // the epoch it leads (its promise)
	// InstallSeq is the seq of Epoch's install entry, its first (0: not
	// known yet).
	InstallSeq uint64
}

// Action is what to do with one publish.
type Action uint8

const (
	// Refuse: answer with the Refusal.
	Refuse Action = iota
	// AnswerDuplicate: answer PUB_OK of the original (Seq, Epoch).
	AnswerDuplicate
	// AnswerTooOld: PRODUCER_SEQ_TOO_OLD.
	AnswerTooOld
	// Wait: the same identity is in flight; the reply waits for it.
	Wait
	// Propose: propose the record; report its end with Completed(Key).
	Propose
	// NotARetry: a publish that may only be a retry (PublishRetryOnly)
	// is new; nothing was kept: answer it as its caller says.
	NotARetry
)

func (a Action) String() string {
	switch a {
	case Refuse:
		return "Refuse"
	case AnswerDuplicate:
		return "AnswerDuplicate"
	case AnswerTooOld:
		return "AnswerTooOld"
	case Wait:
		return "Wait"
	case Propose:
		return "Propose"
	case NotARetry:
		return "NotARetry"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Refusal says why a publish was refused.
type Refusal uint8

const (
	RefusedNone Refusal = iota
	// RefusedNotLeader: NOT_LEADER.
	RefusedNotLeader
	// RefusedQuorumLost: the leader is READ_ONLY_DEGRADED.
	RefusedQuorumLost
	// RefusedTakingOffice: a new leader whose install entry is not
	// applied yet (UNAVAILABLE, retry).
	RefusedTakingOffice
	// RefusedNotApplied: the publish's original committed but is not
	// applied here yet (UNAVAILABLE, retry).
	RefusedNotApplied
)

func (r Refusal) String() string {
	switch r {
	case RefusedNone:
		return "None"
	case RefusedNotLeader:
		return "NotLeader"
	case RefusedQuorumLost:
		return "QuorumLost"
	case RefusedTakingOffice:
		return "TakingOffice"
	case RefusedNotApplied:
		return "NotApplied"
	}
	return fmt.Sprintf("Refusal(%d)", uint8(r))
}

// PublishDecision is what the kernel decided for one publish.
type PublishDecision struct {
	Action  Action
	Refusal Refusal // Refuse
	// Seq, Epoch: where the original landed (AnswerDuplicate).
	Seq, Epoch uint64
	Key        ProposalKey // Propose
}

// Admit reports whether this replica may take publishes now; it seals the
// dedup table for the epoch first when the log's start moved.
func (m *Member[R]) Admit(v View) Refusal {
	switch {
	case !v.Leader:
		return RefusedNotLeader
	case v.ReadOnly:
		return RefusedQuorumLost
	case !m.mutations.SkipInstallGate && (v.InstallSeq == 0 || m.applied < v.InstallSeq):
		// Until its install entry is applied, the dedup table may miss
		// what earlier leaders appended.
		return RefusedTakingOffice
	}
	if m.truncated && m.sealedEpoch != v.Epoch && !m.mutations.SkipDedupSeal {
		// Sequences appended before the kept log are unknown here: seal
		// each producer's window at its oldest known sequence, so that a
		// retry of an older one is PRODUCER_SEQ_TOO_OLD, never a duplicate.
		m.producers.SealHistory()
		m.sealedEpoch = v.Epoch
	}
	return RefusedNone
}

// Publish decides one PUB (producerID 0: not idempotent). reply is kept
// when the decision is Wait or Propose and comes back in an Answer.
func (m *Member[R]) Publish(v View, producerID, producerSeq uint64, reply R) PublishDecision {
	return m.publish(v, producerID, producerSeq, reply, false)
}

// PublishRetryOnly decides a publish its caller takes only as a retry (a
// SCHEDULE to a lane closed since: RetryIsItsOriginal): one the dedup
// table or the proposals in flight know is decided as Publish decides
// it; a new one is NotARetry, and nothing is kept.
func (m *Member[R]) PublishRetryOnly(v View, producerID, producerSeq uint64, reply R) PublishDecision {
	return m.publish(v, producerID, producerSeq, reply, true)
}

func (m *Member[R]) publish(v View, producerID, producerSeq uint64, reply R, retryOnly bool) PublishDecision {
	if r := m.Admit(v); r != RefusedNone {
		return PublishDecision{Action: Refuse, Refusal: r}
	}
	key := ProposalKey{ProducerID: producerID, ProducerSeq: producerSeq}
	if producerID != 0 {
		switch verdict, seq, epoch := m.producers.Check(producerID, producerSeq); verdict {
		case VerdictDuplicate:
			return PublishDecision{Action: AnswerDuplicate, Seq: seq, Epoch: epoch}
		case VerdictTooOld:
			return PublishDecision{Action: AnswerTooOld}
		}
		if w, ok := m.inflight[key]; ok {
			m.inflight[key] = append(w, reply)
			return PublishDecision{Action: Wait}
		}
		if _, ok := m.unapplied[key]; ok {
			return PublishDecision{Action: Refuse, Refusal: RefusedNotApplied}
		}
	}
	if retryOnly {
		return PublishDecision{Action: NotARetry}
	}
	if producerID == 0 {
		m.anon++
		key = ProposalKey{ProducerSeq: m.anon}
	}
	m.inflight[key] = m.single(reply)
	return PublishDecision{Action: Propose, Key: key}
}

// single returns a slice of reply alone, cut from a shared block: a
// publish in flight costs no allocation of its own. Its capacity is
// capped, so a retry's append to it copies instead of writing into the
// next one's.
func (m *Member[R]) single(reply R) []R {
	if len(m.singles) == cap(m.singles) {
		m.singles = make([]R, 0, singlesBlock)
	}
	m.singles = append(m.singles, reply)
	n := len(m.singles)
	return m.singles[n-1 : n : n]
}

// Entry is one committed log entry as the kernel needs it.
type Entry struct {
	Seq, Epoch uint64
	// ProducerID, ProducerSeq: an idempotent publish (0 for control
	// records and non-idempotent publishes).
	ProducerID, ProducerSeq uint64
	// Group names the consumer group of a group record (ack, count,
	// fence, checkpoint or carry; "" otherwise), GroupKind its kind and
	// GroupBase a carry's base.
	Group     string
	GroupKind acklog.Kind
	GroupBase uint64
	// Carry is the value of a dedup carry record (carry.go; nil
	// otherwise).
	Carry []byte
}

// Apply applies one committed entry; entries come in log order (one at
// or below the applied position is ignored). The error reports a carry
// that does not decode: it is applied as changing nothing, the entry
// counts as applied.
func (m *Member[R]) Apply(e Entry) (err error) {
	if e.Seq <= m.applied {
		return nil
	}
	switch {
	case e.ProducerID != 0:
		m.producers.Record(e.ProducerID, e.ProducerSeq, e.Seq, e.Epoch)
		delete(m.unapplied, ProposalKey{ProducerID: e.ProducerID, ProducerSeq: e.ProducerSeq})
	case e.Group != "":
		if m.groupGone == nil || !m.groupGone(e.Group) {
			m.groups.Applied(e.Group, e.Seq, e.GroupKind, e.GroupBase)
		}
	case e.Carry != nil:
		err = m.producers.applyCarry(e.Carry, e.Seq, e.Epoch)
	}
	m.applied = e.Seq
	return err
}

// AppendCarry appends to b a dedup carry for a log the shell would
// compact through want if the dedup table let it; ok is false when none
// is needed (no producer's latest mention is at or below want). The
// leader proposes it as a control record; it takes effect when applied.
//
// A producer with a publish in flight or committed but not applied here
// is left out (CarryHoldsWhatItNames): its entry may commit between the
// applied position the carry re-states and the carry's own seq, where
// every replica takes the carry as the producer's latest mention — the
// entry would lose its protection from compaction, and a replica that
// rebuilds from the kept log would take its retry as new. The shell
// proposes carries only once its epoch's install entry is applied, so
// every entry of an earlier leader is applied already.
func (m *Member[R]) AppendCarry(b []byte, want uint64) (_ []byte, ok bool) {
	if m.mutations.CompactForgetsProducers {
		return b, false
	}
	var busy map[uint64]bool
	if !m.mutations.CarryIgnoresInflight {
		busy = map[uint64]bool{}
		for key := range m.inflight {
			busy[key.ProducerID] = true
		}
		for key := range m.unapplied {
			busy[key.ProducerID] = true
		}
	}
	b, n := m.producers.appendCarry(b, min(want, m.applied), busy)
	return b, n > 0
}

// GroupsDeleted takes in which groups' records belong to deleted group
// incarnations (gone must answer alike for a group from then on, a
// deleted incarnation never living again): what they needed of the log
// is dropped, and their later records are no records of a group
// (DeletedGroupPinsNothing). The shell calls it whenever its metadata
// deletes a group.
func (m *Member[R]) GroupsDeleted(gone func(group string) bool) {
	m.groupGone = gone
	m.groups.Forget(gone)
}

// GroupsVersion changes whenever GroupsFrom would answer differently.
func (m *Member[R]) GroupsVersion() uint64 { return m.groups.Version() }

// GroupsFrom returns where each consumer group's records start in the
// applied log (acklog.Needs.From).
func (m *Member[R]) GroupsFrom() map[string]uint64 { return m.groups.From() }

// LogStart takes in the log's current start. When it moved past what was
// applied (the replica rebuilt from the leader's snapshot point), the
// derived state starts over from the kept log, sealed: it reports true.
func (m *Member[R]) LogStart(start uint64) bool {
	if start <= m.applied+1 {
		return false
	}
	m.producers = m.newProducers()
	m.applied, m.truncated, m.sealedEpoch = start-1, true, 0
	m.groups.Reset()
	clear(m.unapplied) // the table starts over from the kept log, which keeps every producer's latest mention
	return true
}

// Outcome is how a publish is answered.
type Outcome uint8

const (
	// Committed: PUB_OK at (Seq, Epoch).
	Committed Outcome = iota
	// Failed: the proposal did not commit (Answer.Err says why); safe to
	// retry with the same identity.
	Failed
	// NotApplied: committed, but not applied here yet (UNAVAILABLE, retry).
	NotApplied
	// QuorumLost: the leader is READ_ONLY_DEGRADED; the entry stays in
	// flight and may still commit.
	QuorumLost
)

func (o Outcome) String() string {
	switch o {
	case Committed:
		return "Committed"
	case Failed:
		return "Failed"
	case NotApplied:
		return "NotApplied"
	case QuorumLost:
		return "QuorumLost"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Answer is a group of replies to answer with one outcome.
type Answer[R any] struct {
	Replies    []R
	Outcome    Outcome
	Seq, Epoch uint64 // Committed
	Err        error  // Failed: the completion's error
}

// Completed reports the end of the proposal key: committed at (seq, epoch)
// when err is nil. Apply the committed entries first: an entry that is not
// applied yet is answered NotApplied. ok is false for an unknown key.
func (m *Member[R]) Completed(key ProposalKey, seq, epoch uint64, err error) (a Answer[R], ok bool) {
	replies, ok := m.inflight[key]
	if !ok {
		return Answer[R]{}, false
	}
	delete(m.inflight, key)
	a = Answer[R]{Replies: replies, Outcome: Committed, Seq: seq, Epoch: epoch}
	switch {
	case err != nil:
		a.Outcome, a.Err = Failed, err
	case seq > m.applied:
		a.Outcome = NotApplied
		if key.ProducerID != 0 && !m.mutations.NotAppliedForgetsInflight {
			if m.unapplied == nil {
				m.unapplied = map[ProposalKey]uint64{}
			}
			m.unapplied[key] = seq
		}
	}
	return a, true
}

// Degraded answers the publishes in flight once the leader is
// READ_ONLY_DEGRADED, instead of leaving them hanging (QuorumLost). Their
// entries stay in flight: they may still commit when the quorum returns,
// so a retry keeps waiting on the same entry rather than appending again.
func (m *Member[R]) Degraded() []R {
	var replies []R
	for _, key := range m.inflightKeys() {
		replies = append(replies, m.inflight[key]...)
		m.inflight[key] = nil // still in flight: a retry waits on it
	}
	return replies
}

// Close forgets every proposal in flight and returns their replies.
func (m *Member[R]) Close() []R {
	var replies []R
	for _, key := range m.inflightKeys() {
		replies = append(replies, m.inflight[key]...)
		delete(m.inflight, key)
	}
	// A leader again later applies through its install entry first.
	clear(m.unapplied)
	return replies
}

// inflightKeys are the keys in flight in a deterministic order.
func (m *Member[R]) inflightKeys() []ProposalKey {
	keys := make([]ProposalKey, 0, len(m.inflight))
	for key := range m.inflight {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, func(a, b ProposalKey) int {
		return cmp.Or(cmp.Compare(a.ProducerID, b.ProducerID), cmp.Compare(a.ProducerSeq, b.ProducerSeq))
	})
	return keys
}

// Applied is the last committed entry applied.
func (m *Member[R]) Applied() uint64 { return m.applied }

// CompactLimit is the last seq the log may be compacted through: what was
// applied, below what every consumer group still needs, and below every
// known producer's latest mention of its highest producer_seq
// (ProducersKeptInLog, HighestSeqKeptInLog).
func (m *Member[R]) CompactLimit() uint64 {
	limit := m.groups.Limit(m.applied)
	if m.mutations.CompactForgetsProducers {
		return limit
	}
	return min(limit, m.producers.CompactLimit())
}

// Inflight is the number of proposals in flight.
func (m *Member[R]) Inflight() int { return len(m.inflight) }
