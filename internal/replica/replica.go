package replica

import (
	"errors"
	"fmt"
	"slices"
	"sort"
)

// Errors returned to proposers.
var (
	ErrNotLeader  = errors.New("replica: not the leader")
	ErrQuorumLost = errors.New("replica: quorum lost (READ_ONLY_DEGRADED)")
	// ErrTransferring: the leader is handing leadership to another replica
	// (TransferTo) and takes no proposal until the hand-off ends — it is
	// then not the leader any more, or it gave up after TransferTicks and
	// takes proposals again. Nothing was appended: retry, at the new
	// leader if there is one.
	ErrTransferring = errors.New("replica: leadership transfer in progress")
)

// heartbeatsPerElection is how many heartbeats an idle leader sends in an
// election timeout by default (etcd's ratio). More buy nothing: a
// follower campaigns only after a whole timeout of silence, and the
// leader's lease and ReadOnly clock count in election timeouts too. Each
// one costs every idle group a message and its answer per follower: at
// one a tick, 20 idle 3-replica topics kept a 3-node cluster on this
// machine more than half busy.
const heartbeatsPerElection = 10

// Config configures a replica. Times are logical ticks.
type Config struct {
	ID       NodeID
	Replicas []NodeID // the whole group, ID included
	Policy   AckPolicy
	// HeartbeatTicks between leader appends when idle (default
	// ElectionTicks/heartbeatsPerElection, at least 1).
	HeartbeatTicks int
	// ElectionTicks: a follower that hears no leader for a random time in
	// [ElectionTicks, 2*ElectionTicks) campaigns (default 30: 300 ms at
	// the node's 10 ms tick). The one default of this setting: the node
	// and replog pass 0 through.
	ElectionTicks int
	// AckTimeoutTicks: a leader that has not heard from a quorum (every
	// replica under SyncAll) for this long refuses writes (default 2*ElectionTicks).
	AckTimeoutTicks int
	// AppendEntriesMax bounds the entries of one Append (default 256).
	AppendEntriesMax int
	// ReservationTicks: a leader keeps the log a follower still needs
	// (RetainFloor) only while it heard from that follower within this many
	// ticks (default 4*ElectionTicks). A follower that stays away longer
	// may find its range compacted and must rebuild from a snapshot.
	ReservationTicks int
	// ReservationEntriesMax bounds how far behind a follower may be and
	// still pin the leader's log: a reservation is bounded in size as well
	// as time (entries stand in for bytes; default 1<<20).
	ReservationEntriesMax uint64
	// ChaseTicks: a follower whose lag (leader's last - its match) has not
	// shrunk over this many ticks while above AppendEntriesMax is tail
	// chasing; its reservation is revoked so the log can be compacted past
	// it and it rebuilds from a snapshot (default ReservationTicks).
	ChaseTicks int
	// TransferTicks: a leadership transfer (TransferTo) that has not
	// ended within this many ticks is abandoned and the leader takes
	// proposals again (default ElectionTicks): a hand-off costs at most
	// about one election timeout of refused writes.
	TransferTicks int
	// PreferredLeader is the replica that should lead the group while it
	// is healthy (0: none, no automatic transfer). A leader that is not
	// it hands leadership to it (TransferTo) once it has kept up —
	// flushed everything committed, or within one Append of the leader's
	// log, and heard within half an election timeout — for
	// RebalanceStableTicks ticks in a row (default 2*ElectionTicks), and
	// at most once every RebalanceEveryTicks (default 5*ElectionTicks,
	// counted from taking office too), so a flapping replica cannot make
	// leadership flap with it.
	PreferredLeader      NodeID
	RebalanceStableTicks int
	RebalanceEveryTicks  int
	// ReleaseBeforeTransfer: a rebalancing transfer waits for the shell.
	// The leader reports the transfer it wants (Status.TransferWanted)
	// and goes on leading, lease and all, until the shell calls
	// TransferTo — after it drained what acts under the lease (a
	// scheduler shard's owner finishes its publishes in flight first).
	ReleaseBeforeTransfer bool
	// Seed feeds the election jitter (no global randomness).
	Seed uint64
	// Mutations break guards on purpose (tests only).
	Mutations Mutations
}

