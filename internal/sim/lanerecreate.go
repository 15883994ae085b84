package sim

import (
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Destination re-creations (ClusterOptions.LaneRecreate,
// `--lane-recreate`, with --lane-pauses): half the lane holds are an
// operator deleting a destination topic and declaring it again — a new
// incarnation of the name — then resuming its lane at every shard, as
// OPERATIONS tells. A lane whose destination was re-created breaks its
// ordering (ORDERING_BROKEN) until an operator resumes it; an owner that
// had not applied the re-creation when a RESUME reached it pins the old
// incarnation and breaks again later, so the operator watches the
// re-created topic's lanes from then on and resumes any it finds broken
// (never one the pauser holds).
//
//   - LaneFiresOnlyIntoItsIncarnation: at the instant of every publish, a
//     lane that held a schedule before its destination's incarnation I
//     appeared (an acknowledged schedule of that shard and topic) publishes
//     into I only after a RESUME of that shard's lane was asked since I
//     appeared — never into a re-created topic on its own.
//   - ExactlyOnce across incarnations: a schedule seen in one incarnation
//     of its destination never lands in another (an intent claimed for the
//     deleted topic is resolved UNKNOWN, never published again).
//
// A schedule admitted for an incarnation of its destination that an
// operator deleted (read from its SCHEDULE record as it is acknowledged:
// an owner that had not applied the delete yet admits it for the old
// topic) is not required to be published — it may have landed in the
// deleted topic, or be an intent resolved UNKNOWN — only at most once; a
// SCHEDULE answered NOT_FOUND while its destination is re-created is
// sent again. A re-created destination is not held to ScheduledOnTime
// from its first delete on: its lanes wait for the operator whenever an
// owner breaks one.
const (
	LaneFiresOnlyIntoItsIncarnation = "LaneFiresOnlyIntoItsIncarnation"
	// laneRecreate is the pauser's hold that re-creates the destination
	// (not a wire lane command).
	laneRecreate uint8 = 0xf0
	// laneWatchMs is how often the operator looks at a re-created
	// topic's lanes.
	laneWatchMs = 200
)

// recreation is the lanePauser's state for re-created destinations.
type recreation struct {
	// fromInc is the incarnation being deleted.
	fromInc uint64
	// deletedUpTo: by topic, the latest incarnation whose delete was
	// asked.
	deletedUpTo map[string]uint64
	// admittedInc: by schedule, the incarnation of its destination its
	// SCHEDULE record names (0: not read).
	admittedInc map[int]uint64
	// appearedMs: by topic and incarnation, when the ghost first saw a
	// node run it.
	appearedMs map[string]map[uint64]int64
	// resumeAskedMs: by shard and topic, the latest ask of a RESUME.
	resumeAskedMs [node.SchedShards]map[string]int64
	// watching: the re-created topics whose lanes the operator watches;
	// resuming, by shard, the watcher's RESUMEs not answered yet.
	watching map[string]bool
	resuming map[schedLane]bool
	// Counts for the run's summary.
	recreated, watchResumes int
}

func newRecreation() *recreation {
	r := &recreation{deletedUpTo: map[string]uint64{}, admittedInc: map[int]uint64{}, appearedMs: map[string]map[uint64]int64{}, watching: map[string]bool{}, resuming: map[schedLane]bool{}}
	for i := range r.resumeAskedMs {
		r.resumeAskedMs[i] = map[string]int64{}
	}
	return r
}

// recreated reports whether topic's delete was ever asked: its lanes may
// break whenever an owner learns of the new incarnation late.
func (p *lanePauser) recreated(topic string) bool {
	if p == nil || p.rec == nil {
		return false
	}
	_, ok := p.rec.deletedUpTo[topic]
	return ok
}

// lostToRecreate reports whether schedule i was admitted for an
// incarnation of its destination whose delete was asked (or for one not
// read, once a delete was asked).
func (p *lanePauser) lostToRecreate(i int) bool {
	topic := schedTopic(i)
	if !p.recreated(topic) {
		return false
	}
	inc := p.rec.admittedInc[i]
	return inc == 0 || inc <= p.rec.deletedUpTo[topic]
}

// admitted reads the incarnation acknowledged schedule i (shard, id) was
// admitted for from its SCHEDULE record at node b, which answered it.
func (p *lanePauser) admitted(b *broker, i int, shard uint32, id uint64) {
	if p == nil || p.rec == nil || !b.up {
		return
	}
	es, err := b.node.Read(wire.SchedTopic, shard, id, 1)
	if err != nil || len(es) == 0 || es[0].Seq != id || len(es[0].Record.Headers) == 0 {
		return
	}
	if r, err := sched.Decode(es[0].Record.Headers[0].Value); err == nil && r.Kind == sched.KindSchedule {
		p.rec.admittedInc[i] = r.Schedule.Incarnation
	}
}

// startRecreate deletes p.topic's current incarnation, at every node that
// is up until one (the metadata leader) answers.
func (p *lanePauser) startRecreate() {
	s, r, topic := p.s, p.rec, p.topic
	var cur uint64
	for _, b := range s.nodes {
		if b.up {
			c, _ := b.node.TopicIncarnation(topic)
			cur = max(cur, c)
		}
	}
	if cur == 0 {
		// Not there now (a delete of an earlier re-creation still
		// being applied): no hold this time.
		p.topic, p.hold = "", 0
		s.w.after(s.w.between(lanePauseGapMinMs, lanePauseGapMaxMs), p.pause)
		return
	}
	r.fromInc = cur
	r.deletedUpTo[topic] = cur
	sc := s.sched
	for i := range sc.unseen {
		if p.lostToRecreate(i) {
			delete(sc.unseen, i) // not required now: not held to ScheduledOnTime
		}
	}
	p.gen++
	s.w.tracef("lane %s: re-create: delete incarnation %d asked", topic, cur)
	p.tryDelete(p.gen)
}

func (p *lanePauser) tryDelete(gen int) {
	s, topic, inc := p.s, p.topic, p.rec.fromInc
	if p.gen != gen {
		return
	}
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		b.node.DeleteTopic(topic, inc, func(_ uint64, err error) {
			if p.gen != gen {
				return
			}
			if _, deleted := b.node.TopicIncarnation(topic); err != nil && deleted < inc {
				return
			}
			p.gen++
			s.w.tracef("lane %s: incarnation %d deleted (answered by %s)", topic, inc, b.id)
			s.w.after(s.w.between(0, 300), func() { p.tryDeclare(p.gen) })
		})
	}
	s.w.after(lanePauseTryMs, func() { p.tryDelete(gen) })
}

// tryDeclare declares the deleted topic again, at every node that is up
// until one answers with a later incarnation, then resumes its lane a
// hold later.
func (p *lanePauser) tryDeclare(gen int) {
	s, r, topic := p.s, p.rec, p.topic
	if p.gen != gen {
		return
	}
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		b.node.DeclareAsync(wire.TopicConfig{Name: topic, Partitions: schedDestPartitions, Replicas: s.replicas}, func(_ bool, err error) {
			cur, _ := b.node.TopicIncarnation(topic)
			if p.gen != gen || err != nil || cur <= r.fromInc {
				return
			}
			p.gen++
			r.recreated++
			r.watching[topic] = true
			s.w.tracef("lane %s: declared again as incarnation %d (answered by %s)", topic, cur, b.id)
			s.w.after(s.w.between(lanePauseHoldMinMs, lanePauseHoldMaxMs), p.resume)
		})
	}
	s.w.after(lanePauseTryMs, func() { p.tryDeclare(gen) })
}

