package replog

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// The tick timer of Log.run (stepTicks, armTicks), driven by hand on a
// virtual clock: a lone follower of three, which hears nobody.
func TestTheTickTimerWakesAtTheDueTickAndDropsAHoldUp(t *testing.T) {
	const tick = 10 * time.Millisecond
	clock := env.NewVirtual(1_000_003) // off the tick grid
	var sent []replica.Message
	l, err := Open(Config{ID: 1, Members: []replica.NodeID{1, 2, 3}, Dir: "/n1", FS: vfs.NewMem(), Logger: quiet, Seed: 1,
		Manual: true, Clock: clock, Tick: tick, Send: func(m replica.Message) { sent = append(sent, m) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.startTicks()
	if l.tickedAt%int64(tick) != 0 || clock.NowNanos()-l.tickedAt >= int64(tick) {
		t.Fatalf("ticks start at %d, not at the tick boundary before %d", l.tickedAt, clock.NowNanos())
	}
	start := l.tickedAt
	due := l.m.NextTickDue()
	if due < 2 {
		t.Fatalf("a fresh follower's next due tick is %d ticks away; want it asleep for more than one", due)
	}
	l.armTicks()
	if want := start + int64(due)*int64(tick); l.wakeAt != want {
		t.Fatalf("timer armed for %d, want the due tick at %d", l.wakeAt, want)
	}

	// A message before the due tick: the ticks that passed are stepped,
	// the due one is left for the timer's wake.
	clock.Advance(time.Duration(int64(due)*int64(tick) + int64(tick)/2 - (clock.NowNanos() - start)))
	if len(l.wake) != 1 {
		t.Fatalf("the timer did not fire at the due tick")
	}
	l.stepTicks(false)
	if got := l.m.NextTickDue(); got != 1 {
		t.Fatalf("after stepping the quiet ticks the next due tick is %d away, want 1", got)
	}
	if l.tickedAt != start+int64(due-1)*int64(tick) {
		t.Fatalf("ticked to %d, want %d (the due tick left for the wake)", l.tickedAt, start+int64(due-1)*int64(tick))
	}
	if err := l.m.Handle(); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 0 {
		t.Fatalf("quiet ticks sent %v", sent)
	}

	// Held up for a minute: the wake steps the due tick once and drops
	// the rest, as a time.Ticker drops what a slow receiver missed —
	// stepped, a minute's ticks would run out its election timer over a
	// hundred times, each time pre-voting to both peers.
	<-l.wake
	l.timer = nil
	clock.Advance(time.Minute)
	l.stepTicks(true)
	if err := l.m.Handle(); err != nil {
		t.Fatal(err)
	}
	if len(sent) > 2 {
		t.Fatalf("a wake after a hold-up sent %d messages: it stepped the ticks it should drop", len(sent))
	}
	if now := clock.NowNanos(); l.tickedAt > now || now-l.tickedAt >= int64(tick) {
		t.Fatalf("after the hold-up ticks resume from %d, not from the last boundary before %d", l.tickedAt, now)
	}
}

// countingClock counts the timers a member arms.
type countingClock struct {
	env.Clock
	timers *atomic.Int64
}

func (c countingClock) AfterFunc(d time.Duration, f func()) env.Timer {
	c.timers.Add(1)
	return c.Clock.AfterFunc(d, f)
}

// TestIdleFollowersSleepBetweenHeartbeats: an idle group's followers do
// not wake every tick — only for the leader's heartbeats, and their timer
// only once per election timeout — while the leader keeps its lease.
func TestIdleFollowersSleepBetweenHeartbeats(t *testing.T) {
	const tick = 10 * time.Millisecond
	timers := map[replica.NodeID]*atomic.Int64{1: {}, 2: {}, 3: {}}
	g := newGroupWith(t, 3, func(c *Config) {
		c.Tick = tick
		c.Clock = countingClock{Clock: env.Wall{}, timers: timers[c.ID]}
	})
	for attempt := 0; ; attempt++ {
		leader := g.leader()
		st := leader.Status()
		before := map[replica.NodeID]int64{}
		for id, n := range timers {
			before[id] = n.Load()
		}
		const window = time.Second
		time.Sleep(window)
		if after := leader.Status(); after.Role != replica.Leader || after.Hard.Promised != st.Hard.Promised {
			if attempt < 3 {
				continue // an election on a loaded machine: measure a quiet second
			}
			t.Fatalf("no quiet second in %d attempts", attempt+1)
		}
		ticks := int64(window / tick)
		for id, n := range timers {
			armed := n.Load() - before[id]
			if id == st.ID {
				if armed < ticks/4 {
					t.Errorf("the leader armed its timer %d times in %d ticks: does it still tick?", armed, ticks)
				}
				continue
			}
			if armed > ticks/5 {
				t.Errorf("follower %d armed its timer %d times in %d ticks; want it asleep until its election timer", id, armed, ticks)
			}
		}
		if got := leader.Status().LeaseTicks; got <= 0 {
			t.Errorf("the leader lost its lease while idle: %d", got)
		}
		return
	}
}

// TestALeaseEndsOnTheClockThroughAHoldUp (LeaseOnTheClock): a leader
// whose goroutine is held up keeps publishing the lease it had, and on
// waking steps one tick and drops the rest — so its ticks say the lease
// still runs. Its end on the clock says otherwise, both while it is held
// up and after the wake.
func TestALeaseEndsOnTheClockThroughAHoldUp(t *testing.T) {
	g := newManualGroup(t, 3, func(c *Config) { c.Tick = 10 * time.Millisecond })
	g.logs[0].Campaign()
	g.run(200)
	l := g.leader()
	if l == nil || !l.HoldsLease() {
		t.Fatalf("no leader holding a lease after 200 ms: %v", l)
	}
	span := int64(l.m.k.LeaseSpan()) * int64(10*time.Millisecond)
	now := g.clock.NowNanos()
	if until := l.LeaseUntil(); until <= now || until > now+span {
		t.Fatalf("lease until %d, want within (%d, %d]", until, now, now+span)
	}

	// Held up past the lease: the published status stands still.
	g.clock.Advance(time.Duration(span) + time.Millisecond)
	if st := l.Status(); st.LeaseTicks <= 0 {
		t.Fatalf("setup: the published lease ticks are %d", st.LeaseTicks)
	}
	if l.HoldsLease() {
		t.Fatal("a held-up leader holds the lease its status published before the hold-up")
	}

	// The wake steps one tick and drops the rest: the kernel's own count
	// says the lease still runs; its end on the clock has passed.
	g.clock.Advance(time.Second)
	l.startTicks()
	l.tickedAt -= int64(100 * 10 * time.Millisecond)
	l.stepTicks(true)
	if err := l.m.Handle(); err != nil {
		t.Fatal(err)
	}
	if st := l.Status(); st.Role != replica.Leader || st.LeaseTicks <= 0 {
		t.Fatalf("setup: after a wake that dropped ticks the leader's status is %v with %d lease ticks", st.Role, st.LeaseTicks)
	}
	if l.HoldsLease() || l.LeaseUntil() > g.clock.NowNanos() {
		t.Fatalf("lease until %d after a hold-up, now %d: dated from the wake, not from the Append it rests on", l.LeaseUntil(), g.clock.NowNanos())
	}
}

// wallJumpClock is a clock whose wall reading (NowMs) is off by skewMs
// while its monotonic one (NowNanos) runs on: an NTP step.
type wallJumpClock struct {
	env.Clock
	skewMs int64
}

func (c *wallJumpClock) NowMs() int64 { return c.Clock.NowMs() + c.skewMs }

// TestManualTicksRunOnTheMonotonicClock: a Manual log ticks on the
// monotonic clock, as the production goroutine's tick grid does. A wall
// clock set back 5 s stops no tick — a member whose ticks stood still
// would date a lease from a tick its clock read long ago, and hold it
// past another member's election (the cluster simulator's seed 11 of
// --schedules 30, once its nodes' monotonic clocks stopped moving with
// their wall clocks).
func TestManualTicksRunOnTheMonotonicClock(t *testing.T) {
	clock := &wallJumpClock{Clock: env.NewVirtual(1_000_000_000)}
	l, err := Open(Config{ID: 1, Members: []replica.NodeID{1, 2, 3}, Dir: "/n1", FS: vfs.NewMem(), Logger: quiet, Seed: 1,
		Manual: true, Clock: clock, Tick: 10 * time.Millisecond, Send: func(replica.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before := l.m.k.Ticks()
	clock.skewMs = -5000
	clock.Clock.(*env.Virtual).Advance(50 * time.Millisecond)
	if _, err := l.Pump(); err != nil {
		t.Fatal(err)
	}
	if got := l.m.k.Ticks() - before; got != 5 {
		t.Fatalf("%d ticks in 50 ms of a monotonic clock whose wall clock went back 5 s, want 5", got)
	}
}
