package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"testing"
)

func mustWrite(t *testing.T, f File, data string) {
	t.Helper()
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func readAll(t *testing.T, fsys FS, name string) string {
	t.Helper()
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(buf)
}

// newSyncedFile creates dir/name with content synced and its creation durable.
func newSyncedFile(t *testing.T, m *MemFS, dir, name, content string) File {
	t.Helper()
	if err := m.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	f, err := m.Create(dir + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, content)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestMemUnsyncedLostSyncedKept(t *testing.T) {
	m := NewMem()
	f := newSyncedFile(t, m, "d", "a", "synced")
	mustWrite(t, f, "-unsynced")
	if got := readAll(t, m, "d/a"); got != "synced-unsynced" {
		t.Fatalf("before crash got %q", got)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "synced" {
		t.Fatalf("after crash got %q, want %q", got, "synced")
	}
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write on pre-crash handle: got %v, want ErrClosed", err)
	}
}

func TestMemTornTailIsPrefix(t *testing.T) {
	const synced, tail = "0123456789", "abcdefghijklmnopqrstuvwxyz"
	sawPartial := false
	for seed := uint64(0); seed < 200; seed++ {
		m := NewMem()
		f := newSyncedFile(t, m, "d", "a", synced)
		mustWrite(t, f, tail)
		m.Crash(rand.New(rand.NewPCG(seed, 1)))
		got := readAll(t, m, "d/a")
		if len(got) < len(synced) || got != (synced + tail)[:len(got)] {
			t.Fatalf("seed %d: got %q, not synced data plus a prefix of the tail", seed, got)
		}
		if len(got) > len(synced) && len(got) < len(synced)+len(tail) {
			sawPartial = true
		}
	}
	if !sawPartial {
		t.Fatal("no seed produced a torn tail")
	}
}

func TestMemCreateWithoutSyncDirDisappears(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	f, err := m.Create("d/a")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "data")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if _, err := m.Stat("d/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after crash: got %v, want ErrNotExist", err)
	}
}

func TestMemRenameDurability(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "old", "v1")
	if err := m.Rename("d/old", "d/new"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/old"); got != "v1" {
		t.Fatalf("rename without SyncDir survived: d/old = %q", got)
	}
	if _, err := m.Stat("d/new"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("d/new after crash: %v", err)
	}
	if err := m.Rename("d/old", "d/new"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/new"); got != "v1" {
		t.Fatalf("d/new = %q", got)
	}
	if names, _ := m.List("d"); len(names) != 1 || names[0] != "new" {
		t.Fatalf("List = %v", names)
	}
}

func TestMemRemoveDurability(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "v1")
	if err := m.Remove("d/a"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "v1" {
		t.Fatalf("removed-without-SyncDir file: %q", got)
	}
	if err := m.Remove("d/a"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if _, err := m.Stat("d/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat: %v", err)
	}
}

func TestMemTruncateNotDurableUntilSync(t *testing.T) {
	m := NewMem()
	f := newSyncedFile(t, m, "d", "a", "0123456789")
	if err := f.Truncate(4); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "XY")
	if got := readAll(t, m, "d/a"); got != "0123XY" {
		t.Fatalf("got %q", got)
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "0123456789" {
		t.Fatalf("durable = %q", d)
	}
	m.Crash(rand.New(rand.NewPCG(1, 2)))
	if got := readAll(t, m, "d/a"); got != "0123456789" {
		t.Fatalf("after crash got %q", got)
	}
	f, err := m.OpenAppend("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "0123" {
		t.Fatalf("after synced truncate got %q", got)
	}
}

func TestMemInjectedErrors(t *testing.T) {
	m := NewMem()
	f := newSyncedFile(t, m, "d", "a", "abc")
	injected := errors.New("injected")
	var seen []Op
	m.SetInjector(func(op Op, name string) error {
		seen = append(seen, op)
		if op == OpWrite || op == OpSync || op == OpRename {
			return injected
		}
		return nil
	})
	if n, err := f.Write([]byte("def")); !errors.Is(err, injected) || n != 0 {
		t.Fatalf("write: n=%d err=%v", n, err)
	}
	if err := f.Sync(); !errors.Is(err, injected) {
		t.Fatalf("sync: %v", err)
	}
	if err := m.Rename("d/a", "d/b"); !errors.Is(err, injected) {
		t.Fatalf("rename: %v", err)
	}
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("failed write applied: %q", got)
	}
	m.SetInjector(nil)
	if _, err := f.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || seen[0] != OpWrite || OpWrite.String() != "Write" {
		t.Fatalf("injector saw %v", seen)
	}
}

func TestMemFlipBit(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "\x00\x00")
	if err := m.FlipBit("d/a", 1, 3); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "\x00\x08" {
		t.Fatalf("got %q", got)
	}
	if err := m.FlipBit("d/a", 9, 0); err == nil {
		t.Fatal("out-of-range flip succeeded")
	}
}

func TestMemNamespace(t *testing.T) {
	m := NewMem()
	if _, err := m.Open("nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
	if _, err := m.Create("missingdir/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("create in missing dir: %v", err)
	}
	if err := m.MkdirAll("x/y"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"x/b", "x/a"} {
		if _, err := m.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	names, err := m.List("x")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "y"}; len(names) != 3 || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Fatalf("List = %v", names)
	}
	ro, err := m.Open("x/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Write([]byte("z")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write read-only: %v", err)
	}
	buf := make([]byte, 4)
	if n, err := ro.ReadAt(buf, 0); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt empty: %d %v", n, err)
	}
}

