// Package faultio is the error-injecting twin of the storage layer
// (internal/storage) for tests: an FS that passes every call to another FS
// (usually the operating system's) until a test arms a fault, and then fails
// the way a failing device or a full or remounted filesystem makes the
// kernel fail: ENOSPC after N bytes, EIO on the Nth fdatasync, directory
// sync or read, a short write, a read-only remount (EROFS on every change).
// The pool takes it as pool.Options.FS.
//
// Imports from quiver: storage.
package faultio

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/storage"
)

// FS wraps an FS with faults. It is safe for concurrent use.
type FS struct {
	storage.FS
	mu       sync.Mutex
	syncs    int // file fdatasyncs attempted
	dirSyncs int // directory syncs attempted
	reads    int // reads attempted
	writes   int // writes attempted
	failAt   int // fail the file sync with this number (1-based), 0: none
	syncErr  error
	dirAt    int // fail the directory sync with this number, 0: none
	dirErr   error
	readAt   int // fail the read with this number, 0: none
	readErr  error
	shortAt  int // the write with this number stores half and fails, 0: none
	limited  bool
	room     int64 // bytes writes may still add while limited
	readOnly bool  // remounted read-only: every change fails with EROFS
	failures int   // faults injected
	held     chan struct{}
	entered  chan struct{}
}

var (
	_ storage.FS   = (*FS)(nil)
	_ storage.File = (*file)(nil)
)

// New returns an FS over inner with no fault armed.
func New(inner storage.FS) *FS { return &FS{FS: inner} }

// FailSync makes the nth file fdatasync from now (1: the next) fail with
// err, having done nothing. Like Linux, it reports a failure once: the syncs
// after it succeed, which is why the caller must remember it.
func (f *FS) FailSync(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAt, f.syncErr = f.syncs+n, err
}

// FailDirSync makes the nth directory sync from now fail with err.
func (f *FS) FailDirSync(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dirAt, f.dirErr = f.dirSyncs+n, err
}

// FailRead makes the nth read from now fail with err.
func (f *FS) FailRead(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readAt, f.readErr = f.reads+n, err
}

// ShortWrite makes the nth write from now store only the first half of its
// bytes and fail with io.ErrShortWrite.
func (f *FS) ShortWrite(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shortAt = f.writes + n
}

// LimitWrites lets writes store n more bytes; a write that does not fit
// stores what does and fails with ENOSPC, as pwrite on a full filesystem.
// A negative n lifts the limit.
func (f *FS) LimitWrites(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limited, f.room = n >= 0, n
}

// RemountReadOnly makes the filesystem read-only (on) or writable again:
// while read-only, every write, create, rename, removal, mkdir and change
// of size or allocation fails with EROFS, as after the kernel remounted a
// filesystem read-only on an error. Reads and syncs work.
func (f *FS) RemountReadOnly(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readOnly = on
}

// HoldSyncs makes every file fdatasync from now on wait until release is
// called; entered receives a value as each one starts to wait.
func (f *FS) HoldSyncs() (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held, in := make(chan struct{}), make(chan struct{}, 64)
	f.held, f.entered = held, in
	var once sync.Once
	return in, func() {
		once.Do(func() {
			f.mu.Lock()
			f.held, f.entered = nil, nil
			f.mu.Unlock()
			close(held)
		})
	}
}

// Syncs returns how many file fdatasyncs were attempted.
func (f *FS) Syncs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs
}

// Failures returns how many faults were injected.
func (f *FS) Failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures
}

// erofs fails a change while the filesystem is read-only.
func (f *FS) erofs(op, name string) error {
	f.mu.Lock()
	ro := f.readOnly
	if ro {
		f.failures++
	}
	f.mu.Unlock()
	if ro {
		return storage.Classify(&fs.PathError{Op: op, Path: name, Err: unix.EROFS})
	}
	return nil
}

func (f *FS) wrap(sf storage.File, err error) (storage.File, error) {
	if err != nil {
		return nil, err
	}
	return &file{File: sf, fs: f}, nil
}

func (f *FS) OpenFile(rel string, flag int, perm fs.FileMode) (storage.File, error) {
	if flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC) != 0 {
		if err := f.erofs("open", rel); err != nil {
			return nil, err
		}
	}
	return f.wrap(f.FS.OpenFile(rel, flag, perm))
}

func (f *FS) OpenRegular(rel string, flag int) (storage.File, error) {
	if flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		if err := f.erofs("open", rel); err != nil {
			return nil, err
		}
	}
	return f.wrap(f.FS.OpenRegular(rel, flag))
}

func (f *FS) Mkdir(rel string, perm fs.FileMode) error {
	if err := f.erofs("mkdir", rel); err != nil {
		return err
	}
	return f.FS.Mkdir(rel, perm)
}

