package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Lock creates name if needed and takes an exclusive, non-blocking flock
// on it. The kernel drops the lock when its file is closed or the
// process dies (kill -9 included), so a crash never leaves it behind.
// flock locks an open file, not a process: a second Lock of the same
// name in one process fails too.
func (osFS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, filePerm)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", name, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return &osLock{f: f}, nil
}

// osLock holds a flocked file; Close unlocks it once.
type osLock struct {
	f    *os.File
	once sync.Once
	err  error
}

func (l *osLock) Close() error {
	l.once.Do(func() { l.err = l.f.Close() })
	return l.err
}
