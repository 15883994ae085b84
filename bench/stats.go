package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// percentileMicros returns the p-th percentile (nearest rank, 0 < p <= 100)
// of samples in microseconds, sorting samples in place. It is 0 for no
// samples.
func percentileMicros(samples []time.Duration, p float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	if !slices.IsSorted(samples) {
		slices.Sort(samples)
	}
	rank := int(math.Ceil(float64(len(samples))*p/100)) - 1
	rank = min(max(rank, 0), len(samples)-1)
	return float64(samples[rank].Nanoseconds()) / 1e3
}

// formatSamplesMs prints latency samples in milliseconds, in their order:
// "812, 640, 1003".
func formatSamplesMs(samples []time.Duration) string {
	parts := make([]string, len(samples))
	for i, d := range samples {
		parts[i] = fmt.Sprintf("%.0f", float64(d.Microseconds())/1e3)
	}
	return strings.Join(parts, ", ")
}

// median returns the median of values (the mean of the two middle values
// for an even count) without modifying values; 0 for none.
func median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	mid := len(sorted) / 2
	if len(sorted)%2 == 1 {
		return sorted[mid]
	}
	return (sorted[mid-1] + sorted[mid]) / 2
}

// ratio returns nereus/jetstream, and false when either is not measured
// (zero or negative) so that no ratio is printed for it.
func ratio(nereus, jetstream float64) (float64, bool) {
	if nereus <= 0 || jetstream <= 0 {
		return 0, false
	}
	return nereus / jetstream, true
}

// row is one line of latest.json: the median of a case's runs.
type row struct {
	System    string   `json:"system"`
	Mode      string   `json:"mode"`
	Workload  workload `json:"workload"`
	SizeBytes int      `json:"size"`
	MsgsPerS  float64  `json:"msgs_per_s"`
	MBPerS    float64  `json:"mb_per_s"`
	P50Us     float64  `json:"p50_us"`
	P99Us     float64  `json:"p99_us"`
	P999Us    float64  `json:"p999_us"`
	// MaxUs is the largest latency sample (the failover table shows it).
	MaxUs float64 `json:"max_us,omitempty"`
	// CPU time per message during the case, in µs: of the harness process
	// (the load generator, and the broker when it runs in process), of the
	// broker's child processes together, and of the busiest one of them.
	// 0 where not measured.
	HarnessCPUUsPerMsg float64 `json:"harness_cpu_us_per_msg,omitempty"`
	BrokerCPUUsPerMsg  float64 `json:"broker_cpu_us_per_msg,omitempty"`
	BusiestCPUUsPerMsg float64 `json:"busiest_process_cpu_us_per_msg,omitempty"`
	// ReplicationP50Us and ReplicaFsyncP50Us (and their P99s): for a
	// replicated Nereus publish case, the p50 (p99) of the leader's
	// proposal-to-commit time and of the replicas' log fsyncs over the
	// case, from the brokers' metrics (nereus_replication_seconds,
	// nereus_fsync_seconds{kind="replica"}); the Means are their means.
	// ReplicaFsyncsPerMsg counts those fsyncs, every replica's, per
	// message. 0 where not measured.
	ReplicationP50Us    float64 `json:"replication_p50_us,omitempty"`
	ReplicaFsyncP50Us   float64 `json:"replica_fsync_p50_us,omitempty"`
	ReplicationP99Us    float64 `json:"replication_p99_us,omitempty"`
	ReplicaFsyncP99Us   float64 `json:"replica_fsync_p99_us,omitempty"`
	ReplicationMeanUs   float64 `json:"replication_mean_us,omitempty"`
	ReplicaFsyncMeanUs  float64 `json:"replica_fsync_mean_us,omitempty"`
	ReplicaFsyncsPerMsg float64 `json:"replica_fsyncs_per_msg,omitempty"`
	// HeapBytesPerPending is the heap in use (after GC) per pending
	// schedule (sched_pending only).
	HeapBytesPerPending float64 `json:"heap_bytes_per_pending,omitempty"`
	// IdleCPUMsPerS and IdleBusiestCPUMsPerS are the idle row's: the CPU
	// the broker processes used together, and the busiest one of them,
	// in ms per second.
	IdleCPUMsPerS        float64 `json:"idle_cpu_ms_per_s,omitempty"`
	IdleBusiestCPUMsPerS float64 `json:"idle_busiest_process_cpu_ms_per_s,omitempty"`
	// Messages is the median count of messages measured in one run.
	Messages int64 `json:"messages"`
	// Seconds is the median length of the timed part of one run.
	Seconds float64 `json:"seconds"`
	// Runs is how many runs the medians are taken over.
	Runs int `json:"runs"`
}

// runResult is what one run of a case measured.
type runResult struct {
	Messages int64
	Elapsed  time.Duration
	// Latencies are per-message samples; nil for throughput workloads.
	Latencies []time.Duration
	// HeapBytesPerPending: sched_pending's heap per pending schedule.
	HeapBytesPerPending float64
	// CPU is what the harness and the broker's processes used during the
	// case; nil where not measured.
	CPU *cpuUsage
	// Replication is what the case's publishes waited for replication;
	// nil where not measured.
	Replication *replicationUsage
}

