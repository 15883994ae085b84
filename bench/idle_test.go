package main

import (
	"strings"
	"testing"
	"time"
)

func TestIdleRowIsCPUPerSecondOfTheBrokers(t *testing.T) {
	c := benchCase{System: systemNereus, Mode: modeR3, Workload: workloadIdle}
	r := summarize(c, runResult{Elapsed: 2 * time.Second, CPU: &cpuUsage{Harness: time.Second, Brokers: 500 * time.Millisecond, Busiest: 300 * time.Millisecond}})
	if r.IdleCPUMsPerS != 250 || r.IdleBusiestCPUMsPerS != 150 {
		t.Fatalf("idle row %+v: want 250 ms/s for the brokers (the harness left out) and 150 for the busiest", r)
	}
	if r.MsgsPerS != 0 || r.BrokerCPUUsPerMsg != 0 {
		t.Fatalf("idle row %+v: an idle case has no message rate and no CPU per message", r)
	}
	if other := summarize(benchCase{System: systemNereus, Mode: modeR3, Workload: workloadPubSync}, runResult{Messages: 10, Elapsed: time.Second, CPU: &cpuUsage{Brokers: time.Second}}); other.IdleCPUMsPerS != 0 {
		t.Fatalf("a publish row has an idle CPU: %+v", other)
	}
	med := medianRow([]row{{IdleCPUMsPerS: 300}, {IdleCPUMsPerS: 100}, {IdleCPUMsPerS: 200}})
	if med.IdleCPUMsPerS != 200 {
		t.Fatalf("median of 100, 200 and 300 ms/s: %v", med.IdleCPUMsPerS)
	}
}

func TestIdleTableComparesWithJetStreamR3(t *testing.T) {
	var b strings.Builder
	writeIdleMarkdown(&b, []row{{System: systemNereus, Mode: modeR1, Workload: workloadPubSync, MsgsPerS: 9}})
	if b.Len() != 0 {
		t.Fatalf("an idle table without an idle row:\n%s", b.String())
	}
	writeIdleMarkdown(&b, []row{
		{System: systemNereus, Mode: modeR3, Workload: workloadIdle, IdleCPUMsPerS: 300, IdleBusiestCPUMsPerS: 120},
		{System: systemJetStream, Mode: modeR3, Workload: workloadIdle, IdleCPUMsPerS: 100, IdleBusiestCPUMsPerS: 40},
	})
	md := b.String()
	for _, want := range []string{"## Idle:", "| nereus | r3 | 20 | 300 | 120 | 3.00× |", "| jetstream | r3 | 20 | 100 | 40.0 | – |"} {
		if !strings.Contains(md, want) {
			t.Errorf("idle table lacks %q:\n%s", want, md)
		}
	}
}
