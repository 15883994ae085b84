package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fixed bounds shared by every workload.
const (
	inflightMax         = 256              // pub_async window, both systems
	consumeBatchMax     = 500              // Fetch(500) / Credit 500
	latencySamplesMax   = 2_000_000        // per run, 8 bytes each
	setupTimeout        = 30 * time.Second // creating a stream, publisher or subscriber
	flushTimeout        = 60 * time.Second // waiting for a window of async publishes
	receiveWait         = time.Second      // one ReceiveBatch
	consumeIdleMax      = 2 * time.Second  // no message for this long: the stream is drained
	e2eDrainTimeout     = 10 * time.Second // after the last e2e publish, for the deliveries
	e2eTimestampBytes   = 8
	e2ePaceSleepMax     = 5 * time.Millisecond
	prefillProgressName = "prefill"
)

// limits bound every run of every case; -quick and the default run differ
// only here (see newLimits).
type limits struct {
	// TimeLimit bounds the timed part of a pub_sync, pub_async or consume run.
	TimeLimit time.Duration
	// PubSyncCountMax and PubAsyncCountMax bound the messages of one run.
	PubSyncCountMax  int
	PubAsyncCountMax int
	// RunBytesMax bounds count × size of any publishing phase, so that a
	// 64 KiB run does not fill the disk (streams stay until the run ends).
	// -quick's one run per row gets more than the default's three: at
	// 256 MiB its 64 KiB cases lasted 0.2-2.4 s and their ratios to each
	// other moved by 3x between runs (PERFORMANCE, Round 14).
	RunBytesMax int64
	// PrefillCountMax and PrefillTimeLimit bound the untimed fill before a
	// consume run; the consume run reads what the fill wrote.
	PrefillCountMax  int
	PrefillTimeLimit time.Duration
	// E2ERatePerS is the offered publish rate of an e2e run, for E2EDuration.
	E2ERatePerS int
	E2EDuration time.Duration
	// FailoverKills is how many leaders one run of a failover case kills.
	FailoverKills int
	// GroupPrefillCountMax bounds the fill before a group consume run
	// (PrefillTimeLimit bounds its time); GroupChangeRepeats is how many
	// fresh groups one run of a join or leave case measures.
	GroupPrefillCountMax int
	GroupChangeRepeats   int
	// The scheduled-delivery workloads: SchedIntakeClients goroutines
	// schedule in the intake row; SchedFireCount messages are due at one
	// instant in the fire row; the lateness row schedules
	// SchedLatenessRate per second for SchedLatenessDuration, each due
	// SchedLatenessMin plus up to SchedLatenessSpread later;
	// SchedPendingCount schedules are pending in the pending row. The
	// issue asks for a million in the fire and pending rows; the default
	// run takes what fits in a few minutes here: a burst fires at about
	// 100–250 msgs/s (10,000), and beyond 100,000 schedules per shard
	// (200,000 on a node's 2 shards) each SCHEDULE and a restart's replay
	// scan the shard's full dedup table (docs/PERFORMANCE.md).
	SchedIntakeClients    int
	SchedFireCount        int
	SchedLatenessRate     int
	SchedLatenessDuration time.Duration
	SchedLatenessMin      time.Duration
	SchedLatenessSpread   time.Duration
	SchedPendingCount     int
	// SchedPendingWindow is the pending row's node.Config.SchedWindow
	// (0: the default): what a lane of a shard keeps in RAM, up to twice
	// it; the rest is spilled to disk.
	SchedPendingWindow int
	// KVWatchCountMax bounds the updates of one kv_watch run (TimeLimit
	// bounds its time; each is delivered to kvWatchers watchers).
	KVWatchCountMax int
	// Runs is how many times each case runs; rows report the median.
	Runs int
}

