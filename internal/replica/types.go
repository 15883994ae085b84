// Package replica is the replication kernel of one partition replica group
// (DESIGN §2): leader epochs, Prepare/Install elections with persisted
// promises, quorum (or all-replica) commit of flushed entries, epoch fencing
// and a read-only degraded mode. It is pure: the shell feeds it messages,
// ticks and proposals and carries out the Ready it returns — persisting
// first, then sending (the ordering rule written on Ready). It holds no
// payloads: entries are described by (seq, epoch) and the shell reads or
// writes their data in its log.
package replica

import "fmt"

// NodeID names a replica.
type NodeID uint32

// Role is a replica's part in its group.
type Role uint8

const (
	Follower Role = iota
	Candidate
	Leader
)

func (r Role) String() string {
	switch r {
	case Follower:
		return "Follower"
	case Candidate:
		return "Candidate"
	case Leader:
		return "Leader"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// AckPolicy decides when an entry is committed (visible).
type AckPolicy uint8

const (
	// SyncQuorum commits once a majority of replicas has flushed the entry.
	SyncQuorum AckPolicy = iota
	// SyncAll commits only once every replica has flushed it; a lagging
	// replica blocks commits (and new writes fail) — never a silent downgrade.
	SyncAll
)

func (p AckPolicy) String() string {
	if p == SyncAll {
		return "sync_all"
	}
	return "sync_quorum"
}

// Entry identifies one log entry. Data travels only in Ready.Entries (to be
// persisted) and in Append messages (filled in by the shell).
type Entry struct {
	Seq   uint64
	Epoch uint64
	Data  []byte
}

// MsgType is the kind of a replication message.
type MsgType uint8

const (
	// MsgPrepare asks a peer to promise epoch Epoch to candidate From.
	MsgPrepare MsgType = iota + 1
	// MsgPrepareAck answers a Prepare: the peer's durable log end and
	// commit, and whether it granted (promised and the candidate's lineage
	// is at least as good as its own).
	MsgPrepareAck
	// MsgAppend carries entries (FirstSeq..LastSeq, possibly none: a
	// heartbeat) after (PrevSeq, PrevEpoch), and the leader's commit. The
	// first Append of an epoch carries its install entry (INSTALL).
	MsgAppend
	// MsgAppendAck is FLUSHED: everything up to FlushedSeq is durable on the
	// sender and matches the leader's log; or a rejection.
	MsgAppendAck
	// MsgSnapshot tells a follower whose next entries the leader no longer
	// keeps to rebuild from the leader's snapshot at (PrevSeq, PrevEpoch);
	// the shell transfers the snapshot itself.
	MsgSnapshot
	// MsgPreVote asks a peer whether it would promise epoch Epoch to
	// candidate From (lineage LastEpoch, LastSeq) — without promising
	// anything: neither side persists or changes state. A replica whose
	// election timer fires pre-votes first and campaigns only with a
	// majority of pre-grants, so it cannot fence a leader whose lease the
	// others still hold.
	MsgPreVote
	// MsgPreVoteAck answers a PreVote: Granted, with Epoch the asked one;
	// or refused, with Epoch the sender's own promise.
	MsgPreVoteAck
	// MsgTimeoutNow is a leader's hand-off (TransferTo): the addressee,
	// which has flushed the leader's whole log (LastEpoch, LastSeq), is to
	// campaign at once — forced, without a pre-vote — for Epoch+1. It acts
	// only on one from the leader it follows, in its current epoch.
	MsgTimeoutNow
	// MsgPromiseQuery asks a peer for its promise (promise.go): sent by a
	// replica whose hard state was lost (Persisted.PromiseLost), with Tick
	// the loss's nonce (Persisted.LostNonce).
	MsgPromiseQuery
	// MsgPromiseReport answers a PromiseQuery: Epoch is the sender's
	// durable promise, Tick the query's nonce.
	MsgPromiseReport
	// MsgPromiseUnknown answers a PromiseQuery from a replica whose own
	// promise is lost too (Tick: the query's nonce): it has no bound to
	// give, only word that it is lost (promise.go, LostPeersFewerThanAQuorum).
	// A kernel of before knows no such type and ignores it.
	MsgPromiseUnknown
)

func (t MsgType) String() string {
	switch t {
	case MsgPrepare:
		return "PREPARE"
	case MsgPrepareAck:
		return "PREPARE_ACK"
	case MsgAppend:
		return "APPEND"
	case MsgAppendAck:
		return "FLUSHED"
	case MsgSnapshot:
		return "SNAPSHOT"
	case MsgPreVote:
		return "PRE_VOTE"
	case MsgPreVoteAck:
		return "PRE_VOTE_ACK"
	case MsgTimeoutNow:
		return "TIMEOUT_NOW"
	case MsgPromiseQuery:
		return "PROMISE_QUERY"
	case MsgPromiseReport:
		return "PROMISE_REPORT"
	case MsgPromiseUnknown:
		return "PROMISE_UNKNOWN"
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Reject says why an Append was refused.
type Reject uint8

const (
	RejectNone Reject = iota
	// RejectStaleEpoch: the sender's epoch is older than the receiver's
	// promise (STALE_LEADER_EPOCH); Epoch carries the newer one.
	RejectStaleEpoch
	// RejectMismatch: the receiver's log does not hold (PrevSeq, PrevEpoch);
	// HintSeq is where the leader should retry from.
	RejectMismatch
)

func (r Reject) String() string {
	switch r {
	case RejectNone:
		return "none"
	case RejectStaleEpoch:
		return "STALE_LEADER_EPOCH"
	case RejectMismatch:
		return "LOG_MISMATCH"
	}
	return fmt.Sprintf("Reject(%d)", uint8(r))
}

// Message is one replication frame between replicas.
type Message struct {
	Type     MsgType
	From, To NodeID
	Epoch    uint64

	// Prepare, PreVote: the candidate's lineage. PrepareAck: the sender's lineage.
	LastEpoch, LastSeq uint64
	// Prepare: the campaign is forced (Campaign — a leadership transfer's
	// target, a new group's first election), not the end of a pre-vote
	// round; only such a PREPARE is granted by a replica that still holds
	// its leader's lease (PrepareRespectsLease).
	Forced bool
	// PrepareAck, PreVoteAck.
	Granted bool
	// PrepareAck: Uncertain, with Granted, says the sender's log may lack
	// entries it acknowledged as flushed (its grant vouches for less);
	// Damaged, refused, says it lost a damaged range and is rebuilding.
	Uncertain, Damaged bool

	// Append.
	PrevSeq, PrevEpoch    uint64
	FirstSeq, LastSeqSent uint64 // entries the shell must attach; FirstSeq 0 = none
	Entries               []Entry
	CommitSeq             uint64 // also in PrepareAck: the sender's commit

	// AppendAck.
	FlushedSeq uint64
	Reject     Reject
	HintSeq    uint64

	// Tick: on an Append or Snapshot, the leader's tick count when it
	// sent it; on an AppendAck, the Tick of the Append or Snapshot it
	// answers (0: none). A leader's lease dates from when it sent what a
	// quorum answered, not from when the answers arrived (LeaseFromSend).
	Tick uint64
}

func (m Message) String() string {
	switch m.Type {
	case MsgPrepare, MsgPreVote, MsgTimeoutNow:
		return fmt.Sprintf("%s %d->%d e=%d last=(%d,%d)", m.Type, m.From, m.To, m.Epoch, m.LastEpoch, m.LastSeq)
	case MsgPreVoteAck:
		return fmt.Sprintf("%s %d->%d e=%d granted=%v", m.Type, m.From, m.To, m.Epoch, m.Granted)
	case MsgPrepareAck:
		s := fmt.Sprintf("%s %d->%d e=%d granted=%v last=(%d,%d) commit=%d", m.Type, m.From, m.To, m.Epoch, m.Granted, m.LastEpoch, m.LastSeq, m.CommitSeq)
		if m.Uncertain {
			s += " uncertain"
		}
		if m.Damaged {
			s += " damaged"
		}
		return s
	case MsgAppend:
		return fmt.Sprintf("%s %d->%d e=%d prev=(%d,%d) entries=%d..%d commit=%d", m.Type, m.From, m.To, m.Epoch, m.PrevSeq, m.PrevEpoch, m.FirstSeq, m.LastSeqSent, m.CommitSeq)
	case MsgSnapshot:
		return fmt.Sprintf("%s %d->%d e=%d snapshot=(%d,%d) commit=%d", m.Type, m.From, m.To, m.Epoch, m.PrevSeq, m.PrevEpoch, m.CommitSeq)
	case MsgAppendAck:
		if m.Reject != RejectNone {
			return fmt.Sprintf("%s %d->%d e=%d reject=%s hint=%d", m.Type, m.From, m.To, m.Epoch, m.Reject, m.HintSeq)
		}
		return fmt.Sprintf("%s %d->%d e=%d flushed=%d", m.Type, m.From, m.To, m.Epoch, m.FlushedSeq)
	}
	return fmt.Sprintf("%s %d->%d e=%d", m.Type, m.From, m.To, m.Epoch)
}

// EpochStart says that entries from StartSeq on (until the next EpochStart)
// were written in Epoch.
type EpochStart struct {
	Epoch    uint64
	StartSeq uint64
}

// HardState is what a replica persists besides its log entries.
type HardState struct {
	// Promised is the highest epoch this replica promised (to a candidate,
	// itself included) or accepted from a leader. It never decreases.
	Promised uint64
	// PromisedTo is the replica Promised went to (0 = none yet): a replayed
	// PREPARE from it is granted again; any other is refused.
	PromisedTo NodeID
}

// Persisted is a replica's durable state on restart.
type Persisted struct {
	Hard   HardState
	Epochs []EpochStart // the log's epoch boundaries, ascending
	Last   uint64       // last durable seq (0 = empty log)
	// SnapSeq and SnapEpoch: the log was compacted into a snapshot at this
	// (committed) entry; entries at or below SnapSeq are no longer kept.
	SnapSeq, SnapEpoch uint64
	// Rebuilding: the shell dropped a damaged range of its log (replog's
	// rebuilding mark). The replica is then never promotable (it does not
	// campaign or grant) until a snapshot or the leader's log has made it
	// whole again.
	Rebuilding bool
	// Uncertain: the shell cut an invalid tail off the log that may have
	// been a flushed entry gone bad rather than a torn write (nothing
	// after it proved it durable). The replica may have acknowledged
	// entries it no longer holds: it still campaigns and grants, but its
	// grants do not vouch for its whole log (Replica.granted) until a
	// leader of a newer epoch has made it whole.
	Uncertain bool
	// PromiseLost: the shell could not read the hard state (damaged), so
	// the replica does not know which epochs it promised. Hard then holds
	// only a lower bound (the log's last epoch). The replica takes no part
	// in the group — no grant, no vote, no Append accepted — until every
	// peer reported its promise (promise.go); LostNonce (non-zero) tells
	// this loss's reports from a former one's.
	PromiseLost bool
	LostNonce   uint64
}

// Ready is the work a step produced. Ordering rule: the shell makes
// Snapshot, HardState, TruncateAfter and Entries durable (in that order)
// before it sends any of Messages, then calls Advance. Messages may assume
// it. Early holds the messages that need not wait: a leader's Appends,
// unless the Ready changes the hard state (a leader that promised a newer
// epoch in the meantime). They may go once Entries are written, before
// they are durable — the leader counts its own entries toward a commit
// only after Advance (durable), and followers ack only what they flushed —
// so followers flush in parallel with the leader (Raft §10.2.1). A leader
// never truncates or installs a snapshot, and a replica that stops leading
// changes its hard state, so no Ready with Appends in Early truncates or
// installs. The rule is the kernel's, as data: executors (Executor) only
// follow it.
type Ready struct {
	HardState *HardState // nil = unchanged
	// Truncate drops every entry after TruncateAfter before Entries are
	// appended (only uncommitted entries are ever truncated).
	Truncate      bool
	TruncateAfter uint64
	Entries       []Entry // to append, with data
	Messages      []Message
	Early         []Message // may be sent before Entries are durable (above)
	// CommitSeq is the new visible end when it advanced (0 = unchanged).
	CommitSeq uint64
	// Snapshot, when set, must be installed first: the shell fetches the
	// leader's snapshot at (Seq, Epoch), replaces its log and derived state
	// with it (marking the install durable only when complete), then
	// carries out the rest of the Ready.
	Snapshot *SnapshotMeta
}

// SnapshotMeta names a snapshot: the state after applying every entry up
// to Seq, whose entry was written in Epoch.
type SnapshotMeta struct {
	Seq, Epoch uint64
}

// IsEmpty reports whether there is nothing to do.
func (r *Ready) IsEmpty() bool {
	return r.HardState == nil && !r.Truncate && len(r.Entries) == 0 && len(r.Messages) == 0 && len(r.Early) == 0 && r.CommitSeq == 0 && r.Snapshot == nil
}

// PersistedFrom rebuilds a replica's Persisted from its hard state and its
// whole durable log (entries in seq order from 1): the restart path of
// shells that keep the entries themselves.
func PersistedFrom(hard HardState, log []Entry) Persisted {
	return PersistedFromSnapshot(hard, 0, 0, log)
}

// PersistedFromSnapshot is PersistedFrom for a log compacted at (snapSeq,
// snapEpoch): log holds the entries after snapSeq, in seq order.
func PersistedFromSnapshot(hard HardState, snapSeq, snapEpoch uint64, log []Entry) Persisted {
	p := Persisted{Hard: hard, Last: snapSeq + uint64(len(log)), SnapSeq: snapSeq, SnapEpoch: snapEpoch}
	if snapSeq > 0 {
		p.Epochs = append(p.Epochs, EpochStart{Epoch: snapEpoch, StartSeq: snapSeq})
	}
	for _, e := range log {
		if len(p.Epochs) == 0 || p.Epochs[len(p.Epochs)-1].Epoch != e.Epoch {
			p.Epochs = append(p.Epochs, EpochStart{Epoch: e.Epoch, StartSeq: e.Seq})
		}
	}
	return p
}
