package main

import (
	"fmt"
	"strings"
)

// The replicated path's targets (issue 16), each checked in every run
// against an anchor measured in the same run, with the floor's ratio to
// the same anchor beside it: the floor only moves a publish's data
// (floor.go), so when it misses a bound too, no system that keeps three
// fsynced copies on this machine can meet that target here.

// targetSpec is one target: Nereus r3's metric of a row, divided by the
// anchor's, must be at least Bound (at most, when AtMost).
type targetSpec struct {
	Workload  workload
	SizeBytes int
	Metric    metric
	// Anchor is "jetstream/MODE" (a three-replica JetStream mode) or
	// "nereus/r1-proc".
	Anchor string
	Bound  float64
	AtMost bool
}

var anchorR1Proc = systemNereus + "/" + modeR1Proc

var targetSpecs = []targetSpec{
	{Workload: workloadPubAsync, SizeBytes: 1024, Metric: metricMsgsPerS, Anchor: systemJetStream + "/" + modeR3, Bound: 1.5},
	{Workload: workloadPubSync, SizeBytes: 1024, Metric: metricP50, Anchor: systemJetStream + "/" + modeR3Always, Bound: 1, AtMost: true},
	{Workload: workloadPubSync, SizeBytes: 1024, Metric: metricP99, Anchor: systemJetStream + "/" + modeR3Always, Bound: 1, AtMost: true},
	{Workload: workloadConsume, SizeBytes: 1024, Metric: metricMsgsPerS, Anchor: systemJetStream + "/" + modeR3, Bound: 1.5},
	{Workload: workloadPubAsync, SizeBytes: 64 << 10, Metric: metricMsgsPerS, Anchor: anchorR1Proc, Bound: 0.5},
	{Workload: workloadFailover, SizeBytes: 1024, Metric: metricP50, Anchor: systemJetStream + "/" + modeR3, Bound: 1, AtMost: true},
	{Workload: workloadFailover, SizeBytes: 1024, Metric: metricMax, Anchor: systemJetStream + "/" + modeR3, Bound: 1, AtMost: true},
}

// target is one target as a run measured it (latest.json's "targets").
type target struct {
	Workload  workload `json:"workload"`
	SizeBytes int      `json:"size"`
	Metric    string   `json:"metric"`
	Anchor    string   `json:"anchor"`
	Nereus    float64  `json:"nereus_r3"`
	AnchorV   float64  `json:"anchor_value"`
	Ratio     float64  `json:"ratio"`
	Bound     float64  `json:"bound"`
	AtMost    bool     `json:"at_most"`
	Met       bool     `json:"met"`
	// Floor is the floor r3's ratio to the same anchor (0: the floor did
	// not run the row), and FloorMet whether that ratio meets the bound.
	Floor    float64 `json:"floor_r3_ratio,omitempty"`
	FloorMet bool    `json:"floor_r3_met,omitempty"`
	// Runs is the ratio of each run on its own, in run order (run k of
	// Nereus r3 against run k of the anchor): on a noisy machine a
	// verdict from the medians is read against them.
	Runs []float64 `json:"run_ratios,omitempty"`
}

// addRunRatios gives each target the ratio every run measured alone: runs
// holds each run's rows (the runs alternate: run 1 of every case, then
// run 2, ...).
func addRunRatios(targets []target, runs [][]row, modesR1, modesR3 []string) {
	for _, rows := range runs {
		for _, rt := range computeTargets(computeRatios(rows, modesR1, modesR3)) {
			for i := range targets {
				if t := &targets[i]; t.Workload == rt.Workload && t.SizeBytes == rt.SizeBytes && t.Metric == rt.Metric && t.Anchor == rt.Anchor {
					t.Runs = append(t.Runs, rt.Ratio)
				}
			}
		}
	}
}

// meets reports whether ratio satisfies the spec's bound.
func (s targetSpec) meets(ratio float64) bool {
	if s.AtMost {
		return ratio <= s.Bound
	}
	return ratio >= s.Bound
}

