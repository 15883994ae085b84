// Package model is an explicit-state model checker for the replication
// kernel: it explores every interleaving of a small configuration (a few
// replicas, proposals, elections, crashes — also in the middle of a
// Ready's writes —, message loss and duplication, ack timeouts into
// read-only mode, compactions and snapshot installs) by running the real
// internal/replica code through the shared Ready executor, hashes each
// state to visit it once, checks the DESIGN §4 invariants in every state,
// and returns the shortest-found action trace to a violation.
package model

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/replica"
)

// Config bounds the exploration. Every budget limits how often an action
// kind may occur along one path.
type Config struct {
	Replicas  int
	Policy    replica.AckPolicy
	Proposals int // values proposed
	Campaigns int // election timeouts
	// PreVote: an election timeout starts a pre-vote round, as in
	// production (Replica.ElectionTimeout); otherwise it campaigns at once
	// (Replica.Campaign, the forced path). Followers never tick here, so a
	// follower that knows a leader grants a pre-vote only once its own
	// timer fired.
	PreVote bool
	// EarlyAppends: a node carries out a Ready without a promise or a
	// truncation as the replog shell may (the Ready's relaxation): its
	// APPENDs go out as soon as its entries are written, the fsync is a
	// separate action ("fsyncs"), and a kill -9 before it loses those
	// entries. Otherwise every Ready is durable before anything is sent.
	EarlyAppends bool
	// CrashPartial: a kill -9 may land in the middle of a Ready's writes
	// and keep any prefix of them (snapshot install, hard state,
	// truncation, then the entries one by one: a torn tail keeps a prefix
	// of an unsynced append). A Ready that writes the log or installs a
	// snapshot and sent nothing yet offers, while the crash budget lasts,
	// a crash after each prefix besides its fsync; a held Ready whose
	// APPENDs went early (EarlyAppends) offers a crash keeping its durable
	// writes and any prefix of the rest. Truncations and appends are
	// durable only at Sync (the Store contract), so a crash may bring
	// truncated entries back.
	CrashPartial bool
	Heartbeats   int // leader ticks (retransmissions)
	// AckTimeouts: a leader hears nothing for its whole ack timeout
	// (every follower silent: AckTimeoutTicks+1 ticks at once). It goes
	// READ_ONLY_DEGRADED — and its reservations expire, so it may compact
	// past a lagging follower — until FLUSHED answers bring its quorum
	// back. Heartbeats alone never add up to an ack timeout.
	AckTimeouts int
	// Compactions: a node replaces its log up to its RetainFloor with a
	// snapshot (Replica.CompactTo); a follower its leader no longer keeps
	// entries for installs the leader's snapshot (MsgSnapshot).
	Compactions int
	Crashes     int // kill -9 and restart from durable state
	// Damages: a node's last durable entry goes bad and it restarts: its
	// log cuts the entry as a torn tail would (nothing after it proves it
	// was durable) and the node is uncertain (replica.Persisted.Uncertain).
	// Keep it within the damage a group is built for (a minority of
	// nodes: 1 of 3).
	Damages int
	// Rebuilds: an entry of a node's log goes bad and is found as damage
	// (a later batch proves it was durable, or a check found it while the
	// node ran): it drops the entry and everything after it and restarts
	// rebuilding (replica.Persisted.Rebuilding), out of elections until a
	// leader made it whole (RB). Within a minority of nodes too.
	Rebuilds int
	// PromiseLosses: a node's hard state goes bad and it restarts not
	// knowing its promise (replica.Persisted.PromiseLost): it asks every
	// peer for its promise before it takes part again. Keep it within a
	// minority of nodes too.
	PromiseLosses int
	// Transfers: a leader hands leadership to another node
	// (Replica.TransferTo): it refuses proposals, waits for the target to
	// flush its log, and sends TIMEOUT_NOW, on whose delivery the target
	// campaigns (that campaign takes nothing from Campaigns). An ack
	// timeout also abandons a transfer (TransferTicks is the ack
	// timeout), after which the leader takes proposals again.
	Transfers  int
	Drops      int // messages lost
	Dups       int // messages duplicated
	NetworkMax int // states with more messages in flight are not explored further
	DepthMax   int // actions along one path
	StatesMax  int // distinct states before giving up (reported, not a failure)
	Mutations  replica.Mutations
	// SendBeforePersist breaks the shared executor (replica.Executor): a
	// Ready's messages all go before its writes are durable.
	SendBeforePersist bool
}

