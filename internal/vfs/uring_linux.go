package vfs

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// An fdatasync through io_uring, for ParkedSync files: the goroutine that
// syncs parks on a channel instead of blocking its thread in a system
// call. A blocking fdatasync (0.3–2 ms here) enters the Go scheduler's
// system-call state: sysmon takes the thread's P away after 20 µs, starts
// another thread to run the P's goroutines and keeps polling at 20 µs
// while fsyncs come every few milliseconds, and the thread must win a P
// back when the call returns (PERFORMANCE, Rounds 8, 10 and 12). Here a
// kernel worker runs the fdatasync, its completion is posted to the ring
// and signalled on an eventfd that the runtime's netpoller watches, and
// one goroutine (uring.reap) hands each result to its waiter.
//
// One ring serves the process. When it cannot be set up (an old kernel,
// io_uring disabled by sysctl or a seccomp filter, NEREUS_NO_IO_URING=1)
// or has as many syncs in flight as it has entries, Sync calls
// fdatasync itself.

// Linux ABI (include/uapi/linux/io_uring.h; the system call numbers are
// the same on every architecture), and this file's ring size.
const (
	sysIOUringSetup    = 425
	sysIOUringEnter    = 426
	sysIOUringRegister = 427

	ioringOffSQRing       = 0
	ioringOffCQRing       = 0x8000000
	ioringOffSQEs         = 0x10000000
	ioringFeatSingleMmap  = 1 << 0
	ioringFeatNoDrop      = 1 << 1 // 5.5: completions are never dropped
	ioringFeatRWCurPos    = 1 << 3 // 5.6, as IOSQE_ASYNC
	ioringRegisterEventFD = 4
	ioringOpFsync         = 3
	ioringFsyncDatasync   = 1 << 0
	iosqeAsync            = 1 << 4 // straight to a kernel worker: an fsync cannot complete without blocking

	uringParamsBytes = 120
	sqeBytes         = 64
	cqeBytes         = 16
	uringEntries     = 64 // the process ring's: syncs in flight at once, more fall back
	// resStopped, in a waiter's channel, says the reaper stopped before
	// the sync's completion arrived.
	resStopped = math.MinInt32
)

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr (u64)
	cqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr (u64)
}

// Indexes into uringParams.sqOff and cqOff.
const (
	offHead, offTail, offRingMask = 0, 1, 2
	sqOffArray                    = 6
	cqOffCQEs                     = 5
)

// uringSQE is struct io_uring_sqe, as far as an fsync uses it.
type uringSQE struct {
	opcode     uint8
	flags      uint8
	ioprio     uint16
	fd         int32
	off        uint64
	addr       uint64
	len        uint32
	fsyncFlags uint32
	userData   uint64
	_          [3]uint64
}

// uringCQE is struct io_uring_cqe.
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uring is the process's ring. mu guards the submission side and waiters;
// the reaper alone moves the completion head.
type uring struct {
	fd      int
	event   *os.File // the eventfd, non-blocking: its reads park in the netpoller
	sqRing  []byte
	cqRing  []byte // sqRing itself with IORING_FEAT_SINGLE_MMAP
	sqes    []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []uringCQE

	mu      sync.Mutex
	next    uint64
	waiters map[uint64]chan int32 // at most inFlightMax: completions never outnumber the CQ
	// inFlightMax is the SQ's size (the CQ holds twice as many); peak is
	// the most syncs ever in flight at once.
	inFlightMax, peak int
	broken            error // why the ring is off (the reaper stopped, or it refused a request): every later sync falls back

	completed atomic.Uint64 // completions handed to their waiters
}

var (
	theRing     *uring
	theRingErr  error // why theRing is nil
	theRingOnce sync.Once
	// uringDisabled turns the ring off (NEREUS_NO_IO_URING=1, or a test).
	uringDisabled atomic.Bool
)

func init() {
	if os.Getenv("NEREUS_NO_IO_URING") == "1" {
		uringDisabled.Store(true)
	}
}

