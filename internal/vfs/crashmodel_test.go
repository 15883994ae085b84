package vfs

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"testing"
)

// crashSeeds is how many rng seeds the torn-write tests try: enough that
// every allowed outcome of a short written range comes up.
const crashSeeds = 400

// crashOutcomes builds a fresh MemFS with setup for every seed, crashes it
// with that seed and returns d/a's content per seed.
func crashOutcomes(t *testing.T, setup func(m *MemFS)) []string {
	t.Helper()
	var got []string
	for seed := uint64(0); seed < crashSeeds; seed++ {
		m := NewMem()
		setup(m)
		m.Crash(rand.New(rand.NewPCG(seed, 7)))
		got = append(got, readAll(t, m, "d/a"))
	}
	return got
}

// checkOutcomes fails unless every outcome is one of want and every want
// comes up.
func checkOutcomes(t *testing.T, got []string, want []string) {
	t.Helper()
	allowed := map[string]bool{}
	for _, w := range want {
		allowed[w] = true
	}
	seen := map[string]bool{}
	for seed, g := range got {
		if !allowed[g] {
			t.Fatalf("seed %d: got %q, not an allowed crash outcome %q", seed, g, want)
		}
		seen[g] = true
	}
	for _, w := range want {
		if !seen[w] {
			t.Fatalf("the allowed crash outcome %q never came up", w)
		}
	}
}

// overlay is base with p over it at off, grown to off+len(p) if shorter.
func overlay(base string, p string, off int) string {
	b := []byte(base)
	if len(b) < off+len(p) {
		b = append(b, make([]byte, off+len(p)-len(b))...)
	}
	copy(b[off:], p)
	return string(b)
}

// Rule: the bytes written since the last Sync are one range, from the
// lowest to the highest offset written, whatever the order of the writes,
// and a crash keeps any prefix of it (each length, 1 included) over the
// durable content.
func TestCrashKeepsAnyPrefixOfTheWholeWrittenRange(t *testing.T) {
	const durable = "0123456789"
	current := overlay(overlay(durable, "AB", 12), "xyz", 2) // written [2, 14)
	got := crashOutcomes(t, func(m *MemFS) {
		f := newSyncedRW(t, m, durable, 0)
		if _, err := f.WriteAt([]byte("AB"), 12); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("xyz"), 2); err != nil { // lower than the first
			t.Fatal(err)
		}
	})
	var want []string
	for keep := 0; keep <= 12; keep++ {
		want = append(want, overlay(durable, current[2:2+keep], 2))
	}
	checkOutcomes(t, got, want)
}

// Rule: only a truncation below the durable size reverts to exactly the
// durable content; one to the durable size leaves the torn-write model for
// what is written after it.
func TestTruncateToTheDurableSizeDoesNotRevert(t *testing.T) {
	got := crashOutcomes(t, func(m *MemFS) {
		f := newSyncedFile(t, m, "d", "a", "0123456789")
		mustWrite(t, f, "torn")
		if err := f.Truncate(10); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, f, "XY")
	})
	checkOutcomes(t, got, []string{"0123456789", "0123456789X", "0123456789XY"})
}

// Rule: a truncation above the durable size cuts the written range with
// the file: a crash keeps a prefix of what is left of it, and nothing of a
// range cut away whole.
func TestTruncateOfAnUnsyncedTailCutsTheWrittenRange(t *testing.T) {
	got := crashOutcomes(t, func(m *MemFS) {
		f := newSyncedFile(t, m, "d", "a", "0123456789")
		mustWrite(t, f, "abcdefghij")
		if err := f.Truncate(15); err != nil {
			t.Fatal(err)
		}
	})
	var want []string
	for keep := 0; keep <= 5; keep++ {
		want = append(want, "0123456789"+"abcde"[:keep])
	}
	checkOutcomes(t, got, want)

	got = crashOutcomes(t, func(m *MemFS) {
		f := newSyncedRW(t, m, "0123456789", 0)
		if _, err := f.WriteAt([]byte("XY"), 15); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(12); err != nil { // below the write, above the durable size
			t.Fatal(err)
		}
	})
	checkOutcomes(t, got, []string{"0123456789"})
}

