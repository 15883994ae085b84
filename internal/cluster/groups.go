package cluster

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Consumer-group commands go through the metadata log too, but only on its
// leader — the group coordinator, where members connect (their NOTICEs
// are pushed on that connection). A groupJob proposes one decided entry
// and answers once this node applied it; it is stepped with the DECLAREs.
// A leader decides only once it took office (TookOffice): until then the
// job waits with its decide.

type groupJob struct {
	decide     func(*meta.State) (meta.Command, error) // nil once decided and proposed
	deadlineMs int64
	seq        uint64 // committed at; 0 while the proposal is out
	outcome    *declareOutcome
	done       func(error)
}

// TookOffice reports whether this node leads the metadata log and has
// applied its epoch's install entry, so that its applied state holds
// everything earlier leaders committed.
//
// Invariant CoordinatorTookOffice: the coordinator decides a group
// command, a DECLARE or a read of an incarnation only against such a
// state. A new leader knows an entry committed only once an entry of its
// own epoch commits: before, a delete committed under the last leader may
// sit unapplied in its log, and a command decided against the state of
// before — a forced delete naming the incarnation already deleted — was
// applied as nothing and answered OK.
func (c *Cluster) TookOffice() bool {
	st := c.metaLog.Status()
	if st.Role != replica.Leader {
		return false
	}
	if c.opts.DecideBeforeOffice {
		return true
	}
	for _, e := range st.Epochs {
		if e.Epoch == st.Hard.Promised {
			return c.applied() >= e.StartSeq
		}
	}
	return false
}

// InOffice reports whether this node took office (TookOffice) and holds
// its lease as the metadata leader.
//
// Invariant CoordinatorHoldsLease: the coordinator decides and reads only
// while no other node can lead the metadata log. A leader of an older
// epoch that has not heard of a newer one (cut off, paused) still took
// office, and its applied state lacks what the newer leader committed:
// it read a group's incarnation already deleted, found a deleted topic
// existing for a DECLARE, and refused a delete of the current
// incarnation as NOT_FOUND. Proposals alone would need no lease (they
// commit on a quorum or not at all), but a decision may be answered with
// no proposal (an error, a delete already done, a topic that exists).
func (c *Cluster) InOffice() bool {
	return c.TookOffice() && (c.opts.AnswerWithoutLease || c.metaLog.HoldsLease())
}

// Coordinator reports whether this node leads the metadata log — and so
// coordinates the consumer groups — and, if not, the client address of
// the node that does ("" when unknown).
func (c *Cluster) Coordinator() (here bool, addr string) {
	st := c.metaLog.Status()
	if st.Role == replica.Leader {
		return true, c.opts.ClientAddr
	}
	if st.Leader == 0 {
		return false, ""
	}
	return false, c.ClientAddr(st.Leader)
}

// NotCoordinator is the NOT_LEADER answer of a node that does not
// coordinate the groups.
func (c *Cluster) NotCoordinator() *wire.Error {
	if _, addr := c.Coordinator(); addr != "" {
		return wire.Errorf(wire.CodeNotLeader, "consumer groups are coordinated by the metadata leader at %s", addr)
	}
	return wire.Errorf(wire.CodeNotLeader, "no metadata leader known (an election is running); retry")
}

// ReadCoordinated calls f with the applied metadata (f must not keep it)
// as the coordinator reads it: only once this node took office
// (CoordinatorTookOffice) — a delete committed under the last leader may
// not be applied here before — else it answers NOT_LEADER or UNAVAILABLE.
func (c *Cluster) ReadCoordinated(f func(*meta.State)) error {
	if here, _ := c.Coordinator(); !here {
		return c.NotCoordinator()
	}
	if !c.InOffice() {
		return wire.Errorf(wire.CodeUnavailable, "the metadata leader is taking office or renewing its lease; retry")
	}
	c.ReadGroups(f)
	return nil
}

// ReadGroups calls f with the applied metadata (f must not keep it).
func (c *Cluster) ReadGroups(f func(*meta.State)) {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	f(c.state)
}

// ReadPersistedGroups calls f with the applied metadata, as ReadGroups,
// only when meta.json holds all of it, and reports whether it did: the
// coordinator's NOTICEs and fences act on what the node would answer
// (StateDurableBeforeAnswer) — a one-node cluster's entries above
// meta.json may still be cut as a torn tail.
func (c *Cluster) ReadPersistedGroups(f func(*meta.State)) bool {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	if c.persisted < c.state.Applied {
		return false
	}
	f(c.state)
	return true
}

