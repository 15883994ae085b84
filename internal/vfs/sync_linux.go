package vfs

import (
	"os"
	"syscall"
)

// Sync makes the file's data durable with fdatasync: it flushes the data
// and the metadata needed to read it back (the size of an appended file),
// but not timestamps, which fsync would also journal. Measured on the
// project's machine: a 4 KiB append + fdatasync 281 µs, + fsync 320 µs.
//
// A file of a ParkedSync file system runs it through the process's
// io_uring when there is one (uring_linux.go); otherwise, and when the
// ring takes no more, Sync calls fdatasync itself.
func (f osFile) Sync() error {
	fd := int(f.Fd())
	if !f.parkedSync {
		return fdatasync(f, fd)
	}
	if r := processRing(); r != nil {
		if ok, err := r.fdatasync(fd); ok {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
	return fdatasync(f, fd)
}

func fdatasync(f osFile, fd int) error {
	for {
		err := syscall.Fdatasync(fd)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
		}
		return nil
	}
}