// Rule: a Truncate that grows the file is a write of zeroes: unsynced, a
// crash keeps a prefix of them.
func TestTruncateThatGrowsIsAWrite(t *testing.T) {
	m := NewMem()
	f := newSyncedFile(t, m, "d", "a", "abc")
	if err := f.Truncate(10); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "abc"+zeroes(7) {
		t.Fatalf("after Truncate(10) got %q", got)
	}
	got := crashOutcomes(t, func(m *MemFS) {
		f := newSyncedFile(t, m, "d", "a", "abc")
		if err := f.Truncate(10); err != nil {
			t.Fatal(err)
		}
	})
	var want []string
	for keep := 0; keep <= 7; keep++ {
		want = append(want, "abc"+zeroes(keep))
	}
	checkOutcomes(t, got, want)
}

// Rule: a Truncate to the current size writes nothing: allocated, unsynced
// space stays lost at a crash.
func TestTruncateToTheCurrentSizeWritesNothing(t *testing.T) {
	got := crashOutcomes(t, func(m *MemFS) {
		f := newSyncedRW(t, m, "abc", 0)
		if err := f.Allocate(20); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(20); err != nil {
			t.Fatal(err)
		}
	})
	checkOutcomes(t, got, []string{"abc", "xbc"})
}

// Rule: after a truncation below the durable size, writes into the cut
// away part change the current content only; a crash reverts to the
// durable content exactly.
func TestWriteAtAfterATruncationBelowTheDurableSize(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "0123456789", 0)
	if err := f.Truncate(4); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XY"), 6); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "0123\x00\x00XY" {
		t.Fatalf("current %q", got)
	}
	m.Crash(rand.New(rand.NewPCG(5, 5)))
	if got := readAll(t, m, "d/a"); got != "0123456789" {
		t.Fatalf("after crash %q", got)
	}
}

// Rule: a WriteAt that ends one byte past the end grows the file by it.
func TestWriteAtJustPastTheEndGrowsTheFile(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "abc", 0)
	if _, err := f.WriteAt([]byte("d"), 3); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "abcd" {
		t.Fatalf("got %q", got)
	}
}

// Rule: a write past the durable size of which a crash keeps nothing
// leaves the durable size (the gap before it is not kept either).
func TestAnUnkeptWritePastTheEndLeavesTheDurableSize(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "abc", 0)
	if _, err := f.WriteAt([]byte("x"), 50); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("after a clean crash got %q (%d bytes)", got, len(got))
	}
}

// Rule: what a crash leaves is durable: the file is synced by the crash,
// and a second crash with nothing written between leaves it exactly.
func TestAFileUntouchedSinceACrashComesBackExactly(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		m := NewMem()
		f := newSyncedFile(t, m, "d", "a", "0123456789")
		mustWrite(t, f, "abcdefghijklmnopqrstuvwxyz")
		m.Crash(rand.New(rand.NewPCG(seed, 1)))
		first := readAll(t, m, "d/a")
		if d, _ := m.DurableBytes("d/a"); string(d) != first {
			t.Fatalf("seed %d: durable after a crash %q, content %q", seed, d, first)
		}
		m.Crash(rand.New(rand.NewPCG(seed, 2)))
		if got := readAll(t, m, "d/a"); got != first {
			t.Fatalf("seed %d: a second crash changed %q to %q", seed, first, got)
		}
	}
}

// Rule: Sync makes overwrites of durable bytes durable.
func TestSyncMakesOverwritesDurable(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "0123456789", 0)
	if _, err := f.WriteAt([]byte("ab"), 2); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "01ab456789" {
		t.Fatalf("durable %q", d)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "01ab456789" {
		t.Fatalf("after crash %q", got)
	}
}