// anchorValue is the anchor's value in rr (0: not measured).
func (s targetSpec) anchorValue(rr ratioRow) float64 {
	if s.Anchor == anchorR1Proc {
		if rr.NereusProc == nil {
			return 0
		}
		return *rr.NereusProc
	}
	for _, v := range rr.R3Versus {
		if systemJetStream+"/"+v.Mode == s.Anchor {
			return v.JetStream
		}
	}
	return 0
}

// computeTargets evaluates every target whose Nereus r3 row and anchor
// this run measured, in targetSpecs' order.
func computeTargets(ratios []ratioRow) []target {
	var out []target
	for _, s := range targetSpecs {
		for _, rr := range ratios {
			if rr.Workload != s.Workload || rr.SizeBytes != s.SizeBytes || rr.Metric != s.Metric.Name || rr.NereusR3 == nil {
				continue
			}
			anchor := s.anchorValue(rr)
			r, ok := ratio(*rr.NereusR3, anchor)
			if !ok {
				continue
			}
			t := target{Workload: s.Workload, SizeBytes: s.SizeBytes, Metric: s.Metric.Name, Anchor: s.Anchor,
				Nereus: *rr.NereusR3, AnchorV: anchor, Ratio: r, Bound: s.Bound, AtMost: s.AtMost, Met: s.meets(r)}
			if rr.FloorR3 != nil {
				if f, ok := ratio(*rr.FloorR3, anchor); ok {
					t.Floor, t.FloorMet = f, s.meets(f)
				}
			}
			out = append(out, t)
		}
	}
	return out
}

// writeTargetsMarkdown writes the targets' table, when any was measured.
func writeTargetsMarkdown(b *strings.Builder, targets []target) {
	if len(targets) == 0 {
		return
	}
	b.WriteString("## Targets of the replicated path\n\n")
	b.WriteString("Nereus r3 against the anchor named, measured in this run. floor r3 is the floor (no broker: see \"Against the floor\") against the same anchor: when it misses the bound as well, no system that keeps three fsynced copies on this machine meets that target here.\n\n")
	b.WriteString("With more than one run a row, the values are medians, and \"each run\" has the ratio of every run alone (the machine is noisy: a verdict near its bound may hold in some runs and not in others).\n\n")
	b.WriteString("| workload | size | metric | nereus r3 | anchor | anchor's | nereus r3 ÷ anchor | each run | bound | met | floor r3 ÷ anchor | floor met |\n")
	b.WriteString("|---|---|---|---:|---|---:|---:|---|---|---|---:|---|\n")
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	for _, t := range targets {
		bound := fmt.Sprintf("≥ %.2g×", t.Bound)
		if t.AtMost {
			bound = fmt.Sprintf("≤ %.2g×", t.Bound)
		}
		floor, floorMet := "–", "–"
		if t.Floor > 0 {
			floor, floorMet = formatRatio(t.Floor), yes(t.FloorMet)
		}
		label := metricLabel(ratioRow{Workload: t.Workload, Metric: t.Metric})
		nereus, anchor := t.Nereus, t.AnchorV
		if t.Workload == workloadFailover { // seconds long: in ms, as the failover table
			label, nereus, anchor = strings.TrimSuffix(label, " µs")+" ms", nereus/1e3, anchor/1e3
		}
		each := "–"
		if len(t.Runs) > 1 {
			rs := make([]string, len(t.Runs))
			for i, r := range t.Runs {
				rs[i] = formatRatio(r)
			}
			each = strings.Join(rs, ", ")
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t.Workload, formatSize(t.SizeBytes), label,
			formatNumber(nereus), strings.Replace(t.Anchor, "/", " ", 1), formatNumber(anchor), formatRatio(t.Ratio), each, bound, yes(t.Met), floor, floorMet)
	}
	b.WriteString("\n")
}
