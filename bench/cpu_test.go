package main

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatCPU(t *testing.T) {
	// Fields 14 and 15 (utime 250, stime 50 ticks) follow a command name
	// with spaces and parentheses of its own.
	stat := "4242 (nats (x) server) S 1 4242 4242 0 -1 4194560 1292 0 0 0 250 50 0 0 20 0 9 0 1000 1000000 2000 18446744073709551615\n"
	got, err := parseProcStatCPU(stat)
	if err != nil || got != 3*time.Second {
		t.Fatalf("parseProcStatCPU = %v, %v; want 3s", got, err)
	}
	for _, bad := range []string{"", "4242 nats S 1", "4242 (n) S 1 2 3", "4242 (n) S 1 4242 4242 0 -1 4194560 1292 0 0 0 x 50 0"} {
		if _, err := parseProcStatCPU(bad); err == nil {
			t.Errorf("parseProcStatCPU(%q) accepted", bad)
		}
	}
}

func TestCPUSinceLeavesOutProcessesNotInBothSnapshots(t *testing.T) {
	before := cpuSnapshot{harness: time.Second, brokers: map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 0}}
	after := cpuSnapshot{harness: 3 * time.Second, brokers: map[int]time.Duration{1: 4 * time.Second, 2: 3 * time.Second, 4: time.Minute}}
	got := after.since(before)
	want := cpuUsage{Harness: 2 * time.Second, Brokers: 4 * time.Second, Busiest: 3 * time.Second}
	if got != want {
		t.Fatalf("since = %+v, want %+v", got, want)
	}
}

func TestSummarizeCPUPerMessage(t *testing.T) {
	c := benchCase{System: systemNereus, Mode: modeR3, Workload: workloadPubAsync, SizeBytes: 1024}
	r := summarize(c, runResult{Messages: 1000, Elapsed: time.Second,
		CPU: &cpuUsage{Harness: 5 * time.Millisecond, Brokers: 30 * time.Millisecond, Busiest: 20 * time.Millisecond}})
	if r.HarnessCPUUsPerMsg != 5 || r.BrokerCPUUsPerMsg != 30 || r.BusiestCPUUsPerMsg != 20 {
		t.Fatalf("CPU per message: %+v", r)
	}
	if none := summarize(c, runResult{Messages: 1000, Elapsed: time.Second}); none.HarnessCPUUsPerMsg != 0 {
		t.Fatalf("CPU reported where none was measured: %+v", none)
	}
}

func TestCPUOfThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU times are read on Linux only")
	}
	self, err := selfCPUTime()
	if err != nil || self <= 0 {
		t.Fatalf("selfCPUTime = %v, %v", self, err)
	}
	if _, err := processCPUTime(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, err := processCPUTime(-1); err == nil {
		t.Fatal("read the CPU time of pid -1")
	}
}

func TestMarkdownCPUTable(t *testing.T) {
	rep := sampleReport()
	if strings.Contains(rep.markdown(), "## CPU per message") {
		t.Fatal("a CPU table without CPU measurements")
	}
	rep.Rows[2].HarnessCPUUsPerMsg, rep.Rows[2].BrokerCPUUsPerMsg, rep.Rows[2].BusiestCPUUsPerMsg = 3, 30, 15.5
	rep.Rows[2].MsgsPerS = 50000 // 33 µs a message: 1.65 cores busy
	// e2e's CPU covers its whole fixed-rate phase: no cores.
	rep.Rows[5].HarnessCPUUsPerMsg = 200
	md := rep.markdown()
	if !strings.Contains(md, "| nereus | r1 | e2e | 1 KiB | 200 | – | – | 200 | – |\n") {
		t.Errorf("CPU table gives cores for a row whose CPU spans more than its rate:\n%s", md)
	}
	if !strings.Contains(md, "| nereus | r3 | pub_async | 1 KiB | 3.00 | 30.0 | 15.5 | 33.0 | 1.65 |\n") {
		t.Errorf("CPU table:\n%s", md)
	}
}