// Result is the outcome of a check.
type Result struct {
	Outcome
	MaxEpoch  uint64 // the highest epoch some leader took office in
	Committed int    // the most values any visited state committed
	// Distinct states entered through each kind of event: they show that
	// the exploration reached the new dimensions (0: never).
	MidReadyCrashes int // a kill -9 between a Ready's Begin and its fsync
	// TruncationsUndone: a mid-Ready kill -9 lost a truncation (the
	// truncated entries are back on the disk).
	TruncationsUndone int
	ReadOnly          int // an ack timeout left a leader READ_ONLY_DEGRADED
	ReadOnlyBack      int // a FLUSHED brought a read-only leader's quorum back
	Compactions       int // a node compacted its log
	SnapshotInstalls  int // a follower installed its leader's snapshot
	// AppendsBelowSnapshot: a compacted replica took an APPEND that starts
	// below its snapshot point (S8).
	AppendsBelowSnapshot int
	// UncertainGrants: a candidate received an uncertain node's grant.
	UncertainGrants int
	// TransferCampaigns: a node campaigned on a TIMEOUT_NOW;
	// TransferLeaders: a node took office in the epoch it campaigned for
	// on one (the hand-off completed).
	TransferCampaigns, TransferLeaders int
	// TransfersAbandoned: an ack timeout made a transferring leader give
	// up and take proposals again (its TIMEOUT_NOW may still arrive).
	TransfersAbandoned int
	// PromisesRecovered: a node whose promise was lost learned every
	// peer's and took part again.
	PromisesRecovered int
	// DamagedRefusals: a candidate heard a rebuilding node refuse it;
	// Rebuilt: a rebuilding node was made whole again by a leader.
	DamagedRefusals, Rebuilt int
}

type node struct {
	k *replica.Replica
	// disk is what survives a kill -9; unsynced the truncations and
	// appends written since the last Sync (lost by a kill -9).
	disk
	unsynced []write
	// held is a Ready between the executor's Begin and Finish. Under
	// EarlyAppends its APPENDs went out early; its fsync is an action of
	// its own and the kernel takes no step until then (a shell finishes
	// one Ready before the next event). Under CrashPartial a Ready that
	// sent nothing is held silently: the step that produced it is
	// followed at once by its fsync or by a crash after a prefix of its
	// writes (other nodes cannot tell the difference until it sends).
	held   *replica.Ready
	silent bool
	// pre is the disk before held's Begin; writes are held's writes in
	// order: a crash keeps a prefix of them on pre.
	pre    *disk
	writes []write
	// transferEpoch is the epoch the node last campaigned for on a
	// TIMEOUT_NOW: ghost bookkeeping for Result.TransferLeaders only (not
	// part of the state's identity).
	transferEpoch uint64
}

type state struct {
	nodes     []node
	net       []replica.Message
	used      [budgets]int
	committed []replica.Entry  // ghost: the entry ever committed at seq i+1, with its data (snapshots install it)
	ghost     *invariant.Group // the named invariants' ghost state: each epoch's leader, the committed prefix
	events    event            // how this state was entered (not part of its identity)
	owned     uint64           // nodes this state may write (mut); the others are shared
}

const (
	budgetProposals = iota
	budgetCampaigns
	budgetHeartbeats
	budgetCrashes
	budgetDrops
	budgetDups
	budgetAckTimeouts
	budgetCompactions
	budgetDamages
	budgetTransfers
	budgetPromiseLosses
	budgetRebuilds
	budgets
)

func (c *Config) budget(i int) int {
	return [budgets]int{c.Proposals, c.Campaigns, c.Heartbeats, c.Crashes, c.Drops, c.Dups, c.AckTimeouts, c.Compactions, c.Damages, c.Transfers, c.PromiseLosses, c.Rebuilds}[i]
}

// event marks what the step into a state did, for Result's counts.
type event uint16

const (
	evMidReadyCrash event = 1 << iota
	evTruncationUndone
	evReadOnly
	evReadOnlyBack
	evCompaction
	evSnapshotInstall
	evAppendBelowSnapshot
	evUncertainGrant
	evTransferCampaign
	evTransferLeader
	evTransferAbandoned
	evPromiseRecovered
	evDamagedRefusal
	evRebuilt
)

// errNotCommitted is a snapshot of something else than the committed
// prefix: a CommittedPrefixAgreement violation.
var errNotCommitted = errors.New("CommittedPrefixAgreement")

