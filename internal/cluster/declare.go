package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A DECLARE in a cluster goes through the metadata log and never blocks the
// goroutine that asks (a session's reader, or a simulated node's only
// goroutine). It is a declareJob, advanced by stepDeclares whenever what it
// waits for may have happened — metadata applied, the metadata leader
// changed, a forwarded answer or a proposal's outcome arrived, its deadline
// passed. Production steps the jobs on the metadata applier's goroutine; a
// Manual node steps them in Step.

type declareStage uint8

const (
	awaitLeader  declareStage = iota // no metadata leader known yet
	awaitDecide                      // on the leader: deciding, one DECLARE at a time, after earlier commits are applied
	awaitCommit                      // proposed to the metadata log
	awaitApplied                     // committed at seq; this node applies it
	awaitForward                     // forwarded to the metadata leader
	awaitTopic                       // created or confirmed; this node applies the topic
)

// monoMs is the monotonic clock in milliseconds, which every wait of a
// metadata request is measured on (DeclareWaitsAreMonotonic): a step of
// the wall clock must neither hold a request past its deadline nor end it
// early.
func (c *Cluster) monoMs() int64 { return c.opts.Env.Clock.NowNanos() / int64(time.Millisecond) }

// declareAskAgainMs is how long a DECLARE forwarded to the metadata
// leader waits for its answer before it asks again (ForwardedDeclareAsksAgain):
// a forward lost with a peer connection would otherwise hold the DECLARE
// to its deadline, with the cluster healthy.
const declareAskAgainMs = 1000

// timeoutError is a DECLARE's answer when its deadline passed in stage s.
func (c *Cluster) timeoutError(j *declareJob) *wire.Error {
	d := c.cfg.DeclareTimeout
	switch j.stage {
	case awaitLeader:
		return wire.Errorf(wire.CodeUnavailable, "no metadata leader within %v (a quorum of nodes is down?); retry", d)
	case awaitForward:
		return wire.Errorf(wire.CodeUnavailable, "the metadata leader did not answer in %v; retry", d)
	case awaitDecide:
		return wire.Errorf(wire.CodeUnavailable, "the metadata leader was not in office within %v (its install entry applied and its lease held: a quorum out of reach?); retry", d)
	case awaitCommit:
		return wire.Errorf(wire.CodeUnavailable, "the metadata log did not commit in %v; retry", d)
	}
	return wire.Errorf(wire.CodeUnavailable, "metadata not applied in %v; retry", d)
}

type declareJob struct {
	tc         wire.TopicConfig
	deadlineMs int64
	stage      declareStage
	// peer: the DECLARE of another node (PEER_DECLARE), decided here as
	// the metadata leader and answered once applied here; the asker waits
	// for its own apply.
	peer        bool
	decideAfter uint64         // awaitDecide: everything committed before is applied first
	seq         uint64         // awaitApplied
	reqID       uint64         // awaitForward
	to          replica.NodeID // awaitForward: the metadata leader asked
	askedMs     int64          // awaitForward: when it asked
	created     bool
	// outcome is set by a callback (the proposal's, a forwarded answer)
	// under declMu and taken by the stepper.
	outcome *declareOutcome
	done    func(created bool, err error)
}

type declareOutcome struct {
	created bool
	seq     uint64
	err     error
}