// newLimits returns the bounds of a -quick run or of the default run.
func newLimits(quick bool) limits {
	if quick {
		return limits{
			TimeLimit: 3 * time.Second, PubSyncCountMax: 20_000, PubAsyncCountMax: 500_000,
			RunBytesMax: 1 << 30, PrefillCountMax: 100_000, PrefillTimeLimit: 6 * time.Second,
			E2ERatePerS: 2000, E2EDuration: 3 * time.Second, FailoverKills: 5,
			GroupPrefillCountMax: 100_000, GroupChangeRepeats: 10,
			SchedIntakeClients: 16, SchedFireCount: 20_000, SchedLatenessRate: 500, SchedLatenessDuration: 4 * time.Second,
			SchedLatenessMin: time.Second, SchedLatenessSpread: 2 * time.Second, SchedPendingCount: 100_000,
			SchedPendingWindow: 10_000, KVWatchCountMax: 20_000,
			Runs: 1,
		}
	}
	return limits{
		TimeLimit: 6 * time.Second, PubSyncCountMax: 200_000, PubAsyncCountMax: 2_000_000,
		RunBytesMax: 512 << 20, PrefillCountMax: 200_000, PrefillTimeLimit: 15 * time.Second,
		E2ERatePerS: 2000, E2EDuration: 5 * time.Second, FailoverKills: 5,
		GroupPrefillCountMax: 150_000, GroupChangeRepeats: 20,
		SchedIntakeClients: 16, SchedFireCount: 1_000_000, SchedLatenessRate: 1000, SchedLatenessDuration: 10 * time.Second,
		SchedLatenessMin: time.Second, SchedLatenessSpread: 4 * time.Second, SchedPendingCount: 1_000_000,
		KVWatchCountMax: 50_000,
		Runs:            3,
	}
}

// countMax bounds a publishing phase by count and by bytes.
func (l limits) countMax(count, sizeBytes int) int {
	return int(min(int64(count), l.RunBytesMax/int64(max(sizeBytes, 1))))
}

// runCase runs one case once against a started system, on a fresh stream
// named after the case and the run (a KV workload: a bucket so named).
// With -profile, a publish or KV case of a system that can profile its
// stream's or bucket's leader is profiled while it runs.
func runCase(ctx context.Context, env *environment, sys system, c benchCase, lim limits, runIndex int, prog *progress) (res runResult, err error) {
	logf := func(format string, args ...any) { env.logf(c.ID()+": "+format, args...) }
	stream := fmt.Sprintf("bench-%s-%d-%s-%d", c.Workload, c.SizeBytes, c.Mode, runIndex)
	if !c.Workload.createsStream() {
		sctx, cancel := context.WithTimeout(ctx, setupTimeout)
		err = sys.CreateStream(sctx, stream)
		cancel()
		if err != nil {
			return runResult{}, fmt.Errorf("create stream %s: %w", stream, err)
		}
	}
	if c.Workload.isKV() {
		if err := createBucket(ctx, sys, stream); err != nil {
			return runResult{}, err
		}
	}
	if lp, ok := sys.(leaderProfiler); ok && env.profileDir != "" && (c.Workload == workloadPubSync || c.Workload == workloadPubAsync || c.Workload.isKV()) {
		prefix := filepath.Join(env.profileDir, strings.ReplaceAll(c.ID(), "/", "-")+fmt.Sprintf("-run%d", runIndex))
		profile := lp.profileLeader
		if c.Workload.isKV() {
			profile = lp.profileBucketLeader
		}
		finish, err := profile(ctx, stream, lim.TimeLimit, prefix)
		if err != nil {
			return runResult{}, err
		}
		defer func() { err = errors.Join(err, finish()) }()
	}
	// Streams are kept until the run ends, for both systems alike
	// (deleting gigabytes mid-run makes the disk busy with discards during
	// the next case); RunBytesMax bounds the disk.
	payload := make([]byte, c.SizeBytes)
	_, _ = rand.Read(payload) // incompressible
	// Not the failover (which kills and restarts processes), nor a join
	// or leave, whose samples are not messages.
	if c.Workload == workloadPubSync || c.Workload == workloadPubAsync {
		// Read around the CPU measurement (deferred first, so it runs
		// after), whose numbers then leave the scrapes out.
		replication := measureReplication(ctx, sys)
		defer func() { res.Replication = replication() }()
	}
	if c.Workload != workloadFailover && c.Workload != workloadGroupJoin && c.Workload != workloadGroupLeave && c.Workload != workloadSchedPending {
		cpu := measureCPU(sys)
		defer func() {
			if res.CPU == nil { // runConsume and runIdle measure their own timed part
				res.CPU = cpu()
			}
		}()
	}
	switch c.Workload {
	case workloadPubSync:
		return runPubSync(ctx, sys, stream, payload, lim, prog)
	case workloadPubAsync:
		prog.phase("publish")
		return runPubAsync(ctx, sys, stream, payload, lim.countMax(lim.PubAsyncCountMax, len(payload)), lim.TimeLimit, prog)
	case workloadConsume:
		return runConsume(ctx, sys, stream, payload, lim, prog)
	case workloadE2E:
		return runE2E(ctx, sys, stream, payload, lim, prog)
	case workloadFailover:
		return runFailover(ctx, sys, stream, payload, lim, prog)
	case workloadIdle:
		return runIdle(ctx, sys, stream, lim, prog)
	case workloadGroupConsume1, workloadGroupConsume3:
		return runGroupConsume(ctx, sys, stream, payload, c.Workload.groupMembers(), lim, prog, logf)
	case workloadGroupJoin:
		return runGroupChange(ctx, sys, stream, changeJoin, lim, prog, logf)
	case workloadGroupLeave:
		return runGroupChange(ctx, sys, stream, changeLeave, lim, prog, logf)
	case workloadSchedIntake:
		return runSchedIntake(ctx, sys, stream, payload, lim, prog)
	case workloadSchedFire:
		return runSchedFire(ctx, sys, stream, payload, lim, prog, logf)
	case workloadSchedLateness:
		return runSchedLateness(ctx, sys, stream, payload, lim, prog, logf)
	case workloadSchedPending:
		return runSchedPending(ctx, schedPendingDir(env.workDir, runIndex), payload, lim, prog, logf)
	case workloadKVPutSync, workloadKVPut, workloadKVGet, workloadKVWatch:
		return runKV(ctx, sys, c.Workload, stream, payload, lim, prog)
	}
	return runResult{}, fmt.Errorf("unknown workload %q", c.Workload)
}

