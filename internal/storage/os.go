package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/beneath"
	"github.com/quiverstorage/quiver/internal/fscap"
)

// osFS is the operating system's FS: a beneath.Root.
type osFS struct {
	root *beneath.Root
}

var (
	_ FS      = (*osFS)(nil)
	_ File    = (*osFile)(nil)
	_ Batcher = (*osFile)(nil)
)

// OpenOS opens dir as the root of an FS of the operating system. dir itself
// is resolved as given; nothing beneath it follows a symbolic link.
func OpenOS(dir string) (FS, error) {
	r, err := beneath.Open(dir)
	if err != nil {
		return nil, Classify(err)
	}
	return &osFS{root: r}, nil
}

// PrepareDir makes dir (and its parents) when it is absent.
func PrepareDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return Classify(os.MkdirAll(dir, 0o755))
	}
	return nil
}

// CheckMountPoint reports whether dir is a mount point (its device is not
// its parent's, or it is the root).
func CheckMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Stat(filepath.Join(dir, ".."), &parent); err != nil {
		return false, &fs.PathError{Op: "stat", Path: filepath.Dir(dir), Err: err}
	}
	return !(st.Dev == parent.Dev && st.Ino != parent.Ino), nil
}

func (o *osFS) Path() string { return o.root.Path() }
func (o *osFS) Close() error { return o.root.Close() }

func (o *osFS) OpenFile(rel string, flag int, perm fs.FileMode) (File, error) {
	f, err := o.root.OpenFile(rel, flag, perm)
	if err != nil {
		return nil, Classify(err)
	}
	return newOSFile(f), nil
}

func (o *osFS) OpenRegular(rel string, flag int) (File, error) {
	f, err := o.root.OpenRegular(rel, flag)
	if err != nil {
		return nil, Classify(err)
	}
	return newOSFile(f), nil
}

func (o *osFS) ReadDir(rel string) ([]fs.DirEntry, error) {
	es, err := o.root.ReadDir(rel)
	return es, Classify(err)
}

func (o *osFS) Lstat(rel string) (fs.FileInfo, error) {
	fi, err := o.root.Lstat(rel)
	return fi, Classify(err)
}

func (o *osFS) Mkdir(rel string, perm fs.FileMode) error {
	return Classify(o.root.Mkdir(rel, perm))
}
func (o *osFS) Remove(rel string) error    { return Classify(o.root.Remove(rel)) }
func (o *osFS) RemoveAll(rel string) error { return Classify(o.root.RemoveAll(rel)) }
func (o *osFS) Rename(oldrel, newrel string) error {
	return Classify(o.root.Rename(oldrel, newrel))
}

func (o *osFS) SyncDir(rel string) error {
	if SkipSync() {
		return nil
	}
	d, err := o.root.OpenDir(rel)
	if err != nil {
		return Classify(fmt.Errorf("sync dir: %w", err))
	}
	defer d.Close()
	err = d.Sync()
	if err == nil {
		err = confirmSynced(int(d.Fd()))
	}
	if err != nil {
		return Classify(fmt.Errorf("sync dir %s: %w", d.Name(), err))
	}
	return nil
}

// confirmSynced is called after a sync of fd returned success, and fails
// if the filesystem was shut down meanwhile, so that the sync did not make
// anything durable (ErrIO).
//
// XFS's fsync and fdatasync check for a shutdown before they look at the
// log; a forced shutdown that lands after that check (an I/O error or
// corruption found in metadata, or `xfs_io -x -c shutdown`) throws away the
// log's in-memory checkpoint and unpins the inode, and the sync, finding
// nothing pinned, returns 0 without forcing the log. The writes it was
// asked to make durable, a copy-on-write remap among them, are then gone
// when the filesystem is mounted again. test/cloneisolation's probe shuts
// XFS down at random times: without this check it lost acknowledged
// flushes about once in 100 shutdowns (host kernel 6.18), with it none in
// 1,286. The shutdown flag is set before the checkpoint is thrown away, and
// XFS's getattr fails with EIO once it is set, so one fstat after the sync
// tells. It costs one system call per sync.
func confirmSynced(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("the filesystem failed during the sync: %w", err)
	}
	return nil
}

func (o *osFS) Usage() (int64, int64, error) {
	total, free, err := fscap.Usage(o.root.Path())
	return total, free, Classify(err)
}

