package sched

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"slices"
)

// Carrying and checkpoints: what lets a shard's log be compacted.
//
// A schedule's message lives in the record at its At: its SCHEDULE
// record until the owner carries it — a CARRY record re-writes the
// message at the log's tail and moves At there — so a long-pending
// schedule does not pin the log's prefix. A CHECKPOINT lists the State as
// of its base (lanes, fire logs, counts, every live schedule's index and
// At, no messages). A replica whose log starts after what it applied (a
// restart at a checkpoint, a rebuild from the leader's snapshot point)
// loads the first complete checkpoint of its log and applies what
// follows; one that has the state only notes it. The log may then be
// compacted through CompactLimit: no further than the latest complete
// checkpoint's base, nor past the message of any schedule it lists
// (CompactKeepsLiveMessages): a later record never moves an At below it.

// ckptProgress is a checkpoint whose chunks are being applied.
type ckptProgress struct {
	active bool
	base   uint64
	next   uint32 // the chunk expected next
	chunks uint32
	minAt  uint64 // the lowest At among the chunks' entries so far (0: none)
}

// Restore starts a fresh state at a log that begins at from (its entries
// before it are gone): it applies nothing until a complete checkpoint
// with a base of at least from-1 loads it (Restoring), then what follows.
func (s *State) Restore(from uint64) {
	if s.applied != 0 || len(s.entries) != 0 || len(s.lanes) != 0 {
		panic("sched: Restore of a state that applied records")
	}
	if from > 1 {
		s.applied, s.restoring = from-1, true
	}
}

// Restoring reports whether the state waits for a checkpoint (Restore):
// it holds nothing the shard's owner may act on.
func (s *State) Restoring() bool { return s.restoring }

// LastCheckpoint is the base of the latest complete checkpoint applied
// (0: none).
func (s *State) LastCheckpoint() uint64 { return s.lastCkpt }

// SinceCheckpoint counts the entries applied after the latest complete
// checkpoint (or since the state's start).
func (s *State) SinceCheckpoint() uint64 { return s.sinceCkpt }

// CompactLimit is the last seq the shard's log may be compacted through:
// the latest complete checkpoint stays (a replica rebuilt from what is
// left loads it), and so does the message of every schedule it lists
// (CompactKeepsLiveMessages: a schedule's At only moves up, and the
// schedules admitted later lie after it). 0: nothing.
func (s *State) CompactLimit() uint64 {
	if s.restoring || s.lastCkpt == 0 {
		return 0
	}
	if s.lastCkptMinAt != 0 && !s.Mutations.CompactPastMessages {
		return s.lastCkptMinAt - 1 // below the base too: every At it lists is
	}
	return s.lastCkpt
}

// applyCheckpoint applies one chunk. A checkpoint counts only if its
// first chunk declares the entry just before it as its base
// (CheckpointAtItsBase: one proposed while other records were on their
// way to the log misses them) and its chunks follow one another with
// nothing between them (CheckpointChunksTogether); anything else voids
// it, on every replica alike. A restoring state loads it; any other only
// notes it.
func (s *State) applyCheckpoint(seq uint64, c *Checkpoint) {
	p := &s.ckpt
	switch {
	case c.Chunk == 0 && (c.Base == seq-1 || s.Mutations.CheckpointAnyBase):
		*p = ckptProgress{active: true, base: c.Base, chunks: c.Chunks}
		if s.restoring {
			s.loadHead(c)
			if s.failed != nil {
				return // its spill failed (ErrSpill): not to be taken for a contradiction of the log
			}
		}
	case p.active && c.Base == p.base && c.Chunk == p.next && c.Chunks == p.chunks &&
		(seq == c.Base+1+uint64(c.Chunk) || s.Mutations.CheckpointAnyBase || s.Mutations.CheckpointGaps):
	default:
		p.active = false
		return
	}
	p.next++
	for _, e := range c.Entries {
		if p.minAt == 0 || e.At < p.minAt {
			p.minAt = e.At
		}
	}
	if s.restoring {
		s.loadEntries(c)
	}
	if p.next < p.chunks {
		return
	}
	p.active = false
	s.lastCkpt, s.lastCkptMinAt, s.sinceCkpt = p.base, p.minAt, 0
	s.restoring = false
}

