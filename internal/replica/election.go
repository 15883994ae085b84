package replica

// Elections: pre-vote rounds that persist nothing, then Prepare/Install —
// promises persisted before they are sent, a majority of grants to lead,
// grants only to a lineage at least as good as the granter's.

import "slices"

// Campaign starts an election now instead of waiting for the election
// timeout: a forced, immediate campaign with no pre-vote round — it
// persists the promise of the next epoch and PREPAREs at once, fencing a
// leader the others may still hear. For the tests, the model checker
// (whose "times out and campaigns" action is this), a brand-new group's
// first election (the node shell) and the target of a leadership
// transfer (MsgTimeoutNow, transfer.go); an election timeout (Tick)
// pre-votes first instead. A leader, a rebuilding replica and one whose
// promise is lost (promise.go) ignore it.
func (r *Replica) Campaign() {
	if r.role != Leader && !r.barred() && !r.lost {
		r.campaign(true)
	}
}

// ElectionTimeout does what the election timer does when it runs out: it
// starts a pre-vote round (a single replica campaigns at once). Tick calls
// it; a driver that keeps time itself (the model checker) calls it
// directly. A leader, a rebuilding replica and one whose promise is lost
// ignore it.
func (r *Replica) ElectionTimeout() {
	if r.role != Leader && !r.barred() && !r.lost {
		r.preVote()
	}
}

// preVote starts a pre-vote round for the next epoch: it asks the others
// whether they would promise it, changing and persisting nothing, and
// campaigns only once a majority (itself included) would (stepPreVoteAck).
// A single replica has no leader to disrupt and campaigns at once.
func (r *Replica) preVote() {
	if r.quorum == 1 {
		r.campaign(false)
		return
	}
	r.resetElectionTimer()
	r.preVoting = true
	clear(r.preGrants)
	clear(r.preAnswered)
	r.preGrants[r.self], r.preAnswered[r.self] = true, true
	r.heartbeatElapsed = 0
	r.resendPreVotes()
}

// resendPreVotes asks every peer that has not answered the round yet (at
// its start: every peer), and again every HeartbeatTicks until the round
// ends or the election timer fires again: without it a PRE_VOTE lost to
// the network cost a whole election timeout. Asking again changes nothing
// at a peer (stepPreVote), so a repeat is as harmless as the first.
func (r *Replica) resendPreVotes() {
	for i, p := range r.peers {
		if !r.preAnswered[i] {
			r.send(Message{Type: MsgPreVote, To: p, Epoch: r.hard.Promised + 1, LastEpoch: r.lastEpoch(), LastSeq: r.last})
		}
	}
}

// endPreVote ends the pre-vote round, if any, back to the state before it.
func (r *Replica) endPreVote() {
	r.preVoting = false
	clear(r.preGrants)
	clear(r.preAnswered)
}

// leaseExpired reports whether this replica no longer holds its leader's
// lease, so it may help elect another: a follower that has heard no
// leader since it started, or none for ElectionTicks — whichever epoch it
// promised since — or is pre-voting itself (its own timer fired and it
// has heard nothing since); a leader only once it lost its quorum —
// read-only degraded under sync_quorum. A sync_all
// leader that is read-only because one replica lags but still hears a
// majority keeps its lease: granting would let that very replica (which
// no other grants) win with the leader's own answer.
func (r *Replica) leaseExpired() bool {
	if r.role == Leader {
		return r.heardFrom() < r.quorum
	}
	if r.cfg.Mutations.LeaseForgottenWithTheLeader {
		return r.leader == 0 || r.preVoting || r.electionElapsed >= r.cfg.ElectionTicks
	}
	// Measured from the last leader heard, not from r.leader: a follower
	// that adopts a later epoch without a leader (a PREPARE's, or a
	// refusal's that carried it) forgets whom it followed, not what its
	// answers vouched for (LeaseOutlivesTheEpoch).
	return r.heardLeaderTick == 0 || r.preVoting || r.ticks+1-r.heardLeaderTick >= uint64(r.cfg.ElectionTicks)
}