func (o *osFS) Allocated(rel string) (int64, error) {
	fi, err := o.root.Lstat(rel)
	if err != nil {
		return 0, Classify(err)
	}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		return st.Blocks * 512, nil
	}
	return 0, nil
}

func (o *osFS) Extents(rel string) ([]Extent, error) {
	f, err := o.OpenRegular(rel, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	osf, _ := OSFile(f)
	ext, err := fscap.ExtentMap(osf)
	return ext, Classify(err)
}

func (o *osFS) Probe(rel string) (Caps, error) {
	// The probe directory is checked beneath the root first: fscap opens
	// its probe files by path.
	fi, err := o.root.Lstat(rel)
	if err != nil {
		return Caps{}, Classify(err)
	}
	if !fi.IsDir() {
		return Caps{}, fmt.Errorf("probe %s: not a directory: %w", rel, ErrEscape)
	}
	caps, err := fscap.Probe(filepath.Join(o.root.Path(), rel))
	return caps, Classify(err)
}

// osFile is an open file of the operating system.
type osFile struct {
	f  *os.File
	fd uintptr // f's descriptor, for the raw RWF_NOWAIT calls

	// ringMu guards the file's io_uring (uring.go), set up by the first
	// batch; ringOff is set when that failed, and batches then take one
	// system call per IO. ringWrites is whether the filesystem takes
	// RWF_NOWAIT writes (0: not known yet, 1: yes, -1: no), which the ring
	// cannot tell: where pwritev2 fails with EOPNOTSUPP (ext4), an
	// io_uring write fails with EAGAIN.
	ringMu     sync.Mutex
	ring       *ring
	ringOff    bool
	ringWrites int8
}

func newOSFile(f *os.File) *osFile { return &osFile{f: f, fd: f.Fd()} }

// OSFile returns the *os.File under f, if it is (or wraps) a file of the
// operating system.
func OSFile(f File) (*os.File, bool) {
	o, ok := Unwrap(f).(*osFile)
	if !ok {
		return nil, false
	}
	return o.f, true
}

func (o *osFile) Name() string               { return o.f.Name() }
func (o *osFile) Stat() (fs.FileInfo, error) { fi, err := o.f.Stat(); return fi, Classify(err) }
func (o *osFile) Chmod(m fs.FileMode) error  { return Classify(o.f.Chmod(m)) }
func (o *osFile) Truncate(size int64) error  { return Classify(o.f.Truncate(size)) }

func (o *osFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := o.f.ReadAt(p, off)
	return n, Classify(err)
}

func (o *osFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := o.f.WriteAt(p, off)
	return n, Classify(err)
}

func (o *osFile) Sync() error {
	if SkipSync() {
		return nil
	}
	err := retryEINTR(func() error { return unix.Fdatasync(int(o.fd)) })
	if err == nil {
		err = confirmSynced(int(o.fd))
	}
	if err != nil {
		return Classify(&fs.PathError{Op: "fdatasync", Path: o.f.Name(), Err: err})
	}
	return nil
}

func (o *osFile) TryReadAt(p []byte, off int64) (int, error) {
	return nowaitResult(nowaitIO(unix.SYS_PREADV2, o.fd, p, off))
}

func (o *osFile) TryWriteAt(p []byte, off int64) (int, error) {
	return nowaitResult(nowaitIO(unix.SYS_PWRITEV2, o.fd, p, off))
}

func (o *osFile) Close() error {
	o.ringMu.Lock()
	if o.ring != nil {
		o.ring.close()
		o.ring = nil
	}
	o.ringOff = true
	o.ringMu.Unlock()
	return Classify(o.f.Close())
}

// TryBatch tries ios through the file's io_uring when there is more than
// one and the ring is free; a batch that finds it taken by another
// goroutine does not wait for it but makes one system call per IO.
func (o *osFile) TryBatch(ios []IO) {
	if len(ios) > 1 && o.ringMu.TryLock() {
		rest := o.batchRing(ios)
		o.ringMu.Unlock()
		ios = ios[rest:]
	}
	for i := range ios {
		io := &ios[i]
		if io.Err == nil {
			trap := uintptr(unix.SYS_PREADV2)
			if io.Write {
				trap = unix.SYS_PWRITEV2
			}
			io.N, io.Err = nowaitResult(nowaitIO(trap, o.fd, io.P, io.Off))
		}
	}
}

// batchRing runs ios through the ring, up to ringEntries at a time, and
// returns the index of the first IO it did not run (len(ios) when it ran
// all); ringMu is held.
func (o *osFile) batchRing(ios []IO) int {
	if o.ring == nil {
		if o.ringOff || IOUring() != nil {
			return 0
		}
		r, err := newRing(sysSetup)
		if err != nil {
			o.ringOff = true // out of memory or descriptors: one call per IO
			return 0
		}
		o.ring = r
	}
	for start := 0; start < len(ios); start += ringEntries {
		chunk := ios[start:min(start+ringEntries, len(ios))]
		for i := range chunk {
			io := &chunk[i]
			switch {
			case io.Err != nil:
			case len(io.P) == 0:
				io.N = 0
			case io.Write && o.ringWrites < 0:
				io.N, io.Err = 0, errTryUnsupported
			case io.Write:
				o.ring.prep(uringOpWrite, o.fd, io.P, io.Off, uint64(i))
			default:
				o.ring.prep(uringOpRead, o.fd, io.P, io.Off, uint64(i))
			}
		}
		if o.ring.submit(chunk) != nil {
			return start
		}
		if o.ringWrites == 0 {
			o.learnWrites(chunk)
		}
	}
	return len(ios)
}

// learnWrites finds out, from the first write of a batch that the ring
// refused with EAGAIN, whether the filesystem takes RWF_NOWAIT writes at
// all: it tries that write again with pwritev2, whose answer tells (and
// replaces the ring's). Where it does not, later batches refuse writes
// with ErrNotSupported at once, as TryWriteAt does.
func (o *osFile) learnWrites(ios []IO) {
	for i := range ios {
		io := &ios[i]
		switch {
		case !io.Write:
		case io.Err == nil:
			o.ringWrites = 1
			return
		case io.Err == errTryAgain:
			io.N, io.Err = nowaitResult(nowaitIO(unix.SYS_PWRITEV2, o.fd, io.P, io.Off))
			if io.Err != errTryUnsupported {
				o.ringWrites = 1
				return
			}
			o.ringWrites = -1
			for j := i + 1; j < len(ios); j++ {
				if ios[j].Write && ios[j].Err == errTryAgain {
					ios[j].Err = errTryUnsupported
				}
			}
			return
		}
	}
}

// nowaitIO calls preadv2 or pwritev2 (trap) with RWF_NOWAIT on one buffer,
// as a raw system call: with RWF_NOWAIT the kernel never sleeps, so the Go
// scheduler need not hand the thread's P away, and nothing is allocated
// (unix.Preadv2 builds its iovec array on the heap).
func nowaitIO(trap, fd uintptr, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	iov := unix.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	// pos_l, pos_h: on 64-bit Linux the whole offset goes in pos_l.
	n, _, errno := syscall.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&iov)), 1, uintptr(off), 0, unix.RWF_NOWAIT)
	runtime.KeepAlive(p)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Preallocated errors of the Try path, which must not allocate.
