package main

import (
	"fmt"
	"github.com/nereus-broker/nereus/internal/node"
	"strconv"
	"strings"
)

// schedMeasure is one number of the scheduled-delivery section: a sched
// row's measurement and, where the same node measured one in the same
// run, its anchor and the ratio measurement ÷ anchor.
type schedMeasure struct {
	System      string   `json:"system"`
	Mode        string   `json:"mode"`
	Workload    workload `json:"workload"`
	Measurement string   `json:"measurement"`
	Unit        string   `json:"unit"`
	// Count is how many schedules the run measured (taken, fired,
	// received or pending).
	Count int64   `json:"count"`
	Value float64 `json:"value"`
	// Anchor names the anchor row ("" when there is none), AnchorValue
	// is its value in Unit and Ratio = Value ÷ AnchorValue (0 when the
	// anchor did not run).
	Anchor      string  `json:"anchor,omitempty"`
	AnchorValue float64 `json:"anchor_value,omitempty"`
	Ratio       float64 `json:"ratio,omitempty"`
}

// computeSchedSummary returns the scheduled-delivery measurements of
// rows, in row order (nil when no sched row ran). The anchors: the same
// system's pub_async 1 KiB msgs/s for the intake and fire rates, its e2e
// 1 KiB p50 and p99 for the lateness.
func computeSchedSummary(rows []row) []schedMeasure {
	type key struct {
		system, mode string
		w            workload
	}
	byKey := map[key]row{}
	for _, r := range rows {
		if r.SizeBytes == 1024 || r.Workload.isSched() {
			byKey[key{r.System, r.Mode, r.Workload}] = r
		}
	}
	var out []schedMeasure
	for _, r := range rows {
		if !r.Workload.isSched() {
			continue
		}
		m := schedMeasure{System: r.System, Mode: r.Mode, Workload: r.Workload, Count: r.Messages}
		anchor := func(w workload, name string, get func(row) float64) {
			m.Anchor = name
			if a, ok := byKey[key{r.System, r.Mode, w}]; ok {
				m.AnchorValue = get(a)
				m.Ratio, _ = ratio(m.Value, m.AnchorValue)
			}
		}
		msOf := func(us float64) float64 { return us / 1e3 }
		switch r.Workload {
		case workloadSchedIntake:
			m.Measurement, m.Unit, m.Value = "intake: SCHEDULE answered", "schedules/s", r.MsgsPerS
			anchor(workloadPubAsync, "pub_async 1 KiB msgs/s", func(a row) float64 { return a.MsgsPerS })
			out = append(out, m)
		case workloadSchedFire:
			m.Measurement, m.Unit, m.Value = "burst due at one instant: fired", "msgs/s", r.MsgsPerS
			anchor(workloadPubAsync, "pub_async 1 KiB msgs/s", func(a row) float64 { return a.MsgsPerS })
			out = append(out, m)
		case workloadSchedLateness:
			p50, p99 := m, m
			p50.Measurement, p50.Unit, p50.Value = "lateness p50 (receipt − deliver_at)", "ms", msOf(r.P50Us)
			m = p50
			anchor(workloadE2E, "e2e 1 KiB p50 ms", func(a row) float64 { return msOf(a.P50Us) })
			out = append(out, m)
			m = p99
			m.Measurement, m.Unit, m.Value = "lateness p99 (receipt − deliver_at)", "ms", msOf(r.P99Us)
			anchor(workloadE2E, "e2e 1 KiB p99 ms", func(a row) float64 { return msOf(a.P99Us) })
			out = append(out, m)
		case workloadSchedPending:
			heap, restart := m, m
			heap.Measurement, heap.Unit, heap.Value = "heap in use per pending schedule (after GC)", "bytes", r.HeapBytesPerPending
			restart.Measurement, restart.Unit, restart.Value = "restart until every shard ACTIVE_FOR_COMMANDS", "ms", r.Seconds*1e3
			out = append(out, heap, restart)
		}
	}
	return out
}

// writeSchedMarkdown writes the scheduled-delivery section of the report.
func writeSchedMarkdown(b *strings.Builder, ms []schedMeasure, cfg runConfig) {
	if len(ms) == 0 {
		return
	}
	b.WriteString("## Scheduled delivery\n\n")
	fmt.Fprintf(b, "Nereus only: r1 is the node in the harness process, r3 the three-process cluster (the SDK routes each SCHEDULE to its shard's leader); 1 KiB messages, one-partition destinations. "+
		"**Intake**: %d goroutines on one connection each schedule (due in 24 h) and wait for the answer, for the timed phase; the row's p50/p99 are per SCHEDULE; its anchor, pub_async, keeps 256 publishes in flight on one producer. "+
		"**Fire**: %d schedules all due at one instant T, taken (256 in flight) while the destination's lane is paused — a large fill outlasts \"a bit in the future\" — then, once T has passed, the lane is resumed and the time runs from the resume until the destination's commit point shows every message (polled every %.0f ms; more would be an error). "+
		"**Lateness**: %d schedules/s for %.0f s, each due %.0f–%.0f s after it is sent, consumed in this process; lateness = receipt time − deliver_at, an upper bound on the fire's lateness (it includes the publish, the delivery and the SDK). "+
		"**Pending** (r1 only, a node of its own in the harness process): the heap in use after GC before and after %d schedules due in 24 h, ÷ their count (it includes everything the node keeps for them: the shard's state, its log's index, the dedup entry of the SDK's producer identity), on a node whose lanes keep %s pending schedules each in RAM per shard and spill the rest to disk; then the node is closed and reopened, and the restart time runs from the start of the reopening until SchedulerStatus shows every shard %s with every schedule pending. "+
		"The anchors are the same system's rows in this run (– when they did not run).\n\n",
		cfg.SchedIntakeClients, cfg.SchedFireCount, float64(schedPollInterval.Milliseconds()), cfg.SchedLatenessRate, cfg.SchedLatenessSeconds,
		cfg.SchedLatenessMinS, cfg.SchedLatenessMinS+cfg.SchedLatenessSpreadS, cfg.SchedPendingCount, schedWindowText(cfg.SchedPendingWindow), schedActive)
	b.WriteString("| system | mode | measurement | schedules | value | unit | anchor | anchor value | ÷ anchor |\n|---|---|---|---:|---:|---|---|---:|---:|\n")
	for _, m := range ms {
		anchor := m.Anchor
		if anchor == "" {
			anchor = "–"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", m.System, m.Mode, m.Measurement, m.Count,
			formatNumber(m.Value), m.Unit, anchor, formatNumber(m.AnchorValue), formatSmallRatio(m.Ratio))
	}
	b.WriteString("\n")
}

// formatSmallRatio is formatRatio with two significant digits below 0.1
// (a fire rate is a few thousandths of a publish rate).
func formatSmallRatio(v float64) string {
	if v > 0 && v < 0.1 {
		return strconv.FormatFloat(v, 'g', 2, 64) + "×"
	}
	return formatRatio(v)
}

// schedWindowText says what a lane keeps in RAM under a window.
func schedWindowText(window int) string {
	if window == 0 {
		window = node.SchedWindowDefault
	}
	return fmt.Sprintf("up to %d (twice the window of %d, the default being %d)", 2*window, window, node.SchedWindowDefault)
}
