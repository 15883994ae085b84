package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/client"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/server"
)

// The scheduled-delivery workloads (issue 14): against a Nereus node (r1,
// in the harness process) and the three-process cluster (r3), the rate at
// which SCHEDULE is answered, the rate at which a burst of schedules due
// at one instant is fired, how late messages arrive under a steady load,
// and, on a node of its own in the harness process, the heap each pending
// schedule costs and how long a restart with them takes.
//
// Bounds of the scheduled-delivery workloads.
const (
	// schedFarFuture is how far ahead an intake or pending schedule is
	// due: never within a run.
	schedFarFuture = 24 * time.Hour
	// schedFillInflight is how many SCHEDULE requests a fill keeps in
	// flight (goroutines on one SDK connection); the intake row uses
	// limits.SchedIntakeClients instead.
	schedFillInflight = 256
	// schedFillRateFloor bounds a fill's time: count / this rate, at least
	// schedFillTimeMin. A fill that does not finish stops there, and the
	// row measures what it scheduled (its messages column says how many).
	schedFillRateFloor = 5000
	schedFillTimeMin   = 30 * time.Second
	// schedFireRateFloor bounds the wait for a burst to fire the same way
	// (a 100,000 burst fired at 15,000–50,000 msgs/s here, r3 and r1: see
	// docs/PERFORMANCE.md).
	schedFireRateFloor = 2000
	schedFireTimeMin   = 30 * time.Second
	// schedPollInterval paces the polls of the destination's commit point
	// (the fired row) and of the scheduler's status (restart): no event
	// tells the harness. It is the resolution of those times.
	schedPollInterval = 5 * time.Millisecond
	// schedLatenessDrain bounds the wait for the last due messages after
	// the last is due.
	schedLatenessDrain = 10 * time.Second
	// schedLatenessInflight bounds the SCHEDULE requests in flight of the
	// lateness row's steady load.
	schedLatenessInflight = 64
	// schedDeliverAtBytes is the prefix of a lateness payload: its
	// deliver_at in Unix ms.
	schedDeliverAtBytes = 8
	// schedRestartTimeout bounds a restart until every shard is active.
	schedRestartTimeout = 5 * time.Minute
	// schedCaseTimeout replaces caseTimeout for these workloads: a full
	// run fills a million schedules, twice (pending and the burst).
	schedCaseTimeout = 15 * time.Minute
	// schedActive is the lifecycle of a shard whose owner takes commands.
	schedActive = "ACTIVE_FOR_COMMANDS"
)

// schedSystems are the systems of the SDK-driven sched workloads; the
// pending workload opens its own in-process node (r1 only).
var (
	schedSystems        = []string{systemNereus + "/" + modeR1, systemNereus + "/" + modeR3}
	schedPendingSystems = []string{systemNereus + "/" + modeR1}
)

// isSched reports whether w is a scheduled-delivery workload.
func (w workload) isSched() bool {
	switch w {
	case workloadSchedIntake, workloadSchedFire, workloadSchedLateness, workloadSchedPending:
		return true
	}
	return false
}

// schedClient is a nereusSystem's SDK client for the sched workloads.
func schedClient(sys system) (*nereusSystem, error) {
	ns, ok := sys.(*nereusSystem)
	if !ok {
		return nil, errors.New("the scheduled-delivery workloads run on Nereus only")
	}
	return ns, nil
}

// runSchedIntake schedules 1 KiB messages due far in the future from
// lim.SchedIntakeClients goroutines sharing one SDK connection, each
// waiting for its SCHEDULE's answer before the next, for lim.TimeLimit.
// Latencies are per SCHEDULE (request to answer).
func runSchedIntake(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress) (runResult, error) {
	ns, err := schedClient(sys)
	if err != nil {
		return runResult{}, err
	}
	prog.phase(fmt.Sprintf("schedule, %d clients", lim.SchedIntakeClients))
	c, err := ns.dial(ctx, "bench-sched-intake")
	if err != nil {
		return runResult{}, err
	}
	defer c.Close()
	// The first SCHEDULE creates the shards (single node): untimed.
	deliverAt := time.Now().Add(schedFarFuture)
	if _, err := c.Schedule(ctx, stream, client.Message{Value: payload}, deliverAt); err != nil {
		return runResult{}, fmt.Errorf("first schedule: %w", err)
	}
	return runClosedLoop(ctx, lim.SchedIntakeClients, math.MaxInt, lim.TimeLimit, prog, func(ctx context.Context, _ int64) error {
		_, err := c.Schedule(ctx, stream, client.Message{Value: payload}, deliverAt)
		return err
	})
}

