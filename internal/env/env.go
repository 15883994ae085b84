// Package env is the world as a node sees it: files, clock and timers,
// randomness and the peer network, as one value. Production uses OS (the
// real file system, the wall clock, crypto-seeded randomness; TCP peers
// are built by internal/node); the simulator builds its own from a MemFS,
// virtual time and a seeded generator (a simulated peer network plugs into
// Peers), so the very same node code runs in both. Code in internal/node, replog and peer
// dispatch reaches the world only through an Env (internal/archtest
// enforces it).
package env

import (
	crand "crypto/rand"
	"encoding/binary"
	"time"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// Env is everything a node touches in the world.
type Env struct {
	FS    vfs.FS
	Clock Clock
	// Rand returns uniformly random 64-bit values (seeds for the kernels'
	// election jitter, nonces that need not be secret).
	Rand func() uint64
	// Peers is the network to the other members of a cluster (peers.go).
	// OS and WithDefaults leave it nil: production's is TCP, which needs
	// the cluster's secret and addresses, so internal/node builds it from
	// its ClusterConfig when this is nil.
	Peers PeerNetwork
}

// Clock is time: now, and callbacks later.
type Clock interface {
	// NowMs is the wall clock in unix milliseconds (retention, deliver_at).
	NowMs() int64
	// NowNanos measures durations (latencies, rates); only differences
	// between two readings mean anything.
	NowNanos() int64
	// AfterFunc runs f once, d from now: on its own goroutine in
	// production, on the simulator's goroutine at that virtual time.
	AfterFunc(d time.Duration, f func()) Timer
	// NewTicker delivers ticks every d on its channel (production drivers
	// only: a simulated node is stepped by its driver instead).
	NewTicker(d time.Duration) Ticker
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop cancels it; false when it already ran or was stopped.
	Stop() bool
}

// Ticker is a NewTicker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// OS is the production environment: the operating system's files, the
// wall clock and crypto-seeded randomness.
func OS() Env {
	return Env{FS: vfs.OS(), Clock: Wall{}, Rand: cryptoRand}
}

// WithDefaults fills e's unset parts from OS.
func (e Env) WithDefaults() Env {
	os := OS()
	if e.FS == nil {
		e.FS = os.FS
	}
	if e.Clock == nil {
		e.Clock = os.Clock
	}
	if e.Rand == nil {
		e.Rand = os.Rand
	}
	return e
}

func cryptoRand() uint64 {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic("env: crypto/rand failed: " + err.Error()) // never, on Linux
	}
	return binary.LittleEndian.Uint64(b[:])
}

// Wall is the real clock.
type Wall struct{}

func (Wall) NowMs() int64 { return time.Now().UnixMilli() }

// NowNanos is the unix time at the process's start plus the monotonic
// time since: a step of the wall clock (NTP, an operator) moves no
// reading, so durations, the replication shell's tick boundaries and the
// lease's end on the clock (replog) stay true through it.
func (Wall) NowNanos() int64 { return wallStart.UnixNano() + int64(time.Since(wallStart)) }

// wallStart anchors Wall.NowNanos (time.Now's reading carries the
// monotonic clock; time.Since reads it).
var wallStart = time.Now()

func (Wall) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

func (Wall) NewTicker(d time.Duration) Ticker { return wallTicker{time.NewTicker(d)} }

type wallTicker struct{ t *time.Ticker }

func (w wallTicker) C() <-chan time.Time { return w.t.C }
func (w wallTicker) Stop()               { w.t.Stop() }
