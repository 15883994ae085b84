package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// CoordinatorAnswersCurrent: the metadata leader answers group commands,
// group incarnation reads, topic deletes and DECLAREs against a state that
// holds everything the metadata log committed before the request was sent
// (cluster.CoordinatorTookOffice). The checker keeps, after every event,
// the highest facts any node up has applied — applied means committed, and
// a committed entry is never undone — and judges an answer stale when it
// contradicts a fact applied before the request was sent:
//
//   - a GROUP_INCARNATION read (probed after every event of a
//     group-delete run at every metadata leader that is not paused, as a
//     client asking at that moment) answers an incarnation below one a
//     node applied;
//   - a forced group delete naming incarnation k answered OK while the
//     node that answered it still has k current (answered after it
//     applied the delete);
//   - a DECLARE of the churn's topic answered "exists" (created=false)
//     when a node had applied the delete of the topic's last incarnation
//     before the DECLARE was sent and no node had applied a later one by
//     the time the answer came (the coordinator answers "exists" only
//     once it applied the incarnation it found);
//   - a TOPIC_DELETE_OK naming an incarnation a node had applied deleted
//     before the delete was sent;
//   - a TOPIC_DELETE answered NOT_FOUND when a node had applied an
//     incarnation before the delete was sent, and no node had applied
//     that incarnation's delete by the time the answer came.
//
// Every metadata leader is judged, a deposed one too (a leader of an
// older epoch that has not heard of the newer, cut off or paused: it
// answers only while it holds its lease, CoordinatorHoldsLease, and then
// no newer one can lead). The window of CoordinatorTookOffice — a leader
// whose log holds an entry committed under the last one, unapplied until
// its install entry commits — random faults open too seldom (heirFault
// opens it).
const CoordinatorAnswersCurrent = "CoordinatorAnswersCurrent"

// metaFacts are the facts of the metadata the checker judges answers
// by, as the furthest node applied them: each only grows.
type metaFacts struct {
	groupIncarnation uint64 // simGroup's current incarnation (1: never deleted)
	topicCreated     uint64 // churnTopic's highest incarnation declared (current or deleted since)
	topicDeleted     uint64 // churnTopic's highest incarnation deleted
}

// coordChecker follows the applied metadata for CoordinatorAnswersCurrent.
type coordChecker struct {
	s     *sim
	facts metaFacts
	// epochMax is the highest epoch a node was seen leading the metadata
	// log in; a leader of an older one is deposed (counted apart).
	epochMax uint64
	// heirFaults: heirFault may strike (crash faults on, and not
	// ClusterOptions.NoHeirFault).
	heirFaults bool
	// Counts for the result (Result.Coordinator): "windows", events after
	// which the newest metadata leader's applied facts were behind
	// another node's (a stale answer was possible), "windows in office"
	// those where it read as in office; "probes", GROUP_INCARNATION reads
	// judged ("deposed probes" of them at a deposed leader); "judged",
	// churn answers judged.
	counts map[string]int
}

func newCoordChecker(s *sim) *coordChecker {
	return &coordChecker{s: s, facts: metaFacts{groupIncarnation: 1}, counts: map[string]int{}}
}

// observe, after every event: the facts every node up applied, the
// newest leader, then the probes.
func (c *coordChecker) observe() {
	s := c.s
	before := c.facts
	for _, b := range s.nodes {
		if !b.up || b.node == nil {
			continue
		}
		c.facts.groupIncarnation = max(c.facts.groupIncarnation, b.node.GroupIncarnation(simGroup))
		cur, deleted := b.node.TopicIncarnation(churnTopic)
		c.facts.topicCreated = max(c.facts.topicCreated, cur, deleted)
		c.facts.topicDeleted = max(c.facts.topicDeleted, deleted)
		if v, ok := b.node.Replica(meta.MetaTopic, 0); ok && v.Status.Role == replica.Leader {
			c.epochMax = max(c.epochMax, v.Status.Hard.Promised)
		}
	}
	if c.facts != before {
		c.heirFault()
	}
	for _, b := range s.nodes {
		if !b.up || b.node == nil || s.chk.violation != nil {
			continue
		}
		v, ok := b.node.Replica(meta.MetaTopic, 0)
		if !ok || v.Status.Role != replica.Leader {
			continue
		}
		deposed := v.Status.Hard.Promised < c.epochMax
		behind := c.behind(b)
		if b.paused() {
			continue // a client's request waits until it resumes
		}
		inc, err := b.node.CoordinatorGroupIncarnation(simGroup)
		var we *wire.Error
		preOffice := errors.As(err, &we) && we.Code == wire.CodeUnavailable
		if behind && !deposed {
			c.counts["windows"]++
			if !preOffice {
				c.counts["windows in office"]++
			}
		}
		if s.groupDel == nil || err != nil {
			continue
		}
		if inc < c.facts.groupIncarnation {
			s.chk.violate(CoordinatorAnswersCurrent, "%s, leading %s in epoch %d (the newest %d), read group %s at incarnation %d; a node had applied incarnation %d",
				b.id, meta.MetaTopic, v.Status.Hard.Promised, c.epochMax, simGroup, inc, c.facts.groupIncarnation)
		}
		c.counts["probes"]++
		if deposed {
			c.counts["deposed probes"]++
		}
	}
}