// Mutations are deliberate bugs for the simulator's mutation tests.
type Mutations struct {
	CommitOnLeaderFlushAlone    bool // commit without waiting for followers
	InstallWithoutQuorum        bool // take office on the candidate's own promise
	AcceptStaleAppend           bool // accept an APPEND from an older epoch
	PreVoteIgnoresLease         bool // grant a PRE_VOTE while still holding the leader's lease
	LeaseForgottenWithTheLeader bool // a follower that adopts a later epoch without a leader (a refusal's, a PREPARE's) stops vouching for the leader it heard at once (LeaseOutlivesTheEpoch)
	AcceptStaleFlushed          bool // count a FLUSHED of an older epoch toward this epoch's commit
	GrantIgnoresLineage         bool // grant a PREPARE (and a pre-vote) whatever the candidate's lineage
	LeaseFromReceipt            bool // date the lease from when the answers arrived, not from when what they answer was sent
	ProposeWhenReadOnly         bool // accept proposals while READ_ONLY_DEGRADED
	AppendBelowSnapshot         bool // S8: match an APPEND starting below the snapshot point against the compacted prefix
	ProposeWhileTransferring    bool // accept proposals while handing leadership over (TransferTo)
	TimeoutNowBeforeCaughtUp    bool // send TIMEOUT_NOW before the target flushed the leader's last entry
	TimeoutNowAnyEpoch          bool // campaign on any TIMEOUT_NOW, whatever its epoch or sender
	TransferNeverAbandoned      bool // keep refusing proposals until a transfer succeeds
	TransferWithoutRelease      bool // under ReleaseBeforeTransfer, start a rebalancing transfer without waiting for the shell
	TrustUncertainGrants        bool // count an uncertain replica's grant as a witness of its whole log
	RebuildingPromotable        bool // a replica rebuilding a dropped range campaigns and grants as a whole one
	UncertainClearsOnAnyLeader  bool // leave Uncertain once any leader made the replica whole, not only a newer one
	QuietThroughSilence         bool // NextTickDue: sleep past the tick at which a follower stops vouching for its leader
	LeaseFromCurrentTick        bool // replog: end the published lease LeaseTicks after the current tick's clock reading, not LeaseSpan after LeaseFrom's
	PrepareIgnoresLease         bool // promise an election timeout's PREPARE while still holding the leader's lease
	PromiseLostNotRecovered     bool // a replica whose hard state was lost takes part at once, promising from its log's last epoch
	LostPeersUnbounded          bool // a lost replica counts every peer that answered it is lost too, however many (LostPeersFewerThanAQuorum)
	LostPeerSilent              bool // a lost replica answers no query (as before PROMISE_UNKNOWN): two lost replicas of a group wait for each other
	UnknownKeepsReports         bool // a lost replica keeps the reports it heard before a peer answered it is lost too (ReportsAfterTheLostPeer)
	PromiseFromQuorumReports    bool // a replica whose hard state was lost recovers on a majority's reports, not every peer's
	// Outcome: an entry beyond the commit point stays Pending though the
	// committed prefix ends in a later epoch (LostBehindALaterEpoch).
	OutcomeWaitsForTheCommitPoint bool
	// Outcome: an entry beyond the commit point is Lost once a later
	// epoch is promised, whether or not the committed prefix ends in one
	// (LostIsFinal: the next leader may still commit it).
	OutcomeLostOnceDeposed bool
}

func (c *Config) validate() error {
	if c.ID == 0 {
		return errors.New("replica: ID must be non-zero")
	}
	if !slices.Contains(c.Replicas, c.ID) {
		return fmt.Errorf("replica: ID %d not in replicas %v", c.ID, c.Replicas)
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 30
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = max(1, c.ElectionTicks/heartbeatsPerElection)
	}
	if c.AckTimeoutTicks == 0 {
		c.AckTimeoutTicks = 2 * c.ElectionTicks
	}
	if c.AppendEntriesMax == 0 {
		c.AppendEntriesMax = 256
	}
	if c.ReservationTicks == 0 {
		c.ReservationTicks = 4 * c.ElectionTicks
	}
	if c.ChaseTicks == 0 {
		c.ChaseTicks = c.ReservationTicks
	}
	if c.ReservationEntriesMax == 0 {
		c.ReservationEntriesMax = 1 << 20
	}
	if c.TransferTicks == 0 {
		c.TransferTicks = c.ElectionTicks
	}
	if c.RebalanceStableTicks == 0 {
		c.RebalanceStableTicks = 2 * c.ElectionTicks
	}
	if c.RebalanceEveryTicks == 0 {
		c.RebalanceEveryTicks = 5 * c.ElectionTicks
	}
	if c.PreferredLeader != 0 && !slices.Contains(c.Replicas, c.PreferredLeader) {
		return fmt.Errorf("replica: preferred leader %d not in replicas %v", c.PreferredLeader, c.Replicas)
	}
	if c.HeartbeatTicks >= c.ElectionTicks {
		return fmt.Errorf("replica: heartbeat %d ticks must be shorter than election %d", c.HeartbeatTicks, c.ElectionTicks)
	}
	return nil
}