// loadHead replaces the state's content with a checkpoint's head: its
// counts, lanes and fire logs. What an earlier, void checkpoint loaded
// goes.
func (s *State) loadHead(c *Checkpoint) {
	for _, l := range s.lanes {
		if l.spilled > 0 {
			if err := s.spill.Drop(l.Topic); err != nil {
				s.spillFailed(err)
				return
			}
		}
	}
	s.entries, s.lanes, s.fires = map[uint64]*Entry{}, map[string]*Lane{}, map[dest]*fireLog{}
	s.spilledTotal = 0
	s.counts = c.Counts
	for _, l := range c.Lanes {
		t := c.Topics[l.Topic]
		s.lanes[t] = &Lane{Topic: t, Gate: l.Gate, Incarnation: l.Incarnation}
	}
	for _, sp := range c.Refusing {
		l := s.lanes[c.Topics[sp.Topic]]
		if l == nil || len(l.refusing) == RefusingSpansMax {
			s.failed = fmt.Errorf("sched: checkpoint at %d: a refusing span of %q contradicts its lanes", c.Base, c.Topics[sp.Topic])
			return
		}
		l.refusing = append(l.refusing, SeqSpan{From: sp.From, To: sp.To})
	}
	for _, f := range c.Fires {
		s.fires[dest{c.Topics[f.Topic], f.Partition}] = &fireLog{last: f.Last, firing: map[uint64]uint64{}}
	}
}

// loadEntries admits a chunk's schedules to a restoring state.
func (s *State) loadEntries(c *Checkpoint) {
	for _, ce := range c.Entries {
		t := c.Topics[ce.Topic]
		l, dup := s.lanes[t], s.entries[ce.ID] != nil
		var f *fireLog
		if ce.Status == StatusFiring {
			f = s.fires[dest{t, ce.Partition}]
		}
		if l == nil || dup || (ce.Status == StatusFiring && (f == nil || f.firing[ce.FireSeq] != 0)) {
			s.failed = fmt.Errorf("sched: checkpoint at %d: schedule %d of %q contradicts it", c.Base, ce.ID, t)
			return
		}
		e := &Entry{ID: ce.ID, DeliverAtMs: ce.DeliverAtMs, Topic: t, Partition: ce.Partition, Status: ce.Status,
			FireSeq: ce.FireSeq, Epoch: ce.Epoch, Incarnation: ce.Incarnation, At: ce.At, heapIndex: -1}
		l.Pending++
		if e.Status == StatusFiring {
			s.entries[e.ID] = e
			f.firing[e.FireSeq] = e.ID
			continue
		}
		s.admitPending(l, e)
		if s.failed != nil {
			return
		}
	}
}

// applyCarry moves a live schedule's message to the carry's record; a
// schedule no longer live (fired, cancelled meanwhile) is skipped.
func (s *State) applyCarry(seq uint64, c Carry) Result {
	if e := s.entries[c.ID]; e != nil {
		e.At = seq
		return Result{}
	}
	if l := s.lanes[c.Topic]; s.spill != nil && l != nil && l.spilled > 0 {
		ok, err := s.spill.Move(c.Topic, Key{DeliverAtMs: c.DeliverAtMs, ID: c.ID, Partition: c.Partition, At: seq})
		if err != nil {
			s.spillFailed(err)
			return Result{}
		}
		if ok {
			return Result{}
		}
	}
	return Result{Skipped: []uint64{c.ID}}
}

// eachLive calls f with every live schedule, lane by lane in topic
// order: its firing ones, then its pending ones by (deliver_at, id),
// resident then spilled.
func (s *State) eachLive(f func(Entry) bool) error {
	resident := map[string][]*Entry{}
	for _, e := range s.entries {
		resident[e.Topic] = append(resident[e.Topic], e)
	}
	for _, t := range s.Lanes() {
		es := resident[t]
		slices.SortFunc(es, func(a, b *Entry) int { return cmp.Or(cmp.Compare(b.Status, a.Status), compareDue(a, b)) })
		for _, e := range es {
			if !f(*e) {
				return nil
			}
		}
		if l := s.lanes[t]; l.spilled > 0 {
			more := true
			err := s.spill.Scan(t, nil, func(k Key) bool {
				more = f(*pendingEntry(t, k))
				return more
			})
			if err != nil {
				s.spillFailed(err)
				return s.failed
			}
			if !more {
				return nil
			}
		}
	}
	return nil
}

