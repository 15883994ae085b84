// Package budget bounds bytes held between goroutines: a publisher's
// records in a partition's queue, a connection's frames not yet answered
// (and all connections' together). Those that would hold more wait until
// the holders give bytes back.
package budget

import "sync"

// Bytes is a bound on bytes held. One holding larger than the bound is
// let in alone, once nothing is held: it waits, but is never refused.
type Bytes struct {
	mu   sync.Mutex
	held int64
	max  int64
	// within, when set, bounds this bound's holdings together with its
	// other children's: a holding takes room in both.
	within *Bytes
	// freed is closed when bytes are given back, waking every waiter to
	// look again (one that fits must not wait behind one that does not);
	// the first waiter after a close makes the next.
	freed chan struct{}
}

// NewBytes returns a bound of max bytes.
func NewBytes(max int64) *Bytes { return &Bytes{max: max} }

// NewBytesWithin returns a bound of max bytes whose holdings count against
// within too: Acquire waits for room in both (here first), Release gives
// back to both.
func NewBytesWithin(max int64, within *Bytes) *Bytes { return &Bytes{max: max, within: within} }

// Acquire waits until n bytes fit and takes them; it reports false when
// done closes first (nothing taken).
func (b *Bytes) Acquire(n int64, done <-chan struct{}) bool {
	if !b.acquire(n, done) {
		return false
	}
	if b.within != nil && !b.within.Acquire(n, done) {
		b.release(n)
		return false
	}
	return true
}

func (b *Bytes) acquire(n int64, done <-chan struct{}) bool {
	b.mu.Lock()
	for b.held != 0 && b.held+n > b.max {
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-done:
			return false
		}
		b.mu.Lock()
	}
	b.held += n
	b.mu.Unlock()
	return true
}

// Release gives back n bytes.
func (b *Bytes) Release(n int64) {
	if n == 0 {
		return
	}
	b.release(n)
	if b.within != nil {
		b.within.Release(n)
	}
}

func (b *Bytes) release(n int64) {
	b.mu.Lock()
	b.held -= n
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// Held returns the bytes held (under within: this bound's share).
func (b *Bytes) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}
