package pool

import (
	"os"

	"golang.org/x/sys/unix"
)

// DiskIO is how the pool writes disk images and makes their data durable:
// the two calls whose failures the data path must handle (pwrite: ENOSPC,
// EIO; fdatasync: EIO, or ENOSPC on thin or delayed-allocation storage).
// Open uses the operating system's; tests pass one that injects faults
// (Options.DiskIO). Writes through a DiskIO other than the operating
// system's never take the RWF_NOWAIT path (nowait.go), which is a raw system
// call.
type DiskIO interface {
	// WriteAt is pwrite(2) of p at off, as os.File.WriteAt.
	WriteAt(f *os.File, p []byte, off int64) (int, error)
	// Fdatasync is fdatasync(2): when it returns nil, every write to f that
	// returned before it began is durable.
	Fdatasync(f *os.File) error
}

// OSDiskIO is the operating system's DiskIO.
type OSDiskIO struct{}

var _ DiskIO = OSDiskIO{}

// WriteAt implements DiskIO.
func (OSDiskIO) WriteAt(f *os.File, p []byte, off int64) (int, error) { return f.WriteAt(p, off) }

// Fdatasync implements DiskIO.
func (OSDiskIO) Fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// SyncFailures returns how many fdatasync calls on disk images have failed
// since the pool was opened.
func (p *Pool) SyncFailures() int64 { return p.syncFailures.Load() }