// DecideGroup decides a group command against a metadata state.
func DecideGroup(cmd group.Command) func(*meta.State) (meta.Command, error) {
	return func(st *meta.State) (meta.Command, error) { return st.DecideGroup(cmd) }
}

// DecideGroupDelete decides the delete of group name (meta.State.DecideGroupDelete).
func DecideGroupDelete(name string, force bool, incarnation uint64) func(*meta.State) (meta.Command, error) {
	return func(st *meta.State) (meta.Command, error) { return st.DecideGroupDelete(name, force, incarnation) }
}

// ProposeMeta decides a command against the applied metadata — a group
// command (DecideGroup), a topic delete or update — and proposes it, here
// on the metadata leader; done is called exactly once: nil once this node
// applied the entry (and carried out what it asks of this node: a deleted
// topic is stopped), or at once when the decision is no command (Op
// empty: nothing to change), or the error.
func (c *Cluster) ProposeMeta(decide func(*meta.State) (meta.Command, error), done func(error)) {
	if here, _ := c.Coordinator(); !here {
		done(c.NotCoordinator())
		return
	}
	j := &groupJob{deadlineMs: c.monoMs() + c.cfg.DeclareTimeout.Milliseconds(), done: done}
	if !c.InOffice() {
		j.decide = decide // decided once it is in office (stepGroupJobs)
	}
	c.declMu.Lock()
	if c.declClosed {
		c.declMu.Unlock()
		done(wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
		return
	}
	c.groupJobs = append(c.groupJobs, j)
	c.declMu.Unlock()
	if j.decide == nil {
		c.proposeGroupJob(j, decide)
		return
	}
	c.wakeMeta() // it may have taken office since it was asked
}

// proposeGroupJob decides j against the applied state and proposes the
// entry, or finishes j with the decision's error. The caller holds
// neither lock.
func (c *Cluster) proposeGroupJob(j *groupJob, decide func(*meta.State) (meta.Command, error)) {
	c.metaMu.Lock()
	m, err := decide(c.state)
	c.metaMu.Unlock()
	var data []byte
	if err == nil {
		data, err = json.Marshal(m)
	}
	if err != nil || m.Op == "" { // (no command: nothing to change, done)
		c.declMu.Lock()
		c.groupJobs = slices.DeleteFunc(c.groupJobs, func(o *groupJob) bool { return o == j })
		c.declMu.Unlock()
		j.done(err)
		return
	}
	c.metaLog.ProposeFunc(storage.Record{Value: data}, func(seq, _ uint64, err error) {
		c.declMu.Lock()
		j.outcome = &declareOutcome{seq: seq, err: err}
		c.declMu.Unlock()
		c.wakeMeta()
	})
}

// stepGroupJobs answers the group commands whose entry was applied (or
// failed, or timed out), reporting whether any finished.
func (c *Cluster) stepGroupJobs() bool {
	now := c.monoMs()
	answerable := c.answerable()
	inOffice, leading := c.InOffice(), c.metaLog.Status().Role == replica.Leader
	c.declMu.Lock()
	var finished, ready []*groupJob
	var errs []error
	var decides []func(*meta.State) (meta.Command, error)
	for _, j := range c.groupJobs {
		if o := j.outcome; o != nil {
			j.outcome = nil
			if o.err != nil {
				finished, errs = append(finished, j), append(errs, groupProposalError(o.err))
				continue
			}
			j.seq = o.seq
		}
		switch {
		case j.decide != nil && !leading:
			finished, errs = append(finished, j), append(errs, c.NotCoordinator())
		case j.decide != nil && inOffice:
			ready, decides = append(ready, j), append(decides, j.decide)
			j.decide = nil
		case j.seq != 0 && answerable >= j.seq:
			finished, errs = append(finished, j), append(errs, nil)
		case now >= j.deadlineMs:
			finished, errs = append(finished, j), append(errs, wire.Errorf(wire.CodeUnavailable, "the metadata log did not apply the group command in %v; retry", c.cfg.DeclareTimeout))
		}
	}
	c.groupJobs = slices.DeleteFunc(c.groupJobs, func(j *groupJob) bool { return slices.Contains(finished, j) })
	c.declMu.Unlock()
	for i, j := range ready {
		c.proposeGroupJob(j, decides[i]) // answered by a later step
	}
	for i, j := range finished {
		j.done(errs[i])
	}
	return len(finished)+len(ready) > 0
}

func groupProposalError(err error) error {
	if errors.Is(err, replica.ErrQuorumLost) {
		return wire.Errorf(wire.CodeQuorumLost, "metadata log: %v", err)
	}
	return wire.Errorf(wire.CodeUnavailable, "metadata log: %v; retry", err)
}
