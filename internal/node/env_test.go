package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// These tests run a node on env.Virtual: its timers and tickers fire only
// when the test advances virtual time, which proves they come from
// Config.Env and not from the wall clock.

// recordingClock is a Virtual clock that lists what was scheduled on it,
// for timers whose wall-clock twin would fire soon enough to hide a
// regression (the group loop also wakes every second on its own).
type recordingClock struct {
	*env.Virtual
	mu        sync.Mutex
	afterFunc []time.Duration
	tickers   []time.Duration
	// wallStepMs moves the wall clock (NowMs) alone: a step of it, as NTP
	// makes one.
	wallStepMs atomic.Int64
}

func (c *recordingClock) NowMs() int64 { return c.Virtual.NowMs() + c.wallStepMs.Load() }

// AfterFunc records d once the timer is on the clock (a test that saw it
// may advance past it).
func (c *recordingClock) AfterFunc(d time.Duration, f func()) env.Timer {
	t := c.Virtual.AfterFunc(d, f)
	c.mu.Lock()
	c.afterFunc = append(c.afterFunc, d)
	c.mu.Unlock()
	return t
}

func (c *recordingClock) NewTicker(d time.Duration) env.Ticker {
	t := c.Virtual.NewTicker(d)
	c.mu.Lock()
	c.tickers = append(c.tickers, d)
	c.mu.Unlock()
	return t
}

func (c *recordingClock) scheduled(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.afterFunc, d)
}

func (c *recordingClock) ticking(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.tickers, d)
}

// newVirtualHarness opens a node on a virtual clock reading the usual test
// start time.
func newVirtualHarness(t *testing.T, tune func(*Config)) (*harness, *recordingClock) {
	clock := &recordingClock{Virtual: env.NewVirtual(1_000_000)}
	h := &harness{t: t, fs: vfs.NewMem(), tune: func(c *Config) {
		c.Env.Clock = clock
		if tune != nil {
			tune(c)
		}
	}}
	h.open()
	t.Cleanup(func() { h.node.Close() })
	return h, clock
}

// advanceUntil advances the virtual clock by step until cond holds (the
// node's goroutines schedule their timers concurrently with the test).
func advanceUntil(t *testing.T, clock *recordingClock, step time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, func() bool {
		clock.Advance(step)
		return cond()
	})
}

// deliveredOnce opens a node on a virtual clock, publishes one message and
// hands it to a subscription of group g (ack wait 500 ms) with credit.
func deliveredOnce(t *testing.T, credit uint32) (*recordingClock, *Subscription, *sink, *wire.Msg) {
	// No synced marks: the tests read the group's wake-ups, which a
	// ledger's mark period would add to.
	h, clock := newVirtualHarness(t, func(c *Config) { c.ScrubBytesPerSecond, c.SyncedMarkMs = -1, -1 })
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("m")})
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 500}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(credit)
	return clock, sub, s, s.waitFor(t, 1)[0]
}

func TestGroupRedeliversWhenTheEnvClockPassesTheAckWait(t *testing.T) {
	clock, _, s, first := deliveredOnce(t, 10)
	// The group sleeps until the delivery's ack deadline, on the node's
	// clock.
	eventually(t, "the group's wake-up at the ack deadline is an AfterFunc on Config.Env's clock", func() bool {
		return clock.scheduled(500 * time.Millisecond)
	})
	// (Advancing again in case the loop replaced that timer meanwhile.)
	advanceUntil(t, clock, 500*time.Millisecond, "redelivery", func() bool { return s.count() >= 2 })
	second := s.waitFor(t, 2)[1]
	if second.Seq != first.Seq || second.DeliveryCount != 2 || second.DeliveryID == first.DeliveryID {
		t.Fatalf("redelivery %+v after %+v", second, first)
	}
}

// TestGroupAckWaitsRunOnTheMonotonicClock guards AckWaitsAreMonotonic: a
// group measures its ack waits on the monotonic clock. With its wall
// clock stepped an hour back after a delivery, the group waited the hour
// before it redelivered; stepped an hour forward, it redelivered at once.
func TestGroupAckWaitsRunOnTheMonotonicClock(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(step.String(), func(t *testing.T) {
			clock, sub, s, first := deliveredOnce(t, 10)
			clock.wallStepMs.Store(step.Milliseconds())
			clock.Advance(400 * time.Millisecond)
			sub.AddCredit(1) // wakes the group
			time.Sleep(20 * time.Millisecond)
			if n := s.count(); n != 1 {
				t.Fatalf("%d deliveries 400 ms into a 500 ms ack wait, the wall clock stepped %v; want 1", n, step)
			}
			for range 10 {
				clock.Advance(100 * time.Millisecond)
				if s.count() >= 2 {
					break
				}
				time.Sleep(5 * time.Millisecond) // the group's goroutine takes its wake-up
			}
			if second := s.waitFor(t, 2)[1]; second.Seq != first.Seq || second.DeliveryCount != 2 {
				t.Fatalf("redelivery %+v after %+v", second, first)
			}
		})
	}
}