// campaign persists a promise of the next epoch to itself and PREPAREs;
// forced: without a pre-vote round (Campaign), so replicas that still
// hear a leader grant it too.
func (r *Replica) campaign(forced bool) {
	r.setHard(r.hard.Promised+1, r.cfg.ID)
	r.role, r.leader = Candidate, 0
	r.endPreVote()
	r.endTransfer()
	r.resetElectionTimer()
	clear(r.grants)
	clear(r.uncertainGrants)
	clear(r.damagedRefusals)
	r.grants[r.self], r.uncertainGrants[r.self] = true, r.uncertain
	r.heartbeatElapsed = 0
	if r.granted() {
		r.becomeLeader()
		return
	}
	r.sendPrepares(forced)
}

// resendPrepares PREPAREs the epoch it campaigns for again to every peer
// that has not answered it, every HeartbeatTicks from the campaign's
// start until it wins or its election times out. A PREPARE is lost when
// its peer has not opened the group yet (a brand-new topic's first
// campaign races the other members applying its DECLARE) or when the
// network drops it; without a re-send, such a campaign waits out a whole
// election timeout, then a pre-vote round and a new epoch. A re-send is
// never forced, even for a forced campaign: it answers a lost message,
// not a decision to fence a leader, so only replicas whose lease on a
// leader has expired grant it — all of them in a group's first election,
// none while a leader that gave up a hand-off to this candidate leads
// again (a forced re-send would depose it). Granters answer a repeated
// PREPARE as they did the first (stepPrepare's renewed promise).
func (r *Replica) resendPrepares() { r.sendPrepares(false) }

// sendPrepares PREPAREs the promised epoch to every peer that has not
// answered it yet (at the campaign's start: every peer).
func (r *Replica) sendPrepares(forced bool) {
	for i, p := range r.peers {
		if i != r.self && !r.grants[i] && !r.damagedRefusals[i] {
			r.send(Message{Type: MsgPrepare, To: p, Epoch: r.hard.Promised, LastEpoch: r.lastEpoch(), LastSeq: r.last, Forced: forced})
		}
	}
}

// granted reports whether the candidate's grants elect it. A grant
// promises the epoch and vouches that the candidate's lineage holds the
// granter's log; a majority of them meets every quorum that committed an
// entry, so the winner holds every committed entry. An uncertain granter
// (Persisted.Uncertain) may have lost an entry it flushed: its grant
// vouches for less than the commit counted on. Safety then rests on the
// damage bound the group is built for — at most len(peers)-quorum
// replicas lose data they flushed — minus the ones known to have
// (damaged refusals): the candidate needs enough grants that, with
// every granter it cannot trust wrong, no quorum is left outside them.
// A group whose every replica answers elects as before.
func (r *Replica) granted() bool {
	n, uncertain, damaged := 0, 0, 0
	for i, g := range r.grants {
		switch {
		case g && r.uncertainGrants[i] && !r.cfg.Mutations.TrustUncertainGrants:
			uncertain++
			n++
		case g:
			n++
		case r.damagedRefusals[i]:
			damaged++
		}
	}
	if r.cfg.Mutations.InstallWithoutQuorum && n >= 1 {
		return true
	}
	budget := max(0, len(r.peers)-r.quorum-damaged)
	return n >= r.quorum && len(r.peers)-n+min(uncertain, budget) < r.quorum
}

// becomeLeader takes office for the promised epoch: INSTALL is the first
// Append of the epoch, carrying an install entry. Entries of older epochs
// commit only through it (counting replicas never commits them directly).
func (r *Replica) becomeLeader() {
	r.role, r.leader, r.readOnly = Leader, r.cfg.ID, false
	r.endPreVote()
	r.endTransfer()
	r.preferredStable, r.rebalanceIdle = 0, 0
	r.heartbeatElapsed = 0
	for i := range r.peers {
		r.match[i], r.next[i], r.heard[i], r.dirty[i] = 0, r.last+1, 0, i != r.self
		r.leaseFrom[i] = 0 // a lease is of this reign's Appends
		r.chaseLag[i], r.chaseAge[i], r.revoked[i] = 0, 0, false
	}
	r.appendEntry(Entry{Seq: r.last + 1, Epoch: r.hard.Promised})
	r.installAt = r.last
	// Elected by grants that vouch for every committed entry (granted), in
	// an epoch newer than its uncertainty: nothing it lost can commit now.
	r.uncertain = false
}

