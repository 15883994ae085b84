package vfs

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ringOrSkip returns the process's ring; machines without io_uring test
// only the fallback.
func ringOrSkip(t *testing.T) *uring {
	t.Helper()
	r := processRing()
	if r == nil {
		t.Skip("io_uring is not available here")
	}
	return r
}

// testRing is a ring of its own with the given entries (the process's
// ring must exist: ringOrSkip), torn down when the test ends.
func testRing(t *testing.T, entries uint32) *uring {
	t.Helper()
	ringOrSkip(t)
	r, err := newURing(entries)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.event.Close() // a test may have closed it already
		r.unmap()
		syscall.Close(r.fd)
	})
	return r
}

// syncsThroughRing writes and syncs a file of fsys three times and
// returns how many syncs the ring completed meanwhile.
func syncsThroughRing(t *testing.T, r *uring, fsys FS) uint64 {
	t.Helper()
	f, err := fsys.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := r.completed.Load()
	for i := 0; i < 3; i++ {
		if _, err := f.Write([]byte("durable")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	return r.completed.Load() - before
}

// Only a ParkedSync file system's files sync through the ring: a
// single-replica log's publish waits on its fsync alone, and the ring's
// extra wake-up would add to it.
func TestOnlyParkedSyncFilesSyncThroughTheRing(t *testing.T) {
	r := ringOrSkip(t)
	if n := syncsThroughRing(t, r, ParkedSync(OS())); n < 3 {
		t.Fatalf("%d of 3 syncs of a ParkedSync file went through the ring", n)
	}
	if n := syncsThroughRing(t, r, OS()); n != 0 {
		t.Fatalf("%d syncs of a plain OS file went through the ring", n)
	}
	if fsys := NewMem(); ParkedSync(fsys) != fsys {
		t.Fatal("ParkedSync changed the in-memory file system")
	}
}

// A failed fdatasync on a kernel worker is the caller's error, as a failed
// fdatasync(2) is.
func TestRingSyncReportsTheKernelsError(t *testing.T) {
	r := ringOrSkip(t)
	ok, err := r.fdatasync(-1)
	if !ok || !errors.Is(err, syscall.EBADF) {
		t.Fatalf("fdatasync(-1) through the ring = %v, %v; want EBADF", ok, err)
	}
	syncAfterCloseFails(t, ParkedSync(OS()), false)
}

// syncAfterCloseFails creates a file of fsys (written and synced first
// when write is set), closes it and checks that its Sync fails.
func syncAfterCloseFails(t *testing.T, fsys FS, write bool) {
	t.Helper()
	f, err := fsys.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	if write {
		if _, err := f.Write([]byte("durable")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := f.Sync(); err == nil {
		t.Fatal("Sync of a closed file succeeded")
	}
}

// More syncs at once than a ring has entries: it never holds more than
// that in flight (its completions could outnumber its CQ), the rest call
// fdatasync themselves, and every one succeeds.
func TestRingSyncsBeyondItsEntries(t *testing.T) {
	r := testRing(t, 2)
	dir := t.TempDir()
	var wg sync.WaitGroup
	var fellBack atomic.Int32
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			f, err := OS().Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			if _, err := f.Write([]byte("x")); err != nil {
				errs <- err
				return
			}
			ok, err := r.fdatasync(int(f.(osFile).Fd()))
			if !ok {
				fellBack.Add(1)
				err = f.Sync()
			}
			errs <- err
		}(i)
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		// Completions beyond the CQ's room wait in the kernel until an
		// io_uring_enter flushes them: too many in flight can hang.
		t.Fatal("64 concurrent syncs on a ring of 2 entries did not finish in 10 s")
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	peak, most := r.peak, r.inFlightMax
	r.mu.Unlock()
	if peak > most {
		t.Fatalf("%d syncs in flight at once on a ring of %d entries", peak, most)
	}
	if fellBack.Load() == 0 {
		t.Fatal("64 concurrent syncs all fitted a ring of 2 entries: the test shows nothing")
	}
}

// A sync in flight when the ring stops has no known outcome: it must be
// reported as failed, never as done, and later syncs fall back.
func TestStoppedRingFailsTheSyncsInFlight(t *testing.T) {
	r := testRing(t, 8)
	inFlight := make(chan int32, 1)
	r.mu.Lock()
	r.waiters[1<<40] = inFlight // a sync whose completion never comes
	r.mu.Unlock()
	r.event.Close() // the reaper's next read fails
	select {
	case res := <-inFlight:
		if res != resStopped {
			t.Fatalf("the waiter got %d, want resStopped", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter of a stopped ring was never answered")
	}
	f, err := OS().Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ok, _ := r.fdatasync(int(f.(osFile).Fd())); ok {
		t.Fatal("a stopped ring took a sync")
	}
}

func TestParkedSyncWithoutTheRing(t *testing.T) {
	uringDisabled.Store(true)
	defer uringDisabled.Store(false)
	syncAfterCloseFails(t, ParkedSync(OS()), true)
}

// An EINVAL completion (what a kernel lacking part of the request
// answers) turns the ring off: the caller's own fdatasync answers, now
// and for every later sync.
func TestRingRefusingARequestFallsBack(t *testing.T) {
	r := testRing(t, 8)
	var pipe [2]int
	if err := syscall.Pipe2(pipe[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pipe[0])
	defer syscall.Close(pipe[1])
	if ok, err := r.fdatasync(pipe[0]); ok { // fdatasync of a pipe: EINVAL
		t.Fatalf("the ring answered a refused request itself: %v", err)
	}
	f, err := OS().Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ok, _ := r.fdatasync(int(f.(osFile).Fd())); ok {
		t.Fatal("the ring took a sync after refusing one")
	}
}

func TestParkedSyncModeSaysWhichSyncRuns(t *testing.T) {
	if got := ParkedSyncMode(NewMem()); got != "" {
		t.Errorf("in-memory file system: %q, want \"\"", got)
	}
	want := "io_uring"
	if processRing() == nil {
		want = fmt.Sprintf("fdatasync (%v)", theRingErr)
	}
	if got := ParkedSyncMode(OS()); got != want {
		t.Errorf("OS: %q, want %q", got, want)
	}
	uringDisabled.Store(true)
	defer uringDisabled.Store(false)
	if got := ParkedSyncMode(OS()); got != "fdatasync (NEREUS_NO_IO_URING=1)" {
		t.Errorf("disabled: %q", got)
	}
}