// Replica is the kernel state of one replica. Not safe for concurrent use;
// a plain value the model checker can clone (Clone) and hash.
type Replica struct {
	cfg    Config
	peers  []NodeID // cfg.Replicas sorted; indexes below refer to it
	self   int
	quorum int

	hard    HardState // as it will be once the pending Ready is persisted
	role    Role
	leader  NodeID // leader of hard.Promised, 0 if unknown
	epochs  []EpochStart
	last    uint64 // last seq, pending entries included
	snapSeq uint64 // entries at or below are compacted into a snapshot
	// rebuilding: the log lost a damaged range (Persisted.Rebuilding);
	// never promotable until whole again.
	rebuilding bool
	// uncertain: the log may lack entries this replica acknowledged as
	// flushed (Persisted.Uncertain). Its grants do not vouch for its
	// whole log (granted) until a leader of an epoch newer than
	// uncertainEpoch, its promise when it became uncertain, has made it
	// whole: only such a leader ignores FLUSHED answers it sent before.
	uncertain      bool
	uncertainEpoch uint64
	// lost: the promise is unknown (Persisted.PromiseLost) until every
	// peer reported its own (promise.go): reported by peer index, the
	// highest report in reportMax, lostNonce the loss's nonce; unknown by
	// peer index: the peers that answered that their promise is lost too.
	lost      bool
	lostNonce uint64
	reported  []bool
	unknown   []bool
	reportMax uint64
	durable   uint64 // last seq known durable (after Advance)
	commit    uint64

	electionElapsed  int
	electionTimeout  int
	heartbeatElapsed int
	rng              uint64
	// heardLeaderTick is ticks+1 when this replica last took an APPEND or
	// SNAPSHOT of a leader (0: not since it started). Its answer may count
	// toward that leader's lease, so it helps elect no other for
	// ElectionTicks after (leaseExpired) — whatever epoch it adopts
	// meanwhile (LeaseOutlivesTheEpoch).
	heardLeaderTick uint64

	grants []bool // candidate: promises granted, by peer index
	// Candidate, by peer index: grants from uncertain replicas, and
	// refusals from replicas that lost a damaged range (granted).
	uncertainGrants, damagedRefusals []bool

	// Pre-vote round (started by an election timeout): preGrants are the
	// peers that would promise hard.Promised+1 (answers for another epoch
	// are ignored). A round ends on news from a leader, on a promise to
	// another candidate or any role change, and restarts when the timer
	// fires again.
	preVoting bool
	preGrants []bool
	// preAnswered: the peers that answered the round (granted or
	// refused); the others are asked again every HeartbeatTicks
	// (resendPreVotes).
	preAnswered []bool

	// Leader progress, by peer index.
	match []uint64 // highest seq known flushed and matching
	next  []uint64 // next seq to send
	heard []int    // ticks since the peer last answered
	// ticks counts Tick calls since New (from 1: a Message's Tick 0 is
	// none); leaseFrom[i] is the latest Tick of this reign's Appends that
	// peer i answered — the lease's start (leaseTicks).
	ticks     uint64
	leaseFrom []uint64
	dirty     []bool   // peer needs an Append in the next Ready
	chaseLag  []uint64 // lag at the start of the current chase window
	chaseAge  []int    // ticks into the current chase window
	revoked   []bool   // tail chasing: reservation withdrawn until caught up
	readOnly  bool
	installAt uint64 // seq of this epoch's install entry

	// Leadership transfer (transfer.go), leader only: the replica it
	// hands leadership to (0: none), the ticks since it began, and
	// whether TIMEOUT_NOW went out. While transferee is set the leader
	// takes no proposal, so the target's lineage stays the leader's own.
	transferee      NodeID
	transferElapsed int
	timeoutNowSent  bool
	// Rebalancing toward cfg.PreferredLeader (leader only): ticks in a
	// row the preferred replica kept up, and ticks since this leader took
	// office or last tried a transfer.
	preferredStable int
	rebalanceIdle   int
	// transferWanted: the rebalancing transfer this leader would start
	// now, left to the shell under ReleaseBeforeTransfer (0: none).
	transferWanted NodeID

	anomalies uint64 // messages refused as impossible from a correct peer

	pending       Ready
	hardChanged   bool
	lastCommitOut uint64
}

// New restores a replica from its persisted state. It starts as a follower
// with an unknown commit (learned from the next leader).
func New(cfg Config, p Persisted) (*Replica, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	peers := slices.Clone(cfg.Replicas)
	slices.Sort(peers)
	r := &Replica{cfg: cfg, peers: peers, self: slices.Index(peers, cfg.ID), quorum: len(peers)/2 + 1,
		hard: p.Hard, epochs: slices.Clone(p.Epochs), last: p.Last, durable: p.Last,
		snapSeq: p.SnapSeq, commit: p.SnapSeq, lastCommitOut: p.SnapSeq, rebuilding: p.Rebuilding,
		uncertain: p.Uncertain,
		rng:       cfg.Seed ^ uint64(cfg.ID)*0x9E3779B97F4A7C15, ticks: 1}
	n := len(peers)
	r.grants, r.match, r.next, r.heard, r.dirty = make([]bool, n), make([]uint64, n), make([]uint64, n), make([]int, n), make([]bool, n)
	r.leaseFrom = make([]uint64, n)
	r.chaseLag, r.chaseAge, r.revoked = make([]uint64, n), make([]int, n), make([]bool, n)
	r.preGrants, r.uncertainGrants, r.damagedRefusals = make([]bool, n), make([]bool, n), make([]bool, n)
	r.preAnswered = make([]bool, n)
	if p.Uncertain {
		r.uncertainEpoch = p.Hard.Promised
	}
	r.resetElectionTimer()
	r.reported, r.unknown = make([]bool, n), make([]bool, n)
	if p.PromiseLost {
		r.losePromise(p.LostNonce)
	}
	return r, nil
}

// Clone returns an independent copy (for the model checker).
func (r *Replica) Clone() *Replica {
	c := *r
	c.peers, c.epochs = slices.Clone(r.peers), slices.Clone(r.epochs)
	c.grants, c.match, c.next, c.heard, c.dirty = slices.Clone(r.grants), slices.Clone(r.match), slices.Clone(r.next), slices.Clone(r.heard), slices.Clone(r.dirty)
	c.leaseFrom = slices.Clone(r.leaseFrom)
	c.chaseLag, c.chaseAge, c.revoked = slices.Clone(r.chaseLag), slices.Clone(r.chaseAge), slices.Clone(r.revoked)
	c.preGrants, c.uncertainGrants, c.damagedRefusals = slices.Clone(r.preGrants), slices.Clone(r.uncertainGrants), slices.Clone(r.damagedRefusals)
	c.preAnswered = slices.Clone(r.preAnswered)
	c.reported, c.unknown = slices.Clone(r.reported), slices.Clone(r.unknown)
	c.pending.Entries, c.pending.Messages = slices.Clone(r.pending.Entries), slices.Clone(r.pending.Messages)
	return &c
}