// clone copies s for a successor. Nodes are shared until an action
// takes one for writing (mut): most actions touch one node.
func (s *state) clone() *state {
	return &state{nodes: slices.Clone(s.nodes), net: slices.Clone(s.net), used: s.used,
		committed: slices.Clone(s.committed), ghost: s.ghost.Clone()}
}

// mut returns node i for writing, copying what s shares with the state it
// was cloned from (held and pre are never written in place).
func (s *state) mut(i int) *node {
	n := &s.nodes[i]
	if s.owned&(1<<i) == 0 {
		n.k, n.disk, n.unsynced, n.writes = n.k.Clone(), n.disk.clone(), slices.Clone(n.unsynced), slices.Clone(n.writes)
		s.owned |= 1 << i
	}
	return n
}

func (s *state) key() [16]byte {
	var b []byte
	for _, n := range s.nodes {
		if n.held == nil {
			b = n.k.AppendState(b, false) // elections are explicit actions here
			b = append(b, 0)
		} else {
			// A kernel between Ready and Advance has no encoding; its
			// future is the fsync (Advance) or a crash, so encode it as
			// the fsync will leave it, plus what the fsync will do and
			// what a crash may keep.
			k := n.k.Clone()
			k.Advance(*n.held)
			b = k.AppendState(b, false)
			b = append(b, 1)
			b = binary.AppendUvarint(b, n.held.CommitSeq)
			for _, m := range n.held.Messages {
				b = replica.AppendMessage(b, m)
			}
			b = append(b, 0)
			b = n.pre.appendState(b)
			for _, w := range n.writes {
				b = w.appendState(b)
			}
			b = append(b, 0)
		}
		b = n.disk.appendState(b)
		for _, w := range n.unsynced {
			b = w.appendState(b)
		}
		b = append(b, 0)
	}
	msgs := make([][]byte, len(s.net))
	for i, m := range s.net {
		msgs[i] = replica.AppendMessage(nil, m)
	}
	slices.SortFunc(msgs, bytes.Compare) // the network is a multiset
	for _, m := range msgs {
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	for _, u := range s.used {
		b = binary.AppendUvarint(b, uint64(u))
	}
	b = s.ghost.AppendKey(b) // the committed prefix (as committed holds it) and the leaders
	return stateKey(b)
}

func (cfg *Config) ids() []replica.NodeID {
	ids := make([]replica.NodeID, cfg.Replicas)
	for i := range ids {
		ids[i] = replica.NodeID(i + 1)
	}
	return ids
}

// ackTimeoutTicks is longer than every heartbeat of a path together, so
// only the ack-timeout action (AckTimeoutTicks+1 ticks) silences peers.
func (cfg *Config) ackTimeoutTicks() int { return cfg.Heartbeats + 1 }

func (cfg *Config) newKernel(id replica.NodeID, n *node) *replica.Replica {
	p := replica.PersistedFromSnapshot(n.hard, n.snapSeq, n.snapEpoch, n.log)
	p.Uncertain, p.Rebuilding = n.uncertain, n.rebuilding
	p.PromiseLost, p.LostNonce = n.promiseLost, n.lostNonce
	// Election timeouts are explicit actions: a huge ElectionTicks keeps
	// ticks from starting elections on their own. Reservations last as
	// long as the ack timeout: an ack-timeout action expires both.
	k, err := replica.New(replica.Config{ID: id, Replicas: cfg.ids(), Policy: cfg.Policy, HeartbeatTicks: 1,
		ElectionTicks: 1 << 20, AckTimeoutTicks: cfg.ackTimeoutTicks(), ReservationTicks: cfg.ackTimeoutTicks(), TransferTicks: cfg.ackTimeoutTicks(),
		Seed: 1, Mutations: cfg.Mutations}, p)
	if err != nil {
		panic(err)
	}
	return k
}

// tookOffice checks OneLeaderPerEpoch and InstallNeedsQuorumPromise.
func (cfg *Config) tookOffice(s *state, i int, epoch uint64) string {
	promised := 0
	for _, n := range s.nodes {
		// A promise counts even if damage took it since: it was made.
		if max(n.hard.Promised, n.promisedBeforeLoss) >= epoch {
			promised++
		}
	}
	if v := s.ghost.TookOffice(uint32(i+1), epoch, promised); v != nil {
		return v.Error()
	}
	return ""
}

func sameEntry(a, b replica.Entry) bool { return a.Epoch == b.Epoch && bytes.Equal(a.Data, b.Data) }

func entryID(e replica.Entry) string { return fmt.Sprintf("%d/%s", e.Epoch, e.Data) }

// checkCommit checks VisibleImpliesQuorumFlushed, CommittedPrefixAgreement
// and VisibleMonotonic for what node i just made visible.
func (cfg *Config) checkCommit(s *state, i int, commit uint64) string {
	if commit == 0 {
		return ""
	}
	n := &s.nodes[i]
	for seq := uint64(1); seq <= commit; seq++ {
		e, ok := n.entry(seq, s.committed)
		if !ok {
			return fmt.Sprintf("VisibleImpliesQuorumFlushed: n%d made %d visible, its log ends at %d", i+1, seq, n.last())
		}
		if int(seq) <= len(s.committed) {
			if v := s.ghost.Agree(uint32(i+1), seq, ghostEntry(e)); v != nil {
				return v.Error()
			}
			continue
		}
		holders := 0
		for _, o := range s.nodes {
			if o.flushed(seq, e, s.committed) {
				holders++
			}
		}
		if v := s.ghost.Visible(uint32(i+1), seq, ghostEntry(e), holders); v != nil {
			return v.Error()
		}
		s.committed = append(s.committed, e)
	}
	return cfg.checkLostIsFinal(s)
}

// checkLostIsFinal: no replica reports Lost (Outcome) for a committed
// entry beyond its own commit point — Lost there is final, however the
// replica knows it (LostBehindALaterEpoch). At or below its commit point
// a compacted entry may be reported Lost while committed: that answer
// only says the proposer cannot know.
func (cfg *Config) checkLostIsFinal(s *state) string {
	for i := range s.nodes {
		k := s.nodes[i].k
		for seq := uint64(len(s.committed)); seq > 0; seq-- {
			e := s.committed[seq-1]
			if k.Outcome(seq, e.Epoch) != replica.Lost {
				continue
			}
			// Status (a copy) only for the rare Lost answer.
			if commit := k.Status().CommitSeq; seq > commit {
				return fmt.Sprintf("LostIsFinal: n%d reports the entry at %d (epoch %d, %s) lost beyond its commit point %d, but it is committed", i+1, seq, e.Epoch, e.Data, commit)
			}
		}
	}
	return ""
}

func ghostEntry(e replica.Entry) invariant.Entry {
	return invariant.Entry{Epoch: e.Epoch, Value: string(e.Data)}
}

// initial is the state every exploration starts from: empty logs, no
// promise, nothing in flight.
func (cfg *Config) initial() *state {
	s := &state{nodes: make([]node, cfg.Replicas), ghost: invariant.NewGroup(cfg.Replicas, cfg.Policy == replica.SyncAll)}
	for i := range s.nodes {
		s.nodes[i].k = cfg.newKernel(replica.NodeID(i+1), &s.nodes[i])
	}
	return s
}

// Check explores the configuration depth-first and returns the first
// violation with its trace, or the counts of a clean exploration.
func Check(cfg Config) Result {
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.NetworkMax == 0 {
		cfg.NetworkMax = 6
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 40
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 500_000
	}
	res := Result{}
	res.Outcome = search[*state]{
		successors: cfg.successors,
		key:        (*state).key,
		visit:      res.count,
		bounded:    func(s *state) bool { return len(s.net) > cfg.NetworkMax },
		depthMax:   cfg.DepthMax,
		statesMax:  cfg.StatesMax,
	}.run(cfg.initial())
	return res
}

// count adds a newly visited state to the result's tallies.
func (res *Result) count(s *state) {
	res.MaxEpoch = max(res.MaxEpoch, s.ghost.LastLedEpoch())
	res.Committed = max(res.Committed, len(s.committed))
	for _, c := range []struct {
		ev event
		n  *int
	}{
		{evMidReadyCrash, &res.MidReadyCrashes}, {evTruncationUndone, &res.TruncationsUndone}, {evReadOnly, &res.ReadOnly}, {evReadOnlyBack, &res.ReadOnlyBack},
		{evCompaction, &res.Compactions}, {evSnapshotInstall, &res.SnapshotInstalls}, {evAppendBelowSnapshot, &res.AppendsBelowSnapshot},
		{evUncertainGrant, &res.UncertainGrants}, {evTransferCampaign, &res.TransferCampaigns}, {evTransferLeader, &res.TransferLeaders},
		{evTransferAbandoned, &res.TransfersAbandoned}, {evPromiseRecovered, &res.PromisesRecovered},
		{evDamagedRefusal, &res.DamagedRefusals}, {evRebuilt, &res.Rebuilt},
	} {
		if s.events&c.ev != 0 {
			*c.n++
		}
	}
}
