// Command bench measures Nereus side by side with NATS JetStream on this
// machine: the same workloads, message sizes and bounds against Nereus
// (in process, as a `nereus serve` child, and as a three-process cluster)
// and JetStream (an in-process server, and a three-process R3 cluster),
// all on loopback, plus the failover time of both clusters after kill -9
// of a stream leader, and writes the tables to results/latest.{md,svg,json}.
//
// Run it from bench/:
//
//	go run . -quick                 # about 7 minutes
//	go run .                        # 3 runs per row, a few minutes
//	go run . -only 'pub_async'      # rows whose system/mode/workload/size matches
//	go run . -quick -only '^nereus/r3/pub_' -profile /tmp/nereus-profiles
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"
)

// Bounds of the runner.
const (
	// caseTimeout bounds one run of one case, set-up and drain included.
	caseTimeout = 3 * time.Minute
	// syncTimeout bounds the wait for the page-cache flush before a case.
	syncTimeout = 30 * time.Second
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == floorReplicaArg {
		os.Exit(floorReplicaMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(runMain(os.Args[1:], os.Stderr))
}

// flags are the command line of the harness.
type flags struct {
	quick  bool
	outDir string
	only   string
	count  int
	tmpDir string
	// profileDir, when set, receives CPU and allocation profiles of the
	// partition leader's process for the nereus/r3 publish cases.
	profileDir string
}

func parseFlags(args []string, stderr io.Writer) (flags, *regexp.Regexp, error) {
	var f flags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&f.quick, "quick", false, "short bounds and 1 run per row (about 7 minutes)")
	fs.StringVar(&f.outDir, "out", "results", "directory for latest.md, latest.svg and latest.json")
	fs.StringVar(&f.only, "only", "", "run only the rows whose system/mode/workload/size matches this regexp")
	fs.IntVar(&f.count, "count", 0, "runs per row, the median is reported (default 1 with -quick, else 3)")
	fs.StringVar(&f.tmpDir, "tmp", os.TempDir(), "parent directory of the brokers' data (use a real disk, not tmpfs)")
	fs.StringVar(&f.profileDir, "profile", "", "write CPU and allocation profiles of each nereus process (the partition or bucket leader's and each follower's) of each nereus/r3 publish or KV case into this directory (builds nereus with a bench-only pprof endpoint)")
	if err := fs.Parse(args); err != nil {
		return f, nil, err
	}
	if fs.NArg() > 0 {
		return f, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.count < 0 || f.count > 100 {
		return f, nil, errors.New("-count must be 1-100")
	}
	var only *regexp.Regexp
	if f.only != "" {
		var err error
		if only, err = regexp.Compile(f.only); err != nil {
			return f, nil, fmt.Errorf("-only: %w", err)
		}
	}
	return f, only, nil
}

// runMain runs the harness and returns the exit code. Every broker it
// starts is stopped before it returns, on errors, panics and SIGINT/SIGTERM
// alike (the context is cancelled, the workloads return, the defers run).
func runMain(args []string, stderr io.Writer) int {
	f, only, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	lim := newLimits(f.quick)
	if f.count > 0 {
		lim.Runs = f.count
	}
	cases := selectCases(systemSpecs, workloadSpecs, only)
	if len(cases) == 0 {
		fmt.Fprintf(stderr, "bench: -only %q matches no row\n", f.only)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	workDir, err := os.MkdirTemp(f.tmpDir, "nereus-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	env := &environment{workDir: workDir, profileDir: f.profileDir, profiling: f.profileDir != "",
		logf: func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }}
	defer os.RemoveAll(workDir)
	defer func() {
		if err := env.children.closeAll(); err != nil {
			fmt.Fprintln(stderr, "bench: stop brokers:", err)
		}
	}()

	started := time.Now()
	rep, err := runCases(ctx, env, cases, lim, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	rep.Machine = collectMachineInfo(started, workDir)
	rep.Machine.NereusCommit = env.nereusCommit
	if rep.Machine.NereusCommit == "" { // no case built nereus
		rep.Machine.NereusCommit = nereusCommit(context.WithoutCancel(ctx))
	}
	rep.Config = runConfig{Quick: f.quick, Only: f.only, Runs: lim.Runs, TimeLimitS: lim.TimeLimit.Seconds(),
		InflightMax: inflightMax, BatchMax: consumeBatchMax, E2ERatePerS: lim.E2ERatePerS, E2ESeconds: lim.E2EDuration.Seconds(),
		FailoverKills: lim.FailoverKills, GroupPrefillCountMax: lim.GroupPrefillCountMax, GroupChangeRepeats: lim.GroupChangeRepeats,
		SchedIntakeClients: lim.SchedIntakeClients, SchedFireCount: lim.SchedFireCount, SchedLatenessRate: lim.SchedLatenessRate,
		SchedLatenessSeconds: lim.SchedLatenessDuration.Seconds(), SchedLatenessMinS: lim.SchedLatenessMin.Seconds(),
		SchedLatenessSpreadS: lim.SchedLatenessSpread.Seconds(), SchedPendingCount: lim.SchedPendingCount, SchedPendingWindow: lim.SchedPendingWindow,
		KVConcurrency: kvConcurrency, KVKeys: kvKeys, KVWatchers: kvWatchers, KVWatchCountMax: lim.KVWatchCountMax}
	if err := writeReport(f.outDir, rep); err != nil {
		fmt.Fprintln(stderr, "bench: write results:", err)
		return 1
	}
	fmt.Print(rep.markdown())
	fmt.Fprintf(stderr, "bench: done in %s; wrote %s\n", time.Since(started).Round(time.Second),
		filepath.Join(f.outDir, "latest.{md,svg,json}"))
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// environment is what the systems share during one run of the harness.
type environment struct {
	// workDir is this run's temporary directory, removed at exit.
	workDir string
	// logf writes one line about a case to stderr (what a row cannot say).
	logf func(format string, args ...any)
	// children are stopped when the run ends, however it ends.
	children childTracker

	// profiling builds nereus with the pprof overlay; profileDir receives
	// the profiles.
	profiling  bool
	profileDir string

	buildOnce sync.Once
	nereusBin string
	buildErr  error
	// nereusCommit is nereusCommit() when nereus was built.
	nereusCommit string

	natsBuildOnce sync.Once
	natsBin       string
	natsBuildErr  error
}

// track registers a started broker so that it is stopped at exit.
func (e *environment) track(c io.Closer) { e.children.add(c) }

// nereusBinary builds the nereus CLI the first time it is asked for.
func (e *environment) nereusBinary(ctx context.Context) (string, error) {
	e.buildOnce.Do(func() {
		// The tree as built: it may change during a long run.
		e.nereusCommit = nereusCommit(ctx)
		e.nereusBin, e.buildErr = buildNereus(ctx, e.workDir, e.profiling)
	})
	return e.nereusBin, e.buildErr
}

// natsServerBinary builds nats-server the first time it is asked for.
func (e *environment) natsServerBinary(ctx context.Context) (string, error) {
	e.natsBuildOnce.Do(func() { e.natsBin, e.natsBuildErr = buildNATSServer(ctx, e.workDir) })
	return e.natsBin, e.natsBuildErr
}

// pauseOthers stops the child processes of every system but the one
// keyed current and returns the function that lets them go on. All systems
// of a run stay up from its start to its end, and an idle broker is not
// idle: ticks, heartbeats and scrubbing in a three-process cluster with a
// few topics took a quarter of this machine's two cores from the case that
// ran beside it. In-process systems (the harness's own) cannot be paused.
func pauseOthers(systems map[string]system, current string, logf func(string, ...any)) (resume func()) {
	var paused []int
	for key, sys := range systems {
		pg, ok := sys.(processGroup)
		if key == current || !ok {
			continue
		}
		for _, pid := range pg.pids() {
			if err := pauseProcess(pid); err != nil {
				logf("pause %s (pid %d): %v", key, pid, err)
				continue
			}
			paused = append(paused, pid)
		}
	}
	return func() {
		for _, pid := range paused {
			if err := resumeProcess(pid); err != nil {
				logf("resume pid %d: %v", pid, err)
			}
		}
	}
}

// runCases starts the systems the cases need, runs every case lim.Runs
// times (run 1 of every case, then run 2, ...), and returns the median rows.
// A failed case is recorded in report.Errors and the others go on; a
// broker that fails to start fails the run.
func runCases(ctx context.Context, env *environment, cases []benchCase, lim limits, stderr io.Writer) (report, error) {
	systems := map[string]system{}
	for _, spec := range systemSpecs {
		needed := false
		for _, c := range cases {
			needed = needed || (c.System == spec.System && c.Mode == spec.Mode)
		}
		if !needed {
			continue
		}
		key := spec.System + "/" + spec.Mode
		fmt.Fprintf(stderr, "bench: starting %s\n", key)
		dataDir := filepath.Join(env.workDir, spec.System+"-"+spec.Mode)
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return report{}, err
		}
		sys, err := spec.start(ctx, env, dataDir)
		if err != nil {
			return report{}, fmt.Errorf("start %s: %w", key, err)
		}
		systems[key] = sys
	}

	prog := startProgress(stderr)
	defer prog.close()
	runs := map[string][]row{}
	failures := map[string]error{}
	for runIndex := 1; runIndex <= lim.Runs; runIndex++ {
		for i, c := range cases {
			if ctx.Err() != nil {
				return report{}, ctx.Err()
			}
			if failures[c.ID()] != nil {
				continue
			}
			label := fmt.Sprintf("[%d/%d run %d/%d] %s", i+1, len(cases), runIndex, lim.Runs, c.ID())
			flushDirtyPages(syncTimeout) // untimed: the previous case's writeback
			prog.setCase(label)
			timeout := caseTimeout
			if c.Workload.isSched() {
				timeout = schedCaseTimeout
			}
			cctx, cancel := context.WithTimeout(ctx, timeout)
			resume := pauseOthers(systems, c.System+"/"+c.Mode, env.logf)
			res, err := runCase(cctx, env, systems[c.System+"/"+c.Mode], c, lim, runIndex, prog)
			resume()
			cancel()
			prog.setCase("")
			if err != nil {
				if ctx.Err() != nil {
					return report{}, ctx.Err()
				}
				failures[c.ID()] = err
				fmt.Fprintf(stderr, "bench: %s: FAILED: %v\n", label, err)
				continue
			}
			if c.Workload == workloadFailover { // in kill order, before summarize sorts them
				fmt.Fprintf(stderr, "bench: %s: kill -9 of the leader to the next ack, in ms: %s\n", label, formatSamplesMs(res.Latencies))
			}
			r := summarize(c, res)
			runs[c.ID()] = append(runs[c.ID()], r)
			latency := ""
			if r.P50Us > 0 {
				latency = fmt.Sprintf(", p50 %.0fµs p99 %.0fµs max %.0fµs", r.P50Us, r.P99Us, r.MaxUs)
			}
			fmt.Fprintf(stderr, "bench: %s: %d msgs in %.2fs, %.0f msg/s, %.1f MB/s%s\n",
				label, r.Messages, r.Seconds, r.MsgsPerS, r.MBPerS, latency)
		}
	}

	var rep report
	for _, c := range cases {
		if err := failures[c.ID()]; err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", c.ID(), err))
			continue
		}
		rep.Rows = append(rep.Rows, medianRow(runs[c.ID()]))
	}
	rep.Ratios = computeRatios(rep.Rows, jetStreamModes(systemSpecs, 1), jetStreamModes(systemSpecs, 3))
	rep.Targets = computeTargets(rep.Ratios)
	if lim.Runs > 1 {
		each := make([][]row, lim.Runs)
		for _, c := range cases {
			if failures[c.ID()] == nil {
				for k, r := range runs[c.ID()] {
					each[k] = append(each[k], r)
				}
			}
		}
		addRunRatios(rep.Targets, each, jetStreamModes(systemSpecs, 1), jetStreamModes(systemSpecs, 3))
	}
	rep.Groups = computeGroupSummary(rep.Rows)
	rep.Sched = computeSchedSummary(rep.Rows)
	return rep, nil
}