// processRing returns the process's ring, setting it up on first use; nil
// when io_uring is unavailable.
func processRing() *uring {
	if uringDisabled.Load() {
		return nil
	}
	theRingOnce.Do(func() {
		theRing, theRingErr = newURing(uringEntries)
	})
	return theRing
}

// ParkedSyncMode says how the files of ParkedSync(fsys) sync, for the
// node's start-up log: "io_uring", or "fdatasync" and why not io_uring;
// "" when fsys is not the operating system's.
func ParkedSyncMode(fsys FS) string {
	if _, ok := fsys.(osFS); !ok {
		return ""
	}
	if uringDisabled.Load() {
		return "fdatasync (NEREUS_NO_IO_URING=1)"
	}
	r := processRing()
	if r == nil {
		return fmt.Sprintf("fdatasync (%v)", theRingErr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken != nil {
		return fmt.Sprintf("fdatasync (%v)", r.broken)
	}
	return "io_uring"
}

func newURing(entries uint32) (*uring, error) {
	var p uringParams
	if unsafe.Sizeof(p) != uringParamsBytes || unsafe.Sizeof(uringSQE{}) != sqeBytes || unsafe.Sizeof(uringCQE{}) != cqeBytes {
		return nil, errors.New("vfs: io_uring structures of an unexpected size")
	}
	fd, _, errno := syscall.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &uring{fd: int(fd), waiters: make(map[uint64]chan int32), next: 1, inFlightMax: int(p.sqEntries)}
	fail := func(err error) (*uring, error) {
		r.unmap()
		syscall.Close(r.fd)
		return nil, err
	}
	if want := uint32(ioringFeatNoDrop | ioringFeatRWCurPos); p.features&want != want {
		return fail(fmt.Errorf("io_uring before Linux 5.6 (features %#x)", p.features))
	}
	sqSize := int(p.sqOff[sqOffArray]) + int(p.sqEntries)*4
	cqSize := int(p.cqOff[cqOffCQEs]) + int(p.cqEntries)*cqeBytes
	if p.features&ioringFeatSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqRing, err = syscall.Mmap(r.fd, ioringOffSQRing, sqSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap SQ ring: %w", err))
	}
	r.cqRing = r.sqRing
	if p.features&ioringFeatSingleMmap == 0 {
		if r.cqRing, err = syscall.Mmap(r.fd, ioringOffCQRing, cqSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
			return fail(fmt.Errorf("mmap CQ ring: %w", err))
		}
	}
	if r.sqes, err = syscall.Mmap(r.fd, ioringOffSQEs, int(p.sqEntries)*sqeBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap SQEs: %w", err))
	}
	u32 := func(ring []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&ring[off])) }
	r.sqHead, r.sqTail, r.sqMask = u32(r.sqRing, p.sqOff[offHead]), u32(r.sqRing, p.sqOff[offTail]), *u32(r.sqRing, p.sqOff[offRingMask])
	r.sqArray = unsafe.Slice(u32(r.sqRing, p.sqOff[sqOffArray]), p.sqEntries)
	r.cqHead, r.cqTail, r.cqMask = u32(r.cqRing, p.cqOff[offHead]), u32(r.cqRing, p.cqOff[offTail]), *u32(r.cqRing, p.cqOff[offRingMask])
	r.cqes = unsafe.Slice((*uringCQE)(unsafe.Pointer(&r.cqRing[p.cqOff[cqOffCQEs]])), p.cqEntries)

	efd, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return fail(fmt.Errorf("eventfd: %w", errno))
	}
	ev := int32(efd)
	if _, _, errno := syscall.Syscall6(sysIOUringRegister, uintptr(r.fd), ioringRegisterEventFD, uintptr(unsafe.Pointer(&ev)), 1, 0, 0); errno != 0 {
		syscall.Close(int(efd))
		return fail(fmt.Errorf("io_uring_register eventfd: %w", errno))
	}
	r.event = os.NewFile(efd, "io_uring eventfd") // non-blocking: pollable
	go r.reap()
	return r, nil
}