// runPubSync publishes with one message in flight and records each
// publish-to-ack latency.
func runPubSync(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress) (runResult, error) {
	prog.phase("publish")
	pub, err := newPublisher(ctx, sys, stream, 1)
	if err != nil {
		return runResult{}, err
	}
	defer pub.Close()
	countMax := lim.countMax(lim.PubSyncCountMax, len(payload))
	samples := make([]time.Duration, 0, min(countMax, latencySamplesMax))
	tctx, cancel := context.WithTimeout(ctx, lim.TimeLimit)
	defer cancel()
	start := time.Now()
	lastDone := start
	var n int64
	for n < int64(countMax) && tctx.Err() == nil {
		t0 := time.Now()
		if err := pub.Publish(tctx, payload); err != nil {
			if timeIsUp(tctx) {
				break // time is up; this publish is not counted
			}
			return runResult{}, err
		}
		lastDone = time.Now()
		if len(samples) < latencySamplesMax {
			samples = append(samples, lastDone.Sub(t0))
		}
		n++
		prog.count.Store(n)
	}
	return runResult{Messages: n, Elapsed: lastDone.Sub(start), Latencies: samples}, ctx.Err()
}

// runPubAsync publishes up to countMax messages with inflightMax in flight
// for at most timeLimit, then waits for the window to drain. The elapsed
// time runs until the last ack.
func runPubAsync(ctx context.Context, sys system, stream string, payload []byte, countMax int, timeLimit time.Duration, prog *progress) (runResult, error) {
	pub, err := newPublisher(ctx, sys, stream, inflightMax)
	if err != nil {
		return runResult{}, err
	}
	defer pub.Close()
	var acked atomic.Int64
	var failed atomic.Pointer[error]
	done := func(err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
			return
		}
		prog.count.Store(acked.Add(1))
	}
	tctx, cancel := cancelAfter(ctx, timeLimit)
	defer cancel()
	start := time.Now()
	for i := 0; i < countMax && tctx.Err() == nil && failed.Load() == nil; i++ {
		if err := pub.PublishAsync(tctx, payload, done); err != nil {
			if tctx.Err() != nil {
				break
			}
			return runResult{}, err
		}
	}
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	defer fcancel()
	if err := pub.Flush(fctx); err != nil {
		return runResult{}, fmt.Errorf("flush: %w", err)
	}
	elapsed := time.Since(start)
	if e := failed.Load(); e != nil {
		return runResult{}, *e
	}
	return runResult{Messages: acked.Load(), Elapsed: elapsed}, nil
}