// Rule (injector): an injected error is an *fs.PathError naming the
// operation and the file, unless the injector returned one already, which
// is returned as it is.
func TestInjectedErrorsNameTheOperationAndFile(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "x")
	injected := errors.New("injected")
	m.SetInjector(func(Op, string) error { return injected })
	_, err := m.Stat("d/a")
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op != OpStat.String() || pe.Path != "d/a" || !errors.Is(err, injected) {
		t.Fatalf("injected Stat error %#v", err)
	}
	own := &fs.PathError{Op: "custom", Path: "elsewhere", Err: injected}
	m.SetInjector(func(Op, string) error { return own })
	if _, err := m.Stat("d/a"); err != error(own) {
		t.Fatalf("an injector's own *fs.PathError came back as %#v", err)
	}
}

// Rule (injector): every operation asks the injector, with its Op and the
// file's name, and a failed one changes nothing.
func TestEveryOperationConsultsTheInjector(t *testing.T) {
	injected := errors.New("injected")
	cases := []struct {
		op   Op
		name string
		run  func(m *MemFS, f File) error
		// after checks that the failed operation changed nothing.
		after func(t *testing.T, m *MemFS)
	}{
		{OpCreate, "d/new", func(m *MemFS, _ File) error { _, err := m.Create("d/new"); return err }, notThere("d/new")},
		{OpCreate, "d/new", func(m *MemFS, _ File) error { _, err := m.OpenAppend("d/new"); return err }, notThere("d/new")},
		{OpOpen, "d/a", func(m *MemFS, _ File) error { _, err := m.OpenAppend("d/a"); return err }, nil},
		{OpOpen, "d/a", func(m *MemFS, _ File) error { _, err := m.OpenRW("d/a"); return err }, nil},
		{OpOpen, "d/a", func(m *MemFS, _ File) error { _, err := m.Open("d/a"); return err }, nil},
		{OpMkdirAll, "e", func(m *MemFS, _ File) error { return m.MkdirAll("e") }, notThere("e")},
		{OpList, "d", func(m *MemFS, _ File) error { _, err := m.List("d"); return err }, nil},
		{OpStat, "d/a", func(m *MemFS, _ File) error { _, err := m.Stat("d/a"); return err }, nil},
		{OpSyncDir, "d", func(m *MemFS, _ File) error {
			if _, err := m.Create("d/new"); err != nil {
				return err
			}
			return m.SyncDir("d")
		}, func(t *testing.T, m *MemFS) {
			m.CrashClean()
			notThere("d/new")(t, m)
		}},
		{OpRead, "d/a", func(_ *MemFS, f File) error { _, err := f.ReadAt(make([]byte, 1), 0); return err }, nil},
		{OpTruncate, "d/a", func(_ *MemFS, f File) error { return f.Truncate(1) }, nil},
		{OpRemove, "d/a", func(m *MemFS, _ File) error { return m.Remove("d/a") }, nil},
		{OpAllocate, "d/a", func(_ *MemFS, f File) error { return f.Allocate(100) }, nil},
	}
	for _, c := range cases {
		m := NewMem()
		f := newSyncedRW(t, m, "abc", 0)
		var saw []string
		m.SetInjector(func(op Op, name string) error {
			if op == c.op {
				saw = append(saw, name)
				return injected
			}
			return nil
		})
		if err := c.run(m, f); !errors.Is(err, injected) {
			t.Fatalf("%v on %s: got %v, want the injected error", c.op, c.name, err)
		}
		if len(saw) != 1 || saw[0] != c.name {
			t.Fatalf("%v: the injector saw %q, want %q", c.op, saw, c.name)
		}
		m.SetInjector(nil)
		if got := readAll(t, m, "d/a"); got != "abc" {
			t.Fatalf("%v: a failed operation changed d/a to %q", c.op, got)
		}
		if c.after != nil {
			c.after(t, m)
		}
	}
}

