package sim

// Group deletes of a members run (ClusterOptions.GroupDeletes): at random
// moments of the fault phase, once the group acked some records, every
// member crashes and stays cut off from every node; once the coordinator fenced them the group is deleted —
// DELETE asked at every node that is up every 50 ms, for up to 10 s of
// virtual time — and the members come back, as members of the group's next
// incarnation. The checker forgets the group's acks the moment any node
// applied a delete (observeGroupDeletes: its incarnation moved on): from
// then on the next incarnation must deliver and ack every acknowledged
// record kept (Liveness), and AckFloorNeverRedelivered counts its acks
// only (GroupIncarnationStartsEmpty). A delete asked late may still commit
// after the members came back; the metadata refuses it while the group
// has members, and the checker follows whatever it applied.

const (
	groupDeleteTryMs    = 50
	groupDeleteGiveUpMs = 10_000
	groupDeleteGapMinMs = 300
	groupDeleteGapMaxMs = 1_500
)

type groupDeleter struct {
	s        *sim
	left     int    // episodes still to start
	inc      uint64 // the group's incarnation the checker follows
	deleting bool   // the members are away, deletes asked
	untilMs  int64  // when the episode gives up
	deletes  int    // incarnations the checker saw deleted
	// ackedAt: the acks confirmed when the members last came back; an
	// episode starts once the group acked groupDeleteAcks more.
	ackedAt int
}

// groupDeleteAcks: an episode waits for this many acks of the group's
// current incarnation, so that it has something to forget.
const groupDeleteAcks = 10

func newGroupDeleter(s *sim, episodes int) *groupDeleter {
	d := &groupDeleter{s: s, left: episodes, inc: 1}
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
	d.deleting, d.untilMs = true, s.w.nowMs+groupDeleteGiveUpMs
	s.w.tracef("group delete: every member goes away")
	for _, c := range s.consumers {
		s.partitioned[c.name()] = true
		c.crash()
	}
	d.try()
}

// try asks every node that is up to delete the group (the coordinator
// takes it once its members are fenced; the others refuse).
func (d *groupDeleter) try() {
	s := d.s
	if !d.deleting {
		return
	}
	if s.healed || s.w.nowMs > d.untilMs {
		s.w.tracef("group delete: given up")
		d.release()
		return
	}
	for _, b := range s.nodes {
		if b.up {
			b.node.DeleteGroup(simGroup, func(error) {})
		}
	}
	s.w.after(groupDeleteTryMs, d.try)
}

// release brings the members back and plans the next episode.
func (d *groupDeleter) release() {
	s := d.s
	d.deleting, d.ackedAt = false, s.acksConfirmed
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
			d.deletes += int(inc - d.inc)
			d.inc = inc
			clear(s.chk.groupDone)
			clear(s.chk.doneAtID)
			if d.deleting {
				d.release()
			}
		}
	}
}
