// Package vfs is the file-system interface every disk access in Nereus goes
// through. OS returns the real implementation; NewMem returns a crashable,
// fault-injecting in-memory implementation for tests and the simulator.
//
// Names are slash- or OS-separated paths; MemFS cleans them with
// path/filepath. Implementations report a missing file with an error that
// matches errors.Is(err, fs.ErrNotExist).
package vfs

import (
	"errors"
	"io"
	"strconv"
)

// FS is a minimal file system. Implementations must be safe for concurrent
// use by multiple goroutines.
type FS interface {
	// Create creates or truncates name and opens it read-write; writes
	// append at the end of the file.
	Create(name string) (File, error)
	// OpenAppend opens name for reading and appending, creating it if it
	// does not exist (O_RDWR|O_CREATE|O_APPEND).
	OpenAppend(name string) (File, error)
	// OpenRW opens name for reading and positional writing (WriteAt,
	// Allocate), creating it empty if it does not exist (O_RDWR|O_CREATE).
	// Write, which appends, fails on it with ErrOpenMode.
	OpenRW(name string) (File, error)
	// Open opens an existing file read-only.
	Open(name string) (File, error)
	// Remove removes a file, or an empty directory (a directory with
	// entries is an error, as os.Remove's).
	Remove(name string) error
	// Rename atomically renames oldname to newname, replacing newname.
	Rename(oldname, newname string) error
	// MkdirAll creates dir and any missing parents.
	MkdirAll(dir string) error
	// List returns the sorted base names of the entries of dir.
	List(dir string) ([]string, error)
	// Stat returns the size of the file in bytes.
	Stat(name string) (size int64, err error)
	// SyncDir makes creates, renames and removes of entries in dir durable.
	SyncDir(dir string) error
	// Lock takes the exclusive lock name (the operating system's creates
	// the file and flocks it) and holds it until the returned Closer is
	// closed or the process ends; while it is held, another Lock of name
	// fails with ErrLocked. It keeps two processes off one data directory.
	Lock(name string) (io.Closer, error)
}

// ErrLocked is returned by Lock when another holder has the lock.
var ErrLocked = errors.New("vfs: lock held by another holder")

// File is an open file. A file opened with Create or OpenAppend is written
// with Write, which always appends at the current end of the file; a file
// opened with OpenRW is written with WriteAt and Allocate. A File may be
// used by several goroutines at once: ReadAt calls may run concurrently
// with each other and with one writer.
type File interface {
	// Write appends p at the end of the file (Create and OpenAppend only).
	io.Writer
	// WriteAt writes p at offset off, growing the file if it ends before
	// off+len(p) (OpenRW only).
	io.WriterAt
	// ReadAt reads len(p) bytes at off; it returns io.EOF when fewer bytes
	// are available.
	io.ReaderAt
	// Sync makes the file content durable.
	Sync() error
	// Truncate changes the size of the file; subsequent writes append at
	// the new end.
	Truncate(size int64) error
	// Allocate grows the file to size bytes (it never shrinks it): the new
	// bytes read as zeroes and are written to the device, not left as a
	// hole or an unwritten extent, so a later WriteAt inside them followed
	// by Sync need not change the file's size or block map, which makes
	// that Sync cheaper. Like a write, the growth is durable only after
	// Sync (OpenRW only).
	Allocate(size int64) error
	// DropCache tells the operating system that [off, off+n) will not be
	// read again soon, so that its page-cache memory can be reused (a
	// log written faster than it is read then writes into recycled pages
	// instead of taking fresh ones). It is a hint: it changes no content
	// and an error loses nothing. It is meant for durable bytes; on
	// unsynced ones it would start their write-back early.
	DropCache(off, n int64) error
	// Size returns the current size of the file in bytes.
	Size() (int64, error)
	// Close releases the file.
	Close() error
}

// ErrClosed is returned by operations on a closed File, and by every File
// of a MemFS opened before a Crash.
var ErrClosed = errors.New("vfs: file closed")

// ErrReadOnly is returned by Write, WriteAt, Allocate and Truncate on a
// File opened with Open.
var ErrReadOnly = errors.New("vfs: file opened read-only")

// ErrOpenMode is returned by Write on a File opened with OpenRW, and by
// WriteAt and Allocate on a File opened with Create or OpenAppend.
var ErrOpenMode = errors.New("vfs: operation not allowed by the file's open mode")

// Op names a file-system operation for fault injection.
type Op uint8

// The operations an Injector can fail.
const (
	OpWrite Op = iota + 1
	OpSync
	OpSyncDir
	OpCreate
	OpRename
	OpRemove
	OpRead
	OpTruncate
	OpOpen
	OpMkdirAll
	OpList
	OpStat
	OpAllocate
)

// String returns the operation name, e.g. "Write".
func (op Op) String() string {
	switch op {
	case OpWrite:
		return "Write"
	case OpSync:
		return "Sync"
	case OpSyncDir:
		return "SyncDir"
	case OpCreate:
		return "Create"
	case OpRename:
		return "Rename"
	case OpRemove:
		return "Remove"
	case OpRead:
		return "Read"
	case OpTruncate:
		return "Truncate"
	case OpOpen:
		return "Open"
	case OpMkdirAll:
		return "MkdirAll"
	case OpList:
		return "List"
	case OpStat:
		return "Stat"
	case OpAllocate:
		return "Allocate"
	default:
		return "Op(" + strconv.Itoa(int(op)) + ")"
	}
}
