package vfs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// newSyncedRW creates dir/name for positional writes, allocated to
// allocBytes with content written at 0, all synced and durable.
func newSyncedRW(t *testing.T, m *MemFS, content string, allocBytes int64) File {
	t.Helper()
	if err := m.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenRW("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(allocBytes); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	return f
}

func zeroes(n int) string { return string(make([]byte, n)) }

func TestMemPositionalWrites(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "abc", 8)
	if got := readAll(t, m, "d/a"); got != "abc"+zeroes(5) {
		t.Fatalf("got %q", got)
	}
	if err := f.Allocate(4); err != nil { // never shrinks
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XY"), 6); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 10); err != nil { // past the end: grows
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "abc\x00\x00\x00XY\x00\x00end" {
		t.Fatalf("got %q", got)
	}
	if size, _ := f.Size(); size != 13 {
		t.Fatalf("size %d", size)
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "abc"+zeroes(5) {
		t.Fatalf("durable %q", d)
	}
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("Write on an OpenRW file: %v", err)
	}
	a, err := m.OpenAppend("d/b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("x"), 0); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("WriteAt on an append file: %v", err)
	}
	if err := a.Allocate(10); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("Allocate on an append file: %v", err)
	}
	ro, err := m.Open("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.WriteAt([]byte("x"), 0); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("WriteAt read-only: %v", err)
	}
	if err := ro.Allocate(100); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Allocate read-only: %v", err)
	}
	injected := errors.New("injected")
	m.SetInjector(func(op Op, _ string) error {
		if op == OpAllocate || op == OpWrite {
			return injected
		}
		return nil
	})
	if err := f.Allocate(100); !errors.Is(err, injected) {
		t.Fatalf("Allocate: %v", err)
	}
	if _, err := f.WriteAt([]byte("zz"), 0); !errors.Is(err, injected) {
		t.Fatalf("WriteAt: %v", err)
	}
	m.SetInjector(nil)
	if size, _ := f.Size(); size != 13 || readAll(t, m, "d/a")[:3] != "abc" {
		t.Fatalf("a failed operation applied: size %d", size)
	}
	if OpAllocate.String() != "Allocate" {
		t.Fatal(OpAllocate.String())
	}
}

func TestMemAllocateNotDurableUntilSync(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "abc", 0)
	if err := f.Allocate(100); err != nil {
		t.Fatal(err)
	}
	// An allocation is not a write: a crash, torn or not, drops it.
	m.Crash(rand.New(rand.NewPCG(1, 1)))
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("after crash got %q", got)
	}
	f, err := m.OpenRW("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(10); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	m.Crash(rand.New(rand.NewPCG(1, 1)))
	if got := readAll(t, m, "d/a"); got != "abc"+zeroes(7) {
		t.Fatalf("after synced allocation got %q", got)
	}
}

// TestMemTornWriteInsideFile: writes inside the durable size that are not
// synced leave, after a crash, the durable content with a prefix of the
// written range over it, and the durable size.
func TestMemTornWriteInsideFile(t *testing.T) {
	const synced = "0123456789"
	sawPartial, sawNone, sawAll := false, false, false
	for seed := uint64(0); seed < 200; seed++ {
		m := NewMem()
		f := newSyncedRW(t, m, synced, 30)
		// Two sequential writes, the second one past the durable size.
		if _, err := f.WriteAt([]byte("abcdefghijklmnop"), 10); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("qrstuvwx"), 26); err != nil {
			t.Fatal(err)
		}
		m.Crash(rand.New(rand.NewPCG(seed, 1)))
		got := readAll(t, m, "d/a")
		written := "abcdefghijklmnopqrstuvwx"
		keep := -1
		for k := 0; k <= len(written); k++ {
			want := synced + written[:k]
			if len(want) < 30 {
				want += zeroes(30 - len(want))
			}
			if got == want {
				keep = k
			}
		}
		if keep < 0 {
			t.Fatalf("seed %d: got %q, not the durable content with a prefix of the writes", seed, got)
		}
		sawNone = sawNone || keep == 0
		sawAll = sawAll || keep == len(written)
		sawPartial = sawPartial || keep > 0 && keep < len(written)
	}
	if !sawPartial || !sawNone || !sawAll {
		t.Fatalf("torn outcomes: none %v partial %v all %v", sawNone, sawPartial, sawAll)
	}
}

// TestMemOverwriteOfDurableData: overwritten durable bytes stay durable
// until Sync, a bit flip reaches them, and a truncation below the durable
// size still reverts exactly.
func TestMemOverwriteOfDurableData(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "0123456789", 0)
	if _, err := f.WriteAt([]byte("ab"), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XYZ"), 1); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "0XYZ456789" {
		t.Fatalf("got %q", got)
	}
	if err := m.FlipBit("d/a", 2, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "0133456789" {
		t.Fatalf("durable %q", d)
	}
	if got := readAll(t, m, "d/a"); got != "0XXZ456789" {
		t.Fatalf("current after flip %q", got)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "0133456789" {
		t.Fatalf("after crash %q", got)
	}
	f, _ = m.OpenRW("d/a")
	if _, err := f.WriteAt([]byte("ab"), 8); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(5); err != nil {
		t.Fatal(err)
	}
	m.Crash(rand.New(rand.NewPCG(3, 3)))
	if got := readAll(t, m, "d/a"); got != "0133456789" {
		t.Fatalf("after a crash following a truncation %q", got)
	}
}

func TestOSPositional(t *testing.T) {
	dir := t.TempDir()
	fsys := OS()
	f, err := fsys.OpenRW(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Allocate(300 << 10); err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(10); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("hello"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if size, err := f.Size(); err != nil || size != 300<<10 {
		t.Fatalf("size %d %v", size, err)
	}
	want := make([]byte, 300<<10)
	copy(want[5:], "hello")
	if got := readAll(t, fsys, filepath.Join(dir, "a")); got != string(want) {
		t.Fatal("content differs")
	}
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("Write on an OpenRW file: %v", err)
	}
	a, err := fsys.OpenAppend(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.WriteAt([]byte("x"), 0); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("WriteAt on an append file: %v", err)
	}
	if err := a.Allocate(10); !errors.Is(err, ErrOpenMode) {
		t.Fatalf("Allocate on an append file: %v", err)
	}
	ro, err := fsys.Open(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Allocate(10); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Allocate read-only: %v", err)
	}
	// Reopened, the file keeps its content and takes writes in place.
	g, err := fsys.OpenRW(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.WriteAt([]byte("!"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := g.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, []byte("!\x00\x00\x00\x00hello")) {
		t.Fatalf("ReadAt %q %v", buf, err)
	}
}
