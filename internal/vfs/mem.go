package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
)

// memFileBytesMax bounds WriteAt offsets and Allocate sizes, far above any
// file a test holds in memory, so that int conversions cannot overflow.
const memFileBytesMax = 1 << 40

// Injector decides whether an operation fails. A non-nil return fails the
// operation with that error and the operation is not performed. It is
// called with the MemFS lock held and must not call back into the MemFS.
type Injector func(op Op, name string) error

// MemFS is an in-memory FS with a crash model, for tests and the simulator.
// It is safe for concurrent use and fully deterministic: the only source of
// randomness is the *rand.Rand passed to Crash.
//
// Crash model:
//   - Every file has its current content and its durable content (the
//     content as of its last successful Sync).
//   - Create, Rename and Remove change the current namespace at once; they
//     become durable only when SyncDir is called on the parent directory.
//   - Directories made by MkdirAll are durable at once (a simplification:
//     directories are never lost by a crash), and so is the removal of an
//     empty one, with the removals of the files it held.
//   - Crash reverts the namespace to the durable namespace and each file to
//     its durable content plus an rng-chosen prefix of the bytes written
//     since its last Sync (a torn write). The bytes written are taken as
//     one range, from the lowest to the highest offset written (Write,
//     WriteAt, or a Truncate that grows the file), and the kept prefix is
//     applied over the durable content; the file's size after the crash is
//     its durable size, or the end of the kept prefix if that is larger.
//     For appends this keeps the durable content plus a prefix of the
//     appended tail. Growth by Allocate is not a write: unsynced, it is
//     lost. If the file was truncated below its durable size since its
//     last Sync, it reverts to exactly its durable content. Every File
//     opened before the crash returns ErrClosed.
type MemFS struct {
	mu sync.Mutex
	// files is the current namespace: cleaned path to node.
	files map[string]*memNode
	// durableFiles is the namespace as of the last SyncDir of each directory.
	durableFiles map[string]*memNode
	// dirs holds every directory (always durable).
	dirs map[string]bool
	// generation increments on every crash; handles from an older
	// generation are invalid.
	generation uint64
	injector   Injector
	// locks holds the names Lock holds. A lock is no file (it changes no
	// listing and draws nothing from an injector); a crash, which ends
	// the process that held them, frees them all.
	locks map[string]*memLock
}

// memNode is one file's content. Fields are guarded by MemFS.mu.
type memNode struct {
	data []byte
	// durableLen is the durable size while durableCopy is nil: the durable
	// content is then data[:durableLen] with undo applied (appends never
	// modify those bytes).
	durableLen int
	// durableCopy holds the durable content once data was truncated below
	// durableLen since the last Sync; a crash then reverts to it exactly.
	durableCopy []byte
	hasCopy     bool
	// undo holds, oldest first, the durable bytes that WriteAt overwrote
	// since the last Sync (while hasCopy is false).
	undo []undoRecord
	// [writtenLo, writtenHi) covers every byte written since the last
	// Sync, if written.
	written              bool
	writtenLo, writtenHi int
	// dropped and droppedUnsynced count the bytes DropCache was asked to
	// drop, and those of them not durable then (CacheDrops).
	dropped, droppedUnsynced int64
}

// undoRecord is the durable content of data[off:off+len(old)] before a
// WriteAt replaced it.
type undoRecord struct {
	off int
	old []byte
}

// durable returns the durable content; the caller must not modify it.
func (n *memNode) durable() []byte {
	if n.hasCopy {
		return n.durableCopy
	}
	if len(n.undo) == 0 {
		return n.data[:n.durableLen]
	}
	d := append([]byte(nil), n.data[:n.durableLen]...)
	for i := len(n.undo) - 1; i >= 0; i-- {
		copy(d[n.undo[i].off:], n.undo[i].old)
	}
	return d
}

// markWritten adds [lo, hi) to the written range.
func (n *memNode) markWritten(lo, hi int) {
	if !n.written {
		n.written, n.writtenLo, n.writtenHi = true, lo, hi
		return
	}
	n.writtenLo, n.writtenHi = min(n.writtenLo, lo), max(n.writtenHi, hi)
}