// nextRand is splitmix64: deterministic jitter from the configured seed.
func (r *Replica) nextRand() uint64 {
	r.rng += 0x9E3779B97F4A7C15
	z := r.rng
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

func (r *Replica) resetElectionTimer() {
	r.electionElapsed = 0
	r.electionTimeout = r.cfg.ElectionTicks + int(r.nextRand()%uint64(r.cfg.ElectionTicks))
}

// epochAt returns the epoch of the entry at seq (0 for seq 0 or beyond the log).
func (r *Replica) epochAt(seq uint64) uint64 {
	if seq == 0 || seq > r.last {
		return 0
	}
	i := sort.Search(len(r.epochs), func(i int) bool { return r.epochs[i].StartSeq > seq })
	if i == 0 {
		return 0
	}
	return r.epochs[i-1].Epoch
}

func (r *Replica) lastEpoch() uint64 { return r.epochAt(r.last) }

// mismatchHint is a follower's answer to an Append whose prev (seq, epoch)
// it does not hold: the seq the leader should try as prev next. A log too
// short gives its end. An entry of another epoch at prev gives the seq
// before that epoch's run here: the leader's entries may match only a
// prefix of the run, which it then sends again (already held, skipped).
// Stepping back one seq per round trip over a long divergent tail (a
// deposed leader's uncommitted appends) took hundreds of round trips —
// with every rejection answered by a new Append, long enough for the
// Appends in flight to multiply without end (soak seed 300399). Only the
// leader's next Append changes: a follower still accepts only an Append
// whose prev it holds.
func (r *Replica) mismatchHint(prev uint64) uint64 {
	if prev > r.last {
		return r.last
	}
	hint := prev - 1
	i := sort.Search(len(r.epochs), func(i int) bool { return r.epochs[i].StartSeq > prev })
	if i > 0 && r.epochs[i-1].StartSeq > 0 {
		hint = min(hint, r.epochs[i-1].StartSeq-1)
	}
	return hint
}

// lineageAtLeast compares lineages by (last epoch, last seq): a longer log
// of an older epoch is not better than a shorter one of a newer epoch.
func lineageAtLeast(epochA, seqA, epochB, seqB uint64) bool {
	if epochA != epochB {
		return epochA > epochB
	}
	return seqA >= seqB
}

func (r *Replica) setHard(promised uint64, to NodeID) {
	if promised < r.hard.Promised {
		panic(fmt.Sprintf("replica %d: promise would go back from %d to %d", r.cfg.ID, r.hard.Promised, promised))
	}
	if r.hard.Promised != promised || r.hard.PromisedTo != to {
		r.hard = HardState{Promised: promised, PromisedTo: to}
		r.hardChanged = true
	}
}

func (r *Replica) send(m Message) {
	m.From = r.cfg.ID
	r.pending.Messages = append(r.pending.Messages, m)
}

func (r *Replica) truncateAfter(seq uint64) {
	if seq < r.commit {
		panic(fmt.Sprintf("replica %d: truncating committed entries (after %d, commit %d)", r.cfg.ID, seq, r.commit))
	}
	if !r.pending.Truncate || seq < r.pending.TruncateAfter {
		r.pending.Truncate, r.pending.TruncateAfter = true, seq
	}
	// Pending entries above the cut are dropped with it.
	r.pending.Entries = slices.DeleteFunc(r.pending.Entries, func(e Entry) bool { return e.Seq > seq })
	r.last = seq
	r.durable = min(r.durable, seq)
	for len(r.epochs) > 0 && r.epochs[len(r.epochs)-1].StartSeq > seq {
		r.epochs = r.epochs[:len(r.epochs)-1]
	}
}

func (r *Replica) appendEntry(e Entry) {
	if e.Seq != r.last+1 {
		panic(fmt.Sprintf("replica %d: append seq %d after %d", r.cfg.ID, e.Seq, r.last))
	}
	if len(r.epochs) == 0 || r.epochs[len(r.epochs)-1].Epoch != e.Epoch {
		r.epochs = append(r.epochs, EpochStart{Epoch: e.Epoch, StartSeq: e.Seq})
	}
	r.last = e.Seq
	r.pending.Entries = append(r.pending.Entries, e)
}

func (r *Replica) becomeFollower(epoch uint64, leader NodeID) {
	if epoch > r.hard.Promised {
		r.setHard(epoch, leader)
	}
	r.role, r.leader, r.readOnly = Follower, leader, false
	r.endPreVote()
	r.endTransfer()
	r.resetElectionTimer()
}

// NextTickDue is how many ticks from now the first one falls that may do
// more than count (QuietTicks): the ticks before it change neither Ready
// nor Status, so a shell may sleep through them and step them when it
// wakes. A follower's or candidate's next due tick is the one at which it
// stops vouching for its leader (Status.LeaderSilent) or its election
// timer runs out, or the one at which a pre-vote round re-sends its
// PRE_VOTEs (resendPreVotes) or a candidate its PREPAREs
// (resendPrepares). A leader's tick is always due: its lease
// (Status.LeaseTicks), its followers' ack timeouts and its hand-offs are
// counted in ticks. At least 1.
func (r *Replica) NextTickDue() int {
	if r.role == Leader {
		return 1
	}
	if r.lost {
		return max(r.cfg.HeartbeatTicks-r.heartbeatElapsed, 1)
	}
	due := r.electionTimeout - r.electionElapsed
	if silent := r.silentIn(); silent > 0 && !r.cfg.Mutations.QuietThroughSilence {
		due = min(due, silent)
	}
	if r.preVoting || r.role == Candidate {
		due = min(due, r.cfg.HeartbeatTicks-r.heartbeatElapsed)
	}
	return max(due, 1)
}

// silentIn is how many ticks from now this follower stops vouching for
// the last leader it heard (leaseExpired, Status.LeaderSilent); 0 or
// less: it does not vouch.
func (r *Replica) silentIn() int {
	if r.cfg.Mutations.LeaseForgottenWithTheLeader {
		return r.cfg.ElectionTicks - r.electionElapsed
	}
	if r.heardLeaderTick == 0 {
		return 0
	}
	return r.cfg.ElectionTicks - int(r.ticks+1-r.heardLeaderTick)
}

// Tick advances logical time by one tick.
func (r *Replica) Tick() {
	r.ticks++
	switch {
	case r.lost:
		r.tickLost()
	case r.role == Follower, r.role == Candidate:
		r.electionElapsed++
		if r.electionElapsed >= r.electionTimeout {
			r.ElectionTimeout()
		} else if r.preVoting || r.role == Candidate {
			r.heartbeatElapsed++
			if r.heartbeatElapsed >= r.cfg.HeartbeatTicks {
				r.heartbeatElapsed = 0
				if r.preVoting {
					r.resendPreVotes()
				} else {
					r.resendPrepares()
				}
			}
		}
	case r.role == Leader:
		for i := range r.peers {
			if i != r.self {
				r.heard[i]++
				r.watchChase(i)
			}
		}
		r.updateReadOnly()
		r.tickTransfer()
		r.heartbeatElapsed++
		if r.heartbeatElapsed >= r.cfg.HeartbeatTicks {
			r.heartbeatElapsed = 0
			for i := range r.peers {
				r.dirty[i] = i != r.self
			}
		}
	}
}

// Propose appends data as a new entry (leader only). The entry is visible
// once Ready.CommitSeq reaches the returned seq under this epoch.
func (r *Replica) Propose(data []byte) (seq, epoch uint64, err error) {
	if r.role != Leader {
		return 0, 0, ErrNotLeader
	}
	if r.transferee != 0 && !r.cfg.Mutations.ProposeWhileTransferring {
		return 0, 0, ErrTransferring
	}
	if r.readOnly && !r.cfg.Mutations.ProposeWhenReadOnly {
		return 0, 0, ErrQuorumLost
	}
	r.appendEntry(Entry{Seq: r.last + 1, Epoch: r.hard.Promised, Data: data})
	for i := range r.peers {
		r.dirty[i] = i != r.self
	}
	return r.last, r.hard.Promised, nil
}

// Step handles one message. It is total: every message in every state has
// a defined outcome (often: ignore).
func (r *Replica) Step(m Message) {
	if m.To != r.cfg.ID || m.From == r.cfg.ID || !slices.Contains(r.peers, m.From) {
		return // not for us, or not from a member of the group
	}
	if r.lost {
		switch m.Type {
		case MsgPromiseReport, MsgPromiseUnknown:
			r.stepPromiseReport(m)
		case MsgPromiseQuery:
			if !r.cfg.Mutations.LostPeerSilent {
				r.send(Message{Type: MsgPromiseUnknown, To: m.From, Tick: m.Tick})
			}
		}
		return // it takes no part until it knows its promise
	}
	switch m.Type {
	case MsgPrepare:
		r.stepPrepare(m)
	case MsgPrepareAck:
		r.stepPrepareAck(m)
	case MsgAppend:
		r.stepAppend(m)
	case MsgAppendAck:
		r.stepAppendAck(m)
	case MsgSnapshot:
		r.stepSnapshot(m)
	case MsgPreVote:
		r.stepPreVote(m)
	case MsgPreVoteAck:
		r.stepPreVoteAck(m)
	case MsgTimeoutNow:
		r.stepTimeoutNow(m)
	case MsgPromiseQuery:
		r.send(Message{Type: MsgPromiseReport, To: m.From, Epoch: r.hard.Promised, Tick: m.Tick})
	}
}

// wellFormed reports whether an Append's entries can be what a leader of
// its epoch sends: contiguous after PrevSeq, epochs not above the message's
// and not decreasing. A malformed one is ignored (Step stays total).
func wellFormed(m Message) bool {
	prevEpoch := m.PrevEpoch
	for i, e := range m.Entries {
		if e.Seq != m.PrevSeq+uint64(i)+1 || e.Epoch == 0 || e.Epoch > m.Epoch || e.Epoch < prevEpoch {
			return false
		}
		prevEpoch = e.Epoch
	}
	return m.PrevEpoch <= m.Epoch && m.PrevSeq < ^uint64(0)-uint64(len(m.Entries))
}

func (r *Replica) stepAppend(m Message) {
	if !wellFormed(m) {
		return
	}
	if m.Epoch < r.hard.Promised && !r.cfg.Mutations.AcceptStaleAppend {
		r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: r.hard.Promised, Reject: RejectStaleEpoch})
		return
	}
	if m.Epoch == r.hard.Promised && ((r.role == Leader && m.From != r.cfg.ID) || (r.role == Follower && r.leader != 0 && r.leader != m.From)) {
		// Two leaders of one epoch cannot exist; refuse the impossible one.
		r.anomalies++
		return
	}
	if m.Epoch > r.hard.Promised || r.role != Follower || r.leader != m.From {
		r.becomeFollower(m.Epoch, m.From)
	}
	r.electionElapsed, r.heardLeaderTick = 0, r.ticks+1
	r.endPreVote() // heard the leader
	if m.PrevSeq < r.snapSeq && !r.cfg.Mutations.AppendBelowSnapshot {
		// Entries up to the snapshot are committed, so they match the
		// leader's: skip them and match at the snapshot point instead.
		skip := min(uint64(len(m.Entries)), r.snapSeq-m.PrevSeq)
		m.Entries = m.Entries[skip:]
		if len(m.Entries) == 0 {
			r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: m.Epoch, FlushedSeq: r.snapSeq, Tick: m.Tick})
			return
		}
		m.PrevSeq, m.PrevEpoch = m.Entries[0].Seq-1, r.epochAt(m.Entries[0].Seq-1)
	}
	if m.PrevSeq > r.last || r.epochAt(m.PrevSeq) != m.PrevEpoch {
		r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: m.Epoch, Reject: RejectMismatch, HintSeq: r.mismatchHint(m.PrevSeq), Tick: m.Tick})
		return
	}
	for i, e := range m.Entries {
		if e.Seq <= r.last && r.epochAt(e.Seq) == e.Epoch {
			continue // already held
		}
		if e.Seq <= r.commit {
			// A leader never rewrites a committed entry; refuse the message
			// (counted, so checkers and logs see it) instead of obeying.
			r.anomalies++
			return
		}
		if e.Seq <= r.last {
			r.truncateAfter(e.Seq - 1)
		}
		for _, rest := range m.Entries[i:] {
			r.appendEntry(rest)
		}
		break
	}
	matched := m.PrevSeq + uint64(len(m.Entries))
	if c := min(m.CommitSeq, matched); c > r.commit {
		r.commit = c
	}
	if matched >= m.CommitSeq && r.epochAt(m.CommitSeq) == m.Epoch {
		// Whole again: holds everything the leader committed. Only a commit
		// in the leader's own epoch proves that (it covers every earlier
		// commit); before its install commits, a new leader's commit is a
		// stale lower bound — 0 after a restart. An uncertain replica
		// needs a leader newer than its uncertainty: an older one may
		// still count a FLUSHED it sent for entries it lost since.
		r.rebuilding = false
		if m.Epoch > r.uncertainEpoch || r.cfg.Mutations.UncertainClearsOnAnyLeader {
			r.uncertain = false
		}
	}
	r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: m.Epoch, FlushedSeq: matched, Tick: m.Tick})
}

