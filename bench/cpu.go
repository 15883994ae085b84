package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// clockTicksPerSecond is USER_HZ, the unit of utime and stime in
// /proc/PID/stat: 100 on Linux for every architecture Go supports.
const clockTicksPerSecond = 100

// processGroup is a system whose broker runs in child processes: the CPU
// they use during a case is measured (cpuUsage).
type processGroup interface {
	// pids returns the broker's process ids, as they are now.
	pids() []int
}

// cpuSnapshot is the CPU time used so far by the harness process and by
// each broker process of a case's system.
type cpuSnapshot struct {
	harness time.Duration
	brokers map[int]time.Duration // by pid
}

// cpuUsage is the CPU a case used, from one snapshot to the next.
type cpuUsage struct {
	// Harness is the harness process: the load generator, and the broker
	// too when it runs in process.
	Harness time.Duration
	// Brokers is the sum over the broker's child processes, and Busiest
	// the most of any one of them (in a cluster, about the leader's).
	Brokers time.Duration
	Busiest time.Duration
}

// takeCPUSnapshot reads the CPU times of the harness and of sys's processes
// when sys runs in child processes; ok is false where they cannot be read.
func takeCPUSnapshot(sys system) (snap cpuSnapshot, ok bool) {
	var err error
	if snap.harness, err = selfCPUTime(); err != nil {
		return snap, false
	}
	if pg, isGroup := sys.(processGroup); isGroup {
		snap.brokers = map[int]time.Duration{}
		for _, pid := range pg.pids() {
			if snap.brokers[pid], err = processCPUTime(pid); err != nil {
				return snap, false
			}
		}
	}
	return snap, true
}

// since returns the CPU used from before to s. A broker process that is not
// in both snapshots (killed or restarted meanwhile) is left out.
func (s cpuSnapshot) since(before cpuSnapshot) cpuUsage {
	u := cpuUsage{Harness: s.harness - before.harness}
	for pid, t := range s.brokers {
		if t0, ok := before.brokers[pid]; ok {
			d := t - t0
			u.Brokers += d
			u.Busiest = max(u.Busiest, d)
		}
	}
	return u
}

// measureCPU starts measuring the CPU the harness and sys's processes use,
// and returns the function that ends the measurement (nil where it cannot
// be taken).
func measureCPU(sys system) func() *cpuUsage {
	before, ok := takeCPUSnapshot(sys)
	return func() *cpuUsage {
		if !ok {
			return nil
		}
		after, ok := takeCPUSnapshot(sys)
		if !ok {
			return nil
		}
		u := after.since(before)
		return &u
	}
}

// parseProcStatCPU returns utime + stime from the text of /proc/PID/stat.
// The command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so the fields are counted after its last ')'.
func parseProcStatCPU(stat string) (time.Duration, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	// After the name: field 3 (state) is fields[0], utime (14) fields[11],
	// stime (15) fields[12].
	fields := strings.Fields(stat[end+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the command name", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

// pids implements processGroup for a Nereus cluster or child process; an
// in-process node has none.
func (s *nereusSystem) pids() []int {
	var out []int
	for _, p := range s.procs {
		out = append(out, p.pid())
	}
	return out
}

// pids implements processGroup for a JetStream cluster; an in-process
// server has none.
func (s *jetStreamSystem) pids() []int {
	if s.cluster == nil {
		return nil
	}
	var out []int
	for _, p := range s.cluster.procs {
		out = append(out, p.pid())
	}
	return out
}

// pid is the process id of the child's current run.
func (p *childProc) pid() int { return p.cmd.Process.Pid }
