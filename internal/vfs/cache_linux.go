package vfs

import (
	"os"
	"syscall"
)

// DropCache is posix_fadvise(POSIX_FADV_DONTNEED): clean pages of the
// range leave the page cache; dirty ones are queued for write-back and
// stay. Through the file's SyscallConn, so that a concurrent Close cannot
// hand the descriptor's number to another file meanwhile.
func (f osFile) DropCache(off, n int64) error {
	if off < 0 || n < 0 {
		return &os.PathError{Op: "fadvise", Path: f.Name(), Err: syscall.EINVAL}
	}
	if n == 0 {
		return nil // to fadvise a length of 0 means "to the end of the file"
	}
	rc, err := f.File.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall6(syscall.SYS_FADVISE64, fd, uintptr(off), uintptr(n), fadvDontNeed, 0, 0)
	}); err != nil {
		return &os.PathError{Op: "fadvise", Path: f.Name(), Err: err}
	}
	if errno != 0 {
		return &os.PathError{Op: "fadvise", Path: f.Name(), Err: errno}
	}
	return nil
}

const fadvDontNeed = 4 // POSIX_FADV_DONTNEED (include/uapi/linux/fadvise.h)