// watchLanes is the operator looking at the re-created topics' lanes
// every laneWatchMs: a shard whose lane of one is ORDERING_BROKEN is
// resumed (asked at every node that is up until one answers), unless
// the pauser holds that topic now.
func (p *lanePauser) watchLanes() {
	s, r := p.s, p.rec
	s.w.after(laneWatchMs, p.watchLanes)
	for _, topic := range slices.Sorted(maps.Keys(r.watching)) {
		if p.topic == topic {
			continue
		}
		for shard := range uint32(node.SchedShards) {
			lane := schedLane{shard, topic}
			for _, b := range s.nodes {
				if !b.up {
					continue
				}
				b.node.SchedAdmin(&wire.SchedAdmin{Op: wire.SchedStatus, Shard: shard, Topic: topic}, func(ok *wire.SchedAdminOK, err *wire.Error) {
					if err != nil || p.topic == topic || r.resuming[lane] || len(ok.Shards) != 1 || ok.Shards[0].Lifecycle != sched.Active.String() {
						return // (a node that is not the shard's active owner may answer from a state behind)
					}
					for _, l := range ok.Lanes {
						if l.Topic == topic && l.Gate == "ORDERING_BROKEN" {
							r.resuming[lane] = true
							r.watchResumes++
							s.w.tracef("lane %s: shard %d ORDERING_BROKEN at incarnation %d (seen at %s): RESUME asked", topic, shard, l.Incarnation, b.id)
							p.resumeBroken(lane)
						}
					}
				})
			}
		}
	}
}

