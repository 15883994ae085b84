package env

import (
	"container/heap"
	"sync"
	"time"
)

// Virtual is a deterministic Clock for tests and simulators: time moves
// only when its driver calls Advance, and AfterFunc callbacks run on the
// driver's goroutine, inside Advance or RunDue, in (due time, insertion)
// order, each with the clock reading its due time.
//
// Its methods are safe for concurrent use (a node's goroutines read it and
// schedule on it while a test drives it), but it is meant to have one
// driver: callbacks run without its lock held, so they may schedule more.
type Virtual struct {
	mu       sync.Mutex
	nowNanos int64
	seq      uint64 // insertion order of the next timer
	timers   timerHeap
	// runToNanos is where the running Advance stops (tickers skip the
	// ticks in between that nobody could have taken).
	runToNanos int64
}

// NewVirtual returns a virtual clock reading startMs (unix milliseconds).
func NewVirtual(startMs int64) *Virtual {
	return &Virtual{nowNanos: startMs * int64(time.Millisecond)}
}

// NowMs is the virtual time in unix milliseconds.
func (v *Virtual) NowMs() int64 { return v.NowNanos() / int64(time.Millisecond) }

// NowNanos is the virtual time in unix nanoseconds.
func (v *Virtual) NowNanos() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.nowNanos
}

// AfterFunc schedules f at now+d (now, for d <= 0). It never runs f
// itself: the next Advance or RunDue that reaches its due time does.
func (v *Virtual) AfterFunc(d time.Duration, f func()) Timer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.scheduleLocked(v.nowNanos+max(int64(d), 0), f)
}

func (v *Virtual) scheduleLocked(atNanos int64, f func()) *virtualTimer {
	t := &virtualTimer{v: v, atNanos: atNanos, seq: v.seq, fn: f, index: -1}
	v.seq++
	heap.Push(&v.timers, t)
	return t
}

// NewTicker delivers the virtual time every d on its channel, as the
// driver advances past each multiple of d. Like time.Ticker it drops ticks
// a slow receiver has not taken (the channel holds one); one Advance over
// many periods delivers the first tick and then the last one in it, so a
// long jump costs two callbacks, not one per period.
func (v *Virtual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("env: non-positive interval for Virtual.NewTicker")
	}
	t := &virtualTicker{v: v, c: make(chan time.Time, 1), period: int64(d)}
	v.mu.Lock()
	defer v.mu.Unlock()
	t.next = v.scheduleLocked(v.nowNanos+t.period, func() { v.tick(t) })
	return t
}

// tick delivers one tick and schedules the next, unless t was stopped.
func (v *Virtual) tick(t *virtualTicker) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if t.stopped {
		return
	}
	select {
	case t.c <- time.Unix(0, v.nowNanos):
	default:
	}
	periods := max((v.runToNanos-v.nowNanos)/t.period, 1)
	t.next = v.scheduleLocked(v.nowNanos+periods*t.period, func() { v.tick(t) })
}

// Advance moves time forward by d, running every callback due by then
// (including those the callbacks schedule) in (due time, insertion)
// order. It returns how many ran.
func (v *Virtual) Advance(d time.Duration) int {
	v.mu.Lock()
	target := v.nowNanos + max(int64(d), 0)
	v.mu.Unlock()
	return v.runUntil(target)
}

// RunDue runs the callbacks due now (including those they schedule for
// now) and returns how many ran.
func (v *Virtual) RunDue() int { return v.runUntil(v.NowNanos()) }

func (v *Virtual) runUntil(targetNanos int64) int {
	ran := 0
	for {
		v.mu.Lock()
		v.runToNanos = targetNanos
		if len(v.timers) == 0 || v.timers[0].atNanos > targetNanos {
			v.nowNanos = max(v.nowNanos, targetNanos)
			v.mu.Unlock()
			return ran
		}
		t := heap.Pop(&v.timers).(*virtualTimer)
		v.nowNanos = max(v.nowNanos, t.atNanos)
		v.mu.Unlock()
		t.fn()
		ran++
	}
}

// Pending is how many callbacks are scheduled (ticker ticks included).
func (v *Virtual) Pending() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.timers)
}

type virtualTimer struct {
	v       *Virtual
	atNanos int64
	seq     uint64
	fn      func()
	index   int // in v.timers; -1 once it ran or was stopped
}

// Stop cancels the timer; false when it already ran or was stopped.
func (t *virtualTimer) Stop() bool {
	t.v.mu.Lock()
	defer t.v.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.v.timers, t.index)
	return true
}

type virtualTicker struct {
	v       *Virtual
	c       chan time.Time
	period  int64
	next    *virtualTimer // under Virtual.mu
	stopped bool          // under Virtual.mu
}

func (t *virtualTicker) C() <-chan time.Time { return t.c }

func (t *virtualTicker) Stop() {
	t.v.mu.Lock()
	t.stopped = true
	next := t.next
	t.v.mu.Unlock()
	next.Stop()
}

// timerHeap orders timers by (due time, insertion).
type timerHeap []*virtualTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].atNanos != h[j].atNanos {
		return h[i].atNanos < h[j].atNanos
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*virtualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