// storeMax raises v to x.
func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// fillSchedules schedules count messages to stream from inflight
// goroutines on one connection; deliverAt gives message i's deliver_at and
// payload (nil: the shared payload). It stops at timeLimit and returns how
// many were scheduled.
func fillSchedules(ctx context.Context, c *client.Client, stream string, count, inflight int, timeLimit time.Duration,
	message func(i int) (client.Message, time.Time), prog *progress) (int64, error) {
	tctx, cancel := context.WithTimeout(ctx, timeLimit)
	defer cancel()
	var next, done atomic.Int64
	errs := make([]error, inflight)
	var wg sync.WaitGroup
	for g := range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(count) {
					return
				}
				m, at := message(int(i))
				if _, err := c.Schedule(tctx, stream, m, at); err != nil {
					if !timeIsUp(tctx) {
						errs[g] = err
					}
					return
				}
				prog.count.Store(done.Add(1))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return done.Load(), err
	}
	return done.Load(), ctx.Err()
}

// fillTime bounds a fill of count schedules.
func fillTime(count int) time.Duration {
	return max(schedFillTimeMin, time.Duration(count)*time.Second/schedFillRateFloor)
}

// commitSeq returns the destination's committed messages (one partition).
func commitSeq(ctx context.Context, c *client.Client, stream string) (uint64, error) {
	infos, err := c.Topics(ctx, stream)
	if err != nil {
		return 0, err
	}
	if len(infos) != 1 {
		return 0, fmt.Errorf("topic %s: %d answers", stream, len(infos))
	}
	var sum uint64
	for _, p := range infos[0].Partitions {
		sum += p.CommitSeq
	}
	return sum, nil
}

// runSchedFire schedules lim.SchedFireCount messages all due at one
// instant T, one second after the fill starts, while the destination's
// lane is paused (a fill of a million takes longer than "a bit in the
// future": without the pause the burst would fire while it is still being
// scheduled). It then waits until T has passed, resumes the lane, and
// measures from the resume until the destination's commit point shows
// every message (polled every schedPollInterval); more than scheduled is
// an error (a message fired twice).
func runSchedFire(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress, logf func(string, ...any)) (res runResult, err error) {
	ns, err := schedClient(sys)
	if err != nil {
		return runResult{}, err
	}
	c, err := ns.dial(ctx, "bench-sched-fire")
	if err != nil {
		return runResult{}, err
	}
	defer c.Close()
	if err := c.LaneCommand(ctx, stream, client.LanePause); err != nil {
		return runResult{}, err
	}
	defer func() {
		if err != nil {
			// Due schedules left behind would keep the shard's runner busy
			// during the next cases: cancel them (retire the lane).
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
			defer cancel()
			err = errors.Join(err, c.LaneCommand(rctx, stream, client.LaneRetire))
		}
	}()
	// A replica group's log starts with its leader's install entry: the
	// messages are counted above the commit point before the fill.
	base, err := commitSeq(ctx, c, stream)
	if err != nil {
		return runResult{}, err
	}
	prog.phase(prefillProgressName + " (lane paused)")
	due := time.Now().Add(time.Second).Truncate(time.Millisecond)
	fillStart := time.Now()
	count, err := fillSchedules(ctx, c, stream, lim.SchedFireCount, schedFillInflight, fillTime(lim.SchedFireCount),
		func(int) (client.Message, time.Time) { return client.Message{Value: payload}, due }, prog)
	if err != nil {
		return runResult{}, fmt.Errorf("fill: %w", err)
	}
	fillTook := time.Since(fillStart)
	logf("%s: scheduled %d of %d due at one instant in %.1fs (%.0f/s, %d in flight)", stream, count, lim.SchedFireCount,
		fillTook.Seconds(), float64(count)/fillTook.Seconds(), schedFillInflight)
	if err := sleepCtx(ctx, time.Until(due)); err != nil {
		return runResult{}, err
	}
	if got, err := commitSeq(ctx, c, stream); err != nil || got != base {
		return runResult{}, fmt.Errorf("destination before the resume: commit point %d, %d before the fill (%v)", got, base, err)
	}
	prog.phase("fire")
	prog.count.Store(0)
	start := time.Now()
	if err := c.LaneCommand(ctx, stream, client.LaneResume); err != nil {
		return runResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, max(schedFireTimeMin, time.Duration(count)*time.Second/schedFireRateFloor))
	defer cancel()
	var seen uint64
	for seen < uint64(count) {
		if err := sleepCtx(wctx, schedPollInterval); err != nil {
			return runResult{}, fmt.Errorf("%d of %d fired after %.1fs: %w", seen, count, time.Since(start).Seconds(), err)
		}
		got, err := commitSeq(wctx, c, stream)
		if err != nil {
			if wctx.Err() != nil {
				return runResult{}, fmt.Errorf("%d of %d fired after %.1fs: %w", seen, count, time.Since(start).Seconds(), err)
			}
			continue
		}
		seen = got - base
		prog.count.Store(int64(seen))
	}
	elapsed := time.Since(start)
	if seen > uint64(count) {
		return runResult{}, fmt.Errorf("the destination grew by %d entries, %d scheduled (a message fired twice, or a new leader's install entry)", seen, count)
	}
	return runResult{Messages: count, Elapsed: elapsed}, nil
}