// TestRemoveDirectoryAsTheOSDoes: Remove takes an empty directory, not
// one with a file or a directory in it — on the in-memory FS as on the OS
// (a ledger generation's directory goes once its files are removed).
func TestRemoveDirectoryAsTheOSDoes(t *testing.T) {
	for name, fsys := range map[string]FS{"mem": NewMem(), "os": OS()} {
		root := "/r"
		if name == "os" {
			root = t.TempDir()
		}
		if err := fsys.MkdirAll(root + "/d/sub"); err != nil {
			t.Fatal(err)
		}
		f, err := fsys.Create(root + "/d/f")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		for _, full := range []string{root + "/d", root + "/d/sub"} {
			if full == root+"/d/sub" {
				if err := fsys.Remove(full); err != nil {
					t.Fatalf("%s: remove the empty %s: %v", name, full, err)
				}
				continue
			}
			if err := fsys.Remove(full); err == nil {
				t.Fatalf("%s: removed %s with entries", name, full)
			}
		}
		if err := fsys.Remove(root + "/d/f"); err != nil {
			t.Fatal(err)
		}
		if err := fsys.Remove(root + "/d"); err != nil {
			t.Fatalf("%s: remove the emptied directory: %v", name, err)
		}
		if _, err := fsys.List(root + "/d"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: list a removed directory: %v", name, err)
		}
	}
}

// TestRemovedDirectoryStaysEmptyAfterACrash: files removed from a
// directory without a SyncDir of it, then the directory itself, do not
// come back at a crash, nor in a directory made again under its name (a
// ledger generation's directory is: stale acks came back in it).
func TestRemovedDirectoryStaysEmptyAfterACrash(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "/r/d", "f", "old").Close()
	if err := m.Remove("/r/d/f"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("/r/d"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if _, err := m.Stat("/r/d/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a file of a removed directory after a crash: %v", err)
	}
	if err := m.MkdirAll("/r/d"); err != nil {
		t.Fatal(err)
	}
	if names, err := m.List("/r/d"); err != nil || len(names) != 0 {
		t.Fatalf("a directory made again under a removed one's name holds %v (%v)", names, err)
	}
}

func TestOSImplementation(t *testing.T) {
	dir := t.TempDir()
	fsys := OS()
	sub := dir + "/sub"
	if err := fsys.MkdirAll(sub); err != nil {
		t.Fatal(err)
	}
	f, err := fsys.Create(sub + "/a")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "hello world")
	if err := f.Truncate(5); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "!")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if size, err := f.Size(); err != nil || size != 6 {
		t.Fatalf("size %d %v", size, err)
	}
	buf := make([]byte, 6)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, []byte("hello!")) {
		t.Fatalf("ReadAt %q %v", buf, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	a, err := fsys.OpenAppend(sub + "/a")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, "?")
	a.Close()
	if err := fsys.Rename(sub+"/a", sub+"/b"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncDir(sub); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, fsys, sub+"/b"); got != "hello!?" {
		t.Fatalf("got %q", got)
	}
	if names, err := fsys.List(sub); err != nil || len(names) != 1 || names[0] != "b" {
		t.Fatalf("List %v %v", names, err)
	}
	if _, err := fsys.Stat(sub + "/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat missing: %v", err)
	}
	if _, err := fsys.Open(sub + "/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
	if err := fsys.Remove(sub + "/b"); err != nil {
		t.Fatal(err)
	}
}

// A MemFS has no cache to drop: DropCache only counts what it was asked
// to drop, and how much of that was not durable, so that a test can hold
// a log to dropping only what it synced.
func TestMemDropCacheCountsUnsyncedBytes(t *testing.T) {
	m := NewMem()
	f, err := m.OpenRW("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("new"), 10); err != nil { // overwrites durable bytes
		t.Fatal(err)
	}
	if err := f.Allocate(150); err != nil { // grown, not durable
		t.Fatal(err)
	}
	steps := []struct {
		off, n                 int64
		dropped, unsyncedBytes int64
	}{
		{0, 10, 10, 0},     // durable
		{0, 20, 30, 3},     // the overwritten bytes
		{90, 40, 70, 33},   // 10 durable, 30 past the durable size
		{140, 100, 80, 43}, // only what the file holds counts
		{500, 10, 80, 43},  // nothing of the file
	}
	for _, s := range steps {
		if err := f.DropCache(s.off, s.n); err != nil {
			t.Fatal(err)
		}
		if d, u := m.CacheDrops("f"); d != s.dropped || u != s.unsyncedBytes {
			t.Fatalf("after DropCache(%d, %d): %d dropped, %d unsynced; want %d, %d", s.off, s.n, d, u, s.dropped, s.unsyncedBytes)
		}
	}
	if err := f.DropCache(-1, 10); err == nil {
		t.Fatal("DropCache of a negative offset succeeded")
	}
	f.Close()
	if err := f.DropCache(0, 10); !errors.Is(err, ErrClosed) {
		t.Fatalf("DropCache of a closed file: %v", err)
	}
}