// stepSnapshot rebuilds from the leader's snapshot when the leader no
// longer keeps the entries this replica needs.
func (r *Replica) stepSnapshot(m Message) {
	if m.PrevSeq > 0 && (m.PrevEpoch == 0 || m.PrevEpoch > m.Epoch) {
		return // malformed: no leader of m.Epoch has such a snapshot
	}
	if m.Epoch < r.hard.Promised {
		r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: r.hard.Promised, Reject: RejectStaleEpoch})
		return
	}
	if m.Epoch == r.hard.Promised && ((r.role == Leader) || (r.role == Follower && r.leader != 0 && r.leader != m.From)) {
		r.anomalies++
		return
	}
	if m.Epoch > r.hard.Promised || r.role != Follower || r.leader != m.From {
		r.becomeFollower(m.Epoch, m.From)
	}
	r.electionElapsed, r.heardLeaderTick = 0, r.ticks+1
	r.endPreVote() // heard the leader
	seq, epoch := m.PrevSeq, m.PrevEpoch
	if !r.rebuilding && (seq <= r.snapSeq || (seq <= r.last && r.epochAt(seq) == epoch)) {
		// Already holds the snapshot's prefix (a leader whose next index
		// for us went stale sends this too): installing would throw away
		// entries above it that we may have acknowledged as flushed.
		if c := min(m.CommitSeq, seq); c > r.commit {
			r.commit = c
		}
		r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: m.Epoch, FlushedSeq: max(seq, r.snapSeq), Tick: m.Tick})
		return
	}
	r.pending.Snapshot = &SnapshotMeta{Seq: seq, Epoch: epoch}
	r.pending.Entries, r.pending.Truncate = nil, false
	r.epochs = []EpochStart{{Epoch: epoch, StartSeq: seq}}
	r.last, r.durable, r.snapSeq, r.commit = seq, seq, seq, seq
	r.rebuilding = false
	r.send(Message{Type: MsgAppendAck, To: m.From, Epoch: m.Epoch, FlushedSeq: seq, Tick: m.Tick})
}

