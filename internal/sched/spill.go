package sched

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"slices"
)

// Bounded memory. A State given a window (SetSpill) keeps at most about
// twice that many pending schedules of each lane in RAM: the nearest
// ones, by (deliver_at, id). The rest of a lane lies in its Spill, which
// the shell keeps on disk. Every resident pending schedule of a lane
// comes before every spilled one (SpillAfterWindow), so the owner, which
// claims a lane's due work in order from the front, never needs the
// spill: a lane whose resident part falls below half the window is
// refilled with the spill's smallest at once, and one that grows past
// twice the window gives its far half back. Firing schedules are always
// resident (at most the fire window per destination).

// Key is a pending schedule as its lane's spill holds it.
type Key struct {
	DeliverAtMs int64
	ID          uint64
	Partition   uint32
	At          uint64 // where its message lives (Entry.At)
}

// CompareKeys orders schedules as they fall due: by deliver_at, then id.
func CompareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.DeliverAtMs, b.DeliverAtMs), cmp.Compare(a.ID, b.ID))
}

func (e *Entry) key() Key {
	return Key{DeliverAtMs: e.DeliverAtMs, ID: e.ID, Partition: e.Partition, At: e.At}
}

// pendingEntry is the resident entry of a spilled key.
func pendingEntry(lane string, k Key) *Entry {
	return &Entry{ID: k.ID, DeliverAtMs: k.DeliverAtMs, Topic: lane, Partition: k.Partition, At: k.At, Status: StatusPending, heapIndex: -1}
}

// Spill holds each lane's pending schedules beyond the State's window.
// It is the State's only way to the shell's storage, and it must answer
// deterministically: the same calls, the same answers. An error stops the
// State (Failed): its pending schedules are no longer all known.
type Spill interface {
	// Put adds a pending schedule to lane.
	Put(lane string, k Key) error
	// Pop removes and returns lane's n smallest schedules, in order.
	Pop(lane string, n int) ([]Key, error)
	// Delete removes the schedule id if the spill holds it, wherever
	// its lane (the shell knows every schedule's lane and key by its id),
	// and returns its lane and key.
	Delete(id uint64) (lane string, k Key, ok bool, err error)
	// Drop removes all of lane's schedules.
	Drop(lane string) error
	// Move replaces lane's schedule k (by deliver_at and id) with k, whose
	// At moved (a carry); ok is false if the spill does not hold it.
	Move(lane string, k Key) (ok bool, err error)
	// Scan calls f with each of lane's schedules in order, from the
	// first after from (nil: from the first), changing nothing, until f
	// returns false. A listing's page (List) seeks with from, so it
	// must not read what comes before it.
	Scan(lane string, from *Key, f func(Key) bool) error
}

// SetSpill bounds the RAM a State keeps of each lane's pending schedules
// to about twice window (at least 2), spilling the rest to sp. It must be
// called before anything is applied.
func (s *State) SetSpill(sp Spill, window int) {
	if s.applied != 0 || len(s.entries) != 0 {
		panic("sched: SetSpill on a state that applied records")
	}
	s.spill, s.window = sp, max(window, 2)
}

// Spilled is the number of pending schedules the spill holds.
func (s *State) Spilled() int { return s.spilledTotal }

// ErrSpill marks a State's failure in its spill: the shell's storage
// failed, not the shard's log, and a new State replaying the log
// recovers.
var ErrSpill = errors.New("sched: spill failed")

func (s *State) spillFailed(err error) {
	if s.failed == nil {
		s.failed = fmt.Errorf("%w: %w", ErrSpill, err)
	}
}

// admitPending places a new pending schedule: resident unless its lane
// spills and it comes after the lane's resident part.
func (s *State) admitPending(l *Lane, e *Entry) {
	if s.spill != nil && l.spilled > 0 && CompareKeys(e.key(), l.bound) > 0 {
		if err := s.spill.Put(l.Topic, e.key()); err != nil {
			s.spillFailed(err)
			return
		}
		l.spilled++
		s.spilledTotal++
		return
	}
	s.entries[e.ID] = e
	heap.Push(&l.due, e)
	if s.spill != nil && len(l.due) > 2*s.window {
		s.trim(l)
	}
}

// trim keeps a lane's window nearest pending schedules resident and
// spills the others, which all come after them.
func (s *State) trim(l *Lane) {
	es := slices.Clone(l.due)
	slices.SortFunc(es, compareDue)
	keep, far := es[:s.window], es[s.window:]
	for _, e := range far {
		if err := s.spill.Put(l.Topic, e.key()); err != nil {
			s.spillFailed(err)
			return
		}
		delete(s.entries, e.ID)
		e.heapIndex = -1
		l.spilled++
		s.spilledTotal++
	}
	clear(l.due[s.window:]) // no stale pointers past the new end
	l.due = l.due[:0]
	for _, e := range keep {
		heap.Push(&l.due, e)
	}
	l.bound = keep[len(keep)-1].key()
}

// refill brings a lane's resident part back to the window from its
// spill once it fell below half of it.
func (s *State) refill(l *Lane) {
	if s.spill == nil || l.spilled == 0 || len(l.due) >= max(1, s.window/2) {
		return
	}
	n := min(s.window-len(l.due), l.spilled)
	ks, err := s.spill.Pop(l.Topic, n)
	if err == nil && len(ks) != n {
		err = fmt.Errorf("lane %q: popped %d of %d spilled", l.Topic, len(ks), n)
	}
	if err != nil {
		s.spillFailed(err)
		return
	}
	for _, k := range ks {
		e := pendingEntry(l.Topic, k)
		s.entries[e.ID] = e
		heap.Push(&l.due, e)
	}
	l.spilled -= n
	s.spilledTotal -= n
	l.bound = ks[n-1]
}

// unspill takes a pending schedule that is not resident out of its
// lane's spill: a cancel, or an intent that claims it. Replicas keep the
// same schedules resident only while their windows are equal, so a claim
// of a schedule this replica spilled is applied, not skipped.
func (s *State) unspill(id uint64) (*Entry, bool) {
	if s.spill == nil || s.spilledTotal == 0 {
		return nil, false
	}
	lane, k, ok, err := s.spill.Delete(id)
	if err == nil && ok && (s.lanes[lane] == nil || s.lanes[lane].spilled == 0 || k.ID != id) {
		err = fmt.Errorf("deleted schedule %d (%d) from lane %q, which spilled nothing", id, k.ID, lane)
	}
	if err != nil {
		s.spillFailed(err)
		return nil, false
	}
	if !ok {
		return nil, false
	}
	l := s.lanes[lane]
	l.spilled--
	s.spilledTotal--
	e := pendingEntry(lane, k)
	s.entries[id] = e
	return e, true
}

// dropSpilled forgets a lane's spilled schedules and returns how many.
func (s *State) dropSpilled(l *Lane) int {
	n := l.spilled
	if n == 0 {
		return 0
	}
	if err := s.spill.Drop(l.Topic); err != nil {
		s.spillFailed(err)
		return 0
	}
	l.spilled = 0
	l.Pending -= n
	s.spilledTotal -= n
	return n
}