func (f *FS) Remove(rel string) error {
	if err := f.erofs("remove", rel); err != nil {
		return err
	}
	return f.FS.Remove(rel)
}

func (f *FS) RemoveAll(rel string) error {
	if err := f.erofs("remove", rel); err != nil {
		return err
	}
	return f.FS.RemoveAll(rel)
}

func (f *FS) Rename(oldrel, newrel string) error {
	if err := f.erofs("rename", oldrel); err != nil {
		return err
	}
	return f.FS.Rename(oldrel, newrel)
}

func (f *FS) SyncDir(rel string) error {
	if storage.SkipSync() { // the mutation check: as if the call were not there
		return nil
	}
	f.mu.Lock()
	f.dirSyncs++
	fail := f.dirSyncs == f.dirAt
	if fail {
		f.failures++
	}
	err := f.dirErr
	f.mu.Unlock()
	if fail {
		return storage.Classify(&fs.PathError{Op: "sync dir", Path: rel, Err: err})
	}
	return f.FS.SyncDir(rel)
}

// file is a file of a faultio FS.
type file struct {
	storage.File
	fs *FS
}

func (f *file) Unwrap() storage.File { return f.File }

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	x := f.fs
	x.mu.Lock()
	x.reads++
	fail := x.reads == x.readAt
	if fail {
		x.failures++
	}
	err := x.readErr
	x.mu.Unlock()
	if fail {
		return 0, storage.Classify(&fs.PathError{Op: "read", Path: f.Name(), Err: err})
	}
	return f.File.ReadAt(p, off)
}

// TryReadAt always takes the ordinary path, so that ReadAt sees every read.
func (f *file) TryReadAt(p []byte, off int64) (int, error) {
	return 0, storage.ErrWouldBlock
}

// TryWriteAt always takes the ordinary path, so that WriteAt sees every
// write.
func (f *file) TryWriteAt(p []byte, off int64) (int, error) {
	return 0, storage.ErrWouldBlock
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.erofs("write", f.Name()); err != nil {
		return 0, err
	}
	x := f.fs
	x.mu.Lock()
	x.writes++
	fit := len(p)
	short := x.writes == x.shortAt
	if short {
		fit = len(p) / 2
	}
	if x.limited && int64(fit) > x.room {
		fit = int(x.room)
	}
	if x.limited {
		x.room -= int64(fit)
	}
	var fail error
	switch {
	case short:
		fail = io.ErrShortWrite
	case fit < len(p):
		fail = storage.Classify(&fs.PathError{Op: "write", Path: f.Name(), Err: unix.ENOSPC})
	}
	if fail != nil {
		x.failures++
	}
	x.mu.Unlock()
	n, err := f.File.WriteAt(p[:fit], off)
	if err == nil {
		err = fail
	}
	return n, err
}

func (f *file) Sync() error {
	if storage.SkipSync() { // the mutation check: as if the call were not there
		return nil
	}
	x := f.fs
	x.mu.Lock()
	x.syncs++
	fail := x.syncs == x.failAt
	err := x.syncErr
	if fail {
		x.failures++
	}
	held, entered := x.held, x.entered
	x.mu.Unlock()
	if held != nil {
		entered <- struct{}{}
		<-held
	}
	if fail {
		return storage.Classify(&fs.PathError{Op: "fdatasync", Path: f.Name(), Err: err})
	}
	return f.File.Sync()
}

func (f *file) changes(op string, fn func() error) error {
	if err := f.fs.erofs(op, f.Name()); err != nil {
		return err
	}
	return fn()
}

func (f *file) Truncate(size int64) error {
	return f.changes("truncate", func() error { return f.File.Truncate(size) })
}

func (f *file) Punch(off, length int64) error {
	return f.changes("fallocate", func() error { return f.File.Punch(off, length) })
}

func (f *file) ZeroRange(off, length int64) error {
	return f.changes("fallocate", func() error { return f.File.ZeroRange(off, length) })
}

func (f *file) Chmod(m fs.FileMode) error {
	return f.changes("chmod", func() error { return f.File.Chmod(m) })
}

func (f *file) Clone(src storage.File) error {
	return f.changes("clone", func() error { return f.File.Clone(storage.Unwrap(src)) })
}

func (f *file) CloneRange(src storage.File, off, length int64) error {
	return f.changes("clone", func() error { return f.File.CloneRange(storage.Unwrap(src), off, length) })
}

// CopyRange is not passed on: copies go through WriteAt, where the write
// faults are.
func (f *file) CopyRange(src storage.File, off, length int64) (int64, error) {
	return 0, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("faultio copies through WriteAt")}
}