var (
	errTryAgain       error = &Error{Kind: ErrWouldBlock, Err: unix.EAGAIN}
	errTryUnsupported error = &Error{Kind: ErrNotSupported, Err: unix.EOPNOTSUPP}
)

func nowaitResult(n int, err error) (int, error) {
	switch {
	case err == nil:
		return n, nil
	case err == unix.EAGAIN:
		return n, errTryAgain
	case err == unix.EOPNOTSUPP, err == unix.EINVAL:
		return n, errTryUnsupported
	default:
		return n, Classify(err)
	}
}

func (o *osFile) Punch(off, length int64) error {
	return o.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

func (o *osFile) ZeroRange(off, length int64) error {
	return o.fallocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

func (o *osFile) fallocate(mode uint32, off, length int64) error {
	err := retryEINTR(func() error { return unix.Fallocate(int(o.fd), mode, off, length) })
	if err != nil {
		return Classify(&fs.PathError{Op: "fallocate", Path: o.f.Name(), Err: err})
	}
	return nil
}

func (o *osFile) seek(off int64, whence int) (int64, error) {
	var pos int64
	err := retryEINTR(func() error {
		var err error
		pos, err = unix.Seek(int(o.fd), off, whence)
		return err
	})
	switch {
	case err == nil:
		return pos, nil
	case errors.Is(err, unix.ENXIO):
		return 0, ErrNoData
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return 0, notSupported(&fs.PathError{Op: "lseek", Path: o.f.Name(), Err: err})
	default:
		return 0, Classify(&fs.PathError{Op: "lseek", Path: o.f.Name(), Err: err})
	}
}

func (o *osFile) SeekData(off int64) (int64, error) { return o.seek(off, unix.SEEK_DATA) }
func (o *osFile) SeekHole(off int64) (int64, error) { return o.seek(off, unix.SEEK_HOLE) }

// osPair returns the OS files of src, or ErrNotSupported when src is not
// one (a twin's file cannot share extents with an OS file).
func osPair(src File) (*os.File, error) {
	s, ok := OSFile(src)
	if !ok {
		return nil, notSupported(errors.New("source is not a file of the operating system"))
	}
	return s, nil
}

func (o *osFile) Clone(src File) error {
	s, err := osPair(src)
	if err != nil {
		return err
	}
	return classifyClone(fscap.Reflink(o.f, s))
}

func (o *osFile) CloneRange(src File, off, length int64) error {
	s, err := osPair(src)
	if err != nil {
		return err
	}
	return classifyClone(fscap.ReflinkRange(o.f, s, off, length))
}

func classifyClone(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNotSupported) {
		return notSupported(err)
	}
	return Classify(err)
}

func (o *osFile) CopyRange(src File, off, length int64) (int64, error) {
	s, err := osPair(src)
	if err != nil {
		return 0, err
	}
	var done int
	err = retryEINTR(func() error {
		roff, woff := off, off
		var err error
		done, err = unix.CopyFileRange(int(s.Fd()), &roff, int(o.fd), &woff, int(length), 0)
		return err
	})
	runtime.KeepAlive(s)
	switch {
	case err == nil:
		return int64(done), nil
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.EINVAL), errors.Is(err, unix.EBADF):
		return int64(done), notSupported(&fs.PathError{Op: "copy_file_range", Path: o.f.Name(), Err: err})
	default:
		return int64(done), Classify(&fs.PathError{Op: "copy_file_range", Path: o.f.Name(), Err: err})
	}
}