// runConsume fills the stream (untimed), then consumes it with explicit
// acks in batches of consumeBatchMax. The timed part starts before the
// subscriber is opened and ends at the last message received.
func runConsume(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress) (runResult, error) {
	prog.phase(prefillProgressName)
	fill, err := runPubAsync(ctx, sys, stream, payload, lim.countMax(lim.PrefillCountMax, len(payload)), lim.PrefillTimeLimit, prog)
	if err != nil {
		return runResult{}, fmt.Errorf("prefill: %w", err)
	}
	prog.phase("consume")
	tctx, cancel := context.WithTimeout(ctx, lim.TimeLimit)
	defer cancel()
	cpu := measureCPU(sys) // the consumption, not the prefill
	start := time.Now()
	sub, err := newSubscriber(tctx, sys, stream)
	if err != nil {
		return runResult{}, err
	}
	var n int64
	lastAt, idleSince := start, start
	handle := func([]byte) { n++ }
	for n < fill.Messages && tctx.Err() == nil && time.Since(idleSince) < consumeIdleMax {
		k, err := sub.ReceiveBatch(tctx, receiveWait, handle)
		if err != nil && tctx.Err() == nil {
			sub.Close()
			return runResult{}, err
		}
		if k > 0 {
			lastAt, idleSince = time.Now(), time.Now()
			prog.count.Store(n)
		}
	}
	if err := sub.Close(); err != nil {
		return runResult{}, err
	}
	return runResult{Messages: n, Elapsed: lastAt.Sub(start), CPU: cpu()}, ctx.Err()
}

