package replica

// Leadership transfer: a leader hands its group to a chosen follower
// without waiting for an election timeout (Raft §3.10, on Prepare/Install).
// The leader stops taking proposals, waits until the target has flushed
// its whole log, then sends TIMEOUT_NOW; the target campaigns at once
// (forced, no pre-vote). Its lineage is the leader's own, so the old
// leader grants the PREPARE it receives (promising the newer epoch is
// what demotes it), and so does any replica that holds no more than the
// leader did. A hand-off that has not ended within TransferTicks is
// abandoned and the leader takes proposals again.
//
// Safety does not rest on any of this: a transfer only makes one
// replica campaign, which any replica may do at any time. The guards
// here keep a transfer from costing more than one election: writes stop
// (else the target's lineage falls behind and the old leader refuses
// it), TIMEOUT_NOW waits for the target to hold everything (else it
// campaigns with a shorter log and loses), it is obeyed only from the
// current leader in its epoch (else a stale one deposes a later leader),
// and the refusal of writes is bounded in time.

import (
	"fmt"
	"slices"
)

// TransferTo starts handing leadership to replica id: no proposal is
// taken from now on (ErrTransferring) until the transfer ends — this
// replica no longer leads — or is abandoned after TransferTicks ticks.
// It fails when this replica does not lead, is read-only, id is not
// another member, or a transfer to another replica is in progress; a
// second call for the same target changes nothing.
func (r *Replica) TransferTo(id NodeID) error {
	switch {
	case r.role != Leader:
		return ErrNotLeader
	case id == r.cfg.ID || r.peerIndex(id) < 0:
		return fmt.Errorf("replica: cannot transfer leadership to %d: not another member of %v", id, r.peers)
	case r.transferee == id:
		return nil
	case r.transferee != 0:
		return ErrTransferring
	case r.readOnly:
		return ErrQuorumLost
	}
	r.transferee, r.transferElapsed, r.timeoutNowSent = id, 0, false
	r.rebalanceIdle, r.transferWanted = 0, 0
	r.dirty[r.peerIndex(id)] = true // an Append now: its answer may be the last one needed
	r.maybeTimeoutNow()
	return nil
}

// maybeTimeoutNow sends TIMEOUT_NOW once the transfer's target has
// flushed the leader's last entry (nothing is appended meanwhile).
func (r *Replica) maybeTimeoutNow() {
	if r.transferee == 0 || r.timeoutNowSent {
		return
	}
	i := r.peerIndex(r.transferee)
	if r.match[i] < r.last && !r.cfg.Mutations.TimeoutNowBeforeCaughtUp {
		return // the target would campaign with a shorter log than ours, and lose
	}
	r.timeoutNowSent = true
	r.send(Message{Type: MsgTimeoutNow, To: r.transferee, Epoch: r.hard.Promised, LastEpoch: r.lastEpoch(), LastSeq: r.last})
}

// endTransfer forgets a transfer in progress (it succeeded: this replica
// stopped leading; or it is abandoned).
func (r *Replica) endTransfer() {
	r.transferee, r.transferElapsed, r.timeoutNowSent = 0, 0, false
	r.transferWanted = 0
}

// tickTransfer is a leader's tick for transfers: it abandons one that
// took TransferTicks, then considers handing leadership to the
// preferred leader.
func (r *Replica) tickTransfer() {
	if r.transferee != 0 {
		r.transferElapsed++
		if r.transferElapsed >= r.cfg.TransferTicks && !r.cfg.Mutations.TransferNeverAbandoned {
			r.endTransfer() // the target did not take over: lead on
		}
	}
	p := r.cfg.PreferredLeader
	if p == 0 || p == r.cfg.ID {
		return
	}
	r.rebalanceIdle = min(r.rebalanceIdle+1, r.cfg.RebalanceEveryTicks)
	if r.keepsUp(r.peerIndex(p)) {
		r.preferredStable = min(r.preferredStable+1, r.cfg.RebalanceStableTicks)
	} else {
		r.preferredStable = 0
	}
	stable := r.preferredStable >= r.cfg.RebalanceStableTicks
	rested := r.rebalanceIdle >= r.cfg.RebalanceEveryTicks
	if r.transferWanted != 0 && !r.cfg.Mutations.TransferWithoutRelease {
		// Reported to the shell, which may be draining for it, or have
		// asked for it already: it stays wanted until the shell hands
		// off (TransferTo) or this replica stops leading (endTransfer),
		// so the shell never sees it withdrawn while its request is on
		// the way (WantedUntilReleased).
		return
	}
	r.transferWanted = 0
	switch {
	case r.transferee != 0 || !stable || !rested:
	case r.cfg.ReleaseBeforeTransfer && !r.cfg.Mutations.TransferWithoutRelease:
		if !r.readOnly {
			r.transferWanted = p // the shell releases, then calls TransferTo
		}
	default:
		_ = r.TransferTo(p) // refused while read-only: tried again on a later tick
	}
}

// keepsUp reports whether follower i looks fit to lead: heard within half
// an election timeout, and holding everything committed or within one
// Append of the leader's log (under load a healthy replica is often a
// few entries behind the commit point).
func (r *Replica) keepsUp(i int) bool {
	if r.heard[i] > r.cfg.ElectionTicks/2 {
		return false
	}
	return r.match[i] >= max(r.commit, r.installAt) || r.last-r.match[i] <= uint64(r.cfg.AppendEntriesMax)
}

// stepTimeoutNow campaigns at once on the leader's word. Only the leader
// this replica follows, in the epoch it promised, may ask: a TIMEOUT_NOW
// that outlived its epoch (delayed, duplicated, or from a deposed leader)
// would depose a leader nobody wants to replace.
func (r *Replica) stepTimeoutNow(m Message) {
	if !r.cfg.Mutations.TimeoutNowAnyEpoch && (m.Epoch != r.hard.Promised || r.role != Follower || r.leader != m.From) {
		return
	}
	r.Campaign() // a rebuilding replica does not campaign: the transfer is abandoned
}

// peerIndex is id's index in peers (-1: not a member).
func (r *Replica) peerIndex(id NodeID) int { return slices.Index(r.peers, id) }