func (n *memNode) truncate(size int) {
	if size < n.durableLen && !n.hasCopy {
		n.durableCopy = append([]byte(nil), n.durable()...)
		n.hasCopy = true
		n.undo = nil
	}
	if n.written {
		n.writtenLo, n.writtenHi = min(n.writtenLo, size), min(n.writtenHi, size)
	}
	if size <= len(n.data) {
		// Reallocate so later appends never overwrite bytes still
		// shared with a durable view or a reader's slice.
		n.data = append(make([]byte, 0, size), n.data[:size]...)
		return
	}
	n.markWritten(len(n.data), size)
	n.data = append(n.data, make([]byte, size-len(n.data))...)
}

// writeAt writes p at off, growing the file with zeroes up to off first.
func (n *memNode) writeAt(p []byte, off int) {
	end := off + len(p)
	if !n.hasCopy && off < n.durableLen && len(p) > 0 {
		n.undo = append(n.undo, undoRecord{off: off, old: append([]byte(nil), n.data[off:min(end, n.durableLen)]...)})
	}
	if end > len(n.data) {
		n.data = append(n.data, make([]byte, end-len(n.data))...)
	}
	copy(n.data[off:], p)
	n.markWritten(off, end)
}

// allocate grows the file with zeroes to size; it is not a write.
func (n *memNode) allocate(size int) {
	if size > len(n.data) {
		n.data = append(n.data, make([]byte, size-len(n.data))...)
	}
}

// crashContent returns the content after a crash that keeps keep bytes of
// the written range.
func (n *memNode) crashContent(keep int) []byte {
	if n.hasCopy {
		return append([]byte(nil), n.durableCopy...)
	}
	size := n.durableLen
	if keep > 0 {
		size = max(size, n.writtenLo+keep)
	}
	content := make([]byte, size)
	copy(content, n.durable())
	if size > n.durableLen {
		// Bytes past the durable size and below the written range were
		// grown by Allocate or by a WriteAt past the end: zeroes.
		copy(content[n.durableLen:], n.data[n.durableLen:size])
	}
	if keep > 0 {
		copy(content[n.writtenLo:], n.data[n.writtenLo:n.writtenLo+keep])
	}
	return content
}

// dropCache counts a DropCache of [off, end): the bytes of the file in
// it, and those not durable (past the durable size, or written since the
// last Sync).
func (n *memNode) dropCache(off, end int) {
	end = min(end, len(n.data))
	if off >= end {
		return
	}
	overlap := func(lo, hi int) int { return max(0, min(end, hi)-max(off, lo)) }
	n.dropped += int64(end - off)
	unsynced := overlap(n.durableLen, len(n.data))
	if n.written {
		unsynced += overlap(n.writtenLo, min(n.writtenHi, n.durableLen))
	}
	n.droppedUnsynced += int64(unsynced)
}

func (n *memNode) writtenBytes() int {
	if !n.written {
		return 0
	}
	return n.writtenHi - n.writtenLo
}

func (n *memNode) sync() {
	n.durableLen = len(n.data)
	n.durableCopy = nil
	n.hasCopy = false
	n.undo = nil
	n.written = false
}

// NewMem returns an empty MemFS whose root directories "." and "/" exist.
func NewMem() *MemFS {
	return &MemFS{
		files:        make(map[string]*memNode),
		durableFiles: make(map[string]*memNode),
		dirs:         map[string]bool{".": true, "/": true},
	}
}

// SetInjector installs fn as the fault injector; nil removes it.
func (m *MemFS) SetInjector(fn Injector) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.injector = fn
}

func (m *MemFS) inject(op Op, name string) error {
	if m.injector == nil {
		return nil
	}
	if err := m.injector(op, name); err != nil {
		if _, ok := errors.AsType[*fs.PathError](err); ok {
			return err // already names the file
		}
		// Like the OS: an *fs.PathError names the operation and the file.
		return &fs.PathError{Op: op.String(), Path: name, Err: err}
	}
	return nil
}

func clean(name string) string { return filepath.Clean(name) }

func notExist(op, name string) error {
	return &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
}

func (m *MemFS) parentExists(name string) bool { return m.dirs[filepath.Dir(name)] }

// Create implements FS.
func (m *MemFS) Create(name string) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpCreate, name); err != nil {
		return nil, err
	}
	if !m.parentExists(name) {
		return nil, notExist("create", name)
	}
	if m.dirs[name] {
		return nil, fmt.Errorf("vfs: create %s: is a directory", name)
	}
	n, ok := m.files[name]
	if ok {
		n.truncate(0)
	} else {
		n = &memNode{}
		m.files[name] = n
	}
	return &memFile{fs: m, node: n, name: name, generation: m.generation}, nil
}