func notThere(name string) func(t *testing.T, m *MemFS) {
	return func(t *testing.T, m *MemFS) {
		t.Helper()
		if _, err := m.Stat(name); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s after a failed operation: %v", name, err)
		}
	}
}

// Rule (namespace): the guards of the namespace operations answer as the
// OS does, and a failed one changes nothing.
func TestNamespaceGuards(t *testing.T) {
	m := NewMem()
	if names, err := m.List("/"); err != nil || len(names) != 0 {
		t.Fatalf("List of an empty / = %v %v", names, err)
	}
	newSyncedFile(t, m, "d", "a", "abc")
	if err := m.MkdirAll("d/sub"); err != nil {
		t.Fatal(err)
	}
	if names, err := m.List("."); err != nil || len(names) != 1 || names[0] != "d" {
		t.Fatalf("List(.) = %v %v", names, err)
	}
	isNotExist := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: %v, want ErrNotExist", what, err)
		}
	}
	isErr := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s succeeded", what)
		}
	}
	_, err := m.Create("d/sub")
	isErr("Create of a directory", err)
	_, err = m.OpenAppend("d/sub")
	isErr("OpenAppend of a directory", err)
	_, err = m.OpenAppend("missing/x")
	isNotExist("OpenAppend in a missing directory", err)
	isErr("Remove of /", m.Remove("/"))
	isErr("Remove of .", m.Remove("."))
	if _, err := m.List("/"); err != nil {
		t.Fatalf("List(/) after a Remove of it: %v", err)
	}
	isNotExist("Remove of a missing file", m.Remove("d/missing"))
	isNotExist("Rename of a missing file", m.Rename("d/missing", "d/x"))
	isNotExist("Rename into a missing directory", m.Rename("d/a", "missing/b"))
	isErr("Rename onto a directory", m.Rename("d/a", "d/sub"))
	isErr("MkdirAll over a file", m.MkdirAll("d/a"))
	isNotExist("SyncDir of a missing directory", m.SyncDir("missing"))
	_, err = m.Lock("missing/LOCK")
	isNotExist("Lock in a missing directory", err)
	isNotExist("WriteFile in a missing directory", m.WriteFile("missing/x", []byte("x")))
	if size, err := m.Stat("d/sub"); err != nil || size != 0 {
		t.Fatalf("Stat of a directory: %d %v", size, err)
	}
	if size, err := m.Stat("d/a"); err != nil || size != 3 {
		t.Fatalf("Stat of d/a: %d %v", size, err)
	}
	if names, _ := m.List("d"); len(names) != 2 || names[0] != "a" || names[1] != "sub" {
		t.Fatalf("failed operations changed d: %v", names)
	}
	// A directory with one entry is not empty.
	if err := m.Remove("d/sub"); err != nil {
		t.Fatal(err)
	}
	isErr("Remove of a directory holding one file", m.Remove("d"))
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("d/a = %q", got)
	}
}

// Rule: Create of an existing file truncates it, which below the durable
// size reverts at a crash.
func TestCreateOverADurableFileTruncatesUntilSynced(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "durable")
	f, err := m.Create("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if size, _ := f.Size(); size != 0 {
		t.Fatalf("Create left %d bytes", size)
	}
	mustWrite(t, f, "new")
	m.Crash(rand.New(rand.NewPCG(1, 1)))
	if got := readAll(t, m, "d/a"); got != "durable" {
		t.Fatalf("after crash %q", got)
	}
}

