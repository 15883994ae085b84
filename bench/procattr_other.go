//go:build !linux

package main

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// childProcAttr is empty where the kernel cannot tie the child's life to ours;
// the harness still stops the child on every normal, panic and signal exit.
func childProcAttr() *syscall.SysProcAttr { return nil }

// pauseProcess and resumeProcess do nothing here: the other systems' idle
// brokers go on running during a case.
func pauseProcess(int) error  { return nil }
func resumeProcess(int) error { return nil }

// flushDirtyPages is a no-op where sync(2) is not available to us.
func flushDirtyPages(time.Duration) {}

// dataSync is fsync where fdatasync is not available.
func dataSync(f *os.File) error { return f.Sync() }

var errNoCPUTimes = errors.New("process CPU times are read on Linux only")

// selfCPUTime is not measured outside Linux.
func selfCPUTime() (time.Duration, error) { return 0, errNoCPUTimes }

// processCPUTime is not measured outside Linux.
func processCPUTime(int) (time.Duration, error) { return 0, errNoCPUTimes }