// OpenAppend implements FS.
func (m *MemFS) OpenAppend(name string) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.files[name]
	if ok {
		if err := m.inject(OpOpen, name); err != nil {
			return nil, err
		}
	} else {
		if err := m.inject(OpCreate, name); err != nil {
			return nil, err
		}
		if !m.parentExists(name) {
			return nil, notExist("open", name)
		}
		if m.dirs[name] {
			return nil, fmt.Errorf("vfs: open %s: is a directory", name)
		}
		n = &memNode{}
		m.files[name] = n
	}
	return &memFile{fs: m, node: n, name: name, generation: m.generation}, nil
}

// OpenRW implements FS.
func (m *MemFS) OpenRW(name string) (File, error) {
	f, err := m.OpenAppend(name)
	if err != nil {
		return nil, err
	}
	f.(*memFile).positional = true
	return f, nil
}

// Open implements FS.
func (m *MemFS) Open(name string) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpOpen, name); err != nil {
		return nil, err
	}
	n, ok := m.files[name]
	if !ok {
		return nil, notExist("open", name)
	}
	return &memFile{fs: m, node: n, name: name, generation: m.generation, readOnly: true}, nil
}

// Remove implements FS. Open handles to the file keep working.
func (m *MemFS) Remove(name string) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpRemove, name); err != nil {
		return err
	}
	if m.dirs[name] && name != "." && name != "/" {
		// As os.Remove: an empty directory goes (directories are always
		// durable here, its removal too); one with entries stays. A
		// directory gone for good was empty on disk too: the removals of
		// its files become durable with it. (Kept, they came back at a
		// crash inside a directory that no longer existed, and again in
		// a new one made under the same name.)
		if len(m.entries(name)) > 0 {
			return &fs.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
		}
		delete(m.dirs, name)
		for file := range m.durableFiles {
			if filepath.Dir(file) == name {
				delete(m.durableFiles, file)
			}
		}
		return nil
	}
	if _, ok := m.files[name]; !ok {
		return notExist("remove", name)
	}
	delete(m.files, name)
	return nil
}

// Rename implements FS.
func (m *MemFS) Rename(oldname, newname string) error {
	oldname, newname = clean(oldname), clean(newname)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpRename, oldname); err != nil {
		return err
	}
	n, ok := m.files[oldname]
	if !ok {
		return notExist("rename", oldname)
	}
	if !m.parentExists(newname) {
		return notExist("rename", newname)
	}
	if m.dirs[newname] {
		return fmt.Errorf("vfs: rename %s: target is a directory", newname)
	}
	delete(m.files, oldname)
	m.files[newname] = n
	return nil
}

// MkdirAll implements FS. Directories are durable at once.
func (m *MemFS) MkdirAll(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpMkdirAll, dir); err != nil {
		return err
	}
	// Check every missing level before creating any: a file on the path
	// fails the call and leaves no directory below it (as mkdir -p).
	var missing []string
	for d := dir; !m.dirs[d]; d = filepath.Dir(d) {
		if _, ok := m.files[d]; ok {
			return fmt.Errorf("vfs: mkdir %s: a file exists", d)
		}
		missing = append(missing, d)
	}
	for _, d := range missing {
		m.dirs[d] = true
	}
	return nil
}

// List implements FS.
func (m *MemFS) List(dir string) ([]string, error) {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpList, dir); err != nil {
		return nil, err
	}
	if !m.dirs[dir] {
		return nil, notExist("list", dir)
	}
	names := m.entries(dir)
	sort.Strings(names)
	return names, nil
}

// entries are the names of the files and directories in dir, unsorted;
// the caller holds m.mu.
func (m *MemFS) entries(dir string) []string {
	var names []string
	for name := range m.files {
		if filepath.Dir(name) == dir {
			names = append(names, filepath.Base(name))
		}
	}
	for d := range m.dirs {
		if d != dir && filepath.Dir(d) == dir {
			names = append(names, filepath.Base(d))
		}
	}
	return names
}

// Stat implements FS.
func (m *MemFS) Stat(name string) (int64, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpStat, name); err != nil {
		return 0, err
	}
	if m.dirs[name] {
		return 0, nil
	}
	n, ok := m.files[name]
	if !ok {
		return 0, notExist("stat", name)
	}
	return int64(len(n.data)), nil
}

