package main

import (
	"encoding/json"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// report is everything one run writes: latest.json is this value.
type report struct {
	Machine machineInfo `json:"machine"`
	Config  runConfig   `json:"config"`
	Rows    []row       `json:"rows"`
	Ratios  []ratioRow  `json:"ratios"`
	// Targets are the replicated path's targets (targets.go) this run
	// measured.
	Targets []target `json:"targets,omitempty"`
	// Groups compares the consumer-group rows (nil when none ran).
	Groups *groupSummary `json:"groups,omitempty"`
	// Sched lists the scheduled-delivery measurements (nil when none ran).
	Sched []schedMeasure `json:"sched,omitempty"`
	// Errors lists the cases that failed, "id: error"; their rows are absent.
	Errors []string `json:"errors,omitempty"`
}

// runConfig records the flags and bounds a run used.
type runConfig struct {
	Quick       bool    `json:"quick"`
	Only        string  `json:"only,omitempty"`
	Runs        int     `json:"runs"`
	TimeLimitS  float64 `json:"time_limit_s"`
	InflightMax int     `json:"inflight_max"`
	BatchMax    int     `json:"consume_batch_max"`
	E2ERatePerS int     `json:"e2e_rate_per_s"`
	E2ESeconds  float64 `json:"e2e_seconds"`
	// FailoverKills is how many leaders one run of a failover case kills.
	FailoverKills int `json:"failover_kills,omitempty"`
	// GroupPrefillCountMax bounds the fill of a group consume run, and
	// GroupChangeRepeats is how many fresh groups a join or leave run uses.
	GroupPrefillCountMax int `json:"group_prefill_count_max,omitempty"`
	GroupChangeRepeats   int `json:"group_change_repeats,omitempty"`
	// The scheduled-delivery bounds (limits.Sched*).
	SchedIntakeClients   int     `json:"sched_intake_clients,omitempty"`
	SchedFireCount       int     `json:"sched_fire_count,omitempty"`
	SchedLatenessRate    int     `json:"sched_lateness_rate_per_s,omitempty"`
	SchedLatenessSeconds float64 `json:"sched_lateness_seconds,omitempty"`
	SchedLatenessMinS    float64 `json:"sched_lateness_due_min_s,omitempty"`
	SchedLatenessSpreadS float64 `json:"sched_lateness_due_spread_s,omitempty"`
	SchedPendingCount    int     `json:"sched_pending_count,omitempty"`
	SchedPendingWindow   int     `json:"sched_pending_window,omitempty"`
	// The KV bounds: requests in flight of kv_put, kv_get and the
	// kv_watch writer; the key space; the watchers; the updates of one
	// kv_watch run at most.
	KVConcurrency   int `json:"kv_concurrency,omitempty"`
	KVKeys          int `json:"kv_keys,omitempty"`
	KVWatchers      int `json:"kv_watchers,omitempty"`
	KVWatchCountMax int `json:"kv_watch_count_max,omitempty"`
}

// metric is one number compared across systems.
type metric struct {
	Name          string // json field name of the row
	Label         string // for people
	LowerIsBetter bool
	get           func(row) float64
}

var (
	metricMsgsPerS = metric{Name: "msgs_per_s", Label: "msgs/s", get: func(r row) float64 { return r.MsgsPerS }}
	metricP50      = metric{Name: "p50_us", Label: "p50 µs", LowerIsBetter: true, get: func(r row) float64 { return r.P50Us }}
	metricP99      = metric{Name: "p99_us", Label: "p99 µs", LowerIsBetter: true, get: func(r row) float64 { return r.P99Us }}
	metricMax      = metric{Name: "max_us", Label: "max µs", LowerIsBetter: true, get: func(r row) float64 { return r.MaxUs }}
)

// comparedMetrics lists, per workload, the metrics the ratio table shows.
var comparedMetrics = map[workload][]metric{
	workloadPubSync:   {metricMsgsPerS, metricP50, metricP99},
	workloadPubAsync:  {metricMsgsPerS},
	workloadConsume:   {metricMsgsPerS},
	workloadE2E:       {metricP50, metricP99},
	workloadFailover:  {metricP50, metricMax},
	workloadKVPutSync: {metricMsgsPerS, metricP50, metricP99},
	workloadKVPut:     {metricMsgsPerS},
	workloadKVGet:     {metricMsgsPerS},
	workloadKVWatch:   {metricMsgsPerS, metricP50, metricP99},
}

// ratioRow compares one metric of one workload row: Nereus r1 (in the
// harness process, as JetStream r1) against each one-replica JetStream
// mode, against the same Nereus in a child process and with 3 replicas,
// Nereus r3 against each three-replica JetStream mode, and, for pub_sync
// latencies, Nereus r1 against one raw write + fdatasync measured in the
// same run.
type ratioRow struct {
	Workload      workload `json:"workload"`
	SizeBytes     int      `json:"size"`
	Metric        string   `json:"metric"`
	LowerIsBetter bool     `json:"lower_is_better"`
	// Nereus is the metric of Nereus r1 (0 when not run), and Versus its
	// ratio to each one-replica JetStream mode.
	Nereus float64       `json:"nereus"`
	Versus []ratioVersus `json:"versus"`
	// NereusProc is the metric of a `nereus serve` child process (nil when
	// not run), and ProcVersusR1 its ratio to Nereus: what the process
	// boundary costs.
	NereusProc   *float64 `json:"nereus_r1_proc,omitempty"`
	ProcVersusR1 float64  `json:"r1_proc_versus_r1,omitempty"`
	// NereusR3 is the metric with 3 replicas, three child processes (nil
	// when not run), and R3VersusProc its ratio to the one child process:
	// what replication costs.
	NereusR3     *float64 `json:"nereus_r3,omitempty"`
	R3VersusProc float64  `json:"r3_versus_r1_proc,omitempty"`
	// R3Versus is Nereus r3's ratio to each three-replica JetStream mode
	// (JetStream R3, default and sync-always), in the same run.
	R3Versus []ratioVersus `json:"r3_versus,omitempty"`
	// Disk is the same latency of the raw-disk anchor (nil when not run or
	// not a pub_sync latency), and VersusDisk Nereus's ratio to it.
	Disk       *float64 `json:"disk_fsync,omitempty"`
	VersusDisk float64  `json:"versus_disk_fsync,omitempty"`
	// FloorR1 and FloorR3 are the same metric of the floor (floor.go)
	// with one and three replicas (nil when not run).
	FloorR1 *float64 `json:"floor_r1,omitempty"`
	FloorR3 *float64 `json:"floor_r3,omitempty"`
}

// ratioVersus is Nereus's value divided by one JetStream mode's value
// (0 when either is missing); Nereus r1's for a one-replica mode, Nereus
// r3's for a three-replica one.
type ratioVersus struct {
	Mode      string  `json:"mode"`
	JetStream float64 `json:"jetstream"`
	Ratio     float64 `json:"ratio"`
}

// jetStreamModes returns the JetStream modes of specs whose streams have
// the given number of replicas, in table order.
func jetStreamModes(specs []systemSpec, replicas int) []string {
	var modes []string
	for _, s := range specs {
		if s.System == systemJetStream && s.replicationFactor() == replicas {
			modes = append(modes, s.Mode)
		}
	}
	return modes
}

// computeRatios compares, for each (workload, size) that some Nereus row
// measured, in the order of rows: the Nereus r1 row with the JetStream rows
// of modesR1, and the Nereus r3 row with the JetStream rows of modesR3.
func computeRatios(rows []row, modesR1, modesR3 []string) []ratioRow {
	type key struct {
		system, mode string
		w            workload
		size         int
	}
	type workloadKey struct {
		w    workload
		size int
	}
	byKey := map[key]row{}
	var order []workloadKey
	for _, r := range rows {
		byKey[key{r.System, r.Mode, r.Workload, r.SizeBytes}] = r
		wk := workloadKey{r.Workload, r.SizeBytes}
		if r.System == systemNereus && !slices.Contains(order, wk) {
			order = append(order, wk)
		}
	}
	var out []ratioRow
	for _, wk := range order {
		for _, m := range comparedMetrics[wk.w] {
			get := func(system, mode string) (float64, bool) {
				o, ok := byKey[key{system, mode, wk.w, wk.size}]
				return m.get(o), ok
			}
			rr := ratioRow{Workload: wk.w, SizeBytes: wk.size, Metric: m.Name, LowerIsBetter: m.LowerIsBetter}
			rr.Nereus, _ = get(systemNereus, modeR1)
			if v, ok := get(systemNereus, modeR1Proc); ok {
				rr.NereusProc = &v
				rr.ProcVersusR1, _ = ratio(v, rr.Nereus)
			}
			if v, ok := get(systemNereus, modeR3); ok {
				rr.NereusR3 = &v
				if rr.NereusProc != nil {
					rr.R3VersusProc, _ = ratio(v, *rr.NereusProc)
				}
			}
			if v, ok := get(systemFloor, modeR1); ok {
				rr.FloorR1 = &v
			}
			if v, ok := get(systemFloor, modeR3); ok {
				rr.FloorR3 = &v
			}
			if v, ok := get(systemDisk, modeFsync); ok && m.LowerIsBetter {
				rr.Disk = &v
				rr.VersusDisk, _ = ratio(rr.Nereus, v)
			}
			versus := func(nereus float64, modes []string) []ratioVersus {
				var vs []ratioVersus
				for _, mode := range modes {
					if js, ok := get(systemJetStream, mode); ok {
						v := ratioVersus{Mode: mode, JetStream: js}
						v.Ratio, _ = ratio(nereus, js)
						vs = append(vs, v)
					}
				}
				return vs
			}
			rr.Versus = versus(rr.Nereus, modesR1)
			if rr.NereusR3 != nil {
				rr.R3Versus = versus(*rr.NereusR3, modesR3)
			}
			out = append(out, rr)
		}
	}
	return out
}

// anyRatio reports whether some row has the comparison has picks.
func anyRatio(rows []ratioRow, has func(ratioRow) bool) bool {
	return slices.ContainsFunc(rows, has)
}

// formatSize prints a message size: "16 B", "1 KiB", "64 KiB".
func formatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// formatNumber prints a measurement with about three significant digits,
// or "–" when it was not measured.
func formatNumber(v float64) string {
	switch {
	case v <= 0:
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func formatRatio(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", v)
}

// markdown renders the report: machine, ratio table, all rows, errors.
func (rep report) markdown() string {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "# Nereus vs NATS JetStream\n\n")
	kind := "default"
	if rep.Config.Quick {
		kind = "-quick"
	}
	fmt.Fprintf(&b, "Run %s (%s), each row the median of %d run(s). Nereus built from %s. Machine: %d CPU (%s), %s/%s, kernel %s, %s; data in %s (%s).\n\n",
		m.Date, kind, rep.Config.Runs, orUnknown(m.NereusCommit), m.NumCPU, orUnknown(m.CPUModel), m.GOOS, m.GOARCH, orUnknown(m.Kernel), m.GoVersion, m.DataDir, orUnknown(m.DataFS))

	if anyRatio(rep.Ratios, inHeadToHead) {
		b.WriteString("## Nereus ÷ JetStream\n\n")
		b.WriteString("Both run in the harness process. Nereus r1 acks after fsync. JetStream r1 acks before fsync (sync_interval 2 min); r1-always fsyncs every write.\n")
		b.WriteString("For msgs/s a ratio above 1 means Nereus is faster; for latencies (µs) a ratio below 1 means Nereus is faster.\n\n")
		writeVersusTable(&b, rep.Ratios, inHeadToHead, "nereus r1", "nereus",
			func(rr ratioRow) (float64, []ratioVersus) { return rr.Nereus, rr.Versus })
	}

	inR3 := func(rr ratioRow) bool {
		return rr.Workload != workloadFailover && !rr.Workload.isKV() && len(rr.R3Versus) > 0
	}
	if anyRatio(rep.Ratios, inR3) {
		b.WriteString("## Replicated: Nereus r3 ÷ JetStream R3\n\n")
		b.WriteString("Both are three child processes on this machine (and disk), clustered on loopback, with streams of 3 replicas; the clients talk to the stream's leader. Nereus r3 acks once two replicas fsynced a record. JetStream r3 acks once two replicas stored it, fsyncing every 2 min (the default sync_interval); r3-always fsyncs every write.\n\n")
		writeVersusTable(&b, rep.Ratios, inR3, "nereus r3", "nereus r3",
			func(rr ratioRow) (float64, []ratioVersus) { return *rr.NereusR3, rr.R3Versus })
	}

	writeTargetsMarkdown(&b, rep.Targets)
	writeReplicationMarkdown(&b, rep.Rows)

	if anyRatio(rep.Ratios, func(rr ratioRow) bool { return rr.Disk != nil }) {
		b.WriteString("## Against one raw fsync\n\n")
		b.WriteString("disk fsync is no broker: one 1 KiB write and fdatasync into a preallocated file on the same file system, one at a time.\n\n")
		b.WriteString("| workload | size | metric | disk fsync | nereus r1 | ÷ disk | nereus r1-proc | ÷ disk | jetstream r1-always | ÷ disk |\n")
		b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, rr := range rep.Ratios {
			if rr.Disk == nil {
				continue
			}
			proc, procRatio := "–", "–"
			if rr.NereusProc != nil {
				r, _ := ratio(*rr.NereusProc, *rr.Disk)
				proc, procRatio = formatNumber(*rr.NereusProc), formatRatio(r)
			}
			js, jsRatio := "–", "–"
			for _, v := range rr.Versus {
				if v.Mode == modeR1Always {
					r, _ := ratio(v.JetStream, *rr.Disk)
					js, jsRatio = formatNumber(v.JetStream), formatRatio(r)
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rr.Workload, formatSize(rr.SizeBytes), metricLabel(rr),
				formatNumber(*rr.Disk), formatNumber(rr.Nereus), formatRatio(rr.VersusDisk), proc, procRatio, js, jsRatio)
		}
		b.WriteString("\n")
	}

	writeFloorMarkdown(&b, rep.Ratios)

	inNereus := func(rr ratioRow) bool {
		return rr.Workload != workloadFailover && !rr.Workload.isKV() && (rr.NereusProc != nil || rr.NereusR3 != nil)
	}
	if anyRatio(rep.Ratios, inNereus) {
		b.WriteString("## Nereus: in the harness process, in a child process, replicated\n\n")
		b.WriteString("r1 runs in the harness process (as JetStream does), r1-proc is one `nereus serve` child process, r3 is three of them on this same machine (and disk); an r3 record is acked once two of them fsynced it.\n\n")
		b.WriteString("| workload | size | metric | nereus r1 | nereus r1-proc | r1-proc ÷ r1 | nereus r3 | r3 ÷ r1-proc |\n|---|---|---|---:|---:|---:|---:|---:|\n")
		for _, rr := range rep.Ratios {
			if !inNereus(rr) {
				continue
			}
			proc, r3 := "–", "–"
			if rr.NereusProc != nil {
				proc = formatNumber(*rr.NereusProc)
			}
			if rr.NereusR3 != nil {
				r3 = formatNumber(*rr.NereusR3)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", rr.Workload, formatSize(rr.SizeBytes), metricLabel(rr),
				formatNumber(rr.Nereus), proc, formatRatio(rr.ProcVersusR1), r3, formatRatio(rr.R3VersusProc))
		}
		b.WriteString("\n")
	}

	if anyRatio(rep.Ratios, func(rr ratioRow) bool { return rr.Workload == workloadFailover }) {
		b.WriteString("## Failover: kill -9 of the partition leader\n\n")
		fmt.Fprintf(&b, "Time from SIGKILL of the process leading an R3 stream to the next acknowledged synchronous publish; %d kills per run, each on a new stream after %d publishes and with every replica in sync, the killed process started again after each. Both clients retry a publish after at most %.0f ms and wait at most %.0f ms for an ack per attempt.",
			rep.Config.FailoverKills, failoverSteadyCount, float64(failoverRetryWait.Milliseconds()), float64(failoverAttemptTimeout.Milliseconds()))
		if rep.Config.Runs > 1 {
			b.WriteString(" p50 and max are each the median of the runs' p50 and max.")
		}
		b.WriteString("\n\n")
		b.WriteString("| metric | nereus r3 ms |")
		modes := versusModes(rep.Ratios, func(rr ratioRow) []ratioVersus {
			if rr.Workload != workloadFailover {
				return nil
			}
			return rr.R3Versus
		})
		for _, mode := range modes {
			fmt.Fprintf(&b, " jetstream %s ms | nereus ÷ %s |", mode, mode)
		}
		b.WriteString("\n|---|---:|" + strings.Repeat("---:|---:|", len(modes)) + "\n")
		for _, rr := range rep.Ratios {
			if rr.Workload != workloadFailover {
				continue
			}
			nereus := "–"
			if rr.NereusR3 != nil {
				nereus = formatNumber(*rr.NereusR3 / 1e3)
			}
			fmt.Fprintf(&b, "| %s | %s |", strings.TrimSuffix(metricLabel(rr), " µs"), nereus)
			for _, mode := range modes {
				js, r := "–", "–"
				for _, v := range rr.R3Versus {
					if v.Mode == mode {
						js, r = formatNumber(v.JetStream/1e3), formatRatio(v.Ratio)
					}
				}
				fmt.Fprintf(&b, " %s | %s |", js, r)
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}

	writeGroupMarkdown(&b, rep.Groups, rep.Config)
	writeSchedMarkdown(&b, rep.Sched, rep.Config)
	writeKVMarkdown(&b, rep.Ratios, rep.Config)

	if slices.ContainsFunc(rep.Rows, func(r row) bool { return r.HarnessCPUUsPerMsg > 0 }) {
		b.WriteString("## CPU per message\n\n")
		fmt.Fprintf(&b, "User + system CPU time during each case divided by its messages, in µs: the harness process (getrusage: the load generator, and the broker when it runs in process), the broker's child processes together and the busiest one of them (/proc/PID/stat, 10 ms ticks; in a cluster the busiest is about the leader). It includes the case's set-up (stream, connections); for consume it covers the consumption, not the prefill. cores is total × msgs/s for the publish and consume rows, whose CPU is measured over the same phase as their msgs/s: how many of this machine's %d cores the case kept busy (other processes not counted) — near %d, the case is bound by CPU, and more publishes in flight cannot make it faster.\n\n", rep.Machine.NumCPU, rep.Machine.NumCPU)
		b.WriteString("| system | mode | workload | size | harness | broker processes | busiest process | total | cores |\n|---|---|---|---|---:|---:|---:|---:|---:|\n")
		for _, r := range rep.Rows {
			if r.HarnessCPUUsPerMsg <= 0 {
				continue
			}
			total := r.HarnessCPUUsPerMsg + r.BrokerCPUUsPerMsg
			cores := 0.0 // –
			if r.Workload.cpuSpansTheTimedPhase() {
				cores = total * r.MsgsPerS / 1e6
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.System, r.Mode, r.Workload, formatSize(r.SizeBytes),
				formatNumber(r.HarnessCPUUsPerMsg), formatNumber(r.BrokerCPUUsPerMsg), formatNumber(r.BusiestCPUUsPerMsg),
				formatNumber(total), formatNumber(cores))
		}
		b.WriteString("\n")
	}

	writeIdleMarkdown(&b, rep.Rows)
	b.WriteString("## All rows\n\n")
	b.WriteString("| system | mode | workload | size | msgs/s | MB/s | p50 µs | p99 µs | p99.9 µs | messages | seconds | runs |\n")
	b.WriteString("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %.2f | %d |\n",
			r.System, r.Mode, r.Workload, formatSize(r.SizeBytes), formatNumber(r.MsgsPerS), formatNumber(r.MBPerS),
			formatNumber(r.P50Us), formatNumber(r.P99Us), formatNumber(r.P999Us), r.Messages, r.Seconds, r.Runs)
	}
	fmt.Fprintf(&b, "\nBounds: %.1fs per timed phase, %d publishes in flight for pub_async, consume batches of %d, e2e offered at %d msgs/s for %.0fs.\n",
		rep.Config.TimeLimitS, rep.Config.InflightMax, rep.Config.BatchMax, rep.Config.E2ERatePerS, rep.Config.E2ESeconds)
	if len(rep.Errors) > 0 {
		b.WriteString("\n## Errors\n\n")
		for _, e := range rep.Errors {
			fmt.Fprintf(&b, "- %s\n", e)
		}
	}
	return b.String()
}

// writeFloorMarkdown writes the table of the brokers against the floor
// of the same replication factor, when the floor ran.
func writeFloorMarkdown(b *strings.Builder, rows []ratioRow) {
	if !anyRatio(rows, func(rr ratioRow) bool { return rr.FloorR1 != nil || rr.FloorR3 != nil }) {
		return
	}
	b.WriteString("## Against the floor\n\n")
	b.WriteString("The floor is no broker: child processes that only move the data of a publish acked after a quorum fsync — the leader forwards each payload to its followers as it reads it and appends it to a file, every replica fdatasyncs what it has written as often as it can, acks are cumulative counts; no checksums, no encoding, no protocol state, one reused buffer per connection (floor.go). It is a ceiling for a broker that acks after a quorum fsync on this machine, and floor r3 ÷ floor r1 is what replication itself costs here. ÷ floor is the broker's value over the floor's: for msgs/s below 1 is short of the ceiling, for latencies above 1 is slower than the floor.\n\n")
	b.WriteString("| workload | size | metric | floor r1 | nereus r1-proc | ÷ floor | floor r3 | nereus r3 | ÷ floor | jetstream r3 | ÷ floor | floor r3 ÷ r1 | nereus r3 ÷ r1-proc |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	cell := func(v *float64) string {
		if v == nil {
			return "–"
		}
		return formatNumber(*v)
	}
	over := func(v, floor *float64) string {
		if v == nil || floor == nil {
			return "–"
		}
		r, _ := ratio(*v, *floor)
		return formatRatio(r)
	}
	for _, rr := range rows {
		if rr.FloorR1 == nil && rr.FloorR3 == nil {
			continue
		}
		var js *float64
		for _, v := range rr.R3Versus {
			if v.Mode == modeR3 {
				js = &v.JetStream
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rr.Workload, formatSize(rr.SizeBytes), metricLabel(rr),
			cell(rr.FloorR1), cell(rr.NereusProc), over(rr.NereusProc, rr.FloorR1),
			cell(rr.FloorR3), cell(rr.NereusR3), over(rr.NereusR3, rr.FloorR3), cell(js), over(js, rr.FloorR3),
			over(rr.FloorR3, rr.FloorR1), over(rr.NereusR3, rr.NereusProc))
	}
	b.WriteString("\n")
}

// inHeadToHead selects the ratio rows of the Nereus r1 ÷ JetStream table
// (the KV rows have their own section).
func inHeadToHead(rr ratioRow) bool {
	return rr.Workload != workloadFailover && !rr.Workload.isKV() && (rr.Nereus > 0 || len(rr.Versus) > 0)
}

// versusModes returns the JetStream modes that versus names in rows, in
// their first order.
func versusModes(rows []ratioRow, versus func(ratioRow) []ratioVersus) []string {
	var modes []string
	for _, rr := range rows {
		for _, v := range versus(rr) {
			if !slices.Contains(modes, v.Mode) {
				modes = append(modes, v.Mode)
			}
		}
	}
	return modes
}

// writeVersusTable writes one ratio table: the rows that include selects,
// Nereus's value (named label) and, per JetStream mode, its value and the
// ratio "ratioName ÷ mode".
func writeVersusTable(b *strings.Builder, rows []ratioRow, include func(ratioRow) bool, label, ratioName string, values func(ratioRow) (float64, []ratioVersus)) {
	var selected []ratioRow
	for _, rr := range rows {
		if include(rr) {
			selected = append(selected, rr)
		}
	}
	modes := versusModes(selected, func(rr ratioRow) []ratioVersus { _, vs := values(rr); return vs })
	fmt.Fprintf(b, "| workload | size | metric | %s |", label)
	for _, mode := range modes {
		fmt.Fprintf(b, " jetstream %s | %s ÷ %s |", mode, ratioName, mode)
	}
	b.WriteString("\n|---|---|---|---:|" + strings.Repeat("---:|---:|", len(modes)) + "\n")
	for _, rr := range selected {
		nereus, vs := values(rr)
		fmt.Fprintf(b, "| %s | %s | %s | %s |", rr.Workload, formatSize(rr.SizeBytes), metricLabel(rr), formatNumber(nereus))
		for _, mode := range modes {
			js, r := "–", "–"
			for _, v := range vs {
				if v.Mode == mode {
					js, r = formatNumber(v.JetStream), formatRatio(v.Ratio)
				}
			}
			fmt.Fprintf(b, " %s | %s |", js, r)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// metricLabel returns the label of the metric a ratio row compares.
func metricLabel(rr ratioRow) string {
	if rr.Metric == metricMsgsPerS.Name && rr.Workload.isKV() {
		if rr.Workload == workloadKVWatch {
			return "updates/s"
		}
		return "ops/s"
	}
	for _, m := range []metric{metricMsgsPerS, metricP50, metricP99, metricMax} {
		if m.Name == rr.Metric {
			return m.Label
		}
	}
	return rr.Metric
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Geometry and colours of the SVG chart.
const (
	svgWidth       = 960
	svgLabelWidth  = 250
	svgBarMaxWidth = 520
	svgBarHeight   = 16
	svgGroupGap    = 14
	svgTop         = 70
)

// svgSeries are the bars of each group, in order, with their colours.
var svgSeries = []struct{ system, mode, color string }{
	{systemNereus, modeR1, "#2b6cb0"},
	{systemNereus, modeR1Proc, "#4299e1"},
	{systemNereus, modeR3, "#90cdf4"},
	{systemJetStream, modeR1, "#dd6b20"},
	{systemJetStream, modeR1Always, "#9c4221"},
	{systemJetStream, modeR3, "#f6ad55"},
	{systemJetStream, modeR3Always, "#fbd38d"},
	{systemDisk, modeFsync, "#718096"},
}

// svgLegendPerLine is how many legend entries share one line.
const svgLegendPerLine = 5

// svg renders one group of horizontal bars per compared metric (the rows
// of the ratio table), each group scaled to its own largest value, with
// the values written beside the bars.
func (rep report) svg() string {
	type bar struct {
		label string
		color string
		value float64
	}
	type group struct {
		title string
		bars  []bar
	}
	var groups []group
	for _, rr := range rep.Ratios {
		better := "higher is better"
		if rr.LowerIsBetter {
			better = "lower is better"
		}
		g := group{title: fmt.Sprintf("%s %s — %s (%s)", rr.Workload, formatSize(rr.SizeBytes), metricLabel(rr), better)}
		for _, s := range svgSeries {
			v := -1.0
			switch {
			case s.system == systemNereus && s.mode == modeR3:
				if rr.NereusR3 != nil {
					v = *rr.NereusR3
				}
			case s.system == systemNereus && s.mode == modeR1Proc:
				if rr.NereusProc != nil {
					v = *rr.NereusProc
				}
			case s.system == systemNereus:
				if rr.Nereus > 0 { // 0: Nereus r1 did not run this row
					v = rr.Nereus
				}
			case s.system == systemDisk:
				if rr.Disk != nil {
					v = *rr.Disk
				}
			default: // a JetStream mode: one replica or three
				for _, vs := range append(slices.Clone(rr.Versus), rr.R3Versus...) {
					if vs.Mode == s.mode {
						v = vs.JetStream
					}
				}
			}
			if v >= 0 {
				g.bars = append(g.bars, bar{label: s.system + " " + s.mode, color: s.color, value: v})
			}
		}
		groups = append(groups, g)
	}
	legendLines := (len(svgSeries) + svgLegendPerLine - 1) / svgLegendPerLine
	top := svgTop + (legendLines-1)*18
	height := top + 30
	for _, g := range groups {
		height += 20 + len(g.bars)*(svgBarHeight+4) + svgGroupGap
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="16" font-weight="bold">%s</text>`+"\n",
		html.EscapeString("Nereus vs NATS JetStream (each group scaled to its largest value)"))
	fmt.Fprintf(&b, `<text x="10" y="40" fill="#555">%s</text>`+"\n", html.EscapeString(fmt.Sprintf("%s, %d CPU, %s/%s, %s, median of %d run(s)",
		rep.Machine.Date, rep.Machine.NumCPU, rep.Machine.GOOS, rep.Machine.GOARCH, rep.Machine.GoVersion, rep.Config.Runs)))
	for i, s := range svgSeries {
		x, y := 10+(i%svgLegendPerLine)*180, 50+(i/svgLegendPerLine)*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			x, y, s.color, x+16, y+10, html.EscapeString(s.system+" "+s.mode))
	}
	y := top
	for _, g := range groups {
		y += 14
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y, html.EscapeString(g.title))
		y += 6
		peak := 0.0
		for _, br := range g.bars {
			peak = max(peak, br.value)
		}
		for _, br := range g.bars {
			width := 0
			if peak > 0 {
				width = int(br.value / peak * svgBarMaxWidth)
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", svgLabelWidth-8, y+12, html.EscapeString(br.label))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", svgLabelWidth, y, width, svgBarHeight, br.color)
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", svgLabelWidth+width+6, y+12, html.EscapeString(formatNumber(br.value)))
			y += svgBarHeight + 4
		}
		y += svgGroupGap
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// jsonBytes is latest.json.
func (rep report) jsonBytes() ([]byte, error) {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// writeReport writes latest.md, latest.svg and latest.json into dir.
func writeReport(dir string, rep report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := rep.jsonBytes()
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{"latest.md", []byte(rep.markdown())},
		{"latest.svg", []byte(rep.svg())},
		{"latest.json", js},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeReplicationMarkdown writes what the replicated Nereus publish rows
// waited for, from the brokers' metrics (measureReplication).
func writeReplicationMarkdown(b *strings.Builder, rows []row) {
	if !slices.ContainsFunc(rows, func(r row) bool { return r.ReplicationP50Us > 0 }) {
		return
	}
	b.WriteString("## Nereus r3: what a publish waits for\n\n")
	b.WriteString("From the brokers' metrics over each case: the leader's time from taking a proposal to its commit (`nereus_replication_seconds`) and the replicas' log fsyncs (`nereus_fsync_seconds{kind=\"replica\"}`), p50s and p99s interpolated in their power-of-two buckets (a p99 is known to within a factor of two); and the fsyncs of every replica per message.\n\n")
	b.WriteString("| mode | workload | size | replication p50 µs | replica fsync p50 µs | replication ÷ fsync | replication p99 µs | replica fsync p99 µs | fsyncs per message |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.ReplicationP50Us <= 0 {
			continue
		}
		ratio := "–"
		if r.ReplicaFsyncP50Us > 0 {
			ratio = formatRatio(r.ReplicationP50Us / r.ReplicaFsyncP50Us)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %.3f |\n", r.Mode, r.Workload, formatSize(r.SizeBytes),
			formatNumber(r.ReplicationP50Us), formatNumber(r.ReplicaFsyncP50Us), ratio,
			formatNumber(r.ReplicationP99Us), formatNumber(r.ReplicaFsyncP99Us), r.ReplicaFsyncsPerMsg)
	}
	b.WriteString("\n")
	writeInFlightMarkdown(b, rows)
}

// writeInFlightMarkdown splits a publish's mean time in flight: the
// window over the throughput (Little's law: 1 for pub_sync, inflightMax
// for pub_async, whose window stays full), against the leader's mean
// proposal-to-commit time and the replicas' mean fsync.
func writeInFlightMarkdown(b *strings.Builder, rows []row) {
	var publishes []row
	for _, r := range rows {
		if r.ReplicationMeanUs > 0 && r.MsgsPerS > 0 && (r.Workload == workloadPubSync || r.Workload == workloadPubAsync) {
			publishes = append(publishes, r)
		}
	}
	if len(publishes) == 0 {
		return
	}
	b.WriteString("Means, and how much of a publish's time in flight each is. A publish is in flight for the window divided by the throughput (Little's law; the window is 1 for pub_sync, the run's async window for pub_async, which the harness keeps full); the leader's proposal-to-commit is part of it, the rest is the client, the network, the leader's session and queue, and the answer. The replica fsync is one fsync, not all a publish waits on.\n\n")
	b.WriteString("| mode | workload | size | in flight µs | replication mean µs | ÷ in flight | replica fsync mean µs | ÷ in flight |\n|---|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range publishes {
		window := 1.0
		if r.Workload == workloadPubAsync {
			window = inflightMax
		}
		inFlight := window / r.MsgsPerS * 1e6
		fsync, fsyncShare := "–", "–"
		if r.ReplicaFsyncMeanUs > 0 {
			fsync, fsyncShare = formatNumber(r.ReplicaFsyncMeanUs), formatRatio(r.ReplicaFsyncMeanUs/inFlight)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Mode, r.Workload, formatSize(r.SizeBytes),
			formatNumber(inFlight), formatNumber(r.ReplicationMeanUs), formatRatio(r.ReplicationMeanUs/inFlight), fsync, fsyncShare)
	}
	b.WriteString("\n")
}
