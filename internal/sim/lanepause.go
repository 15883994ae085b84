package sim

import (
	"fmt"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Lane pauses (ClusterOptions.LanePauses, `--lane-pauses N`, with
// --schedules): at random moments of the fault phase the operator pauses
// one destination topic's lane — a PAUSE for each schedule shard, asked
// at every node that is up every lanePauseTryMs until one (the shard's
// owner) answers it — holds it for lanePauseHoldMinMs to
// lanePauseHoldMaxMs, then resumes it the same way, and only then pauses
// again. Schedules keep being admitted meanwhile (IntakeNeverBlocked
// still holds); what falls due on a paused lane waits for the resume.
//
//   - PauseHolds: from the instant a shard answered PAUSE until the
//     RESUME is first asked, no owner of that shard publishes a schedule
//     of the paused lane — not one it claimed before the pause, not one
//     a later owner finds FIRING. (The check is at the instant of every
//     publish, node.Config.SchedPublishObserver.)
//
// While a lane is paused or being resumed, its schedules are not held to
// ScheduledOnTime: its destination counts as troubled, so the bound runs
// from the resume's answer.
const (
	lanePauseTryMs     = 50
	lanePauseGapMinMs  = 200
	lanePauseGapMaxMs  = 1_000
	lanePauseHoldMinMs = 300
	lanePauseHoldMaxMs = 1_500
)

const PauseHolds = "PauseHolds"

type lanePauser struct {
	s    *sim
	left int // pauses still to start
	// topic is the lane paused, being paused or being resumed ("":
	// none); op the command being asked (0: none), gen numbers the asks
	// so a late answer to an earlier one is not taken for this one's.
	topic    string
	op       uint8
	gen      int
	answered [node.SchedShards]bool
	// heldFromMs: by shard, when it answered the current PAUSE (0: not
	// paused, or its RESUME asked): PauseHolds from then on.
	heldFromMs [node.SchedShards]int64
	pauses     int // PAUSEs answered by every shard
	// heldBack counts the schedules due and not yet seen published when
	// their lane's RESUME was asked: what the pauses held.
	heldBack int
}

func newLanePauser(s *sim, pauses int) *lanePauser {
	p := &lanePauser{s: s, left: pauses}
	s.w.after(s.w.between(lanePauseGapMinMs, lanePauseGapMaxMs), p.pause)
	return p
}

// pause picks a lane and asks for its PAUSE; none once healed.
func (p *lanePauser) pause() {
	s := p.s
	if s.healed || p.left == 0 {
		return
	}
	p.left--
	p.topic = schedDestTopics[s.w.rng.IntN(len(schedDestTopics))]
	p.ask(wire.LanePause)
}

// resume asks for the paused lane's RESUME: from now on its owners may
// publish again.
func (p *lanePauser) resume() {
	p.heldFromMs = [node.SchedShards]int64{}
	sc := p.s.sched
	sc.observe()
	for i := range sc.unseen {
		if schedTopic(i) == p.topic && sc.due[i] <= p.s.w.nowMs {
			p.heldBack++
		}
	}
	p.ask(wire.LaneResume)
}

func (p *lanePauser) ask(op uint8) {
	p.op, p.answered = op, [node.SchedShards]bool{}
	p.gen++
	p.s.w.tracef("lane %s: %s asked", p.topic, laneOpName(op))
	p.try()
}

// try asks every node that is up for each shard's part of the command
// not answered yet, again every lanePauseTryMs until every shard
// answered (after the heal too).
func (p *lanePauser) try() {
	s, gen, op, topic := p.s, p.gen, p.op, p.topic
	if op == 0 {
		return
	}
	for shard := range uint32(node.SchedShards) {
		if p.answered[shard] {
			continue
		}
		for _, b := range s.nodes {
			if !b.up {
				continue
			}
			b.node.SchedAdmin(&wire.SchedAdmin{Op: wire.SchedLane, Shard: shard, Topic: topic, LaneOp: op}, func(_ *wire.SchedAdminOK, err *wire.Error) {
				if err != nil || p.gen != gen || p.answered[shard] {
					return
				}
				p.answered[shard] = true
				if op == wire.LanePause {
					p.heldFromMs[shard] = s.w.nowMs
				}
				s.w.tracef("lane %s: %s answered for shard %d by %s", topic, laneOpName(op), shard, b.id)
				p.answeredAll()
			})
		}
	}
	s.w.after(lanePauseTryMs, func() {
		if p.gen == gen {
			p.try()
		}
	})
}

// answeredAll moves on once every shard answered the command asked.
func (p *lanePauser) answeredAll() {
	for _, ok := range p.answered {
		if !ok {
			return
		}
	}
	s := p.s
	p.gen++ // the asks still in flight are done with
	if p.op == wire.LanePause {
		p.pauses++
		p.op = 0
		s.w.after(s.w.between(lanePauseHoldMinMs, lanePauseHoldMaxMs), p.resume)
		return
	}
	p.op, p.topic = 0, ""
	s.w.after(s.w.between(lanePauseGapMinMs, lanePauseGapMaxMs), p.pause)
}

// held reports whether topic's lane is paused or being paused or resumed.
func (p *lanePauser) held(topic string) bool { return p != nil && p.topic == topic }

// published is PauseHolds at the instant node b publishes a schedule of
// topic from shard.
func (p *lanePauser) published(b *broker, shard uint32, id uint64, topic string) {
	if p == nil || p.topic != topic || p.heldFromMs[shard] == 0 {
		return
	}
	p.s.chk.violate(PauseHolds, "%s published schedule %d of shard %d to %s, whose lane that shard paused %d ms before (no RESUME asked since)",
		b.id, id, shard, topic, p.s.w.nowMs-p.heldFromMs[shard])
}

// final waits, after the final power loss, until the lane paused last is
// resumed (the schedules' final check needs it open).
func (p *lanePauser) final(deadline int64) {
	s := p.s
	for s.chk.violation == nil && p.topic != "" {
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(Liveness, "lane %s still paused or being resumed 30 s after the final power loss", p.topic)
			return
		}
	}
}

func laneOpName(op uint8) string {
	switch op {
	case wire.LanePause:
		return "PAUSE"
	case wire.LaneResume:
		return "RESUME"
	}
	return fmt.Sprint("lane op ", op)
}
