package vfs

import (
	"errors"
	"path/filepath"
	"testing"
)

// Both file systems hold a lock against a second taker until it is
// closed, and closing it twice frees nothing else.
func TestLockIsExclusiveUntilClosed(t *testing.T) {
	for _, c := range []struct {
		name string
		fs   FS
		file string
	}{
		{"os", OS(), filepath.Join(t.TempDir(), "LOCK")},
		{"mem", NewMem(), "/data/LOCK"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.fs.MkdirAll(filepath.Dir(c.file)); err != nil {
				t.Fatal(err)
			}
			first, err := c.fs.Lock(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.fs.Lock(c.file); !errors.Is(err, ErrLocked) {
				t.Fatalf("second Lock while the first holds it: %v, want ErrLocked", err)
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			second, err := c.fs.Lock(c.file)
			if err != nil {
				t.Fatalf("Lock after the holder closed: %v", err)
			}
			first.Close() // a stale holder's second Close must not free the new holder's lock
			if _, err := c.fs.Lock(c.file); !errors.Is(err, ErrLocked) {
				t.Fatalf("Lock after a stale Close: %v, want ErrLocked", err)
			}
			second.Close()
		})
	}
}

// A crash ends the process that held a MemFS lock: it is free after it,
// and it leaves no file behind.
func TestMemLockIsFreedByACrash(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("/data"); err != nil {
		t.Fatal(err)
	}
	old, err := m.Lock("/data/LOCK")
	if err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if _, err := m.Lock("/data/LOCK"); err != nil {
		t.Fatalf("Lock after a crash: %v", err)
	}
	old.Close() // the dead holder's Close frees nothing
	if _, err := m.Lock("/data/LOCK"); !errors.Is(err, ErrLocked) {
		t.Fatalf("Lock after the dead holder's Close: %v, want ErrLocked", err)
	}
	if names, _ := m.List("/data"); len(names) != 0 {
		t.Fatalf("a MemFS lock left entries %v", names)
	}
}
