// Package partition holds the deterministic state of one partition that is
// derived from its committed log: today the idempotent-producer dedup table
// and the sequence/commit bookkeeping of the publish path. It is a kernel
// (DESIGN §3): no I/O, no clock, no goroutines; the node shell feeds it
// requests and log entries and carries out its decisions.
package partition

// dedupEntry remembers where one producer_seq landed.
type dedupEntry struct {
	producerSeq uint64
	seq         uint64
	epoch       uint64
}

// producerWindow is the dedup state of one producer on one partition.
//
// Invariant: every producer_seq ≥ floor that was ever appended is in the
// window. So a producer_seq not in it is provably new when it is ≥ floor,
// and unprovable (PRODUCER_SEQ_TOO_OLD) when it is below.
//
// A full window forgets its lowest producer_seq, not its oldest append:
// retries and leader changes append a producer's sequences out of order,
// and forgetting an early-appended high sequence would raise the floor over
// lower ones still in flight, whose retries could then only be TOO_OLD. With
// lowest-first eviction a sequence stays provable while fewer than
// windowMax higher ones were appended — which the SDK guarantees by keeping
// its sequences within a window's span of the oldest still in flight.
//
// The window is a ring sorted by producer_seq: a producer's next message
// (the common case, on every replica for every publish) goes at the tail
// and evicts at the head in O(1); one out of order is inserted in place.
type producerWindow struct {
	ring    []dedupEntry // n entries from head on, wrapping; grows up to windowMax
	head, n int
	floor   uint64 // raised past every evicted producer_seq
	// lastSeq is the log seq of the producer's latest mention of its
	// highest producer_seq: the append of a producer_seq above every one
	// before it, or a carry that re-stated its window since (carry.go).
	// An append out of order (a retry of a lower producer_seq landing
	// after a higher one) does not move it: the log is kept from the
	// highest one's mention on (HighestSeqKeptInLog), which a window
	// rebuilt from the kept log is sealed at (SealHistory). It orders
	// eviction (least recent first) and bounds compaction.
	lastSeq uint64
	maxSeen uint64 // highest producer_seq ever recorded
	// id and the recency list: the table's windows by (lastSeq, id).
	id           uint64
	older, newer *producerWindow
}

// at is the window's i-th lowest entry (i ≤ n, and i < len(ring)).
func (w *producerWindow) at(i int) *dedupEntry {
	if i += w.head; i >= len(w.ring) {
		i -= len(w.ring)
	}
	return &w.ring[i]
}