// declareAsync starts a DECLARE of tc (peer: on another node's behalf);
// done is called exactly once, on the stepper's goroutine or, for an
// error found at once, on the caller's.
func (c *Cluster) declareAsync(tc wire.TopicConfig, peer bool, done func(created bool, err error)) {
	tc, err := meta.Normalize(tc, len(c.names))
	if err != nil {
		done(false, err)
		return
	}
	j := &declareJob{tc: tc, peer: peer, done: done} // the deadline starts at its first step
	if peer {
		j.stage, j.decideAfter = awaitDecide, c.metaLog.CommitSeq()
	}
	c.declMu.Lock()
	if c.declClosed {
		c.declMu.Unlock()
		done(false, wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
		return
	}
	c.declares = append(c.declares, j)
	c.declMu.Unlock()
	c.wakeMeta()
}

// DeclareAsync starts a DECLARE of tc through the metadata log; done is
// called exactly once: on the stepper's goroutine (the applier's, or a
// Manual node's driver), or on the caller's for an error found at once.
func (c *Cluster) DeclareAsync(tc wire.TopicConfig, done func(created bool, err error)) {
	c.declareAsync(tc, false, done)
}

// Declare is DeclareAsync for callers that may block (production only).
func (c *Cluster) Declare(tc wire.TopicConfig) (bool, error) {
	if c.opts.Manual {
		return false, wire.Errorf(wire.CodeUnavailable, "a simulated node declares topics asynchronously only")
	}
	ch := make(chan declareOutcome, 1)
	c.declareAsync(tc, false, func(created bool, err error) { ch <- declareOutcome{created: created, err: err} })
	o := <-ch
	return o.created, o.err
}

// stepDeclares advances every DECLARE as far as it can go now, reporting
// whether any moved. Only one goroutine steps (the applier's, or a Manual
// node's driver).
func (c *Cluster) stepDeclares() bool {
	c.declMu.Lock()
	jobs := slices.Clone(c.declares)
	c.declMu.Unlock()
	now := c.monoMs()
	var finished []*declareJob
	moved := false
	for _, j := range jobs {
		stage := j.stage
		created, err, ok := c.advance(j, now)
		moved = moved || ok || j.stage != stage
		if ok {
			finished = append(finished, j)
			if c.deciding == j {
				c.deciding = nil
			}
			c.declMu.Lock()
			delete(c.declForwards, j.reqID)
			c.declMu.Unlock()
			j.done(created, err)
		}
	}
	if len(finished) > 0 {
		c.declMu.Lock()
		c.declares = slices.DeleteFunc(c.declares, func(j *declareJob) bool { return slices.Contains(finished, j) })
		c.declMu.Unlock()
	}
	return moved
}

// takeOutcome returns j's outcome once a callback has set it.
func (c *Cluster) takeOutcome(j *declareJob) *declareOutcome {
	c.declMu.Lock()
	defer c.declMu.Unlock()
	o := j.outcome
	j.outcome = nil
	return o
}

// applied is the last metadata entry this node applied.
func (c *Cluster) applied() uint64 {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return c.state.Applied
}

// answerable is the last metadata entry this node applied and holds in
// meta.json: a command is answered only once its entry is there
// (StateDurableBeforeAnswer).
func (c *Cluster) answerable() uint64 {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return c.persisted
}

// advance moves j on as far as it can; ok reports that it is finished
// with (created, err).
func (c *Cluster) advance(j *declareJob, nowMs int64) (created bool, err error, ok bool) {
	if j.deadlineMs == 0 {
		j.deadlineMs = nowMs + c.cfg.DeclareTimeout.Milliseconds()
	}
	for {
		if nowMs >= j.deadlineMs {
			return false, c.timeoutError(j), true
		}
		switch j.stage {
		case awaitLeader:
			st := c.metaLog.Status()
			switch {
			case st.Role == replica.Leader:
				j.stage, j.decideAfter = awaitDecide, c.metaLog.CommitSeq()
			case st.Leader != 0 && st.Leader != c.self:
				j.reqID, j.to, j.askedMs = c.reqID.Add(1), st.Leader, nowMs
				c.declMu.Lock()
				c.declForwards[j.reqID] = j
				c.declMu.Unlock()
				j.stage = awaitForward
				if !c.tr.Send(uint32(st.Leader), &wire.PeerDeclare{ReqID: j.reqID, Topic: j.tc}) {
					return false, wire.Errorf(wire.CodeUnavailable, "metadata leader %s unreachable; retry", c.Name(st.Leader)), true
				}
			default:
				return false, nil, false
			}
		case awaitDecide:
			if c.deciding != nil && c.deciding != j {
				return false, nil, false
			}
			if c.metaLog.Status().Role != replica.Leader {
				if j.peer {
					return false, wire.Errorf(wire.CodeUnavailable, "metadata leadership moved; retry"), true
				}
				j.stage = awaitLeader // find the new leader, within the deadline
				return false, nil, false
			}
			if c.applied() < j.decideAfter || !c.InOffice() {
				return false, nil, false // CoordinatorTookOffice, CoordinatorHoldsLease
			}
			c.deciding = j
			c.metaMu.Lock()
			cmd, exists, err := c.state.Decide(j.tc, len(c.names))
			c.metaMu.Unlock()
			switch {
			case err != nil:
				return false, err, true
			case exists && j.peer:
				return false, nil, true
			case exists:
				c.deciding, j.stage = nil, awaitTopic
				continue
			}
			data, err := json.Marshal(cmd)
			if err != nil {
				return false, err, true
			}
			j.stage = awaitCommit
			c.metaLog.ProposeFunc(storage.Record{Value: data}, func(seq, _ uint64, err error) {
				c.declMu.Lock()
				j.outcome = &declareOutcome{seq: seq, err: err}
				c.declMu.Unlock()
				c.wakeMeta()
			})
		case awaitCommit:
			o := c.takeOutcome(j)
			switch {
			case o == nil:
				return false, nil, false
			case errors.Is(o.err, replica.ErrQuorumLost):
				return false, wire.Errorf(wire.CodeQuorumLost, "metadata log: %v", o.err), true
			case o.err != nil && j.peer:
				return false, wire.Errorf(wire.CodeUnavailable, "metadata log: %v; retry", o.err), true
			case o.err != nil:
				// Not committed here (or no longer provable): decide again
				// at whichever node leads now; a committed decision is
				// then found existing.
				c.deciding, j.stage = nil, awaitLeader
				return false, nil, false
			}
			j.seq, j.created, j.stage = o.seq, true, awaitApplied
		case awaitApplied:
			if c.answerable() < j.seq {
				return false, nil, false
			}
			c.deciding = nil
			if j.peer {
				return true, nil, true
			}
			j.stage = awaitTopic
		case awaitForward:
			o := c.takeOutcome(j)
			if o == nil {
				st := c.metaLog.Status()
				same := st.Leader == j.to || st.Leader == 0 && st.Role != replica.Leader
				if same && nowMs < j.askedMs+declareAskAgainMs {
					return false, nil, false
				}
				// Another leader took over (the one asked is cut off, or
				// dead), or no answer came in declareAskAgainMs (the
				// forward or its answer was lost with a broken peer
				// connection, or the leader restarted and was elected
				// again): ask again now, not at the deadline. A late
				// answer to the former ask finds no forward; a DECLARE the
				// leader committed is found existing (an identical DECLARE
				// is OK).
				c.declMu.Lock()
				delete(c.declForwards, j.reqID)
				c.declMu.Unlock()
				j.stage = awaitLeader
				continue
			}
			if we := asWire(o.err); o.err != nil && we.Code == wire.CodeUnavailable {
				j.stage = awaitLeader // the leader moved: ask again, within the deadline
				return false, nil, false
			}
			if o.err != nil {
				return false, o.err, true
			}
			j.created, j.stage = o.created, awaitTopic
		case awaitTopic:
			c.metaMu.Lock()
			_, ok := c.state.Topics[j.tc.Name]
			c.metaMu.Unlock()
			return j.created, nil, ok
		default:
			panic(fmt.Sprintf("node: declare in stage %d", j.stage))
		}
	}
}

// declareAnswered takes the metadata leader's answer to a forwarded
// DECLARE.
func (c *Cluster) declareAnswered(f *wire.PeerDeclareOK) {
	c.declMu.Lock()
	j := c.declForwards[f.ReqID]
	delete(c.declForwards, f.ReqID)
	if j != nil {
		o := &declareOutcome{created: f.Created}
		if f.Code != wire.CodeOK {
			o.err = wire.Errorf(f.Code, "%s", f.Message)
		}
		j.outcome = o
	}
	c.declMu.Unlock()
	c.wakeMeta()
}

// failDeclares answers every DECLARE in progress (the node is closing).
func (c *Cluster) failDeclares() {
	c.declMu.Lock()
	jobs, gjobs := c.declares, c.groupJobs
	c.declares, c.groupJobs, c.declClosed = nil, nil, true
	c.declMu.Unlock()
	for _, j := range jobs {
		j.done(false, wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
	}
	for _, j := range gjobs {
		j.done(wire.Errorf(wire.CodeUnavailable, "node is shutting down"))
	}
}

// asWire is err as a wire error (a storage or other failure: STORAGE).
func asWire(err error) *wire.Error {
	if we, ok := err.(*wire.Error); ok {
		return we
	}
	return wire.Errorf(wire.CodeStorage, "%v", err)
}