// TestRepeatedErrorsAreLimitedOnTheMonotonicClock guards the repeat
// limiter's clock: a repeating ERROR line gets through once per window
// of the monotonic clock. On the wall clock, a step of it an hour back
// silenced the line for the hour.
func TestRepeatedErrorsAreLimitedOnTheMonotonicClock(t *testing.T) {
	var logs logBuffer
	h, clock := newVirtualHarness(t, func(c *Config) {
		c.ScrubBytesPerSecond = -1
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	lines := func() int { return strings.Count(logs.String(), "repeating fault") }
	h.node.logRepeatedError("t/0", "repeating fault")
	h.node.logRepeatedError("t/0", "repeating fault")
	if n := lines(); n != 1 {
		t.Fatalf("%d lines of a repeat within the window; want 1", n)
	}
	clock.wallStepMs.Store(-time.Hour.Milliseconds())
	clock.Advance(repeatWindowMs * time.Millisecond)
	h.node.logRepeatedError("t/0", "repeating fault")
	if n := lines(); n != 2 || !strings.Contains(logs.String(), "suppressed_repeats=1") {
		t.Fatalf("%d lines once the window passed, the wall clock stepped an hour back; want 2, the second counting 1 suppressed:\n%s", n, logs.String())
	}
}

func TestRetentionRunsOnTheEnvClocksTicker(t *testing.T) {
	h, clock := newVirtualHarness(t, func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.RetentionCheckMs = 60_000
		c.ScrubBytesPerSecond = -1
	})
	if _, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1, RetentionMs: 1000}); err != nil {
		t.Fatal(err)
	}
	publishTo(h, "t", 0, 200)
	if len(segmentsOf(t, h.fs, "t", 0)) < 3 {
		t.Fatal("want sealed segments for retention to delete")
	}
	startSeq := func() uint64 { return h.node.Metadata([]string{"t"})[0].Partitions[0].StartSeq }
	if s := startSeq(); s > 1 {
		t.Fatalf("start seq %d before any retention check", s)
	}
	// The records are a virtual minute old at the first check.
	advanceUntil(t, clock, time.Minute, "retention deleted the expired sealed segments", func() bool { return startSeq() > 1 })
}

func TestScrubberRunsOnTheEnvClocksTicker(t *testing.T) {
	h, clock := newVirtualHarness(t, func(c *Config) { c.SegmentBytesMax = 4 << 10 })
	h.declare("t", 1)
	publishTo(h, "t", 0, 200)
	segs := segmentsOf(t, h.fs, "t", 0)
	if err := h.fs.FlipBit(segs[0], 100, 2); err != nil {
		t.Fatal(err)
	}
	// (A wall-clock ticker would find it too, a real second later.)
	eventually(t, "the scrubber's one-second ticker is on Config.Env's clock", func() bool { return clock.ticking(time.Second) })
	advanceUntil(t, clock, time.Second, "the scrubber found the flipped bit", func() bool {
		return partitionState(h, "t", 0) == wire.PartitionStateCorrupt
	})
}

// fakePeers is a peer network that records what a member sends and
// delivers nothing: the member is alone, so no election can succeed.
type fakePeers struct {
	mu       sync.Mutex
	endpoint env.PeerEndpoint
	sent     map[uint32][]wire.Frame
	closed   bool
}

func (f *fakePeers) Join(e env.PeerEndpoint) (env.PeerLink, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endpoint, f.sent = e, map[uint32][]wire.Frame{}
	return f, nil
}

func (f *fakePeers) Send(to uint32, fr wire.Frame) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent[to] = append(f.sent[to], fr)
	return true
}

func (f *fakePeers) ClientAddr(id uint32) string { return fmt.Sprint("client-of-", id) }

func (f *fakePeers) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// metaReplicateSent reports whether replication frames of `__meta` went
// to member to.
func (f *fakePeers) metaReplicateSent(to uint32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fr := range f.sent[to] {
		if r, ok := fr.(*wire.Replicate); ok && r.Topic == meta.MetaTopic {
			return true
		}
	}
	return false
}