func (r *Replica) stepAppendAck(m Message) {
	if m.Epoch > r.hard.Promised {
		r.becomeFollower(m.Epoch, 0) // STALE_LEADER_EPOCH: demote, catch up later
		return
	}
	// A FLUSHED of an older epoch (S18) says what the sender held of
	// that epoch's log — which this replica may no longer hold itself:
	// restarted without fsyncing its tail, it reused those seqs for this
	// epoch's entries. Counting it would commit entries no quorum holds.
	if r.role != Leader || (m.Epoch != r.hard.Promised && !r.cfg.Mutations.AcceptStaleFlushed) {
		return
	}
	i := slices.Index(r.peers, m.From)
	if i < 0 {
		return
	}
	r.heard[i] = 0
	if m.Tick <= r.ticks && m.Tick > r.leaseFrom[i] && !r.cfg.Mutations.LeaseFromReceipt {
		r.leaseFrom[i] = m.Tick
	}
	r.updateReadOnly()
	switch m.Reject {
	case RejectMismatch:
		r.next[i] = max(1, min(r.next[i]-1, m.HintSeq+1))
		r.dirty[i] = true
	case RejectNone:
		if m.FlushedSeq > r.match[i] {
			r.match[i] = m.FlushedSeq
			r.maybeCommit()
			r.maybeTimeoutNow()
		}
		r.next[i] = max(r.next[i], m.FlushedSeq+1)
		if r.next[i] <= r.last {
			r.dirty[i] = true
		}
	}
}

// heardFrom counts the replicas a leader heard from within the ack
// timeout, itself included.
func (r *Replica) heardFrom() int {
	alive := 1
	for i := range r.peers {
		if i != r.self && r.heard[i] <= r.cfg.AckTimeoutTicks {
			alive++
		}
	}
	return alive
}