func (o *osFile) Solid(off, length int64) (bool, error) {
	ok, err := fscap.Solid(o.f, off, length)
	return ok, Classify(err)
}

func (o *osFile) Sharing(off, length int64) (bool, bool, error) {
	data, shared, err := fscap.Sharing(o.f, off, length)
	return data, shared, Classify(err)
}

func (o *osFile) SameBlocks(other File, off, length int64) (bool, error) {
	g, ok := other.(*osFile)
	if !ok {
		return false, &Error{Kind: ErrNotSupported, Err: fmt.Errorf("%s: blocks compared with a %T", o.f.Name(), other)}
	}
	same, err := fscap.SameBlocks(o.f, g.f, off, length)
	return same, Classify(err)
}

func (o *osFile) Differences(other File, size int64) ([][2]int64, error) {
	g, ok := other.(*osFile)
	if !ok {
		return nil, &Error{Kind: ErrNotSupported, Err: fmt.Errorf("%s: extents compared with a %T", o.f.Name(), other)}
	}
	rs, err := fscap.Differences(o.f, g.f, size)
	return rs, Classify(err)
}

func (o *osFile) SharedBlocks(other File, size int64) ([][2]int64, error) {
	g, ok := other.(*osFile)
	if !ok {
		return nil, &Error{Kind: ErrNotSupported, Err: fmt.Errorf("%s: extents compared with a %T", o.f.Name(), other)}
	}
	rs, err := fscap.SharedBlocks(o.f, g.f, size)
	return rs, Classify(err)
}

func (o *osFile) SetExtentSizeHint(bytes uint32) error {
	return Classify(fscap.SetExtentSizeHint(o.f, bytes))
}

func (o *osFile) SetCowExtentSize(bytes uint32) error {
	return Classify(fscap.SetCowExtentSize(o.f, bytes))
}

func (o *osFile) CowExtentSize() (uint32, error) {
	n, err := fscap.CowExtentSize(o.f)
	return n, Classify(err)
}

func (o *osFile) Advise(off, length int64, advice Advice) error {
	a := unix.FADV_WILLNEED
	if advice == AdviseDontNeed {
		a = unix.FADV_DONTNEED
	}
	return Classify(unix.Fadvise(int(o.fd), off, length, a))
}

func (o *osFile) Lock() error {
	err := retryEINTR(func() error { return unix.Flock(int(o.fd), unix.LOCK_EX|unix.LOCK_NB) })
	if errors.Is(err, unix.EWOULDBLOCK) {
		return &Error{Kind: ErrLocked, Err: err}
	}
	return Classify(err)
}

func retryEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}
