//go:build !linux

package main

import "syscall"

// childProcAttr is empty where the kernel cannot tie the child's life to ours;
// the harness still stops the child on every normal, panic and signal exit.
func childProcAttr() *syscall.SysProcAttr { return nil }