// Checkpoint returns the chunks of a checkpoint of the state as of what
// it applied, at most chunkEntries schedules a chunk. They must land at
// the log's next seqs, one after another (CheckpointAtItsBase).
func (s *State) Checkpoint(chunkEntries int) ([]Record, error) {
	if s.failed != nil || s.restoring {
		return nil, fmt.Errorf("sched: no checkpoint of a state that is failed or restoring")
	}
	chunkEntries = max(1, min(chunkEntries, RecordEntriesMax))
	topics := s.Lanes()
	if len(topics) > ckptTopicsMax {
		return nil, fmt.Errorf("sched: %d lanes do not fit a checkpoint", len(topics))
	}
	index := make(map[string]uint16, len(topics))
	for i, t := range topics {
		index[t] = uint16(i)
	}
	head := Checkpoint{Base: s.applied, Counts: s.counts, Topics: topics}
	for _, t := range topics {
		l := s.lanes[t]
		head.Lanes = append(head.Lanes, CheckpointLane{Topic: index[t], Gate: l.Gate, Incarnation: l.Incarnation})
		for _, sp := range l.refusing {
			head.Refusing = append(head.Refusing, CheckpointSpan{Topic: index[t], From: sp.From, To: sp.To})
		}
	}
	for _, d := range slices.SortedFunc(maps.Keys(s.fires), compareDest) {
		head.Fires = append(head.Fires, CheckpointFire{Topic: index[d.topic], Partition: d.partition, Last: s.fires[d].last})
	}
	if len(head.Fires) > RecordEntriesMax {
		return nil, fmt.Errorf("sched: %d fire logs do not fit a checkpoint", len(head.Fires))
	}
	chunks := []Checkpoint{head}
	err := s.eachLive(func(e Entry) bool {
		c := &chunks[len(chunks)-1]
		if len(c.Entries) == chunkEntries {
			chunks = append(chunks, Checkpoint{Base: s.applied, Topics: topics})
			c = &chunks[len(chunks)-1]
		}
		ce := CheckpointEntry{Topic: index[e.Topic], Status: e.Status, ID: e.ID, DeliverAtMs: e.DeliverAtMs, Partition: e.Partition, At: e.At}
		if e.Status == StatusFiring {
			ce.FireSeq, ce.Epoch, ce.Incarnation = e.FireSeq, e.Epoch, e.Incarnation
		}
		c.Entries = append(c.Entries, ce)
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(chunks) > CheckpointChunksMax {
		return nil, fmt.Errorf("sched: %d live schedules need %d checkpoint chunks, more than %d", s.Live(), len(chunks), CheckpointChunksMax)
	}
	recs := make([]Record, len(chunks))
	for i := range chunks {
		chunks[i].Chunk, chunks[i].Chunks = uint32(i), uint32(len(chunks))
		recs[i] = Record{Kind: KindCheckpoint, Checkpoint: chunks[i]}
	}
	return recs, nil
}

// CarryCandidates returns up to n live schedules whose message lies at
// or below seq, lowest At first: what the owner carries so the log's
// prefix through seq can go. It keeps only the n lowest while it scans.
func (s *State) CarryCandidates(seq uint64, n int) ([]Carry, error) {
	if seq == 0 || n <= 0 {
		return nil, nil
	}
	s.carryScans++
	var best carryHeap
	err := s.eachLive(func(e Entry) bool {
		if e.At > seq {
			return true
		}
		c := Carry{ID: e.ID, Topic: e.Topic, DeliverAtMs: e.DeliverAtMs, Partition: e.Partition, From: e.At}
		if len(best) < n {
			heap.Push(&best, c)
		} else if compareCarry(c, best[0]) < 0 {
			best[0] = c
			heap.Fix(&best, 0)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(best, compareCarry)
	return best, nil
}

func compareCarry(a, b Carry) int {
	return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.ID, b.ID))
}

// carryHeap is a max-heap of carries by (From, ID): its top is the one
// to drop first.
type carryHeap []Carry

func (h carryHeap) Len() int           { return len(h) }
func (h carryHeap) Less(i, j int) bool { return compareCarry(h[i], h[j]) > 0 }
func (h carryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *carryHeap) Push(x any)        { *h = append(*h, x.(Carry)) }
func (h *carryHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
