package node

import "sync"

// queueBytes bounds the record bytes waiting in a partition's publish
// queue. The queue's channel counts hand-offs, and one hand-off (a
// PUB_BATCH's records for the partition) can carry up to a frame's worth
// of records: counted alone, 8,192 of them could hold tens of GiB.
// Publishers wait here, as they wait for room in the channel; a hand-off
// larger than the bound goes in alone, once the queue holds no bytes.
type queueBytes struct {
	mu   sync.Mutex
	held int64
	max  int64
	// freed is poked when bytes leave the queue, and by a waiter that got
	// in while room is left, so that the next waiter looks again.
	freed chan struct{}
}

func newQueueBytes(max int64) *queueBytes {
	return &queueBytes{max: max, freed: make(chan struct{}, 1)}
}

// acquire waits until n bytes fit, and takes them; it reports false when
// done closes first (nothing taken).
func (q *queueBytes) acquire(n int64, done <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if q.held == 0 || q.held+n <= q.max {
			q.held += n
			room := q.held < q.max
			q.mu.Unlock()
			if room {
				q.poke()
			}
			return true
		}
		q.mu.Unlock()
		select {
		case <-q.freed:
		case <-done:
			return false
		}
	}
}

// release gives back n bytes that left the queue.
func (q *queueBytes) release(n int64) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	q.held -= n
	q.mu.Unlock()
	q.poke()
}

func (q *queueBytes) poke() {
	select {
	case q.freed <- struct{}{}:
	default:
	}
}

// queued returns the bytes in the queue.
func (q *queueBytes) queued() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held
}