// SyncDir implements FS: the current namespace of dir becomes durable.
func (m *MemFS) SyncDir(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inject(OpSyncDir, dir); err != nil {
		return err
	}
	if !m.dirs[dir] {
		return notExist("syncdir", dir)
	}
	for name := range m.durableFiles {
		if filepath.Dir(name) == dir {
			delete(m.durableFiles, name)
		}
	}
	for name, n := range m.files {
		if filepath.Dir(name) == dir {
			m.durableFiles[name] = n
		}
	}
	return nil
}

// Crash simulates kill -9 or power loss (see the MemFS crash model): the
// namespace reverts to the durable namespace, every file keeps its durable
// content plus a prefix of its unsynced writes whose length rng chooses,
// and every open File becomes invalid.
func (m *MemFS) Crash(rng *rand.Rand) { m.crash(rng) }

// CrashClean is Crash without torn writes: every file reverts to exactly
// its durable content.
func (m *MemFS) CrashClean() { m.crash(nil) }

func (m *MemFS) crash(rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.generation++
	m.locks = nil
	// Visit names in sorted order so rng draws are deterministic.
	names := make([]string, 0, len(m.durableFiles))
	for name := range m.durableFiles {
		names = append(names, name)
	}
	sort.Strings(names)
	seen := make(map[*memNode]bool, len(names))
	m.files = make(map[string]*memNode, len(names))
	for _, name := range names {
		n := m.durableFiles[name]
		m.files[name] = n
		if seen[n] {
			continue
		}
		seen[n] = true
		keep := 0
		if !n.hasCopy && rng != nil {
			keep = rng.IntN(n.writtenBytes() + 1)
		}
		n.data = n.crashContent(keep)
		n.sync()
	}
}

// Lock takes the lock name; a crash frees every lock.
func (m *MemFS) Lock(name string) (io.Closer, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.parentExists(name) {
		return nil, notExist("lock", name)
	}
	if m.locks[name] != nil {
		return nil, fmt.Errorf("%s: %w", name, ErrLocked)
	}
	if m.locks == nil {
		m.locks = map[string]*memLock{}
	}
	l := &memLock{m: m, name: name}
	m.locks[name] = l
	return l, nil
}

// memLock is a MemFS lock held until Close or a crash.
type memLock struct {
	m    *MemFS
	name string
}

// Close frees the lock if this holder still has it (not after a crash,
// which freed it, and not twice).
func (l *memLock) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.locks[l.name] == l {
		delete(l.m.locks, l.name)
	}
	return nil
}

// FlipBit flips one bit of name's content in both the current and the
// durable content, modelling media corruption.
func (m *MemFS) FlipBit(name string, offset int64, bit uint) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.files[name]
	if !ok {
		return notExist("flipbit", name)
	}
	mask := byte(1) << (bit % 8)
	flipped := false
	if offset >= 0 && offset < int64(len(n.data)) {
		// Copy first: readers may hold slices of the old array.
		n.data = append([]byte(nil), n.data...)
		n.data[offset] ^= mask
		flipped = true
	}
	if n.hasCopy && offset >= 0 && offset < int64(len(n.durableCopy)) {
		n.durableCopy[offset] ^= mask
		flipped = true
	}
	for _, u := range n.undo {
		if i := int(offset) - u.off; i >= 0 && i < len(u.old) {
			u.old[i] ^= mask // the durable byte under a later write
		}
	}
	if !flipped {
		return fmt.Errorf("vfs: flipbit %s: offset %d out of range", name, offset)
	}
	return nil
}

// DurableBytes returns a copy of the durable content of the file that the
// durable namespace holds under name: what a CrashClean would leave.
func (m *MemFS) DurableBytes(name string) ([]byte, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.durableFiles[name]
	if !ok {
		return nil, notExist("durablebytes", name)
	}
	return append([]byte(nil), n.durable()...), nil
}

// CacheDrops returns how many bytes of the file DropCache was asked to
// drop, and how many of them were not durable at the time: a log drops
// only what it has synced, and a test holds it to that.
func (m *MemFS) CacheDrops(name string) (dropped, unsynced int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.files[clean(name)]
	if n == nil {
		return 0, 0
	}
	return n.dropped, n.droppedUnsynced
}