// above is the index of the first entry whose producer_seq is above ps
// (n when none is).
func (w *producerWindow) above(ps uint64) int {
	lo, hi := 0, w.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if w.at(mid).producerSeq <= ps {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (w *producerWindow) find(producerSeq uint64) (dedupEntry, bool) {
	if producerSeq > w.maxSeen {
		return dedupEntry{}, false // the common case: a producer's next message
	}
	if i := w.above(producerSeq); i > 0 && w.at(i-1).producerSeq == producerSeq {
		return *w.at(i - 1), true
	}
	return dedupEntry{}, false
}

func (w *producerWindow) add(e dedupEntry, windowMax int, outOfOrderMoves bool) {
	if w.n == 0 || e.producerSeq > w.maxSeen || outOfOrderMoves {
		w.lastSeq = e.seq
	}
	w.insert(e, windowMax)
}

// insert puts e in the window in its place by producer_seq.
func (w *producerWindow) insert(e dedupEntry, windowMax int) {
	w.maxSeen = max(w.maxSeen, e.producerSeq)
	if w.n == windowMax {
		// Full: the lowest goes — e itself when it is the lowest.
		lowest := w.at(0).producerSeq
		if lowest >= e.producerSeq {
			w.floor = max(w.floor, e.producerSeq+1)
			return
		}
		w.floor = max(w.floor, lowest+1)
		if w.head++; w.head == len(w.ring) {
			w.head = 0
		}
		w.n--
	}
	if w.n == len(w.ring) {
		w.grow(windowMax)
	}
	i := w.n
	if i > 0 && w.at(i-1).producerSeq > e.producerSeq {
		i = w.above(e.producerSeq)
		for j := w.n; j > i; j-- {
			*w.at(j) = *w.at(j - 1)
		}
	}
	*w.at(i) = e
	w.n++
}

// grow doubles the ring (up to windowMax entries) and unwraps it.
func (w *producerWindow) grow(windowMax int) {
	ring := make([]dedupEntry, min(max(2*len(w.ring), 4), windowMax))
	for i := range w.n {
		ring[i] = *w.at(i)
	}
	w.ring, w.head = ring, 0
}

// Producers is the dedup table of one partition, bounded in producers and
// in remembered sequences per producer.
type Producers struct {
	byID         map[uint64]*producerWindow
	windowMax    int
	producersMax int
	// oldest and newest end the recency list, ordered by (lastSeq, id):
	// the least recently used producer is evicted in O(1). Entries come
	// in log order, so a window moves to the newest end; one that comes
	// out of order walks back to its place.
	oldest, newest *producerWindow
	// Mutations (tests only): the old rules — an append out of order
	// moves the latest mention; a rebuilt window is sealed at its lowest
	// remembered producer_seq.
	outOfOrderMoves, sealAtLowest bool
}

// NewProducers returns an empty table. windowMax bounds the remembered
// producer_seqs per producer (it must exceed a client's in-flight window);
// producersMax bounds the producers kept, evicting the least recently used.
func NewProducers(windowMax, producersMax int) *Producers {
	if windowMax < 1 || producersMax < 1 {
		panic("partition: dedup bounds must be positive")
	}
	return &Producers{byID: make(map[uint64]*producerWindow), windowMax: windowMax, producersMax: producersMax}
}

// Verdict classifies a (producer_id, producer_seq) against the table.
type Verdict uint8

const (
	// VerdictNew: never appended; append it.
	VerdictNew Verdict = iota
	// VerdictDuplicate: appended before at the returned seq and epoch.
	VerdictDuplicate
	// VerdictTooOld: below the window floor; whether it was appended is unknown.
	VerdictTooOld
)

func (v Verdict) String() string {
	switch v {
	case VerdictNew:
		return "New"
	case VerdictDuplicate:
		return "Duplicate"
	case VerdictTooOld:
		return "TooOld"
	}
	return "Verdict(?)"
}

// Check looks a producer_seq up without changing the table.
func (p *Producers) Check(producerID, producerSeq uint64) (v Verdict, seq, epoch uint64) {
	w := p.byID[producerID]
	if w == nil {
		return VerdictNew, 0, 0
	}
	if e, ok := w.find(producerSeq); ok {
		return VerdictDuplicate, e.seq, e.epoch
	}
	if producerSeq < w.floor {
		return VerdictTooOld, 0, 0
	}
	return VerdictNew, 0, 0
}

// Record notes that producerSeq was appended at (seq, epoch).
func (p *Producers) Record(producerID, producerSeq, seq, epoch uint64) {
	w := p.byID[producerID]
	if w == nil {
		if len(p.byID) >= p.producersMax {
			p.evictLeastRecent()
		}
		w = &producerWindow{id: producerID}
		p.byID[producerID] = w
	} else {
		p.unlink(w)
	}
	w.add(dedupEntry{producerSeq: producerSeq, seq: seq, epoch: epoch}, p.windowMax, p.outOfOrderMoves)
	p.link(w)
}

// link puts w in its place in the recency list, searching from the
// newest end.
func (p *Producers) link(w *producerWindow) {
	after := p.newest
	for after != nil && (after.lastSeq > w.lastSeq || after.lastSeq == w.lastSeq && after.id > w.id) {
		after = after.older
	}
	w.older = after
	if after == nil {
		w.newer, p.oldest = p.oldest, w
	} else {
		w.newer, after.newer = after.newer, w
	}
	if w.newer == nil {
		p.newest = w
	} else {
		w.newer.older = w
	}
}

func (p *Producers) unlink(w *producerWindow) {
	if w.older == nil {
		p.oldest = w.newer
	} else {
		w.older.newer = w.newer
	}
	if w.newer == nil {
		p.newest = w.older
	} else {
		w.newer.older = w.older
	}
	w.older, w.newer = nil, nil
}

// SealHistory marks every known producer's window as possibly incomplete
// below its highest remembered entry. The shell calls it after rebuilding
// from a log whose oldest records were deleted by retention: sequences
// appended in the deleted part are no longer provable, so they must not
// pass as new. The kept log holds each producer's highest producer_seq
// (HighestSeqKeptInLog), but a lower one may have landed before the
// compaction point and a still lower one after it (appends out of order),
// so only the highest remembered bounds what is provably new: a lower one
// not remembered is PRODUCER_SEQ_TOO_OLD (sealing at the lowest
// remembered let such a retry append again — found by the produce model).
func (p *Producers) SealHistory() {
	for _, w := range p.byID {
		if w.n > 0 {
			at := w.n - 1
			if p.sealAtLowest {
				at = 0
			}
			w.floor = max(w.floor, w.at(at).producerSeq)
		}
	}
}

// Len is the number of producers tracked.
func (p *Producers) Len() int { return len(p.byID) }

// evictLeastRecent forgets the producer with the lowest lastSeq (the
// lowest id among equals).
func (p *Producers) evictLeastRecent() {
	w := p.oldest
	p.unlink(w)
	delete(p.byID, w.id)
}