// runE2E publishes at lim.E2ERatePerS for lim.E2EDuration (asynchronously,
// so a slow ack does not lower the offered rate until the window is full)
// while a consumer in this process receives and acks. Each payload carries
// its send time (monotonic, relative to the run's start); the latency of a
// message is its receive time minus its send time.
func runE2E(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress) (runResult, error) {
	if len(payload) < e2eTimestampBytes {
		return runResult{}, fmt.Errorf("e2e needs messages of at least %d bytes", e2eTimestampBytes)
	}
	prog.phase("e2e")
	total := int(float64(lim.E2ERatePerS) * lim.E2EDuration.Seconds())
	sub, err := newSubscriber(ctx, sys, stream)
	if err != nil {
		return runResult{}, err
	}
	pub, err := newPublisher(ctx, sys, stream, inflightMax)
	if err != nil {
		sub.Close()
		return runResult{}, err
	}
	defer pub.Close()

	start := time.Now()
	consumeCtx, cancelConsume := context.WithTimeout(ctx, lim.E2EDuration+e2eDrainTimeout)
	defer cancelConsume()
	type consumed struct {
		latencies []time.Duration
		err       error
	}
	result := make(chan consumed, 1)
	go func() {
		latencies := make([]time.Duration, 0, min(total, latencySamplesMax))
		handle := func(p []byte) {
			sent := time.Duration(binary.LittleEndian.Uint64(p))
			if len(latencies) < latencySamplesMax {
				latencies = append(latencies, time.Since(start)-sent)
			}
		}
		var err error
		for len(latencies) < total && consumeCtx.Err() == nil {
			if _, err = sub.ReceiveBatch(consumeCtx, receiveWait, handle); err != nil {
				break
			}
			prog.count.Store(int64(len(latencies)))
		}
		if consumeCtx.Err() != nil {
			err = nil // a shortfall shows as fewer messages
		}
		result <- consumed{latencies: latencies, err: errors.Join(err, sub.Close())}
	}()

	var failed atomic.Pointer[error]
	done := func(err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	interval := time.Second / time.Duration(lim.E2ERatePerS)
	// Each message needs its own buffer: the timestamp differs and the
	// publisher may still hold the previous one.
	var buffers sync.Pool
	for sent := 0; sent < total && ctx.Err() == nil && failed.Load() == nil; {
		if wait := time.Until(start.Add(time.Duration(sent) * interval)); wait > 0 {
			time.Sleep(min(wait, e2ePaceSleepMax)) // at most E2EDuration in all
			continue
		}
		sent++
		buf, _ := buffers.Get().([]byte)
		if len(buf) != len(payload) {
			buf = make([]byte, len(payload))
			copy(buf, payload)
		}
		binary.LittleEndian.PutUint64(buf, uint64(time.Since(start)))
		err := pub.PublishAsync(ctx, buf, func(err error) { done(err); buffers.Put(buf) })
		if err != nil {
			return runResult{}, err
		}
	}
	offered := time.Since(start)
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	defer fcancel()
	if err := pub.Flush(fctx); err != nil {
		return runResult{}, fmt.Errorf("flush: %w", err)
	}
	got := <-result // bounded by consumeCtx
	if e := failed.Load(); e != nil {
		return runResult{}, *e
	}
	if got.err != nil {
		return runResult{}, got.err
	}
	return runResult{Messages: int64(len(got.latencies)), Elapsed: offered, Latencies: got.latencies}, ctx.Err()
}

func newPublisher(ctx context.Context, sys system, stream string, inflight int) (publisher, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	pub, err := sys.NewPublisher(sctx, stream, inflight)
	if err != nil {
		return nil, fmt.Errorf("new publisher: %w", err)
	}
	return pub, nil
}

// newSubscriber opens a consumer group named after the stream.
func newSubscriber(ctx context.Context, sys system, stream string) (subscriber, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	sub, err := sys.NewSubscriber(sctx, stream, stream+"-group", consumeBatchMax)
	if err != nil {
		return nil, fmt.Errorf("new subscriber: %w", err)
	}
	return sub, nil
}

// cancelAfter returns a context that is cancelled after d, without a
// deadline. The hand-over loops use it: the Nereus SDK takes a PublishAsync
// context's deadline as the message's delivery deadline (its doc says the
// context bounds only the wait for a window slot), which would fail the
// messages still in flight when the time limit strikes. Cancellation
// without a deadline stops the loop and lets them complete, as with JetStream.
func cancelAfter(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(d, cancel)
	return ctx, func() { timer.Stop(); cancel() }
}

// timeIsUp reports whether ctx's deadline has passed. A publish may give up
// at its deadline a moment before ctx's own timer marks ctx done.
func timeIsUp(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || (ok && !time.Now().Before(d))
}

// runClosedLoop calls op from workers goroutines, each calling it again
// once it returned, with i = 0, 1, 2, ... across them, until countMax
// calls were made or timeLimit passed (op's context ends then: a call in
// flight that fails because of it is not counted). It returns the calls
// that succeeded, the time from the start to the last of them, and a
// latency sample per call (up to latencySamplesMax in all). A failure
// before the time limit ends the loop with that error.
func runClosedLoop(ctx context.Context, workers, countMax int, timeLimit time.Duration, prog *progress, op func(ctx context.Context, i int64) error) (runResult, error) {
	tctx, cancel := context.WithTimeout(ctx, timeLimit)
	defer cancel()
	var next, n, lastNs atomic.Int64
	perWorker := make([][]time.Duration, workers)
	errs := make([]error, workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(countMax) {
					return
				}
				t0 := time.Now()
				if err := op(tctx, i); err != nil {
					if !timeIsUp(tctx) {
						errs[w] = err
					}
					return
				}
				done := time.Now()
				if len(perWorker[w]) < latencySamplesMax/workers {
					perWorker[w] = append(perWorker[w], done.Sub(t0))
				}
				prog.count.Store(n.Add(1))
				storeMax(&lastNs, int64(done.Sub(start)))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return runResult{}, err
	}
	var samples []time.Duration
	for _, s := range perWorker {
		samples = append(samples, s...)
	}
	return runResult{Messages: n.Load(), Elapsed: time.Duration(lastNs.Load()), Latencies: samples}, ctx.Err()
}
