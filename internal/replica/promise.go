package replica

import "slices"

// Recovering a lost promise. A replica whose hard state cannot be read
// (a damaged file) does not know which epochs it promised: granting or
// following any epoch at or below one it promised could break
// OneLeaderPerEpoch, or let an older leader commit past a newer one's
// lineage (the newer candidate counted this replica's grant). So it
// takes no part in the group until it learns an upper bound of every
// promise it may have made: each promise went to a candidate — a peer,
// or itself — that persisted that epoch as its own promise first
// (campaign), and a promise to itself that no peer granted elected
// nobody and died with the restart. Every peer's durable promise, asked
// after the loss, is therefore at least every epoch this replica
// promised to another or that won with its grant; their highest is the
// bound (PromiseBoundedByEveryPeer). A majority's reports are not
// enough: the candidate it promised to may be the peer that did not
// answer.
//
// A peer whose own promise is lost has no bound to give (its lower bound
// is none): it answers PROMISE_UNKNOWN. It restarted since any campaign
// it ran, so what this replica promised it needs a bound only if that
// campaign won before the restart — and then a quorum granted it. Every
// quorum holds a member that reported as long as the lost replicas, this
// one included, are at most replicas minus quorum
// (LostPeersFewerThanAQuorum), and that member's report bounds the epoch
// if it was asked after the lost peer answered (ReportsAfterTheLostPeer):
// the member may have granted the campaign after a report it gave
// earlier. So a PROMISE_UNKNOWN clears the reports heard so far, and the
// loss ends once every peer answered, a report or PROMISE_UNKNOWN, within
// that bound. Two lost replicas of five both take part again; two of
// three still wait, as the damage bound (a minority) allows: with one
// healthy member, a quorum could have elected a leader no report bounds.

// losePromise starts a lost promise's recovery (New): the hard state is
// only a lower bound — no replica accepts entries of an epoch above its
// promise, so its log's last epoch is one.
func (r *Replica) losePromise(nonce uint64) {
	floor := max(r.hard.Promised, r.lastEpoch())
	r.hard = HardState{Promised: floor}
	r.lost, r.lostNonce, r.reportMax = true, nonce, floor
	clear(r.reported)
	clear(r.unknown)
	r.reported[r.self] = true
	// The first tick asks every peer.
	r.heartbeatElapsed = r.cfg.HeartbeatTicks - 1
	if r.cfg.Mutations.PromiseLostNotRecovered {
		for i := range r.reported {
			r.reported[i] = true // as if every peer reported the floor
		}
	}
	r.recoverPromise()
}

// tickLost asks the peers that have not reported yet, every
// HeartbeatTicks: a query or its report may be lost, and a peer may not
// have opened the group yet. A peer that answered it is lost is asked
// again too: it may have recovered since, and its report is a bound.
func (r *Replica) tickLost() {
	r.heartbeatElapsed++
	if r.heartbeatElapsed < r.cfg.HeartbeatTicks {
		return
	}
	r.heartbeatElapsed = 0
	for i, p := range r.peers {
		if !r.reported[i] {
			r.send(Message{Type: MsgPromiseQuery, To: p, Tick: r.lostNonce})
		}
	}
}

// stepPromiseReport counts a peer's report of its promise, or its word
// that its promise is lost too (PROMISE_UNKNOWN). A report that does not
// carry this loss's nonce answers a query of a former loss: the peer's
// promise then may predate epochs this replica promised since.
func (r *Replica) stepPromiseReport(m Message) {
	i := slices.Index(r.peers, m.From)
	if i < 0 || m.Tick != r.lostNonce {
		return
	}
	if m.Type == MsgPromiseUnknown {
		if r.unknown[i] || r.reported[i] {
			return // a report it gave since this loss bounds it already
		}
		r.unknown[i] = true
		// The reports heard so far may predate a grant their senders gave
		// the lost peer's campaign after this replica's loss, which may
		// have won with this replica's grant from before it: only reports
		// asked once that campaign is dead — the peer answered it is lost,
		// so it restarted — bound its epoch (ReportsAfterTheLostPeer).
		if !r.cfg.Mutations.UnknownKeepsReports {
			clear(r.reported)
			r.reported[r.self] = true
		}
	} else {
		r.reported[i], r.unknown[i] = true, false
		r.reportMax = max(r.reportMax, m.Epoch)
	}
	r.recoverPromise()
}

// recoverPromise ends the loss once every peer reported (a majority under
// the PromiseFromQuorumReports mutation): the replica promises the highest
// report, to no one, and becomes a follower that knows no leader. The
// hard state is written even when the bound equals the floor: the file
// on disk is still the damaged one.
func (r *Replica) recoverPromise() {
	n, unknown := 0, 0 // reports (its own floor included), peers lost too
	for i, ok := range r.reported {
		switch {
		case ok:
			n++
		case r.unknown[i]:
			unknown++
		}
	}
	// Peers lost too count only while the lost, this one included, are
	// at most replicas minus quorum.
	everyPeer := n+unknown == len(r.peers) &&
		(unknown == 0 || 1+unknown <= len(r.peers)-r.quorum || r.cfg.Mutations.LostPeersUnbounded)
	if !everyPeer && !(r.cfg.Mutations.PromiseFromQuorumReports && n >= r.quorum) {
		return
	}
	r.setHard(r.reportMax, 0)
	r.hardChanged = true
	r.lost = false
	clear(r.reported)
	clear(r.unknown)
	if r.uncertain {
		// Its promise when it became uncertain is unknown too: only a
		// leader of an epoch newer than the bound may make it whole.
		r.uncertainEpoch = max(r.uncertainEpoch, r.reportMax)
	}
	r.role, r.leader = Follower, 0
	r.heartbeatElapsed = 0
	r.resetElectionTimer()
}
