package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The idle row: what a cluster costs while nobody uses it.
const (
	// idleStreams is how many streams (topics) of the system's
	// replication the idle row creates, all left idle.
	idleStreams = 20
	// idleSettle is the wait between the last stream's creation and the
	// measurement: elections, installs and their commits are done by then.
	idleSettle = 2 * time.Second
)

// runIdle creates idleStreams streams, lets the cluster settle, and
// measures the CPU its broker processes use over idleWindow(lim) with
// nothing published, consumed or watched: ticks, heartbeats and whatever
// else a broker does on its own. It runs first, on fresh clusters, so the
// streams of other rows do not count.
func runIdle(ctx context.Context, sys system, stream string, lim limits, prog *progress) (runResult, error) {
	if _, ok := sys.(processGroup); !ok {
		return runResult{}, errors.New("idle: the broker does not run in child processes whose CPU can be read")
	}
	prog.phase("create")
	for i := range idleStreams {
		sctx, cancel := context.WithTimeout(ctx, setupTimeout)
		err := sys.CreateStream(sctx, fmt.Sprintf("%s-%d", stream, i))
		cancel()
		if err != nil {
			return runResult{}, fmt.Errorf("create idle stream %d: %w", i, err)
		}
	}
	prog.phase("settle")
	if err := sleepCtx(ctx, idleSettle); err != nil {
		return runResult{}, err
	}
	prog.phase("idle")
	before, ok := takeCPUSnapshot(sys)
	start := time.Now()
	if !ok {
		return runResult{}, errors.New("idle: cannot read the broker processes' CPU time")
	}
	if err := sleepCtx(ctx, idleWindow(lim)); err != nil {
		return runResult{}, err
	}
	after, ok := takeCPUSnapshot(sys)
	elapsed := time.Since(start)
	if !ok {
		return runResult{}, errors.New("idle: cannot read the broker processes' CPU time")
	}
	usage := after.since(before)
	return runResult{Elapsed: elapsed, CPU: &usage}, nil
}

// idleWindow is how long the idle row measures: twice a timed phase, as
// /proc counts each process's CPU time in 10 ms units.
func idleWindow(lim limits) time.Duration { return 2 * lim.TimeLimit }

// msPerS is d of CPU per second of elapsed.
func msPerS(d time.Duration, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e6 / elapsed.Seconds()
}

// writeIdleMarkdown writes the idle row's table, when it ran.
func writeIdleMarkdown(b *strings.Builder, rows []row) {
	var idle []row
	for _, r := range rows {
		if r.Workload == workloadIdle {
			idle = append(idle, r)
		}
	}
	if len(idle) == 0 {
		return
	}
	b.WriteString("## Idle: what a cluster costs while nobody uses it\n\n")
	fmt.Fprintf(b, "CPU used by the broker processes, per second, with %d idle streams of 3 replicas and nothing published, consumed or watched: ticks, heartbeats and whatever else each broker does on its own. Measured first, on fresh clusters, %.0f s after the last stream was created, over twice a timed phase (/proc counts each process's CPU time in 10 ms units).\n\n", idleStreams, idleSettle.Seconds())
	b.WriteString("| system | mode | streams | CPU ms/s | busiest process ms/s | ÷ jetstream r3 |\n|---|---|---:|---:|---:|---:|\n")
	var js float64
	for _, r := range idle {
		if r.System == systemJetStream && r.Mode == modeR3 {
			js = r.IdleCPUMsPerS
		}
	}
	for _, r := range idle {
		versus := "–"
		if v, ok := ratio(r.IdleCPUMsPerS, js); ok && !(r.System == systemJetStream && r.Mode == modeR3) {
			versus = formatRatio(v)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s |\n", r.System, r.Mode, idleStreams, formatNumber(r.IdleCPUMsPerS), formatNumber(r.IdleBusiestCPUMsPerS), versus)
	}
	b.WriteString("\n")
}