// runSchedLateness schedules messages at lim.SchedLatenessRate per second
// for lim.SchedLatenessDuration, message i due lim.SchedLatenessMin plus
// a share of lim.SchedLatenessSpread that cycles over 100 steps, while a
// consumer in this process receives the destination; each payload carries
// its deliver_at (Unix ms, the broker's clock being this machine's), and
// a message's lateness is its receipt time minus it: an upper bound on
// the time from deliver_at to the fire (it includes the publish, the
// delivery to the consumer and the SDK).
func runSchedLateness(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress, logf func(string, ...any)) (runResult, error) {
	ns, err := schedClient(sys)
	if err != nil {
		return runResult{}, err
	}
	if len(payload) < schedDeliverAtBytes {
		return runResult{}, fmt.Errorf("sched_lateness needs messages of at least %d bytes", schedDeliverAtBytes)
	}
	c, err := ns.dial(ctx, "bench-sched-lateness")
	if err != nil {
		return runResult{}, err
	}
	defer c.Close()
	sub, err := newSubscriber(ctx, sys, stream)
	if err != nil {
		return runResult{}, err
	}
	prog.phase("schedule and consume")
	total := int(float64(lim.SchedLatenessRate) * lim.SchedLatenessDuration.Seconds())
	start := time.Now()
	cctx, cancelConsume := context.WithTimeout(ctx, lim.SchedLatenessDuration+lim.SchedLatenessMin+lim.SchedLatenessSpread+schedLatenessDrain)
	defer cancelConsume()
	type consumed struct {
		lateness []time.Duration
		early    int
		err      error
	}
	result := make(chan consumed, 1)
	go func() {
		var got consumed
		got.lateness = make([]time.Duration, 0, total)
		handle := func(p []byte) {
			at := time.UnixMilli(int64(binary.LittleEndian.Uint64(p)))
			d := time.Since(at)
			if d < 0 {
				got.early++
			}
			got.lateness = append(got.lateness, d)
		}
		var err error
		for len(got.lateness) < total && cctx.Err() == nil {
			if _, err = sub.ReceiveBatch(cctx, receiveWait, handle); err != nil {
				break
			}
			prog.count.Store(int64(len(got.lateness)))
		}
		if cctx.Err() != nil {
			err = nil // a shortfall shows as fewer messages
		}
		got.err = errors.Join(err, sub.Close())
		result <- got
	}()

	interval := time.Second / time.Duration(lim.SchedLatenessRate)
	sem := make(chan struct{}, schedLatenessInflight)
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := 0; i < total && ctx.Err() == nil && failed.Load() == nil; {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(min(wait, e2ePaceSleepMax))
			continue
		}
		offset := lim.SchedLatenessMin + lim.SchedLatenessSpread*time.Duration(i%100)/100
		at := time.Now().Add(offset).Truncate(time.Millisecond)
		buf := make([]byte, len(payload))
		copy(buf, payload)
		binary.LittleEndian.PutUint64(buf, uint64(at.UnixMilli()))
		i++
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, schedLatenessDrain)
			defer cancel()
			if _, err := c.Schedule(sctx, stream, client.Message{Value: buf}, at); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		}()
	}
	offered := time.Since(start)
	wg.Wait()
	got := <-result // bounded by cctx
	if e := failed.Load(); e != nil {
		return runResult{}, fmt.Errorf("schedule: %w", *e)
	}
	if got.err != nil {
		return runResult{}, got.err
	}
	if got.early > 0 {
		logf("%s: %d of %d messages received BEFORE their deliver_at", stream, got.early, len(got.lateness))
	}
	return runResult{Messages: int64(len(got.lateness)), Elapsed: offered, Latencies: got.lateness}, ctx.Err()
}

// pendingNode is a Nereus node with its server on loopback in the
// harness process, for the pending workload, which closes and reopens it.
type pendingNode struct {
	n   *node.Node
	srv *server.Server
	c   *client.Client
}

func openPendingNode(ctx context.Context, dataDir string, schedWindow int) (*pendingNode, error) {
	n, srv, addr, err := serveInProcess(dataDir, schedWindow)
	if err != nil {
		return nil, err
	}
	pn := &pendingNode{n: n, srv: srv}
	if pn.c, err = client.Dial(ctx, client.Options{Servers: []string{addr}, ClientName: "bench-sched-pending"}); err != nil {
		pn.Close()
		return nil, err
	}
	return pn, nil
}

func (pn *pendingNode) Close() error {
	if pn.c != nil {
		pn.c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), nereusStopTimeout)
	defer cancel()
	err := pn.srv.Close(ctx)
	pn.n.Close()
	return err
}

