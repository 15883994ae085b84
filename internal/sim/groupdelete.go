package sim

// Group deletes (ClusterOptions.GroupDeletes): at random moments of the
// fault phase, once the group acked some records, every consumer crashes
// and stays cut off from every node; the group is deleted — DELETE asked
// at every node that is up every 50 ms — and the consumers come back,
// as consumers of the group's next incarnation. Every DELETE of an
// episode names the incarnation the checker follows, as a client that
// learnt it first and retries does (GROUP_DELETE_INCARNATION). A
// members run deletes once the coordinator fenced the members; a run
// without members deletes with force (the metadata never knew the
// group). A copy decided before the first was applied names the same
// incarnation and deletes nothing more when it applies
// (GroupDeleteNamesItsIncarnation); one decided after is answered as
// done and proposes nothing (meta: GroupDeleteRetryDeletesOnce). The
// checker forgets the group's acks the moment any node applied a delete
// (observeGroupDeletes: its incarnation moved on): from then on the next
// incarnation must deliver and ack every acknowledged record kept
// (Liveness), and AckFloorNeverRedelivered counts its acks only
// (GroupIncarnationStartsEmpty).
//
// A members run gives up after 10 s of virtual time or at the heal; a
// delete asked late may still commit after the members came back, and
// the metadata refuses it while the group has members. Nothing refuses a
// forced delete but the incarnation it names, so a run without members
// never gives up, and goes on asking after a node applied the delete:
// until every node applied it (everyNodeApplied) — its consumers stay
// away until then (after the heal too), as a node that has not applied
// it still serves the deleted incarnation, whose acks the checker could
// not tell from the next incarnation's — and for groupDeleteRetryMs more
// once they are back and acking the next incarnation, a client whose
// answers were lost. A retry that deleted the next incarnation moves the
// group's incarnation a second time: GroupDeleteNamesItsIncarnation.

const (
	groupDeleteTryMs    = 50
	groupDeleteGiveUpMs = 10_000
	groupDeleteGapMinMs = 300
	groupDeleteGapMaxMs = 1_500
	groupDeleteRetryMs  = 1_000
)

type groupDeleter struct {
	s        *sim
	force    bool   // the consumers are no members: delete with force
	left     int    // episodes still to start
	inc      uint64 // the group's incarnation the checker follows
	deleting bool   // the consumers are away, deletes asked
	applied  bool   // force: a node applied the delete; the consumers wait for every node
	untilMs  int64  // when the episode gives up
	asking   bool   // a try is planned
	askInc   uint64 // the incarnation the episode's DELETEs name
	deletes  int    // incarnations the checker saw deleted
	// retryUntilMs: force, the consumers back: the episode's DELETE is
	// asked again until then.
	retryUntilMs int64
	// ackedAt: the acks confirmed when the members last came back; an
	// episode starts once the group acked groupDeleteAcks more.
	ackedAt int
}

// groupDeleteAcks: an episode waits for this many acks of the group's
// current incarnation, so that it has something to forget.
const groupDeleteAcks = 10

func newGroupDeleter(s *sim, episodes int, force bool) *groupDeleter {
	d := &groupDeleter{s: s, left: episodes, inc: 1, force: force}
	s.chk.groupInc = 1
	s.w.after(s.w.between(groupDeleteGapMinMs, groupDeleteGapMaxMs), d.start)
	return d
}

// start sends the members away and asks for the delete.
func (d *groupDeleter) start() {
	s := d.s
	if s.healed || d.left == 0 {
		return
	}
	if s.acksConfirmed < d.ackedAt+groupDeleteAcks {
		s.w.after(100, d.start)
		return
	}
	d.left--
	d.deleting, d.untilMs, d.askInc = true, s.w.nowMs+groupDeleteGiveUpMs, d.inc
	s.w.tracef("group delete: every member goes away")
	for _, c := range s.consumers {
		s.partitioned[c.name()] = true
		c.crash()
	}
	if !d.asking {
		d.try()
	}
}

// try asks every node that is up to delete the group's incarnation
// askInc (the coordinator takes it once its members are fenced; the
// others refuse), every groupDeleteTryMs while the episode lasts and, with
// force, until retryUntilMs after it.
func (d *groupDeleter) try() {
	s := d.s
	d.asking = d.deleting || s.w.nowMs < d.retryUntilMs
	if !d.asking {
		return
	}
	if d.deleting && !d.force && (s.healed || s.w.nowMs > d.untilMs) {
		s.w.tracef("group delete: given up")
		d.asking = false
		d.release()
		return
	}
	for _, b := range s.nodes {
		if b.up {
			inc := d.askInc
			b.node.DeleteGroup(simGroup, d.force, inc, func(err error) {
				if err == nil && d.force {
					s.coord.groupDeleteAnswered(b, inc)
				}
			})
		}
	}
	s.w.after(groupDeleteTryMs, d.try)
}

// healed, at the heal (which lets every client reach every node):
// consumers waiting for a forced delete stay away until it is applied.
func (d *groupDeleter) healed() {
	if d.deleting && d.force {
		for _, c := range d.s.consumers {
			d.s.partitioned[c.name()] = true
		}
	}
}

// release brings the members back and plans the next episode.
func (d *groupDeleter) release() {
	s := d.s
	if d.force && d.applied {
		d.retryUntilMs = s.w.nowMs + groupDeleteRetryMs
	}
	d.deleting, d.applied, d.ackedAt = false, false, s.acksConfirmed
	for _, c := range s.consumers {
		delete(s.partitioned, c.name())
	}
	if d.left > 0 {
		s.w.after(s.w.between(groupDeleteGapMinMs, groupDeleteGapMaxMs), d.start)
	}
}

// observeGroupDeletes, after every event: once a node applied a delete of
// the group's incarnation, the checker forgets its acks, and the members
// come back.
func (s *sim) observeGroupDeletes() {
	d := s.groupDel
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		if inc := b.node.GroupIncarnation(simGroup); inc > d.inc {
			s.w.tracef("group delete: %s applied incarnation %d; the group's acks are forgotten", b.id, inc)
			if d.force && (inc > d.inc+1 || !d.deleting || d.applied) {
				// Every forced DELETE an episode asked, before and
				// after a node applied the first, named the incarnation
				// it saw; only one may move it.
				s.chk.violate(GroupDeleteNamesItsIncarnation, "%s moved group %s from incarnation %d to %d (deleting: %v, applied before: %v): a delete, or a retry of one, removed an incarnation it did not name",
					b.id, simGroup, d.inc, inc, d.deleting, d.applied)
			}
			d.deletes += int(inc - d.inc)
			d.inc = inc
			s.chk.groupDeleted(inc)
			switch {
			case d.deleting && d.force:
				d.applied = true
			case d.deleting:
				d.release()
			}
		}
	}
	if d.applied && d.everyNodeApplied() {
		s.w.tracef("group delete: every node applied incarnation %d; the consumers come back", d.inc)
		d.release()
	}
}

// everyNodeApplied reports whether every node is up and past the
// incarnation the checker follows. A forced delete's consumers come back
// only then: a node that has not applied the delete yet still serves the
// deleted incarnation to a consumer that reaches it, and the acks it
// confirms there are that incarnation's (the next redelivers those
// records), which the checker could not tell from the next one's.
func (d *groupDeleter) everyNodeApplied() bool {
	for _, b := range d.s.nodes {
		if !b.up || b.node.GroupIncarnation(simGroup) < d.inc {
			return false
		}
	}
	return true
}