func (r *Replica) updateReadOnly() {
	need := r.quorum
	if r.cfg.Policy == SyncAll {
		need = len(r.peers)
	}
	r.readOnly = r.heardFrom() < need
}

// maybeCommit advances commit to the highest seq of this epoch that enough
// replicas flushed: a majority under SyncQuorum, all under SyncAll.
func (r *Replica) maybeCommit() {
	flushed := slices.Clone(r.match)
	flushed[r.self] = r.durable
	slices.Sort(flushed)
	var c uint64
	switch {
	case r.cfg.Mutations.CommitOnLeaderFlushAlone:
		c = r.durable
	case r.cfg.Policy == SyncAll:
		c = flushed[0]
	default:
		c = flushed[len(flushed)-r.quorum]
	}
	if c > r.commit && c >= r.installAt && r.epochAt(c) == r.hard.Promised {
		r.commit = c
	}
}

// Ready returns the work accumulated since the last Advance: persist, then
// send (see Ready). Call Advance once it is done.
func (r *Replica) Ready() Ready {
	if r.role == Leader {
		for i, p := range r.peers {
			if r.dirty[i] {
				r.dirty[i] = false
				r.send(r.appendFor(i, p))
			}
		}
	}
	rd := r.pending
	if r.hardChanged {
		h := r.hard
		rd.HardState = &h
	}
	if r.commit > r.lastCommitOut {
		rd.CommitSeq = r.commit
	}
	if !r.hardChanged && slices.ContainsFunc(rd.Messages, isAppend) {
		var late []Message
		for _, m := range rd.Messages {
			if isAppend(m) {
				rd.Early = append(rd.Early, m)
			} else {
				late = append(late, m)
			}
		}
		rd.Messages = late
	}
	return rd
}

func isAppend(m Message) bool { return m.Type == MsgAppend }

// appendFor builds the Append for peer i from its next seq, advancing next
// optimistically (a loss comes back as a mismatch and resets it).
func (r *Replica) appendFor(i int, p NodeID) Message {
	if r.next[i] <= r.snapSeq {
		// The entries this follower needs are compacted: it must rebuild
		// from the snapshot, then continue from its end.
		r.next[i] = r.snapSeq + 1
		return Message{Type: MsgSnapshot, To: p, Epoch: r.hard.Promised, PrevSeq: r.snapSeq, PrevEpoch: r.epochAt(r.snapSeq), CommitSeq: r.commit, Tick: r.ticks}
	}
	prev := r.next[i] - 1
	m := Message{Type: MsgAppend, To: p, Epoch: r.hard.Promised, PrevSeq: prev, PrevEpoch: r.epochAt(prev), CommitSeq: r.commit, Tick: r.ticks}
	if r.next[i] <= r.last {
		m.FirstSeq = r.next[i]
		m.LastSeqSent = min(r.last, r.next[i]+uint64(r.cfg.AppendEntriesMax)-1)
		r.next[i] = m.LastSeqSent + 1
	}
	return m
}

// AppendShort tells the replica that an Append it built for peer `to` left
// with its entries only through sent: the shell's read of the range
// stopped short (a bound on the bytes of one read), and appendFor counted
// the whole range as sent. The next Append to that peer then starts after
// sent, not after the range: one that starts further on would only be
// refused as a mismatch, a round trip lost for every short read of a
// catch-up. It never moves the peer's next entry forward, so a late or
// repeated call costs a resend at worst.
func (r *Replica) AppendShort(to NodeID, sent uint64) {
	if i := r.peerIndex(to); i >= 0 {
		r.next[i] = min(r.next[i], sent+1)
	}
}

// Advance reports that the last Ready was carried out: its state is durable
// and its messages are sent. Nothing may reach the replica between Ready
// and Advance (no Step, Tick, Propose or other call that changes it):
// Advance marks everything up to the log's end durable and drops whatever
// was pending, so an entry proposed in between would count as flushed
// without being written, and a message queued in between would be lost.
// Every driver carries out a Ready through Executor.Begin and Finish
// before it takes the next event (the model checker explores only a crash
// in between).
func (r *Replica) Advance(rd Ready) {
	if len(rd.Entries) > 0 || rd.Truncate || rd.Snapshot != nil {
		r.durable = r.last
	}
	r.pending = Ready{}
	r.hardChanged = false
	if rd.CommitSeq > r.lastCommitOut {
		r.lastCommitOut = rd.CommitSeq
	}
	if r.role == Leader {
		r.maybeCommit()
	}
}

// Status is a read-only view for tools, tests and checkers.
type Status struct {
	ID        NodeID
	Role      Role
	Hard      HardState
	Leader    NodeID
	Last      uint64
	Durable   uint64
	CommitSeq uint64
	ReadOnly  bool
	Epochs    []EpochStart
	// Anomalies counts messages refused because no correct peer could have
	// sent them (a second leader of an epoch, a rewrite of a committed entry).
	Anomalies uint64
	// SnapSeq is where the log was compacted; Rebuilding is true while the
	// replica's log is incomplete (never promotable then).
	SnapSeq    uint64
	Rebuilding bool
	// Uncertain: the log may lack entries this replica acknowledged as
	// flushed (Persisted.Uncertain); cleared once a newer leader made it
	// whole.
	Uncertain bool
	// PromiseLost: the hard state was lost and not every peer has
	// reported its promise yet (Persisted.PromiseLost); the replica takes
	// no part in the group meanwhile.
	PromiseLost bool
	// Peers is the leader's view of every other replica.
	Peers []PeerStatus
	// TransferTo: the replica this leader is handing leadership to
	// (TransferTo; 0: none). It takes no proposal meanwhile.
	TransferTo NodeID
	// TransferWanted: under ReleaseBeforeTransfer, the replica this
	// leader would hand leadership to now (0: none); the shell releases
	// what depends on the lease, then calls TransferTo with it.
	TransferWanted NodeID
	// LeaseTicks: for a leader, how many more ticks no other replica can
	// take office, by its own reckoning (0 for any other role, and while
	// handing leadership over). The shell turns it into a local lease
	// guard (the scheduler acts for a shard only while it is open).
	LeaseTicks int
	// LeaseFrom: while LeaseTicks > 0, the tick (of Ticks' count) the
	// lease dates from — its quorum's oldest latest answered Append was
	// sent in it; the lease ends LeaseSpan ticks after it. A shell that
	// skips ticks (a held-up goroutine drops them) dates the lease on its
	// clock from this tick, not from the current one (LeaseOnTheClock).
	LeaseFrom uint64
	// LeaderSilent: this follower (or candidate) no longer holds its
	// leader's lease (leaseExpired): it knows none, or has not heard from it
	// for ElectionTicks — it may be dead, so the shell must not point
	// clients at it. Always false on a leader.
	LeaderSilent bool
}