// stepPreVote answers whether this replica would promise m.Epoch to m.From
// were it to campaign: only for a newer epoch than its promise, when it is
// not rebuilding, the candidate's lineage is at least as good as its own,
// and its lease on the leader has expired. Answering changes nothing here
// — no promise, no timer — so a pre-vote cannot disturb a healthy group.
func (r *Replica) stepPreVote(m Message) {
	granted := m.Epoch > r.hard.Promised && !r.barred() &&
		(r.cfg.Mutations.GrantIgnoresLineage || lineageAtLeast(m.LastEpoch, m.LastSeq, r.lastEpoch(), r.last)) &&
		(r.cfg.Mutations.PreVoteIgnoresLease || r.leaseExpired())
	epoch := r.hard.Promised
	if granted {
		epoch = m.Epoch
	}
	r.send(Message{Type: MsgPreVoteAck, To: m.From, Epoch: epoch, Granted: granted})
}

// stepPreVoteAck counts pre-grants for the round in progress and
// campaigns for real with a majority; a refusal from a newer epoch means
// this replica is behind: it adopts that epoch as a follower.
func (r *Replica) stepPreVoteAck(m Message) {
	from := slices.Index(r.peers, m.From)
	if !m.Granted {
		if m.Epoch > r.hard.Promised {
			r.becomeFollower(m.Epoch, 0)
		} else if r.preVoting && from >= 0 {
			r.preAnswered[from] = true // it would not: no need to ask again
		}
		return
	}
	if !r.preVoting || m.Epoch != r.hard.Promised+1 || from < 0 {
		return // no round in progress, or a stale round's answer
	}
	r.preGrants[from], r.preAnswered[from] = true, true
	n := 0
	for _, g := range r.preGrants {
		if g {
			n++
		}
	}
	if n >= r.quorum {
		r.campaign(false)
	}
}

// stepPrepare promises m.Epoch and grants it to a lineage at least as
// good as this replica's. A replica that still holds its leader's lease
// (leaseExpired) promises nothing to a campaign that was not forced
// (PrepareRespectsLease): it may have granted the candidate's pre-vote
// before it heard the leader again, and answered an APPEND since — which
// gave the leader a lease that a promise now would break.
func (r *Replica) stepPrepare(m Message) {
	renewed := m.Epoch == r.hard.Promised && r.hard.PromisedTo == m.From
	vouching := !m.Forced && !renewed && !r.leaseExpired() && !r.cfg.Mutations.PrepareIgnoresLease
	if m.Epoch <= r.hard.Promised && !renewed || vouching {
		r.send(Message{Type: MsgPrepareAck, To: m.From, Epoch: r.hard.Promised, LastEpoch: r.lastEpoch(), LastSeq: r.last, CommitSeq: r.commit})
		return
	}
	// Promise the epoch even to a candidate with a worse lineage: the
	// promise is what fences the old leader. Grant only a lineage at least
	// as good as ours, so the winner carries every committed entry.
	granted := !r.barred() && (r.cfg.Mutations.GrantIgnoresLineage || lineageAtLeast(m.LastEpoch, m.LastSeq, r.lastEpoch(), r.last))
	to := NodeID(0)
	if granted {
		to = m.From
	}
	if !renewed {
		r.setHard(m.Epoch, to)
		r.role, r.leader, r.readOnly = Follower, 0, false
		r.endPreVote()
		r.endTransfer()
	}
	if granted {
		r.resetElectionTimer()
	}
	r.send(Message{Type: MsgPrepareAck, To: m.From, Epoch: m.Epoch, Granted: granted, LastEpoch: r.lastEpoch(), LastSeq: r.last, CommitSeq: r.commit,
		Uncertain: granted && r.uncertain, Damaged: r.rebuilding})
}

// barred reports whether this replica is kept out of elections by a
// rebuild (RebuildingNeverPromotable): its log lacks a range it may have
// acknowledged, so neither its campaign nor its grant may count.
func (r *Replica) barred() bool {
	return r.rebuilding && !r.cfg.Mutations.RebuildingPromotable
}

func (r *Replica) stepPrepareAck(m Message) {
	if m.Epoch > r.hard.Promised {
		r.becomeFollower(m.Epoch, 0)
		return
	}
	i := slices.Index(r.peers, m.From)
	if r.role != Candidate || m.Epoch != r.hard.Promised || i < 0 || !m.Granted && !m.Damaged {
		return
	}
	if m.Granted {
		r.grants[i], r.uncertainGrants[i] = true, m.Uncertain
	} else {
		r.damagedRefusals[i] = true
	}
	if r.granted() {
		r.becomeLeader()
	}
}
