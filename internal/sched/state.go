package sched

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Gate is a lane's admission gate: the management axis, changed only by
// KindLane records applied in the shard's log order.
type Gate uint8

const (
	GateOpen           Gate = iota + 1 // schedules are admitted and fire
	GatePaused                         // admitted, held until resumed
	GateOrderingBroken                 // the destination was re-created: held until an operator resumes
	GateClosed                         // no new schedules; held until resumed
	GateRetired                        // terminal: nothing admitted, nothing fires
)

func (g Gate) String() string {
	switch g {
	case GateOpen:
		return "OPEN"
	case GatePaused:
		return "ADMIN_PAUSED"
	case GateOrderingBroken:
		return "ORDERING_BROKEN"
	case GateClosed:
		return "CLOSED"
	case GateRetired:
		return "RETIRED"
	}
	return fmt.Sprintf("Gate(%d)", uint8(g))
}

// Status is where a live schedule is.
type Status uint8

const (
	StatusPending Status = iota + 1 // waiting for its time (or its lane)
	StatusFiring                    // its intent committed: published until resolved
)

func (s Status) String() string {
	switch s {
	case StatusPending:
		return "PENDING"
	case StatusFiring:
		return "FIRING"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Entry is a live schedule: pending or firing. Resolved ones (fired,
// unknown, cancelled) are forgotten but counted.
type Entry struct {
	ID          uint64
	DeliverAtMs int64
	Topic       string
	Partition   uint32 // chosen at intake; an intent's partition once firing
	Status      Status
	FireSeq     uint64 // firing: the intent's fire sequence
	Epoch       uint64 // firing: the owner epoch that claimed it
	Incarnation uint64 // firing: the destination incarnation it was claimed for
	// At is the seq of the record that holds its message: its SCHEDULE
	// record (At = ID) until a CARRY re-writes it further on.
	At        uint64
	heapIndex int // position in its lane's due queue; -1 when not in it
}

// Lane is a destination topic's lane in the shard.
type Lane struct {
	Topic       string
	Gate        Gate
	Incarnation uint64 // pinned by its first schedule, re-pinned by a resume
	Pending     int    // live schedules (pending and firing), resident or spilled
	due         dueQueue
	spilled     int // pending schedules in the spill (bounded memory: spill.go)
	bound       Key // while spilled > 0: the last resident, before every spilled one
	// refusing: the lane's last RefusingSpansMax spans of shard seqs in
	// which it admitted no schedule (CLOSED or RETIRED), kept in its
	// checkpoints: a schedule whose record lies in one was refused as it
	// applied, and a retry of it is answered so long after (Refused).
	refusing []SeqSpan
}

// SeqSpan is the shard seqs after From and before To (0: none yet).
type SeqSpan struct{ From, To uint64 }

// Refusing returns the spans of seqs in which the lane refused schedules
// (the last RefusingSpansMax).
func (l Lane) Refusing() []SeqSpan { return slices.Clone(l.refusing) }

// RefusingSpansMax bounds the spans a lane remembers (Lane.refusing).
const RefusingSpansMax = 8

func gateRefuses(g Gate) bool { return g == GateClosed || g == GateRetired }

// dest is one destination partition of a lane: one producer identity.
type dest struct {
	topic     string
	partition uint32
}

// compareDest orders destination partitions by topic, then partition.
func compareDest(a, b dest) int {
	return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
}

// fireLog is a destination partition's fire sequences.
type fireLog struct {
	last   uint64            // highest fire sequence an applied intent used
	firing map[uint64]uint64 // unresolved fire sequence → schedule id
}

// Counts are the shard's resolved schedules.
type Counts struct {
	Admitted, Fired, Unknown, Cancelled, Rejected uint64
}

// State is a shard's scheduler state, derived from its committed log:
// every replica applies the same records in the same order and holds the
// same state. It is not safe for concurrent use.
type State struct {
	applied uint64
	// carryScans counts CarryCandidates' scans of every live schedule
	// (for the tests: an owner's round must not scan per carry batch).
	carryScans int
	loaded     bool
	failed     error
	entries    map[uint64]*Entry
	lanes      map[string]*Lane
	fires      map[dest]*fireLog
	counts     Counts
	// spill holds what does not fit the window (spill.go); nil: all
	// pending schedules are resident.
	spill        Spill
	window       int
	spilledTotal int
	// Checkpoints (checkpoint.go). restoring: the state was started at a
	// log that begins after what it applied (Restore) and holds nothing
	// until a complete checkpoint loads it. ckpt is the checkpoint being
	// applied; lastCkpt the base of the latest complete one, with the
	// lowest At of the schedules it lists (0: none); sinceCkpt counts the
	// entries applied after it.
	restoring     bool
	ckpt          ckptProgress
	lastCkpt      uint64
	lastCkptMinAt uint64
	sinceCkpt     uint64
	// Mutations break guards on purpose (tests only).
	Mutations StateMutations
}

// StateMutations are deliberate bugs in the applied state.
type StateMutations struct {
	// ReuseFireSeq applies an intent whose fire sequence is not above
	// its destination's last one: the destination would take the second
	// schedule for a retry of the first and drop it.
	ReuseFireSeq bool
	// CheckpointAnyBase takes a checkpoint whose declared base is not the
	// entry before it (it misses what landed between its making and its
	// append): a state loaded from it is not the log's.
	CheckpointAnyBase bool
	// CheckpointGaps takes a checkpoint's chunks wherever they lie, with
	// other records between them.
	CheckpointGaps bool
	// CompactPastMessages lets the log be compacted through the latest
	// checkpoint's base, messages of live schedules included.
	CompactPastMessages bool
	// CancelFiring lets a cancel take a FIRING schedule too, whose
	// publish may be on its way.
	CancelFiring bool
	// RetireRetriedRefused refuses a RETIRE of a RETIRED lane, as any
	// other command there: the operator's retry of a retire whose answer
	// was lost fails for good.
	RetireRetriedRefused bool
	// ClosedLaneAdmits applies a schedule into a CLOSED or RETIRED lane
	// as into an open one: a schedule admitted before the close applied,
	// whose record commits after it, is taken (and, in a retired lane,
	// never published).
	ClosedLaneAdmits bool
	// LaterIncarnationAdmitted applies a schedule admitted under a later
	// incarnation of its destination than its lane pins as any other:
	// the lane goes on claiming for the deleted one, and the schedule is
	// resolved UNKNOWN when the lane resumes (NoClaimForAnEarlierIncarnation).
	LaterIncarnationAdmitted bool
}

// NewState returns the state of an empty shard.
func NewState() *State {
	return &State{entries: map[uint64]*Entry{}, lanes: map[string]*Lane{}, fires: map[dest]*fireLog{}}
}

// Result is what applying one record decided, for the request that
// proposed it.
type Result struct {
	Err     error    // the record was refused as a whole (a schedule into a closed lane)
	Skipped []uint64 // ids an intent, cancel or resolution did not apply to
}

// Applied is the seq of the last applied entry.
func (s *State) Applied() uint64 { return s.applied }

// Loaded reports whether the shell finished restoring the state (its
// snapshot and the log after it) once after start.
func (s *State) Loaded() bool { return s.loaded }

// MarkLoaded is the shell's: the state is restored.
func (s *State) MarkLoaded() { s.loaded = true }

// Failed is the integrity failure that stopped the state, or nil.
func (s *State) Failed() error { return s.failed }

// Counts returns the shard's counters.
func (s *State) Counts() Counts { return s.counts }

// Entry returns a live schedule.
func (s *State) Entry(id uint64) (Entry, bool) {
	e, ok := s.entries[id]
	if !ok {
		return Entry{}, false
	}
	return *e, true
}

// Lane returns a lane.
func (s *State) Lane(topic string) (Lane, bool) {
	l, ok := s.lanes[topic]
	if !ok {
		return Lane{}, false
	}
	return Lane{Topic: l.Topic, Gate: l.Gate, Incarnation: l.Incarnation, Pending: l.Pending, refusing: slices.Clone(l.refusing)}, true
}

// Lanes returns the lanes' topics in order.
func (s *State) Lanes() []string {
	var ts []string
	for t := range s.lanes {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// Entries returns the live resident schedules by (deliver_at, id), at most
// n (0 = all): with a spill, each lane's nearest ones (its window).
func (s *State) Entries(n int) []Entry {
	es := make([]Entry, 0, len(s.entries))
	for _, e := range s.entries {
		es = append(es, *e)
	}
	slices.SortFunc(es, func(a, b Entry) int { return compareDue(&a, &b) })
	if n > 0 && len(es) > n {
		es = es[:n]
	}
	return es
}

// Live is the number of live schedules.
func (s *State) Live() int { return len(s.entries) + s.spilledTotal }

// NextDue is the earliest deliver_at of a lane's pending schedules.
func (s *State) NextDue(topic string) (int64, bool) {
	l := s.lanes[topic]
	if l == nil || len(l.due) == 0 {
		return 0, false
	}
	return l.due[0].DeliverAtMs, true
}

// LastFire is a destination partition's highest applied fire sequence.
func (s *State) LastFire(topic string, partition uint32) uint64 {
	if f := s.fires[dest{topic, partition}]; f != nil {
		return f.last
	}
	return 0
}

// lowestFiring is a destination partition's lowest unresolved fire
// sequence, or 0.
func (s *State) lowestFiring(d dest) uint64 {
	f := s.fires[d]
	if f == nil {
		return 0
	}
	var low uint64
	for seq := range f.firing {
		if low == 0 || seq < low {
			low = seq
		}
	}
	return low
}

// Apply applies the committed entry at seq: r is nil for an entry that is
// not the scheduler's (the replica group's own install entries). Entries
// must come in seq order without gaps: the state and its applied cursor
// advance together. A record that contradicts the state beyond what the
// rules below resolve is an integrity failure: the state stops (Failed)
// and applies nothing more.
// Drop steps over seqs first..last, which a repair dropped from the
// shard's log (storage's gap): what they held — a schedule, an intent, a
// cancel, a checkpoint's chunk — is gone, and they count as records that
// are not the scheduler's. A checkpoint they interrupted completes
// nothing: its next chunk no longer sits where its base says
// (CheckpointAtItsBase). first must be Applied()+1. Without it a shard stopped at the
// repair's gap for good: none of its schedules fired again.
func (s *State) Drop(first, last uint64) error {
	if s.failed != nil {
		return s.failed
	}
	if first != s.applied+1 || last < first {
		return fmt.Errorf("sched: drop seqs %d-%d after %d", first, last, s.applied)
	}
	s.applied = last
	s.sinceCkpt += last - first + 1
	return nil
}

func (s *State) Apply(seq uint64, r *Record) (Result, error) {
	if s.failed != nil {
		return Result{}, s.failed
	}
	if seq != s.applied+1 {
		return Result{}, fmt.Errorf("sched: apply seq %d after %d", seq, s.applied)
	}
	s.applied = seq
	s.sinceCkpt++
	if r == nil || r.Kind != KindCheckpoint {
		if !s.Mutations.CheckpointGaps {
			s.ckpt.active = false // a checkpoint's chunks lie together or not at all
		}
		if r == nil || s.restoring {
			return Result{}, nil // a restoring state waits for a checkpoint
		}
	}
	res := s.apply(seq, r)
	if s.failed != nil {
		return Result{}, s.failed
	}
	return res, nil
}

func (s *State) apply(seq uint64, r *Record) Result {
	switch r.Kind {
	case KindSchedule:
		return s.applySchedule(seq, r.Schedule)
	case KindIntent:
		return s.applyIntent(r.Epoch, r.Incarnation, r.Intents)
	case KindFired:
		var res Result
		for _, f := range r.Fired {
			if !s.resolve(f.ID) {
				res.Skipped = append(res.Skipped, f.ID)
				continue
			}
			s.counts.Fired++
		}
		return res
	case KindUnknown:
		var res Result
		for _, id := range r.IDs {
			if !s.resolve(id) {
				res.Skipped = append(res.Skipped, id)
				continue
			}
			s.counts.Unknown++
		}
		return res
	case KindCancel:
		var res Result
		for _, id := range r.IDs {
			e := s.entries[id]
			if e == nil {
				e, _ = s.unspill(id)
			}
			if e == nil || e.Status != StatusPending && !(s.Mutations.CancelFiring && e.Status == StatusFiring) {
				res.Skipped = append(res.Skipped, id) // unknown, already fired or firing: too late
				continue
			}
			s.drop(e)
			s.counts.Cancelled++
		}
		return res
	case KindLane:
		return s.applyLane(seq, r.Lane)
	case KindCarry:
		return s.applyCarry(seq, r.Carry)
	case KindCheckpoint:
		s.applyCheckpoint(seq, &r.Checkpoint)
		return Result{}
	}
	s.failed = fmt.Errorf("sched: entry %d: record of kind %v", seq, r.Kind)
	return Result{}
}

func (s *State) applySchedule(id uint64, sc Schedule) Result {
	l := s.lanes[sc.Topic]
	if l == nil {
		l = &Lane{Topic: sc.Topic, Gate: GateOpen, Incarnation: sc.Incarnation}
		s.lanes[sc.Topic] = l
	}
	if l.Incarnation == 0 {
		l.Incarnation = sc.Incarnation // a standing order's lane: its first schedule pins it
	}
	switch l.Gate {
	case GateClosed, GateRetired:
		if s.Mutations.ClosedLaneAdmits {
			break
		}
		s.counts.Rejected++
		return Result{Err: fmt.Errorf("lane %q is %v: it admits no schedules", sc.Topic, l.Gate)}
	}
	if sc.Incarnation > l.Incarnation && (l.Gate == GateOpen || l.Gate == GatePaused) && !s.Mutations.LaterIncarnationAdmitted {
		// NoClaimForAnEarlierIncarnation: the schedule was admitted for
		// a destination declared again since the lane's pin — proof that
		// the pinned topic was deleted, which the owner would otherwise
		// learn only from a probe or a refused publish, claiming due
		// schedules for the deleted topic meanwhile (this one included:
		// resolved UNKNOWN at the resume, never published). The lane
		// breaks as the record applies, on every replica alike, until
		// an operator resumes it into the new topic.
		l.Gate = GateOrderingBroken
	}
	e := &Entry{ID: id, DeliverAtMs: sc.DeliverAtMs, Topic: sc.Topic, Partition: sc.Partition, Status: StatusPending, At: id, heapIndex: -1}
	l.Pending++
	s.admitPending(l, e)
	s.counts.Admitted++
	return Result{}
}

// applyIntent marks claimed schedules firing. An item for a schedule no
// longer pending (cancelled, or claimed twice) is skipped, and so is one
// whose fire sequence is not above the destination's last: a reused
// sequence would make the destination take it for a retry of an earlier
// schedule and drop it (FireSeqNeverReused). A skipped item leaves its
// schedule as it was; a pending one is claimed again.
func (s *State) applyIntent(epoch, incarnation uint64, intents []Intent) Result {
	var res Result
	for _, in := range intents {
		e := s.entries[in.ID]
		if e == nil {
			e, _ = s.unspill(in.ID)
		}
		if e == nil || e.Status != StatusPending {
			res.Skipped = append(res.Skipped, in.ID)
			continue
		}
		d := dest{e.Topic, in.Partition}
		f := s.fires[d]
		if f == nil {
			f = &fireLog{firing: map[uint64]uint64{}}
			s.fires[d] = f
		}
		if in.FireSeq <= f.last && !s.Mutations.ReuseFireSeq {
			res.Skipped = append(res.Skipped, in.ID)
			if e.heapIndex < 0 {
				delete(s.entries, e.ID)
				s.admitPending(s.lanes[e.Topic], e) // taken from the spill for nothing: back
			}
			continue
		}
		f.last = max(f.last, in.FireSeq)
		f.firing[in.FireSeq] = in.ID
		l := s.lanes[e.Topic]
		if e.heapIndex >= 0 {
			heap.Remove(&l.due, e.heapIndex)
		}
		e.Status, e.Partition, e.FireSeq, e.Epoch, e.Incarnation = StatusFiring, in.Partition, in.FireSeq, epoch, incarnation
		s.refill(l)
	}
	return res
}

// resolve forgets a firing schedule (fired or unknown).
func (s *State) resolve(id uint64) bool {
	e := s.entries[id]
	if e == nil || e.Status != StatusFiring {
		return false
	}
	s.drop(e)
	return true
}

// drop forgets a live schedule.
func (s *State) drop(e *Entry) {
	l := s.lanes[e.Topic]
	if e.Status == StatusPending {
		if e.heapIndex >= 0 {
			heap.Remove(&l.due, e.heapIndex)
		}
		defer s.refill(l)
	} else if f := s.fires[dest{e.Topic, e.Partition}]; f != nil {
		delete(f.firing, e.FireSeq)
	}
	l.Pending--
	delete(s.entries, e.ID)
}

// applyLane changes a lane's gate at seq and notes where it starts or
// stops refusing schedules (Lane.refusing).
func (s *State) applyLane(seq uint64, c LaneCommand) Result {
	l := s.lanes[c.Topic]
	was := l != nil && gateRefuses(l.Gate)
	res := s.applyGate(c)
	if l = s.lanes[c.Topic]; l == nil || gateRefuses(l.Gate) == was {
		return res
	}
	if was {
		// Its span is open, unless the lane was loaded closed from a
		// checkpoint made before spans were kept.
		if n := len(l.refusing); n > 0 && l.refusing[n-1].To == 0 {
			l.refusing[n-1].To = seq
		}
		return res
	}
	if len(l.refusing) == RefusingSpansMax {
		l.refusing = slices.Delete(l.refusing, 0, 1)
	}
	l.refusing = append(l.refusing, SeqSpan{From: seq})
	return res
}

// Refused answers for a schedule of topic whose record lies at seq, as a
// retry of it may ask long after it applied: the error it was refused
// with, or nil when its lane admitted schedules there.
//
// RefusalNeverForgottenAsOK: a lane that holds RefusingSpansMax spans may
// have dropped older ones, so below its oldest it cannot tell a refusal
// from an admission: a schedule there that is not live (resident or in
// its lane's spill) is answered ErrRefusalForgotten, never nil — an OK
// for a refused schedule would tell its client it will fire.
func (s *State) Refused(topic string, seq uint64) error {
	l := s.lanes[topic]
	if l == nil {
		return nil
	}
	for _, sp := range l.refusing {
		if seq > sp.From && (sp.To == 0 || seq < sp.To) {
			return fmt.Errorf("lane %q admitted no schedules at shard seq %d (CLOSED or RETIRED from %d): %w", topic, seq, sp.From, ErrLaneAdmitsNone)
		}
	}
	if len(l.refusing) < RefusingSpansMax || seq > l.refusing[0].From || s.entries[seq] != nil {
		return nil
	}
	spilled, err := s.spilledIn(l, seq)
	switch {
	case err != nil:
		return fmt.Errorf("lane %q cannot tell whether it admitted the schedule at shard seq %d: read its spill: %v: %w", topic, seq, err, ErrRefusalForgotten)
	case !spilled:
		return fmt.Errorf("lane %q closed %d times or more since shard seq %d and no longer knows whether it admitted the schedule there "+
			"(list the lane's schedules to find it): %w", topic, RefusingSpansMax, seq, ErrRefusalForgotten)
	}
	return nil
}

// spilledIn reports whether lane l's spill holds the pending schedule id.
// It reads the lane's whole spill (Refused's rare case: a retry from
// before the lane's oldest remembered refusal).
func (s *State) spilledIn(l *Lane, id uint64) (bool, error) {
	if l.spilled == 0 {
		return false, nil
	}
	found := false
	err := s.spill.Scan(l.Topic, nil, func(k Key) bool {
		found = k.ID == id
		return !found
	})
	return found, err
}

// ErrRefusalForgotten answers a retry of a schedule whose lane no longer
// knows whether it refused it (State.Refused).
var ErrRefusalForgotten = errors.New("its outcome is no longer known")

// applyGate changes a lane's gate. The transitions are closed: a retired
// lane takes no command; an ordering break names the incarnation it saw
// contradicted and is ignored once a resume re-pinned another.
func (s *State) applyGate(c LaneCommand) Result {
	l := s.lanes[c.Topic]
	if l == nil {
		if c.Op == LaneBreak || c.Op == LaneResume {
			return Result{} // nothing to break or open
		}
		// Pausing, closing or retiring a lane this shard never held is a
		// standing order for the topic's future schedules here: a topic's
		// lane is one per shard, and the operator commands the topic.
		l = &Lane{Topic: c.Topic, Gate: GateOpen, Incarnation: c.Incarnation}
		s.lanes[c.Topic] = l
	}
	if l.Gate == GateRetired {
		if c.Op == LaneRetire && !s.Mutations.RetireRetriedRefused {
			return Result{} // a retried retire: what it asks holds
		}
		return Result{Err: fmt.Errorf("lane %q is RETIRED", c.Topic)}
	}
	switch c.Op {
	case LaneResume:
		l.Gate = GateOpen
		if c.Incarnation != 0 {
			l.Incarnation = c.Incarnation
		}
	case LanePause:
		if l.Gate == GatePaused {
			return Result{} // a retried pause
		}
		if l.Gate != GateOpen {
			return Result{Err: fmt.Errorf("lane %q is %v, not OPEN", c.Topic, l.Gate)}
		}
		l.Gate = GatePaused
	case LaneClose:
		l.Gate = GateClosed
	case LaneBreak:
		if c.Incarnation != l.Incarnation || l.Gate == GateClosed {
			return Result{} // stale: resumed since, or already held harder
		}
		l.Gate = GateOrderingBroken
	case LaneRetire:
		l.Gate = GateRetired
		s.counts.Cancelled += uint64(s.dropSpilled(l))
		for _, e := range s.laneEntries(c.Topic) {
			if e.Status == StatusPending {
				s.counts.Cancelled++
			} else {
				// Its publish may or may not have landed, and nothing
				// will try again: recorded, not guessed.
				s.counts.Unknown++
			}
			s.drop(e)
		}
	}
	return Result{}
}

func (s *State) laneEntries(topic string) []*Entry {
	var es []*Entry
	for _, e := range s.entries {
		if e.Topic == topic {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, compareDue)
	return es
}

// firing returns a lane's firing schedules by (partition, fire sequence):
// the order their publishes go out in.
func (s *State) firing(topic string) []*Entry {
	var es []*Entry
	for d, f := range s.fires {
		if d.topic != topic {
			continue
		}
		for _, id := range f.firing {
			es = append(es, s.entries[id])
		}
	}
	slices.SortFunc(es, func(a, b *Entry) int {
		if a.Partition != b.Partition {
			return int(a.Partition) - int(b.Partition)
		}
		return cmpU64(a.FireSeq, b.FireSeq)
	})
	return es
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareDue(a, b *Entry) int { return CompareKeys(a.key(), b.key()) }

// dueQueue is a lane's pending schedules, a min-heap by (deliver_at, id).
type dueQueue []*Entry

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return compareDue(q[i], q[j]) < 0 }
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].heapIndex, q[j].heapIndex = i, j
}
func (q *dueQueue) Push(x any) {
	e := x.(*Entry)
	e.heapIndex = len(*q)
	*q = append(*q, e)
}
func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.heapIndex = -1
	return e
}

// dueInOrder calls f with a lane's pending schedules by (deliver_at, id)
// until f returns false, without disturbing the queue: a frontier of
// heap positions, smallest first, visits k entries in O(k log k).
func (s *State) dueInOrder(topic string, f func(*Entry) bool) {
	l := s.lanes[topic]
	if l == nil || len(l.due) == 0 {
		return
	}
	q := l.due
	frontier := positions{q: q, at: []int{0}}
	for len(frontier.at) > 0 {
		i := heap.Pop(&frontier).(int)
		if !f(q[i]) {
			return
		}
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(q) {
				heap.Push(&frontier, c)
			}
		}
	}
}

// positions is a min-heap of positions in a due queue, by their entries.
type positions struct {
	q  dueQueue
	at []int
}

func (p positions) Len() int           { return len(p.at) }
func (p positions) Less(i, j int) bool { return compareDue(p.q[p.at[i]], p.q[p.at[j]]) < 0 }
func (p positions) Swap(i, j int)      { p.at[i], p.at[j] = p.at[j], p.at[i] }
func (p *positions) Push(x any)        { p.at = append(p.at, x.(int)) }
func (p *positions) Pop() any {
	v := p.at[len(p.at)-1]
	p.at = p.at[:len(p.at)-1]
	return v
}

// Clone returns a deep copy of s (the model checker branches states).
func (s *State) Clone() *State {
	if s.spill != nil {
		panic("sched: Clone of a state with a spill") // the model's states keep everything resident
	}
	c := *s
	c.entries = make(map[uint64]*Entry, len(s.entries))
	for id, e := range s.entries {
		x := *e
		c.entries[id] = &x
	}
	c.lanes = make(map[string]*Lane, len(s.lanes))
	for t, l := range s.lanes {
		x := *l
		x.refusing = slices.Clone(l.refusing)
		x.due = make(dueQueue, len(l.due))
		for i, e := range l.due {
			x.due[i] = c.entries[e.ID]
		}
		c.lanes[t] = &x
	}
	c.fires = make(map[dest]*fireLog, len(s.fires))
	for d, f := range s.fires {
		c.fires[d] = &fireLog{last: f.last, firing: maps.Clone(f.firing)}
	}
	return &c
}