// Rule: handles from before a crash are invalid; handles opened after it
// work, however they were opened.
func TestHandlesOpenedAfterACrashWork(t *testing.T) {
	m := NewMem()
	old := newSyncedFile(t, m, "d", "a", "abc")
	m.CrashClean()
	if _, err := old.Size(); !errors.Is(err, ErrClosed) {
		t.Fatalf("a pre-crash handle: %v", err)
	}
	f, err := m.Create("d/b")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "x")
	a, err := m.OpenAppend("d/a")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, "d")
	rw, err := m.OpenRW("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.WriteAt([]byte("e"), 4); err != nil {
		t.Fatal(err)
	}
	ro, err := m.Open("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if size, err := ro.Size(); err != nil || size != 5 {
		t.Fatalf("size %d %v", size, err)
	}
}

// Rule: removing an empty directory makes durable the removals of its own
// files only, not those of other directories.
func TestRemovingAnEmptyDirectoryKeepsOtherDurableFiles(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "abc")
	if err := m.MkdirAll("e"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("e"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("d/a after crash %q", got)
	}
}

// Rule: SyncDir makes durable the namespace of its directory only; other
// directories keep theirs as of their own last SyncDir.
func TestSyncDirTouchesOnlyItsDirectory(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "abc")
	newSyncedFile(t, m, "e", "durable", "e1")
	if _, err := m.Create("e/unsynced"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("d/c"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	for name, want := range map[string]error{"d/a": nil, "d/c": nil, "e/durable": nil, "e/unsynced": fs.ErrNotExist} {
		if _, err := m.Stat(name); !errors.Is(err, want) {
			t.Fatalf("%s after crash: %v, want %v", name, err, want)
		}
	}
}

// Rule: a crash is deterministic: the same history and the same rng seed
// leave the same files, whatever the order of map iteration.
func TestCrashIsDeterministic(t *testing.T) {
	build := func(seed uint64) []string {
		m := NewMem()
		var names []string
		for i := range 8 {
			name := string(rune('a' + i))
			f := newSyncedFile(t, m, "d", name, "0123456789")
			mustWrite(t, f, "abcdefghijklmnopqrstuvwxyz")
			names = append(names, name)
		}
		m.Crash(rand.New(rand.NewPCG(seed, 9)))
		var got []string
		for _, name := range names {
			got = append(got, readAll(t, m, "d/"+name))
		}
		return got
	}
	for seed := uint64(0); seed < 20; seed++ {
		first, second := build(seed), build(seed)
		for i := range first {
			if first[i] != second[i] {
				t.Fatalf("seed %d: file %d came back %q, then %q", seed, i, first[i], second[i])
			}
		}
	}
}

// Rule: FlipBit hits exactly the byte asked for, in the current content,
// in the durable content under an overwrite (undo records) and in the
// durable copy of a file truncated below its durable size; an offset
// outside both is an error.
func TestFlipBitHitsExactlyItsByte(t *testing.T) {
	m := NewMem()
	newSyncedFile(t, m, "d", "a", "\x00\x00")
	for _, off := range []int64{-1, 2} {
		if err := m.FlipBit("d/a", off, 0); err == nil {
			t.Fatalf("FlipBit at %d of a 2-byte file succeeded", off)
		}
	}

	m = NewMem()
	f := newSyncedRW(t, m, "0123456789", 0)
	if _, err := f.WriteAt([]byte("ab"), 4); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{3, 6} { // just before and just after the overwrite
		if err := m.FlipBit("d/a", off, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "0122457789" {
		t.Fatalf("durable after flips around an overwrite %q", d)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "0122457789" {
		t.Fatalf("after crash %q", got)
	}

	m = NewMem()
	f = newSyncedRW(t, m, "0123456789", 0)
	if err := f.Truncate(4); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit("d/a", 2, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit("d/a", 8, 0); err != nil { // past the current size, in the durable content
		t.Fatalf("FlipBit of a durable byte cut away by a truncation: %v", err)
	}
	if got := readAll(t, m, "d/a"); got != "0133" {
		t.Fatalf("current %q", got)
	}
	if d, _ := m.DurableBytes("d/a"); string(d) != "0133456799" {
		t.Fatalf("durable %q", d)
	}
	m.CrashClean()
	if got := readAll(t, m, "d/a"); got != "0133456799" {
		t.Fatalf("after crash %q", got)
	}
}

// Rule: DurableBytes reads the durable namespace: a file whose creation
// was never made durable by a SyncDir has none.
func TestDurableBytesReadsTheDurableNamespace(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	f, err := m.Create("d/new")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "x")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DurableBytes("d/new"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("DurableBytes of a file not in the durable namespace: %v", err)
	}
}

// Rule: WriteFile is durable at once, content and name, and ReadFile
// returns a copy the caller may change.
func TestWriteFileIsDurableAndReadFileACopy(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("d/a", []byte("fixture")); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	b, err := m.ReadFile("d/a")
	if err != nil || string(b) != "fixture" {
		t.Fatalf("after crash %q %v", b, err)
	}
	b[0] = 'X'
	if b, _ := m.ReadFile("d/a"); string(b) != "fixture" {
		t.Fatalf("changing ReadFile's result changed the file: %q", b)
	}
}

// Rule (handles): out-of-range arguments and misuse fail with an error
// and change nothing, as on the OS.
func TestHandleArgumentGuards(t *testing.T) {
	m := NewMem()
	f := newSyncedRW(t, m, "abc", 0)
	if _, err := f.WriteAt([]byte("x"), -1); err == nil {
		t.Fatal("WriteAt at -1 succeeded")
	}
	if _, err := f.WriteAt([]byte("x"), math.MaxInt64); err == nil {
		t.Fatal("WriteAt at MaxInt64 succeeded")
	}
	if err := f.Allocate(-1); err == nil {
		t.Fatal("Allocate(-1) succeeded")
	}
	if _, err := f.ReadAt(make([]byte, 1), -1); err == nil {
		t.Fatal("ReadAt at -1 succeeded")
	}
	buf := make([]byte, 4)
	if n, err := f.ReadAt(buf, 1); n != 2 || !errors.Is(err, io.EOF) || string(buf[:n]) != "bc" {
		t.Fatalf("a short ReadAt: %d %v", n, err)
	}
	if err := f.Truncate(-1); err == nil {
		t.Fatal("Truncate(-1) succeeded")
	}
	ro, err := m.Open("d/a")
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Truncate(0); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Truncate of a read-only file: %v", err)
	}
	if got := readAll(t, m, "d/a"); got != "abc" {
		t.Fatalf("failed operations changed the file to %q", got)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ro.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("a second Close: %v", err)
	}
}

// Rule: DropCache counts as unsynced only bytes not durable now: nothing
// after a Sync, and bytes past the durable size once.
func TestDropCacheCountsOnlyWhatIsUnsyncedNow(t *testing.T) {
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
	if err := f.DropCache(0, 100); err != nil {
		t.Fatal(err)
	}
	if d, u := m.CacheDrops("f"); d != 100 || u != 0 {
		t.Fatalf("after a Sync: %d dropped, %d unsynced; want 100, 0", d, u)
	}
	if _, err := f.WriteAt(make([]byte, 10), 100); err != nil {
		t.Fatal(err)
	}
	if err := f.DropCache(100, 10); err != nil {
		t.Fatal(err)
	}
	if d, u := m.CacheDrops("f"); d != 110 || u != 10 {
		t.Fatalf("after an unsynced append: %d dropped, %d unsynced; want 110, 10", d, u)
	}
}

// MkdirAll through a file fails and creates nothing: no directory below
// the file, none above it that was missing (as mkdir -p).
func TestMkdirAllThroughAFileCreatesNothing(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("d/a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := m.MkdirAll("d/a/x/y"); err == nil {
		t.Fatal("MkdirAll through a file succeeded")
	}
	for _, dir := range []string{"d/a/x", "d/a/x/y"} {
		if _, err := m.List(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("List(%s) after the failed MkdirAll: %v, want not exist", dir, err)
		}
	}
}
