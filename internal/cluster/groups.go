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

type groupJob struct {
	cmd        meta.Command
	deadlineMs int64
	seq        uint64 // committed at; 0 while the proposal is out
	outcome    *declareOutcome
	done       func(error)
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

// ReadGroups calls f with the applied metadata (f must not keep it).
func (c *Cluster) ReadGroups(f func(*meta.State)) {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	f(c.state)
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
// command (DecideGroup) or a topic delete — and proposes it, here on the
// metadata leader; done is called exactly once: nil once this node
// applied the entry (and carried out what it asks of this node: a deleted
// topic is stopped), or the error.
func (c *Cluster) ProposeMeta(decide func(*meta.State) (meta.Command, error), done func(error)) {
	if here, _ := c.Coordinator(); !here {
		done(c.NotCoordinator())
		return
	}
	c.metaMu.Lock()
	m, err := decide(c.state)
	c.metaMu.Unlock()
	if err != nil {
		done(err)
		return
	}
	data, err := json.Marshal(m)
	if err != nil {
		done(err)
		return
	}
	j := &groupJob{cmd: m, deadlineMs: c.monoMs() + c.cfg.DeclareTimeout.Milliseconds(), done: done}
	c.declMu.Lock()
	if c.declClosed {
		c.declMu.Unlock()
		done(wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
		return
	}
	c.groupJobs = append(c.groupJobs, j)
	c.declMu.Unlock()
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
	applied := c.applied()
	c.declMu.Lock()
	var finished []*groupJob
	var errs []error
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
		case j.seq != 0 && applied >= j.seq:
			finished, errs = append(finished, j), append(errs, nil)
		case now >= j.deadlineMs:
			finished, errs = append(finished, j), append(errs, wire.Errorf(wire.CodeUnavailable, "the metadata log did not apply the group command in %v; retry", c.cfg.DeclareTimeout))
		}
	}
	c.groupJobs = slices.DeleteFunc(c.groupJobs, func(j *groupJob) bool { return slices.Contains(finished, j) })
	c.declMu.Unlock()
	for i, j := range finished {
		j.done(errs[i])
	}
	return len(finished) > 0
}

func groupProposalError(err error) error {
	if errors.Is(err, replica.ErrQuorumLost) {
		return wire.Errorf(wire.CodeQuorumLost, "metadata log: %v", err)
	}
	return wire.Errorf(wire.CodeUnavailable, "metadata log: %v; retry", err)
}
