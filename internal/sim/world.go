// Package sim is the deterministic simulator: it runs the real node (the
// same kernels, storage and protocol code that `nereus serve` runs, in
// node.Config.Manual mode) on one goroutine with virtual time, a simulated
// network and a crashable in-memory disk, drives it with producer and
// consumer workloads, injects faults from a seeded PRNG, and checks named
// invariants against a reference model. The same seed gives the same run,
// bit for bit: a failing seed replays exactly.
package sim

import (
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// World is the simulated environment: virtual clock, event queue, PRNG and
// trace. Everything that happens in a run is an event popped from the queue
// in (time, insertion) order; nothing else advances time.
type World struct {
	seed   uint64
	rng    *rand.Rand
	nowMs  int64
	skewMs int64 // the broker's clock minus virtual time (clock jumps)
	queue  eventQueue
	seq    uint64
	events int
	trace  *tracer
	logs   io.Writer // ClusterOptions.Logs
}

// epochMs is the virtual time a run starts at (a plausible unix time, so
// record timestamps look real).
const epochMs = 1_700_000_000_000

func newWorld(seed uint64, keepTrace bool) *World {
	return &World{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x6e6572657573)), nowMs: epochMs,
		trace: newTracer(keepTrace)}
}

// after schedules fn at now+delayMs.
func (w *World) after(delayMs int64, fn func()) {
	w.seq++
	heap.Push(&w.queue, &event{atMs: w.nowMs + max(delayMs, 0), seq: w.seq, fn: fn})
}

// next runs the earliest event; it reports false when the queue is empty.
func (w *World) next() bool {
	if len(w.queue) == 0 {
		return false
	}
	e := heap.Pop(&w.queue).(*event)
	w.nowMs = e.atMs
	w.events++
	e.fn()
	return true
}

// brokerNowMs is the broker's wall clock: virtual time plus any clock jump.
func (w *World) brokerNowMs() int64 { return w.nowMs + w.skewMs }

func (w *World) brokerNowNanos() int64 { return w.brokerNowMs() * 1_000_000 }

// brokerEnv is the world as the broker's node sees it: its MemFS, the
// broker's clock and the World's seeded randomness.
func (w *World) brokerEnv(fsys vfs.FS) env.Env {
	return env.Env{FS: fsys, Clock: brokerClock{w}, Rand: w.rng.Uint64}
}

// brokerClock is the broker's env.Clock: virtual time plus the World's
// clock skew. AfterFunc schedules a World event, so its callback runs on
// the simulator's goroutine at that virtual time (rounded up to the
// World's millisecond).
type brokerClock struct{ w *World }

func (c brokerClock) NowMs() int64    { return c.w.brokerNowMs() }
func (c brokerClock) NowNanos() int64 { return c.w.brokerNowNanos() }

func (c brokerClock) AfterFunc(d time.Duration, f func()) env.Timer {
	t := &worldTimer{fn: f}
	c.w.after(int64((d+time.Millisecond-1)/time.Millisecond), t.fire)
	return t
}

// NewTicker is for production drivers: a simulated node runs in Manual
// mode and is stepped by the simulator, so a ticker here is a bug.
func (brokerClock) NewTicker(time.Duration) env.Ticker {
	panic("sim: the broker asked for a ticker; a Manual node is stepped by the simulator")
}

// worldTimer is an AfterFunc on the World: Stop turns its event into a
// no-op (the event stays queued; nothing is traced for it).
type worldTimer struct {
	fn   func()
	done bool // ran or stopped
}

func (t *worldTimer) fire() {
	if !t.done {
		t.done = true
		t.fn()
	}
}

func (t *worldTimer) Stop() bool {
	stopped := !t.done
	t.done = true
	return stopped
}

// chance returns true with probability p.
func (w *World) chance(p float64) bool { return p > 0 && w.rng.Float64() < p }

// between returns a uniform integer in [lo, hi].
func (w *World) between(lo, hi int64) int64 { return lo + w.rng.Int64N(hi-lo+1) }

func (w *World) tracef(format string, args ...any) {
	w.trace.add(fmt.Sprintf("%8d %s", w.nowMs-epochMs, fmt.Sprintf(format, args...)))
}

type event struct {
	atMs int64
	seq  uint64
	fn   func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].atMs != q[j].atMs {
		return q[i].atMs < q[j].atMs
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// tracer hashes every trace line and keeps the last lines (and, for golden
// traces, all of them).
type tracer struct {
	hash  hash.Hash
	lines int
	tail  []string // ring of the last tailMax lines
	all   []string // nil unless kept
	keep  bool
}

const tailMax = 60

func newTracer(keepAll bool) *tracer { return &tracer{hash: sha256.New(), keep: keepAll} }

func (t *tracer) add(line string) {
	t.hash.Write([]byte(line))
	t.hash.Write([]byte{'\n'})
	if len(t.tail) < tailMax {
		t.tail = append(t.tail, line)
	} else {
		t.tail[t.lines%tailMax] = line
	}
	t.lines++
	if t.keep {
		t.all = append(t.all, line)
	}
}

// lastLines returns the kept tail in order.
func (t *tracer) lastLines() []string {
	if len(t.tail) < tailMax {
		return append([]string(nil), t.tail...)
	}
	start := t.lines % tailMax
	return append(append([]string(nil), t.tail[start:]...), t.tail[:start]...)
}

func (t *tracer) sum() string { return hex.EncodeToString(t.hash.Sum(nil))[:16] }
