package sched

import (
	"container/heap"
	"errors"
	"slices"
)

// Listing. A shard may hold millions of live schedules, most of them
// spilled, so it is listed a page at a time: List answers the live
// schedules (firing ones, resident pending ones and spilled ones alike)
// after a cursor, by (deliver_at, id), at most ListPageMax of them. The
// cursor is a schedule's key, which every replica derives alike from the
// shard's log and which never changes while the schedule lives (a carry
// moves its message, not its key), so it survives a rebuilt spill, a
// restarted state and a new owner: a page after it holds exactly the
// schedules that are live then and come after it — none listed twice, and
// none that stayed live throughout skipped.

// ListPageMax bounds the schedules of one page of a listing.
const ListPageMax = 1000

// ListCursor is where a page of a listing ended: the next page holds
// the schedules after (DeliverAtMs, ID). The zero cursor (ID 0: no
// schedule has id 0) is the listing's start.
type ListCursor struct {
	DeliverAtMs int64
	ID          uint64
}

// ErrListUnavailable refuses a listing of a state that is restoring (it
// holds nothing yet) or failed (it no longer knows every schedule): its
// answer would be wrong, not late.
var ErrListUnavailable = errors.New("sched: the state cannot be listed")

// after reports whether k comes after the cursor.
func (c ListCursor) after(k Key) bool {
	return c.ID == 0 || CompareKeys(k, Key{DeliverAtMs: c.DeliverAtMs, ID: c.ID}) > 0
}

// List returns the live schedules of lane topic ("" = every lane) that
// come after cursor, by (deliver_at, id), at most n (n < 1 or above
// ListPageMax: ListPageMax), and whether more follow. It reads at most
// n+1 spilled schedules of each lane, from the cursor on (Spill.Scan),
// fewer once they cannot make the page, and changes nothing — except that a spill that fails to read stops the
// state (ErrSpill), as any spill failure does: it no longer knows its
// schedules.
func (s *State) List(topic string, cursor ListCursor, n int) ([]Entry, bool, error) {
	if s.failed != nil || s.restoring {
		return nil, false, ErrListUnavailable
	}
	if n < 1 || n > ListPageMax {
		n = ListPageMax
	}
	// The n+1 smallest live schedules after the cursor (one more than
	// the page: whether more follow), in a max-heap by key.
	var best listHeap
	offer := func(e Entry) {
		if len(best) <= n {
			heap.Push(&best, e)
		} else if compareDue(&e, &best[0]) < 0 {
			best[0] = e
			heap.Fix(&best, 0)
		}
	}
	for _, e := range s.entries {
		if (topic == "" || e.Topic == topic) && cursor.after(e.key()) {
			offer(*e)
		}
	}
	lanes := []string{topic}
	if topic == "" {
		lanes = s.Lanes()
	}
	for _, t := range lanes {
		l := s.lanes[t]
		if l == nil || l.spilled == 0 {
			continue
		}
		var from *Key
		if cursor.ID != 0 {
			from = &Key{DeliverAtMs: cursor.DeliverAtMs, ID: cursor.ID}
		}
		taken := 0
		err := s.spill.Scan(t, from, func(k Key) bool {
			if !cursor.after(k) {
				return true // a spill that seeks loosely: skipped
			}
			if len(best) > n && CompareKeys(k, best[0].key()) >= 0 {
				return false // in order: none of the rest makes the page
			}
			offer(*pendingEntry(t, k))
			taken++
			return taken <= n
		})
		if err != nil {
			s.spillFailed(err)
			return nil, false, s.failed
		}
	}
	page := []Entry(best)
	slices.SortFunc(page, func(a, b Entry) int { return compareDue(&a, &b) })
	for i := range page {
		page[i].heapIndex = -1
	}
	if len(page) > n {
		return page[:n], true, nil
	}
	return page, false, nil
}

// listHeap is a max-heap of entries by (deliver_at, id): its top is the
// one a smaller candidate replaces.
type listHeap []Entry

func (h listHeap) Len() int           { return len(h) }
func (h listHeap) Less(i, j int) bool { return compareDue(&h[i], &h[j]) > 0 }
func (h listHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *listHeap) Push(x any)        { *h = append(*h, x.(Entry)) }
func (h *listHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