// schedStatus returns the pending schedules and whether every shard is
// active.
func schedStatus(ctx context.Context, c *client.Client) (pending int64, active bool, err error) {
	st, err := c.SchedulerStatus(ctx, "")
	if err != nil {
		return 0, false, err
	}
	active = len(st.Shards) > 0
	for _, s := range st.Shards {
		pending += int64(s.Pending)
		active = active && s.Lifecycle == schedActive
	}
	return pending, active, nil
}

// heapInuse returns HeapInuse after two collections.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// runSchedPending opens a node of its own (data under dataDir), creates
// its schedule shards and a destination topic, takes the heap in use after
// GC, schedules lim.SchedPendingCount messages due far in the future, and
// takes it again: the difference ÷ the count is the heap per pending
// schedule (the whole harness process's heap; the other brokers are idle
// meanwhile). Then it closes the node and measures from the start of its
// reopening until SchedulerStatus shows every shard ACTIVE_FOR_COMMANDS
// with every schedule pending: that is the run's timed part.
func runSchedPending(ctx context.Context, dataDir string, payload []byte, lim limits, prog *progress, logf func(string, ...any)) (res runResult, err error) {
	const topic = "bench-sched-pending"
	pn, err := openPendingNode(ctx, dataDir, lim.SchedPendingWindow)
	if err != nil {
		return runResult{}, err
	}
	defer func() {
		if pn != nil {
			err = errors.Join(err, pn.Close())
		}
	}()
	if _, err := pn.c.DeclareTopic(ctx, client.TopicConfig{Name: topic, Partitions: 1}); err != nil {
		return runResult{}, err
	}
	if _, _, err := schedStatus(ctx, pn.c); err != nil { // creates the shards
		return runResult{}, err
	}
	before := heapInuse()
	prog.phase(prefillProgressName)
	deliverAt := time.Now().Add(schedFarFuture)
	fillStart := time.Now()
	count, err := fillSchedules(ctx, pn.c, topic, lim.SchedPendingCount, schedFillInflight, fillTime(lim.SchedPendingCount),
		func(int) (client.Message, time.Time) { return client.Message{Value: payload}, deliverAt }, prog)
	if err != nil {
		return runResult{}, fmt.Errorf("fill: %w", err)
	}
	fillTook := time.Since(fillStart)
	pending, _, err := schedStatus(ctx, pn.c)
	if err != nil {
		return runResult{}, err
	}
	if pending != count {
		return runResult{}, fmt.Errorf("%d schedules taken, %d pending", count, pending)
	}
	after := heapInuse()
	perPending := (float64(after) - float64(before)) / float64(max(count, 1))
	logf("scheduled %d in %.1fs (%.0f/s, %d in flight); heap in use after GC %.1f → %.1f MiB: %.0f B per pending schedule",
		count, fillTook.Seconds(), float64(count)/fillTook.Seconds(), schedFillInflight, float64(before)/(1<<20), float64(after)/(1<<20), perPending)

	prog.phase("restart")
	if err := pn.Close(); err != nil {
		return runResult{}, fmt.Errorf("close: %w", err)
	}
	pn = nil
	rctx, cancel := context.WithTimeout(ctx, schedRestartTimeout)
	defer cancel()
	start := time.Now()
	pn, err = openPendingNode(rctx, dataDir, lim.SchedPendingWindow)
	if err != nil {
		return runResult{}, fmt.Errorf("reopen: %w", err)
	}
	opened := time.Since(start)
	// Once every shard is active its state has applied everything
	// committed before the restart: the pending count is final then.
	for {
		pending, active, err := schedStatus(rctx, pn.c)
		if err == nil && active {
			if pending != count {
				return runResult{}, fmt.Errorf("after the restart every shard is active with %d pending, %d before", pending, count)
			}
			break
		}
		if err != nil && !client.IsRetryable(err) {
			return runResult{}, fmt.Errorf("after the restart: %w", err)
		}
		if err := sleepCtx(rctx, schedPollInterval); err != nil {
			return runResult{}, fmt.Errorf("after the restart, %d of %d pending, every shard active: %v: %w", pending, count, active, err)
		}
	}
	elapsed := time.Since(start)
	logf("restart with %d pending: node.Open %.0f ms, every shard %s at %.0f ms", count, float64(opened.Microseconds())/1e3, schedActive, float64(elapsed.Microseconds())/1e3)
	return runResult{Messages: count, Elapsed: elapsed, HeapBytesPerPending: perPending}, nil
}

// schedPendingDir is the data directory of one run of the pending workload.
func schedPendingDir(workDir string, runIndex int) string {
	return filepath.Join(workDir, fmt.Sprintf("nereus-sched-pending-%d", runIndex))
}
