package main

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// childProcAttr makes the kernel kill the broker child if the harness dies
// without running its deferred cleanup (a crash in another goroutine, kill -9).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// pauseProcess stops process pid (SIGSTOP) until resumeProcess (SIGCONT).
func pauseProcess(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

func resumeProcess(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }

// flushDirtyPages asks the kernel to write back every dirty page (sync(2)),
// so that the writeback of one case's data does not land in the fsyncs of
// the next. It returns when sync does, or after timeout (sync then goes on
// in the background).
func flushDirtyPages(timeout time.Duration) {
	done := make(chan struct{})
	go func() { syscall.Sync(); close(done) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
}

// dataSync is fdatasync(2), as Nereus's log uses on Linux: file data and
// only the metadata needed to read it back.
func dataSync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}

// selfCPUTime is the user and system CPU time the harness process used.
func selfCPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// processCPUTime is the user and system CPU time process pid used so far,
// in clock ticks (10 ms).
func processCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStatCPU(string(b))
}