// PeerState is a leader's classification of a follower.
type PeerState uint8

const (
	InSync       PeerState = iota // flushed everything committed
	CatchingUp                    // behind, served from the leader's log
	NeedsRebuild                  // behind the leader's compacted prefix: snapshot required
)

func (s PeerState) String() string {
	switch s {
	case InSync:
		return "InSync"
	case CatchingUp:
		return "CatchingUp"
	case NeedsRebuild:
		return "NeedsRebuild"
	}
	return fmt.Sprintf("PeerState(%d)", uint8(s))
}

// PeerStatus is one follower as its leader sees it.
type PeerStatus struct {
	ID    NodeID
	Match uint64
	State PeerState
	// Silent: the leader has not heard from it for AckTimeoutTicks (it
	// does not count toward the quorum then); State is its last known.
	Silent bool
}

// Status returns the replica's current view.
func (r *Replica) Status() Status {
	st := Status{ID: r.cfg.ID, Role: r.role, Hard: r.hard, Leader: r.leader, Last: r.last, Durable: r.durable,
		CommitSeq: r.commit, ReadOnly: r.readOnly, Epochs: slices.Clone(r.epochs), Anomalies: r.anomalies,
		SnapSeq: r.snapSeq, Rebuilding: r.rebuilding, Uncertain: r.uncertain, PromiseLost: r.lost, Peers: r.peerStatus(),
		TransferTo: r.transferee, TransferWanted: r.transferWanted, LeaderSilent: r.role != Leader && r.leaseExpired()}
	if from := r.leaseStart(); from != 0 {
		if left := int64(r.LeaseSpan()) - int64(r.ticks-from); left > 0 {
			st.LeaseTicks, st.LeaseFrom = int(left), from
		}
	}
	return st
}

// Ticks is how many ticks this replica counted: 1 at New, then one more
// each Tick (a Message's Tick is this count as of its sending).
func (r *Replica) Ticks() uint64 { return r.ticks }

// LeaseSpan is how many ticks a lease lasts from its LeaseFrom tick: half
// an election timeout (leaseStart).
func (r *Replica) LeaseSpan() int { return r.cfg.ElectionTicks / 2 }

// leaseStart is the tick a leader's lease dates from (0: it holds none);
// the lease lasts LeaseSpan ticks from it (Status.LeaseTicks): a quorum
// (this leader included) answered Appends it sent in that tick or later,
// and each of those followers refuses to help elect another replica (no
// pre-vote grant: leaseExpired) for at least ElectionTicks after it last
// heard this leader, which was before its answer. Half of ElectionTicks
// is kept back for the answers' transit and for tick rates that differ
// between nodes. A leader handing over (TIMEOUT_NOW skips the pre-vote)
// holds none.
func (r *Replica) leaseStart() uint64 {
	if r.role != Leader || r.transferee != 0 {
		return 0
	}
	if r.quorum == 1 {
		return r.ticks // nobody else can take office
	}
	since := make([]uint64, 0, len(r.peers)-1)
	for i := range r.peers {
		if i != r.self {
			if r.cfg.Mutations.LeaseFromReceipt {
				since = append(since, r.ticks-uint64(r.heard[i])) // the answer's arrival
				continue
			}
			since = append(since, r.leaseFrom[i])
		}
	}
	slices.Sort(since)
	return since[len(since)-(r.quorum-1)] // the quorum's oldest latest Append
}

func (r *Replica) peerStatus() []PeerStatus {
	if r.role != Leader {
		return nil
	}
	var out []PeerStatus
	for i, id := range r.peers {
		if i == r.self {
			continue
		}
		st := CatchingUp
		switch {
		case r.match[i] >= max(r.commit, r.installAt):
			// In sync: holds everything committed — and, until this epoch's
			// install commits (the commit is then a stale lower bound, 0
			// after a restart), everything up to the install entry.
			st = InSync
		case r.match[i] < r.snapSeq || r.revoked[i]:
			st = NeedsRebuild
		}
		out = append(out, PeerStatus{ID: id, Match: r.match[i], State: st, Silent: r.heard[i] > r.cfg.AckTimeoutTicks})
	}
	return out
}

// HasReady reports whether Ready would return work.
func (r *Replica) HasReady() bool {
	if r.hardChanged || len(r.pending.Entries) > 0 || r.pending.Truncate || len(r.pending.Messages) > 0 || r.commit > r.lastCommitOut || r.pending.Snapshot != nil {
		return true
	}
	return r.role == Leader && slices.Contains(r.dirty, true)
}
