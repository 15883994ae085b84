package kv

import (
	"fmt"
	"sort"
	"strings"
)

// Cursor is a watcher's position: Next is the first revision it has not
// seen (1 or more); Prefix limits it to keys that start with it.
type Cursor struct {
	Next   uint64
	Prefix string
}

// EventKind is the kind of a watch event.
type EventKind uint8

const (
	// EventPut and EventDelete deliver a revision (a value, a tombstone).
	EventPut EventKind = iota + 1
	EventDelete
	// EventSkipped: the seqs From..To hold nothing for this watcher, for
	// benign Reasons; the watcher's cursor moves to To+1.
	EventSkipped
	// EventCursorExpired: the watcher's cursor is below Floor, so a
	// revision it has not seen was evicted. The watch ends; the watcher
	// must resync (list the keys) and resume from the bucket's revision.
	EventCursorExpired
)

func (k EventKind) String() string {
	switch k {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DEL"
	case EventSkipped:
		return "SKIPPED"
	case EventCursorExpired:
		return "CURSOR_EXPIRED"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// SkipReason says why seqs were skipped; a Skipped event ORs them.
type SkipReason uint8

const (
	// SkipOverwritten: no kept revision — one overwritten by HistoryMax
	// newer revisions of its key, or none at all (a refused CAS, a
	// compaction record, a checkpoint chunk, a record that is not KV).
	// Never an eviction.
	SkipOverwritten SkipReason = 1 << iota
	// SkipOutsidePrefix: kept revisions of keys outside the prefix.
	SkipOutsidePrefix
)

func (r SkipReason) String() string {
	var parts []string
	if r&SkipOverwritten != 0 {
		parts = append(parts, "overwritten")
	}
	if r&SkipOutsidePrefix != 0 {
		parts = append(parts, "outside-prefix")
	}
	if rest := r &^ (SkipOverwritten | SkipOutsidePrefix); rest != 0 || len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("SkipReason(%d)", uint8(rest)))
	}
	return strings.Join(parts, "|")
}

// Event is one watch event. Revision is set for PUT and DEL (its Value is
// the bucket's: do not modify); From, To and Reasons for SKIPPED; Floor
// for CURSOR_EXPIRED.
type Event struct {
	Kind     EventKind
	Revision Revision
	From, To uint64
	Reasons  SkipReason
	Floor    uint64
}

// WatchBatch is one Watch call's answer. The events account for every
// seq from the cursor up to Next-1, in order: each is delivered or inside
// a SKIPPED range. Expired: the last event is CURSOR_EXPIRED and Next is
// the cursor unchanged.
type WatchBatch struct {
	Events  []Event
	Next    uint64
	Expired bool
}

// Watch returns the events after the cursor, in revision order: at most
// credit PUT/DEL events (SKIPPED markers take no credit; there is at most
// one before each delivered event and one at the end), looking at no more
// than WatchScanRevisionsMax kept revisions. A cursor below the floor gets
// CURSOR_EXPIRED and nothing else: the server never jumps a watcher over
// an evicted revision.
func (b *Bucket) Watch(c Cursor, credit int) WatchBatch {
	next := max(c.Next, 1)
	if next < b.floor {
		// A watcher resumes only at or above the floor: below it a
		// revision it has not seen was evicted, and moving it up would
		// hide that (the silent clamp).
		if !b.cfg.Mutations.WatchJumpsFloor {
			return WatchBatch{Events: []Event{{Kind: EventCursorExpired, Floor: b.floor}}, Next: next, Expired: true}
		}
		next = b.floor
	}
	batch := WatchBatch{Next: next}
	var skip Event // pending SKIPPED range, Kind 0 when none
	noteSkip := func(from, to uint64, reason SkipReason) {
		if skip.Kind == 0 {
			skip = Event{Kind: EventSkipped, From: from}
		}
		skip.To, skip.Reasons = to, skip.Reasons|reason
	}
	flushSkip := func() {
		if skip.Kind != 0 {
			batch.Events = append(batch.Events, skip)
			skip = Event{}
		}
	}
	delivered, scanned := 0, 0
	i := sort.Search(len(b.order), func(i int) bool { return b.order[i] >= next })
	for ; i < len(b.order) && delivered < credit && scanned < b.cfg.WatchScanRevisionsMax; i++ {
		seq := b.order[i]
		key, kept := b.bySeq[seq]
		if !kept {
			continue // dropped: inside the gap before the next kept one
		}
		scanned++
		if seq > next {
			noteSkip(next, seq-1, SkipOverwritten)
		}
		next = seq + 1
		if !strings.HasPrefix(key, c.Prefix) {
			noteSkip(seq, seq, SkipOutsidePrefix)
			continue
		}
		flushSkip()
		rev := b.revisionAt(key, seq)
		kind := EventPut
		if rev.Op == OpDelete {
			kind = EventDelete
		}
		batch.Events = append(batch.Events, Event{Kind: kind, Revision: rev})
		delivered++
	}
	if i == len(b.order) && next <= b.applied {
		// Every kept revision was looked at: the rest up to Applied holds
		// none.
		noteSkip(next, b.applied, SkipOverwritten)
		next = b.applied + 1
	}
	flushSkip()
	batch.Next = next
	return batch
}

func (b *Bucket) revisionAt(key string, seq uint64) Revision {
	history := b.keys[key]
	j := sort.Search(len(history), func(j int) bool { return history[j].Seq >= seq })
	if j == len(history) || history[j].Seq != seq {
		panic(fmt.Sprintf("kv: kept revision %d of %q missing from its history", seq, key))
	}
	return history[j]
}
