package vfs

import (
	"bytes"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

const tmpfsMagic = 0x01021994 // TMPFS_MAGIC, statfs(2)

// resident counts the pages of f's first size bytes that are in the page
// cache (mincore(2) of a read-only mapping of it).
func resident(t *testing.T, f File, size int) int {
	t.Helper()
	m, err := syscall.Mmap(int(f.(osFile).Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	pages := (size + syscall.Getpagesize() - 1) / syscall.Getpagesize()
	vec := make([]byte, pages)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// DropCache takes synced pages of the range out of the page cache and
// leaves the rest; what the file holds does not change, synced or not.
func TestDropCacheReleasesSyncedPages(t *testing.T) {
	const size = 4 << 20
	dir := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err == nil && st.Type == tmpfsMagic {
		t.Skip("tmpfs: its pages are the file, there is no cache to drop")
	}
	f, err := OS().OpenRW(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	pages := size / syscall.Getpagesize()
	if n := resident(t, f, size); n < pages*9/10 {
		t.Skipf("only %d of %d pages cached after the write: this file system shows nothing", n, pages)
	}
	if err := f.DropCache(0, 0); err != nil { // an empty range, not "to the end"
		t.Fatal(err)
	}
	if n := resident(t, f, size); n < pages*9/10 {
		t.Fatalf("an empty DropCache dropped: %d of %d pages cached", n, pages)
	}
	if err := f.DropCache(0, size/2); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, f, size/2); n > pages/20 {
		t.Fatalf("%d of the %d dropped pages still cached", n, pages/2)
	}
	if n := resident(t, f, size); n < pages*9/20 {
		t.Fatalf("%d pages cached: the kept half went too", n)
	}
	if _, err := f.WriteAt([]byte("unsynced"), size/4); err != nil { // dirty, then dropped
		t.Fatal(err)
	}
	copy(data[size/4:], "unsynced")
	if err := f.DropCache(0, size); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the file's content changed")
	}
	f.Close()
	if err := f.DropCache(0, size); err == nil {
		t.Fatal("DropCache of a closed file succeeded")
	}
}