// summarize turns one run into a row (Runs = 1). Latency percentiles are
// reported only when the run took latency samples.
func summarize(c benchCase, r runResult) row {
	out := row{System: c.System, Mode: c.Mode, Workload: c.Workload, SizeBytes: c.SizeBytes,
		Messages: r.Messages, Seconds: r.Elapsed.Seconds(), HeapBytesPerPending: r.HeapBytesPerPending, Runs: 1}
	// A restart's time is no message rate (sched_pending).
	if s := r.Elapsed.Seconds(); s > 0 && c.Workload != workloadSchedPending {
		out.MsgsPerS = float64(r.Messages) / s
		out.MBPerS = out.MsgsPerS * float64(c.SizeBytes) / 1e6
	}
	if len(r.Latencies) > 0 {
		out.P50Us = percentileMicros(r.Latencies, 50)
		out.P99Us = percentileMicros(r.Latencies, 99)
		out.P999Us = percentileMicros(r.Latencies, 99.9)
		out.MaxUs = percentileMicros(r.Latencies, 100)
	}
	if r.CPU != nil && r.Messages > 0 {
		perMsg := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(r.Messages) }
		out.HarnessCPUUsPerMsg = perMsg(r.CPU.Harness)
		out.BrokerCPUUsPerMsg = perMsg(r.CPU.Brokers)
		out.BusiestCPUUsPerMsg = perMsg(r.CPU.Busiest)
	}
	if r.CPU != nil && c.Workload == workloadIdle {
		out.IdleCPUMsPerS = msPerS(r.CPU.Brokers, r.Elapsed)
		out.IdleBusiestCPUMsPerS = msPerS(r.CPU.Busiest, r.Elapsed)
	}
	if u := r.Replication; u != nil && r.Messages > 0 {
		out.ReplicationP50Us = float64(u.ReplicationP50.Nanoseconds()) / 1e3
		out.ReplicaFsyncP50Us = float64(u.FsyncP50.Nanoseconds()) / 1e3
		out.ReplicationP99Us = float64(u.ReplicationP99.Nanoseconds()) / 1e3
		out.ReplicaFsyncP99Us = float64(u.FsyncP99.Nanoseconds()) / 1e3
		out.ReplicationMeanUs = float64(u.ReplicationMean.Nanoseconds()) / 1e3
		out.ReplicaFsyncMeanUs = float64(u.FsyncMean.Nanoseconds()) / 1e3
		out.ReplicaFsyncsPerMsg = u.Fsyncs / float64(r.Messages)
	}
	return out
}

// medianRow combines the runs of one case, taking the median of each
// metric on its own. runs must be non-empty and all of the same case.
func medianRow(runs []row) row {
	out := runs[0]
	out.Runs = len(runs)
	pick := func(get func(row) float64) float64 {
		values := make([]float64, len(runs))
		for i, r := range runs {
			values[i] = get(r)
		}
		return median(values)
	}
	out.MsgsPerS = pick(func(r row) float64 { return r.MsgsPerS })
	out.MBPerS = pick(func(r row) float64 { return r.MBPerS })
	out.P50Us = pick(func(r row) float64 { return r.P50Us })
	out.P99Us = pick(func(r row) float64 { return r.P99Us })
	out.P999Us = pick(func(r row) float64 { return r.P999Us })
	out.MaxUs = pick(func(r row) float64 { return r.MaxUs })
	out.HarnessCPUUsPerMsg = pick(func(r row) float64 { return r.HarnessCPUUsPerMsg })
	out.BrokerCPUUsPerMsg = pick(func(r row) float64 { return r.BrokerCPUUsPerMsg })
	out.BusiestCPUUsPerMsg = pick(func(r row) float64 { return r.BusiestCPUUsPerMsg })
	out.ReplicationP50Us = pick(func(r row) float64 { return r.ReplicationP50Us })
	out.ReplicaFsyncP50Us = pick(func(r row) float64 { return r.ReplicaFsyncP50Us })
	out.ReplicationP99Us = pick(func(r row) float64 { return r.ReplicationP99Us })
	out.ReplicaFsyncP99Us = pick(func(r row) float64 { return r.ReplicaFsyncP99Us })
	out.ReplicationMeanUs = pick(func(r row) float64 { return r.ReplicationMeanUs })
	out.ReplicaFsyncMeanUs = pick(func(r row) float64 { return r.ReplicaFsyncMeanUs })
	out.ReplicaFsyncsPerMsg = pick(func(r row) float64 { return r.ReplicaFsyncsPerMsg })
	out.HeapBytesPerPending = pick(func(r row) float64 { return r.HeapBytesPerPending })
	out.IdleCPUMsPerS = pick(func(r row) float64 { return r.IdleCPUMsPerS })
	out.IdleBusiestCPUMsPerS = pick(func(r row) float64 { return r.IdleBusiestCPUMsPerS })
	out.Messages = int64(pick(func(r row) float64 { return float64(r.Messages) }))
	out.Seconds = pick(func(r row) float64 { return r.Seconds })
	return out
}
