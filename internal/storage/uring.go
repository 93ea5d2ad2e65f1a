package storage

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A ring is a small io_uring instance (io_uring_setup(2), io_uring_enter(2),
// include/uapi/linux/io_uring.h): a submission queue and a completion queue
// shared with the kernel through one mapping, and an array of submission
// entries through a second. It is used by one goroutine at a time (its
// owner holds a lock) and only for requests that never wait (RWF_NOWAIT),
// so that one io_uring_enter runs a whole batch of them inline.

// Constants of the io_uring ABI used here.
const (
	uringOpRead  = 22 // IORING_OP_READ (Linux 5.6)
	uringOpWrite = 23 // IORING_OP_WRITE

	uringSetupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL (5.18): an SQE that fails does not stop the batch

	uringFeatSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP (5.4)
	uringFeatNodrop     = 1 << 1 // IORING_FEAT_NODROP

	uringEnterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

	uringOffSQRing = 0          // IORING_OFF_SQ_RING
	uringOffSQEs   = 0x10000000 // IORING_OFF_SQES
)

// uringParams is struct io_uring_params (120 bytes).
type uringParams struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        uringSQOffsets
	cqOff        uringCQOffsets
}

// uringSQOffsets is struct io_sqring_offsets.
type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// uringCQOffsets is struct io_cqring_offsets.
type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// uringSQE is struct io_uring_sqe (64 bytes).
type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

// uringCQE is struct io_uring_cqe (16 bytes).
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// ringEntries is the size of each ring: the most IOs one enter submits.
const ringEntries = 64

type ring struct {
	fd      int
	rings   []byte // the SQ and CQ rings (one mapping: IORING_FEAT_SINGLE_MMAP)
	sqeMem  []byte
	sqTail  *uint32
	sqMask  uint32
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	sqes    *[ringEntries]uringSQE
	cqes    unsafe.Pointer // cq entries of uringCQE
	pending uint32         // SQEs written since the last submit
}

// setupFunc is io_uring_setup(2); tests pass one that fails.
type setupFunc func(entries uint32, p *uringParams) (int, error)

func sysSetup(entries uint32, p *uringParams) (int, error) {
	fd, _, errno := syscall.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// newRing sets up a ring of ringEntries entries. It fails where the kernel
// has no io_uring (ENOSYS), refuses it (EPERM: kernel.io_uring_disabled,
// seccomp) or lacks what this ring needs (Linux 5.18).
func newRing(setup setupFunc) (*ring, error) {
	p := uringParams{flags: uringSetupSubmitAll}
	fd, err := setup(ringEntries, &p)
	if err != nil {
		return nil, fmt.Errorf("io_uring_setup: %w", err)
	}
	r := &ring{fd: fd}
	if err := r.mapRings(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mapRings(p *uringParams) error {
	if p.features&(uringFeatSingleMmap|uringFeatNodrop) != uringFeatSingleMmap|uringFeatNodrop {
		return fmt.Errorf("io_uring: features %#x lack SINGLE_MMAP or NODROP: %w", p.features, unix.ENOSYS)
	}
	if p.sqEntries != ringEntries || p.cqEntries < ringEntries {
		return fmt.Errorf("io_uring: %d/%d entries, not %d: %w", p.sqEntries, p.cqEntries, ringEntries, unix.EINVAL)
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(uringCQE{})))
	var err error
	r.rings, err = unix.Mmap(r.fd, uringOffSQRing, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("io_uring: mmap rings: %w", err)
	}
	r.sqeMem, err = unix.Mmap(r.fd, uringOffSQEs, ringEntries*int(unsafe.Sizeof(uringSQE{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("io_uring: mmap SQEs: %w", err)
	}
	base := unsafe.Pointer(&r.rings[0])
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Add(base, p.cqOff.cqes)
	r.sqes = (*[ringEntries]uringSQE)(unsafe.Pointer(&r.sqeMem[0]))
	// Slot i of the SQ ring always names SQE i: the SQEs are used in ring
	// order, so the array is written once.
	array := unsafe.Slice((*uint32)(unsafe.Add(base, p.sqOff.array)), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	return nil
}

func (r *ring) close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
		r.sqeMem = nil
	}
	if r.rings != nil {
		_ = unix.Munmap(r.rings)
		r.rings = nil
	}
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

// prep writes the next SQE: a read or write of p at off on fd with
// RWF_NOWAIT (or a NOP), tagged with tag. At most ringEntries SQEs are written between
// two submits.
func (r *ring) prep(op uint8, fd uintptr, p []byte, off int64, tag uint64) {
	tail := atomic.LoadUint32(r.sqTail) + r.pending
	s := &r.sqes[tail&r.sqMask]
	*s = uringSQE{
		opcode:   op,
		fd:       int32(fd),
		off:      uint64(off),
		addr:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))),
		len:      uint32(len(p)),
		userData: tag,
	}
	if op != uringOpNop {
		s.rwFlags = unix.RWF_NOWAIT
	}
	r.pending++
}

// submit hands the prepared SQEs to the kernel and stores each completion
// in ios (the tag of an SQE is its index there; N and Err as TryReadAt
// gives them). It returns once all have completed, since the
// kernel writes into their buffers until then. RWF_NOWAIT requests complete
// inside io_uring_enter, so the first, raw, call normally reaps them all;
// any left over are waited for with an ordinary (blocking) system call.
func (r *ring) submit(ios []IO) error {
	n := r.pending
	if n == 0 {
		return nil
	}
	r.pending = 0
	atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)+n)
	submitted, _, errno := syscall.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), 0, 0, 0, 0)
	runtime.KeepAlive(ios)
	if errno != 0 {
		// Nothing was taken (with SUBMIT_ALL an error means none was):
		// take the SQEs back.
		atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)-n)
		return fmt.Errorf("io_uring_enter: %w", errno)
	}
	n = uint32(submitted)
	for reaped := r.reap(ios); reaped < n; reaped += r.reap(ios) {
		_, _, errno := syscall.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(n-reaped), uringEnterGetEvents, 0, 0)
		if errno != 0 && errno != unix.EINTR && errno != unix.EAGAIN && errno != unix.EBUSY {
			// The IOs are still the kernel's: their buffers cannot be
			// handed back before they complete.
			panic(fmt.Sprintf("io_uring_enter: waiting for %d completions: %v", n-reaped, errno))
		}
	}
	runtime.KeepAlive(ios)
	return nil
}