func (r *uring) unmap() {
	if r.sqes != nil {
		syscall.Munmap(r.sqes)
	}
	if r.cqRing != nil && &r.cqRing[0] != &r.sqRing[0] {
		syscall.Munmap(r.cqRing)
	}
	if r.sqRing != nil {
		syscall.Munmap(r.sqRing)
	}
}

// errRingStopped: the reaper stopped, so a sync in flight has no known
// outcome. Sync reports it as a failed sync: an fdatasync retried after
// one whose result is lost could report success for a write-back error
// the lost one consumed.
var errRingStopped = errors.New("io_uring completion reaper stopped")

// fdatasync runs fdatasync(fd) on a kernel worker and waits for it. ok is
// false when the ring takes no more syncs now (the caller syncs itself).
func (r *uring) fdatasync(fd int) (ok bool, err error) {
	r.mu.Lock()
	if r.broken != nil || len(r.waiters) >= r.inFlightMax {
		r.mu.Unlock()
		return false, nil
	}
	done := make(chan int32, 1)
	tail := *r.sqTail // only submitters (under mu) move the tail
	if tail-atomic.LoadUint32(r.sqHead) > r.sqMask {
		r.mu.Unlock()
		return false, nil
	}
	id := r.next
	r.next++
	idx := tail & r.sqMask
	sqe := (*uringSQE)(unsafe.Pointer(&r.sqes[int(idx)*sqeBytes]))
	*sqe = uringSQE{opcode: ioringOpFsync, flags: iosqeAsync, fd: int32(fd), fsyncFlags: ioringFsyncDatasync, userData: id}
	r.sqArray[idx] = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	r.waiters[id] = done
	r.peak = max(r.peak, len(r.waiters))
	for {
		// Short: an IOSQE_ASYNC request is queued for a worker, not run.
		n, _, errno := syscall.Syscall6(sysIOUringEnter, uintptr(r.fd), 1, 0, 0, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 || n != 1 {
			// Not submitted (the ring refuses it: no memory, for one):
			// take the entry back, and the caller syncs itself.
			atomic.StoreUint32(r.sqTail, tail)
			delete(r.waiters, id)
			r.mu.Unlock()
			return false, nil
		}
		break
	}
	r.mu.Unlock()
	res := <-done
	switch {
	case res == 0:
		return true, nil
	case res == -int32(syscall.EINTR):
		return false, nil // not run: the caller runs it
	case res == -int32(syscall.EINVAL) || res == -int32(syscall.EOPNOTSUPP):
		// The ring refused the request itself (a kernel that lacks
		// something of it); nothing ran, so a plain fdatasync is the
		// first to report on this file. The ring is not used again.
		r.mu.Lock()
		r.broken = fmt.Errorf("io_uring refused an fsync: %w", syscall.Errno(-res))
		r.mu.Unlock()
		return false, nil
	case res == resStopped:
		return true, errRingStopped
	default:
		return true, syscall.Errno(-res)
	}
}

// reap waits on the eventfd and hands every completion to its waiter. If
// the eventfd fails the ring is broken: waiters get errRingStopped and
// later syncs fall back to fdatasync.
func (r *uring) reap() {
	var buf [8]byte // the eventfd's counter
	for {
		_, err := r.event.Read(buf[:])
		r.mu.Lock()
		head := *r.cqHead
		for tail := atomic.LoadUint32(r.cqTail); head != tail; head++ {
			c := r.cqes[head&r.cqMask]
			if w, ok := r.waiters[c.userData]; ok {
				delete(r.waiters, c.userData)
				// Counted before the hand-off: a waiter that has its
				// result sees its sync in the count.
				r.completed.Add(1)
				w <- c.res
			}
		}
		atomic.StoreUint32(r.cqHead, head)
		if err != nil {
			r.broken = fmt.Errorf("%w: %w", errRingStopped, err)
			for id, w := range r.waiters {
				delete(r.waiters, id)
				w <- resStopped
			}
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}
