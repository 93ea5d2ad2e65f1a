// Package faultio is an error-injecting twin of pool.DiskIO for tests: the
// pool's disk writes and syncs go through it (pool.Options.DiskIO) and fail
// when a test says so, the way a failing device makes the kernel fail them.
//
// It imports only the standard library and x/sys, so that tests of any
// package, pool's own included, can use it.
//
// Imports from quiver: nothing.
package faultio

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// IO passes writes and syncs to the operating system until a fault is
// armed. It is safe for concurrent use.
type IO struct {
	mu       sync.Mutex
	syncs    int   // fdatasyncs attempted
	failAt   int   // fail the fdatasync with this number (1-based), 0: none
	syncErr  error // what it fails with
	limited  bool
	room     int64 // bytes writes may still add while limited
	failures int   // faults injected
	held     chan struct{}
	entered  chan struct{}
}

// New returns an IO with no fault armed.
func New() *IO { return &IO{} }

// FailSync makes the nth fdatasync from now (1: the next) fail with err,
// having done nothing. Like Linux, it reports a failure once: the syncs after
// it succeed, which is why the caller must remember it.
func (f *IO) FailSync(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAt, f.syncErr = f.syncs+n, err
}

// LimitWrites lets writes store n more bytes; a write that does not fit
// stores what does and fails with ENOSPC, as pwrite on a full filesystem.
// A negative n lifts the limit.
func (f *IO) LimitWrites(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limited, f.room = n >= 0, n
}

// HoldSyncs makes every fdatasync from now on wait until release is
// called; entered receives a value as each one starts to wait.
func (f *IO) HoldSyncs() (entered <-chan struct{}, release func()) {
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

// Syncs returns how many fdatasyncs were attempted.
func (f *IO) Syncs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs
}

// Failures returns how many faults were injected.
func (f *IO) Failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures
}

// WriteAt is pool.DiskIO's pwrite.
func (f *IO) WriteAt(file *os.File, p []byte, off int64) (int, error) {
	f.mu.Lock()
	fit := len(p)
	if f.limited && int64(fit) > f.room {
		fit = int(f.room)
	}
	if f.limited {
		f.room -= int64(fit)
	}
	short := fit < len(p)
	if short {
		f.failures++
	}
	f.mu.Unlock()
	n, err := file.WriteAt(p[:fit], off)
	if err == nil && short {
		err = &os.PathError{Op: "write", Path: file.Name(), Err: unix.ENOSPC}
	}
	return n, err
}

// Fdatasync is pool.DiskIO's fdatasync.
func (f *IO) Fdatasync(file *os.File) error {
	f.mu.Lock()
	f.syncs++
	fail := f.syncs == f.failAt
	err := f.syncErr
	if fail {
		f.failures++
	}
	held, entered := f.held, f.entered
	f.mu.Unlock()
	if held != nil {
		entered <- struct{}{}
		<-held
	}
	if fail {
		return &os.PathError{Op: "fdatasync", Path: file.Name(), Err: err}
	}
	return unix.Fdatasync(int(file.Fd()))
}
