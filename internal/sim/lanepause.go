package sim

import (
	"fmt"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Lane pauses (ClusterOptions.LanePauses, `--lane-pauses N`, with
// --schedules): at random moments of the fault phase the operator pauses
// or closes one destination topic's lane — a PAUSE or CLOSE for each
// schedule shard, asked at every node that is up every lanePauseTryMs
// until one (the shard's owner) answers it — holds it for
// lanePauseHoldMinMs to lanePauseHoldMaxMs, then resumes it the same way,
// and only then holds one again. A paused lane keeps admitting schedules
// (IntakeNeverBlocked still holds); a closed one refuses new ones
// (INVALID_ARGUMENT), and answers a retry of one it admitted before with
// that one's SCHEDULE_OK (RetryIsItsOriginal). What falls due on a held
// lane waits for the resume. With ClusterOptions.LaneRetire
// (`--lane-retire`) the last hold is a RETIRE, never resumed: the lane
// refuses every schedule from then on, its pending ones are cancelled and
// its firing ones recorded UNKNOWN, so none of its schedules is required
// to be published (each at most once), and PauseHolds holds for good.
//
//   - PauseHolds: from the instant a shard answered PAUSE or CLOSE until
//     the RESUME is first asked, no owner of that shard publishes a
//     schedule of the held lane — not one it claimed before, not one a
//     later owner finds FIRING. (The check is at the instant of every
//     publish, node.Config.SchedPublishObserver.)
//   - RefusedNeverPublished: a SCHEDULE refused INVALID_ARGUMENT — in
//     flight when its lane's CLOSE was asked, or sent while the lane was
//     being closed, closed or being resumed (the refusal, decided then,
//     may be answered later) — was never admitted: a retry of one
//     admitted before is its original. It is never published.
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

const (
	PauseHolds            = "PauseHolds"
	RefusedNeverPublished = "RefusedNeverPublished"
)

type lanePauser struct {
	s    *sim
	left int // pauses still to start
	// topic is the lane held, being held or being resumed ("": none),
	// hold the command that holds it (PAUSE or CLOSE); op the command
	// being asked (0: none), gen numbers the asks so a late answer to an
	// earlier one is not taken for this one's.
	topic    string
	hold     uint8
	op       uint8
	gen      int
	answered [node.SchedShards]bool
	// heldFromMs: by shard, when it answered the current PAUSE (0: not
	// paused, or its RESUME asked): PauseHolds from then on.
	heldFromMs [node.SchedShards]int64
	pauses     int // PAUSEs and CLOSEs answered by every shard
	closed     int // of which CLOSEs
	// retire: the last hold is a RETIRE (ClusterOptions.LaneRetire);
	// retired is the lane it retired ("" none), retiredFromMs when each
	// shard answered it.
	retire        bool
	retired       string
	retiredFromMs [node.SchedShards]int64
	// heldBack counts the schedules due and not yet seen published when
	// their lane's RESUME was asked: what the pauses held.
	heldBack int
	// rec: with ClusterOptions.LaneRecreate, half the holds re-create the
	// destination (lanerecreate.go); nil otherwise.
	rec *recreation
}

func newLanePauser(s *sim, pauses int, retire, recreate bool) *lanePauser {
	p := &lanePauser{s: s, left: pauses, retire: retire}
	s.w.after(s.w.between(lanePauseGapMinMs, lanePauseGapMaxMs), p.pause)
	if recreate {
		p.rec = newRecreation()
		s.w.after(laneWatchMs, p.watchLanes)
	}
	return p
}

// pause picks a lane and asks for its PAUSE or CLOSE (the last hold, with
// retire: its RETIRE); none once healed.
func (p *lanePauser) pause() {
	s := p.s
	if s.healed || p.left == 0 {
		return
	}
	p.left--
	p.topic = schedDestTopics[s.w.rng.IntN(len(schedDestTopics))]
	p.hold = []uint8{wire.LanePause, wire.LaneClose}[s.w.rng.IntN(2)]
	if p.retire && p.left == 0 {
		p.hold = wire.LaneRetire
	}
	if p.rec != nil && p.hold != wire.LaneRetire && s.w.rng.IntN(2) == 0 {
		p.hold = laneRecreate
		p.startRecreate()
		return
	}
	if p.hold != wire.LanePause {
		// A SCHEDULE in flight now may be appended after the CLOSE (its
		// first answer lost, or QUORUM_LOST), and refused as it applies.
		for i := range s.sched.inflight {
			if schedTopic(i) == p.topic {
				s.sched.mayRefuse[i] = true
			}
		}
	}
	p.ask(p.hold)
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
		if p.rec != nil && op == wire.LaneResume {
			p.rec.resumeAskedMs[shard][topic] = s.w.nowMs
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
				if op != wire.LaneResume {
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
	if p.op == wire.LaneRetire {
		s.w.tracef("lane %s: retired", p.topic)
		p.retired, p.retiredFromMs = p.topic, p.heldFromMs
		p.op, p.topic, p.hold, p.heldFromMs = 0, "", 0, [node.SchedShards]int64{}
		return // for good: nothing to resume, and the last hold
	}
	if p.op != wire.LaneResume {
		p.pauses++
		if p.op == wire.LaneClose {
			p.closed++
		}
		p.op = 0
		s.w.after(s.w.between(lanePauseHoldMinMs, lanePauseHoldMaxMs), p.resume)
		return
	}
	p.op, p.topic, p.hold = 0, "", 0
	s.w.after(s.w.between(lanePauseGapMinMs, lanePauseGapMaxMs), p.pause)
}

// held reports whether topic's lane is held or being held or resumed, or
// retired, or its destination was ever re-created (its lanes may break
// and wait for the operator).
func (p *lanePauser) held(topic string) bool {
	return p != nil && (p.topic == topic || p.retired == topic || p.recreated(topic))
}

// closes reports whether topic's lane is closed or retired, or being
// closed, retired or resumed: a SCHEDULE to it may be refused.
func (p *lanePauser) closes(topic string) bool {
	return p != nil && (p.topic == topic && (p.hold == wire.LaneClose || p.hold == wire.LaneRetire) || p.retired == topic)
}

// retiredLane reports whether topic's lane is retired or being retired:
// its schedules may be cancelled by it, or recorded UNKNOWN.
func (p *lanePauser) retiredLane(topic string) bool {
	return p != nil && (p.retired == topic || p.topic == topic && p.hold == wire.LaneRetire)
}

// published is PauseHolds at the instant node b publishes a schedule of
// topic from shard.
func (p *lanePauser) published(b *broker, shard uint32, id uint64, topic string) {
	if p != nil && p.retired == topic && p.retiredFromMs[shard] != 0 {
		p.s.chk.violate(PauseHolds, "%s published schedule %d of shard %d to %s, whose lane that shard retired %d ms before",
			b.id, id, shard, topic, p.s.w.nowMs-p.retiredFromMs[shard])
		return
	}
	if p == nil || p.topic != topic || p.heldFromMs[shard] == 0 {
		return
	}
	p.s.chk.violate(PauseHolds, "%s published schedule %d of shard %d to %s, whose lane that shard held (%s) %d ms before (no RESUME asked since)",
		b.id, id, shard, topic, laneOpName(p.hold), p.s.w.nowMs-p.heldFromMs[shard])
}

// final waits, after the final power loss, until the lane paused last is
// resumed (the schedules' final check needs it open).
func (p *lanePauser) final(deadline int64) {
	s := p.s
	for s.chk.violation == nil && p.topic != "" {
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(Liveness, "lane %s: %s still not answered by every shard 30 s after the final power loss", p.topic, laneOpName(p.op))
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
	case wire.LaneClose:
		return "CLOSE"
	case wire.LaneRetire:
		return "RETIRE"
	}
	return fmt.Sprint("lane op ", op)
}
