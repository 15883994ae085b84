// Package budget bounds bytes held between goroutines: a publisher's
// records in a partition's queue, a connection's frames not yet answered.
// Those that would hold more wait until the holders give bytes back.
package budget

import "sync"

// Bytes is a bound on bytes held. One holding larger than the bound is
// let in alone, once nothing is held: it waits, but is never refused.
type Bytes struct {
	mu   sync.Mutex
	held int64
	max  int64
	// freed is poked when bytes are given back, and by a waiter that got
	// in while room is left, so that the next waiter looks again.
	freed chan struct{}
}

// NewBytes returns a bound of max bytes.
func NewBytes(max int64) *Bytes {
	return &Bytes{max: max, freed: make(chan struct{}, 1)}
}

// Acquire waits until n bytes fit and takes them; it reports false when
// done closes first (nothing taken).
func (b *Bytes) Acquire(n int64, done <-chan struct{}) bool {
	for {
		b.mu.Lock()
		if b.held == 0 || b.held+n <= b.max {
			b.held += n
			room := b.held < b.max
			b.mu.Unlock()
			if room {
				b.poke()
			}
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-done:
			return false
		}
	}
}

// Release gives back n bytes.
func (b *Bytes) Release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
	b.poke()
}

func (b *Bytes) poke() {
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// Held returns the bytes held.
func (b *Bytes) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}
