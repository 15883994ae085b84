package main

import "syscall"

// childProcAttr makes the kernel kill the broker child if the harness dies
// without running its deferred cleanup (a crash in another goroutine, kill -9).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
