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
	// Open opens an existing file read-only.
	Open(name string) (File, error)
	// Remove removes a file.
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
}

// File is an open file. Writes always append at the current end of the
// file. A File may be used by several goroutines at once: ReadAt calls may
// run concurrently with each other and with one writer.
type File interface {
	// Write appends p at the end of the file.
	io.Writer
	// ReadAt reads len(p) bytes at off; it returns io.EOF when fewer bytes
	// are available.
	io.ReaderAt
	// Sync makes the file content durable.
	Sync() error
	// Truncate changes the size of the file; subsequent writes append at
	// the new end.
	Truncate(size int64) error
	// Size returns the current size of the file in bytes.
	Size() (int64, error)
	// Close releases the file.
	Close() error
}

// ErrClosed is returned by operations on a closed File, and by every File
// of a MemFS opened before a Crash.
var ErrClosed = errors.New("vfs: file closed")

// ErrReadOnly is returned by Write and Truncate on a File opened with Open.
var ErrReadOnly = errors.New("vfs: file opened read-only")

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
	default:
		return "Op(" + strconv.Itoa(int(op)) + ")"
	}
}