// resumeBroken asks a broken lane's RESUME at every node that is up,
// again every lanePauseTryMs until one answers (or the pauser takes the
// topic meanwhile).
func (p *lanePauser) resumeBroken(lane schedLane) {
	s, r := p.s, p.rec
	if !r.resuming[lane] {
		return
	}
	if p.topic == lane.topic {
		delete(r.resuming, lane) // held: the pauser resumes it
		return
	}
	r.resumeAskedMs[lane.shard][lane.topic] = s.w.nowMs
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		b.node.SchedAdmin(&wire.SchedAdmin{Op: wire.SchedLane, Shard: lane.shard, Topic: lane.topic, LaneOp: wire.LaneResume}, func(_ *wire.SchedAdminOK, err *wire.Error) {
			if err == nil && r.resuming[lane] {
				delete(r.resuming, lane)
				s.w.tracef("lane %s: shard %d resumed by the operator (answered by %s)", lane.topic, lane.shard, b.id)
			}
		})
	}
	s.w.after(lanePauseTryMs, func() { p.resumeBroken(lane) })
}

// watchIncarnations notes, after every event, the incarnations of the
// destinations the nodes that are up run.
func (p *lanePauser) watchIncarnations() {
	if p == nil || p.rec == nil {
		return
	}
	for _, b := range p.s.nodes {
		if !b.up || b.node == nil {
			continue
		}
		for _, topic := range schedDestTopics {
			cur, _ := b.node.TopicIncarnation(topic)
			if cur == 0 {
				continue
			}
			seen := p.rec.appearedMs[topic]
			if seen == nil {
				seen = map[uint64]int64{}
				p.rec.appearedMs[topic] = seen
			}
			if _, ok := seen[cur]; !ok {
				seen[cur] = p.s.w.nowMs
			}
		}
	}
}

// publishedInto is LaneFiresOnlyIntoItsIncarnation at the instant node b
// publishes schedule id of shard into incarnation inc of topic.
func (p *lanePauser) publishedInto(b *broker, shard uint32, id uint64, topic string, inc uint64) {
	if p == nil || p.rec == nil {
		return
	}
	s, r := p.s, p.rec
	if r.recreated > 0 && inc > 1 {
		s.sched.ghost.stats["publishes into a re-created destination"]++
	}
	appeared, ok := r.appearedMs[topic][inc]
	if !ok {
		appeared = s.w.nowMs
	}
	held, ok := s.sched.laneSinceMs[schedLane{shard, topic}]
	if !ok || held >= appeared {
		return // the lane may have been created for inc
	}
	if asked, ok := r.resumeAskedMs[shard][topic]; ok && asked >= appeared {
		return
	}
	s.chk.violate(LaneFiresOnlyIntoItsIncarnation, "%s published schedule %d of shard %d into %s incarnation %d, which appeared %d ms ago; the lane held schedules since %d ms before that and no RESUME of it was asked since",
		b.id, id, shard, topic, inc, s.w.nowMs-appeared, appeared-held)
}

// recreateStats adds the re-creations' counts to the run's summary.
func (p *lanePauser) recreateStats(stats map[string]int) {
	if p == nil || p.rec == nil {
		return
	}
	stats["destinations re-created"] = p.rec.recreated
	for i, inc := range p.rec.admittedInc {
		if inc <= p.rec.deletedUpTo[schedTopic(i)] {
			stats["schedules admitted for a deleted incarnation"]++
		} else if inc > 1 {
			stats["schedules admitted for a re-created destination"]++
		}
	}
	stats["broken lanes resumed by the watching operator"] = p.rec.watchResumes
}