// reap stores each completion in the CQ ring in ios and returns how many
// there were.
func (r *ring) reap(ios []IO) uint32 {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	for i := head; i != tail; i++ {
		c := (*uringCQE)(unsafe.Add(r.cqes, uintptr(i&r.cqMask)*unsafe.Sizeof(uringCQE{})))
		if c.userData >= uint64(len(ios)) {
			continue // the probe's NOP
		}
		io := &ios[c.userData]
		if c.res < 0 {
			io.N, io.Err = nowaitResult(0, syscall.Errno(-c.res))
		} else {
			io.N, io.Err = int(c.res), nil
		}
	}
	atomic.StoreUint32(r.cqHead, tail)
	return tail - head
}

const uringOpNop = 0 // IORING_OP_NOP

// ringState is io_uring's verdict for this process, decided once.
var ringState struct {
	once sync.Once
	off  atomic.Bool // DisableIOUring was called
	err  error       // why io_uring is not used; nil when it is
}

// DisableIOUring makes batches take one system call per IO (RWF_NOWAIT
// preadv2 and pwritev2) instead of io_uring. It takes effect if called
// before the first IOUring, at the start of the process.
func DisableIOUring() { ringState.off.Store(true) }

// IOUring reports whether Batcher.TryBatch of the operating system's files
// uses io_uring: nil if it does, else why not (switched off, or the kernel
// has none, refuses it or lacks a feature). The first call decides, by
// setting up a ring and running a NOP through it; every later call returns
// the same.
func IOUring() error {
	ringState.once.Do(func() {
		if ringState.off.Load() {
			ringState.err = errRingOff
			return
		}
		ringState.err = probeRing(sysSetup)
	})
	return ringState.err
}

// errRingOff is the reason given when io_uring was switched off.
var errRingOff = errors.New("io_uring switched off")

// probeRing sets up a ring with setup and runs a NOP through it.
func probeRing(setup setupFunc) error {
	r, err := newRing(setup)
	if err != nil {
		return err
	}
	defer r.close()
	r.prep(uringOpNop, 0, nil, 0, ^uint64(0))
	return r.submit(nil)
}