// A cluster member reaches its peers only through Config.Env.Peers, and
// its first campaign and DECLARE deadline run on Config.Env's clock: with
// a one-hour tick and timeout nothing happens in real time.
func TestClusterUsesTheEnvsPeerNetworkAndClock(t *testing.T) {
	clock := &recordingClock{Virtual: env.NewVirtual(1_000_000)}
	peers := &fakePeers{}
	n, err := Open(Config{NodeID: "n1", DataDir: "/n1", ClientAddr: "client-of-n1", ScrubBytesPerSecond: -1,
		Env: env.Env{FS: vfs.NewMem(), Clock: clock, Peers: peers},
		Cluster: &ClusterConfig{
			Members: []Member{{ID: "n1", PeerAddr: "peer-1"}, {ID: "n2", PeerAddr: "peer-2"}, {ID: "n3", PeerAddr: "peer-3"}},
			// No Secret: the TCP network would refuse to start.
			Tick: time.Hour, DeclareTimeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	peers.mu.Lock()
	ep := peers.endpoint
	peers.mu.Unlock()
	if ep.ID != 1 || ep.ClientAddr != "client-of-n1" || len(ep.Addrs) != 3 || ep.Addrs[2] != "peer-2" || ep.Handler == nil {
		t.Fatalf("joined the peer network as %+v", ep)
	}
	if got := n.cluster.ClientAddr(2); got != "client-of-2" {
		t.Fatalf("member 2's client address %q, want the peer network's", got)
	}

	// The first member campaigns for the new `__meta` group five ticks
	// after it opened.
	clock.Advance(5 * time.Hour)
	eventually(t, "PREPAREs of __meta to both peers", func() bool {
		return peers.metaReplicateSent(2) && peers.metaReplicateSent(3)
	})

	// Nobody answers: a DECLARE gives up at its deadline.
	declared := make(chan error, 1)
	go func() {
		_, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1})
		declared <- err
	}()
	var declareErr error
	advanceUntil(t, clock, time.Hour, "DECLARE gave up", func() bool {
		select {
		case declareErr = <-declared:
			return true
		default:
			return false
		}
	})
	var we *wire.Error
	if !errors.As(declareErr, &we) || we.Code != wire.CodeUnavailable || !strings.Contains(we.Message, "no metadata leader") {
		t.Fatalf("DECLARE: %v, want UNAVAILABLE for want of a metadata leader", declareErr)
	}
	n.Close()
	peers.mu.Lock()
	defer peers.mu.Unlock()
	if !peers.closed {
		t.Fatal("Close left the node on the peer network")
	}
}

// A peer network that cannot start (the TCP one without a secret) fails
// Open with its error; the half-open node closes cleanly.
func TestClusterOpenFailsCleanlyWhenThePeerNetworkCannotStart(t *testing.T) {
	_, err := Open(Config{NodeID: "n1", DataDir: "/n1", ScrubBytesPerSecond: -1, Env: env.Env{FS: vfs.NewMem()},
		Cluster: &ClusterConfig{Members: []Member{{ID: "n1", PeerAddr: "127.0.0.1:0"}, {ID: "n2", PeerAddr: "127.0.0.1:1"}}}})
	if err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("Open without a cluster secret: %v, want the TCP network's refusal", err)
	}
}

// A group whose redelivery fell due while no subscription has credit
// sleeps until a credit comes (a command, which wakes it), not in a 1 ms
// loop over the due retry; the credit brings the redelivery at once.
func TestGroupWithoutCreditSleepsThroughADueRedelivery(t *testing.T) {
	clock, sub, s, first := deliveredOnce(t, 1)
	eventually(t, "the group's wake-up at the ack deadline", func() bool { return clock.scheduled(500 * time.Millisecond) })
	clock.Advance(500 * time.Millisecond) // the delivery expires: a retry due, no credit
	eventually(t, "the pass at the ack deadline", func() bool {
		clock.mu.Lock()
		defer clock.mu.Unlock()
		return len(clock.afterFunc) > 0 && clock.afterFunc[len(clock.afterFunc)-1] != 500*time.Millisecond
	})
	clock.mu.Lock()
	clock.afterFunc = nil
	clock.mu.Unlock()
	for range 20 {
		clock.Advance(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // (a 1 ms loop would have rescheduled by now)
	if clock.scheduled(time.Millisecond) {
		t.Error("the group woke every millisecond for a redelivery no subscription has credit for")
	}
	sub.AddCredit(1)
	second := s.waitFor(t, 2)[1]
	if second.Seq != first.Seq || second.DeliveryCount != 2 {
		t.Fatalf("redelivery %+v after %+v", second, first)
	}
}

// TestManualRetentionRunsOnTheMonotonicClock: a Manual node schedules its
// partitions' retention checks on the monotonic clock. With the wall
// clock stepped an hour back after the first check was scheduled, a
// topic over its byte retention is still compacted at the next check; on
// the wall clock the checks stopped for the hour.
func TestManualRetentionRunsOnTheMonotonicClock(t *testing.T) {
	var now, step atomic.Int64
	now.Store(1_000_000)
	n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: vfs.NewMem(), Clock: testClock{nowMs: &now, wallStepMs: &step}}, Manual: true,
		SegmentBytesMax: 4 << 10, RetentionCheckMs: 1000, ScrubBytesPerSecond: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1, RetentionBytes: 8 << 10}); err != nil {
		t.Fatal(err)
	}
	step.Store(-time.Hour.Milliseconds())
	for i := range 300 {
		pub := wire.Pub{Topic: "t", Partition: 0, Value: []byte(fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 100)))}
		n.Publish(&pub, func(wire.PubOK, *wire.Error) {})
		n.Step()
	}
	now.Add(2000)
	n.Step()
	if start := n.Metadata([]string{"t"})[0].Partitions[0].StartSeq; start <= 1 {
		t.Fatalf("start seq %d two checks after 300 records over an 8 KiB retention, the wall clock stepped an hour back; want it compacted", start)
	}
}