// ReadFile returns a copy of the current content of name.
func (m *MemFS) ReadFile(name string) ([]byte, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.files[name]
	if !ok {
		return nil, notExist("readfile", name)
	}
	return append([]byte(nil), n.data...), nil
}

// WriteFile replaces name with data, durably (content and namespace), for
// setting up test fixtures. The parent directory must exist.
func (m *MemFS) WriteFile(name string, data []byte) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.parentExists(name) {
		return notExist("writefile", name)
	}
	n := &memNode{data: append([]byte(nil), data...)}
	n.sync()
	m.files[name] = n
	m.durableFiles[name] = n
	return nil
}

// memFile is a handle on a memNode.
type memFile struct {
	fs         *MemFS
	node       *memNode
	name       string
	generation uint64
	readOnly   bool
	// positional is set for OpenRW: WriteAt and Allocate, no Write.
	positional bool
	// closed is guarded by fs.mu.
	closed bool
}

func (f *memFile) check(op string) error {
	if f.closed || f.generation != f.fs.generation {
		return fmt.Errorf("vfs: %s %s: %w", op, f.name, ErrClosed)
	}
	return nil
}

// Write appends p. A failed Write (closed, read-only or injected) applies
// nothing.
func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	if f.readOnly {
		return 0, fmt.Errorf("vfs: write %s: %w", f.name, ErrReadOnly)
	}
	if f.positional {
		return 0, fmt.Errorf("vfs: write %s: %w", f.name, ErrOpenMode)
	}
	if err := f.fs.inject(OpWrite, f.name); err != nil {
		return 0, err
	}
	f.node.markWritten(len(f.node.data), len(f.node.data)+len(p))
	f.node.data = append(f.node.data, p...)
	return len(p), nil
}

// checkPositional checks that f may be written with WriteAt or Allocate.
func (f *memFile) checkPositional(op string) error {
	if err := f.check(op); err != nil {
		return err
	}
	if f.readOnly {
		return fmt.Errorf("vfs: %s %s: %w", op, f.name, ErrReadOnly)
	}
	if !f.positional {
		return fmt.Errorf("vfs: %s %s: %w", op, f.name, ErrOpenMode)
	}
	return nil
}

// WriteAt writes p at off (an OpWrite for the injector). A failed WriteAt
// applies nothing.
func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkPositional("writeat"); err != nil {
		return 0, err
	}
	if off < 0 || off > memFileBytesMax {
		return 0, fmt.Errorf("vfs: writeat %s: offset %d out of range", f.name, off)
	}
	if err := f.fs.inject(OpWrite, f.name); err != nil {
		return 0, err
	}
	f.node.writeAt(p, int(off))
	return len(p), nil
}

// Allocate grows the file with zeroes. A failed Allocate applies nothing.
func (f *memFile) Allocate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkPositional("allocate"); err != nil {
		return err
	}
	if size < 0 || size > memFileBytesMax {
		return fmt.Errorf("vfs: allocate %s: size %d out of range", f.name, size)
	}
	if err := f.fs.inject(OpAllocate, f.name); err != nil {
		return err
	}
	f.node.allocate(int(size))
	return nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if err := f.fs.inject(OpRead, f.name); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("vfs: read %s: negative offset", f.name)
	}
	if off >= int64(len(f.node.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.node.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("sync"); err != nil {
		return err
	}
	if err := f.fs.inject(OpSync, f.name); err != nil {
		return err
	}
	f.node.sync()
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate"); err != nil {
		return err
	}
	if f.readOnly {
		return fmt.Errorf("vfs: truncate %s: %w", f.name, ErrReadOnly)
	}
	if err := f.fs.inject(OpTruncate, f.name); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("vfs: truncate %s: negative size", f.name)
	}
	f.node.truncate(int(size))
	return nil
}

// DropCache has no cache to drop: it counts the request (CacheDrops).
func (f *memFile) DropCache(off, n int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("dropcache"); err != nil {
		return err
	}
	if off < 0 || n < 0 || off > memFileBytesMax || n > memFileBytesMax {
		return fmt.Errorf("vfs: dropcache %s: range %d+%d out of range", f.name, off, n)
	}
	f.node.dropCache(int(off), int(off+n))
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("size"); err != nil {
		return 0, err
	}
	return int64(len(f.node.data)), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return fmt.Errorf("vfs: close %s: %w", f.name, ErrClosed)
	}
	f.closed = true
	return nil
}

var _ FS = (*MemFS)(nil)