// groupDeleteAnswered judges a forced delete of incarnation k that node
// b answered OK: b applied it, so k is deleted there.
func (c *coordChecker) groupDeleteAnswered(b *broker, k uint64) {
	if inc := b.node.GroupIncarnation(simGroup); inc <= k {
		c.s.chk.violate(CoordinatorAnswersCurrent, "%s answered OK a forced delete of group %s incarnation %d, which it still has current (%d)",
			b.id, simGroup, k, inc)
	}
}

// churnSent is what the checker knows of a churn request as it is sent:
// the facts then.
func (c *coordChecker) churnSent() metaFacts { return c.facts }

// churnAnswered judges an answer f to the churn's request of stage, sent
// when the facts were was.
func (c *coordChecker) churnAnswered(stage uint64, was metaFacts, f wire.Frame) {
	now := c.facts
	var stale string
	switch f := f.(type) {
	case *wire.DeclareOK:
		if !f.Created && was.topicDeleted > 0 && now.topicCreated <= was.topicDeleted {
			stale = fmt.Sprintf("DECLARE %s answered \"exists\"; a node had applied the delete of incarnation %d before it was sent, and none has applied a later one",
				churnTopic, was.topicDeleted)
		}
	case *wire.TopicDeleteOK:
		if f.Incarnation <= was.topicDeleted {
			stale = fmt.Sprintf("TOPIC_DELETE %s answered OK, incarnation %d deleted; a node had applied the delete of incarnation %d before it was sent",
				churnTopic, f.Incarnation, was.topicDeleted)
		}
	case *wire.Err:
		if stage == churnDelete && f.Code == wire.CodeNotFound && was.topicCreated > was.topicDeleted && now.topicDeleted < was.topicCreated {
			stale = fmt.Sprintf("TOPIC_DELETE %s answered NOT_FOUND; a node had applied incarnation %d before it was sent, and none has applied its delete",
				churnTopic, was.topicCreated)
		}
	default:
		return
	}
	if stale != "" {
		c.s.chk.violate(CoordinatorAnswersCurrent, "%s", stale)
		return
	}
	c.counts["judged"]++
}

// heirFaultP is how often heirFault strikes when it may.
const heirFaultP = 1.0 / 3

// heirFault, when the facts just grew (an entry of the churn's topic or
// of the deleter's group applied) and only the metadata leader has
// applied them: now and then (crash faults on, the fault phase; not with
// ClusterOptions.NoHeirFault) the
// leader is killed -9 at once and its frames in flight are lost — those
// that would tell its followers the entry committed. Its heir then leads
// with the entry committed but not applied in its log until its own
// install entry commits: the window CoordinatorTookOffice guards, which
// random faults open too seldom to test it.
func (c *coordChecker) heirFault() {
	s := c.s
	if !c.heirFaults || s.healed {
		return
	}
	var leader *broker
	for _, b := range s.nodes {
		if !b.up || b.node == nil {
			continue
		}
		if c.behind(b) {
			continue
		}
		if v, ok := b.node.Replica(meta.MetaTopic, 0); !ok || v.Status.Role != replica.Leader || leader != nil {
			return // a follower applied them too, or two leaders
		}
		leader = b
	}
	if leader == nil || !s.w.chance(heirFaultP) {
		return
	}
	c.counts["heir faults"]++
	s.w.tracef("fault %s kill -9 as it applies a metadata entry; its frames in flight lost", leader.id)
	s.holdCut(s.net.linksOf(uint32(slices.Index(s.nodes, leader)+1), true, false), "heal the links of "+leader.id)
	leader.crash()
}

// behind reports whether node b's applied metadata lacks a fact some
// node applied.
func (c *coordChecker) behind(b *broker) bool {
	cur, deleted := b.node.TopicIncarnation(churnTopic)
	return b.node.GroupIncarnation(simGroup) < c.facts.groupIncarnation || max(cur, deleted) < c.facts.topicCreated || deleted < c.facts.topicDeleted
}
