package nbd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
)

func TestToErrno(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want uint32
	}{
		{pool.ErrReadOnly, errPerm},
		{fmt.Errorf("write: %w", pool.ErrOutOfRange), errInval},
		{&pool.FieldError{Field: "disk", Rule: "bad"}, errInval},
		{pool.ErrNoSpace, errNoSpc},
		{fmt.Errorf("write: %w: %w", pool.ErrNoSpace, syscall.ENOSPC), errNoSpc},
		{fmt.Errorf("write: %w: %w", pool.ErrNoSpace, syscall.EDQUOT), errNoSpc},
		{pool.ErrNotSupported, errNotSup},
		{fmt.Errorf("fallocate: %w: %w", pool.ErrNotSupported, syscall.EOPNOTSUPP), errNotSup},
		{errShuttingDown, errShutdown},
		{syscall.ENOMEM, errNoMem},
		{syscall.EIO, errIO},
		{pool.ErrClosed, errIO},
		{fmt.Errorf("disk: %w", pool.ErrDiskRemoved), errIO},
		{fmt.Errorf("disk: %w: %w", pool.ErrSyncFailed, syscall.EIO), errIO},
		{fmt.Errorf("disk: %w: %w", pool.ErrSyncFailed, pool.ErrNoSpace), errIO},
		{errors.New("anything else"), errIO},
	} {
		if got := toErrno(tc.err); got != tc.want {
			t.Errorf("toErrno(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestDomainError walks errnoMapping both ways: every value has at most
// one way back, that way back maps to the value again, and every error of
// the mapping comes back as one of the same value, or as none (EIO,
// ESHUTDOWN).
func TestDomainError(t *testing.T) {
	want := map[uint32]error{errPerm: pool.ErrFenced, errInval: pool.ErrInvalid, errNoSpc: pool.ErrNoSpace,
		errNotSup: pool.ErrNotSupported, errNoMem: syscall.ENOMEM}
	backs := map[uint32]int{}
	for _, m := range errnoMapping {
		if m.back {
			backs[m.errno]++
		}
	}
	for _, errno := range append(specErrnos, 0, 2, 1000) {
		if backs[errno] > 1 {
			t.Errorf("NBD error %d has %d ways back", errno, backs[errno])
		}
		err := DomainError(errno)
		if err != want[errno] {
			t.Errorf("DomainError(%d) = %v, want %v", errno, err, want[errno])
		}
		if err != nil && toErrno(err) != errno {
			t.Errorf("DomainError(%d) = %v, which maps to %d", errno, err, toErrno(err))
		}
	}
	for _, m := range errnoMapping {
		errno := toErrno(m.err)
		if back := DomainError(errno); back != nil && toErrno(back) != errno {
			t.Errorf("%v maps to %d, whose way back %v maps to %d", m.err, errno, back, toErrno(back))
		}
	}
}

// faultExports wraps exports with disks that fail: ReadAt of any range
// touching [faultOff, +4 KiB) (data on root), Extents of any range touching
// [extentFaultOff, +4 KiB), and every write, flush, trim and fast zero, each
// with an error of its own.
type faultExports struct{ Exports }

const (
	faultOff       = 1 << 20
	extentFaultOff = 1792 << 10
)

type faultDisk struct{ pool.Disk }

func (f faultExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := f.Exports.Open(ctx, name, peer)
	if err != nil {
		return Export{}, err
	}
	x.Disk = faultDisk{x.Disk}
	return x, nil
}

func touches(off, n, bad int64) bool { return off < bad+4096 && off+n > bad }

func (d faultDisk) ReadAt(p []byte, off int64) error {
	if touches(off, int64(len(p)), faultOff) {
		return fmt.Errorf("read: %w", syscall.EIO)
	}
	return d.Disk.ReadAt(p, off)
}

func (d faultDisk) Extents(off, n int64, limit int) ([]pool.Extent, error) {
	if touches(off, n, extentFaultOff) {
		return nil, fmt.Errorf("seek: %w", syscall.EIO)
	}
	return d.Disk.Extents(off, n, limit)
}

func (d faultDisk) WriteAt(p []byte, off int64, fua bool) error {
	return fmt.Errorf("pwrite: %w: %w", pool.ErrNoSpace, syscall.ENOSPC) // as the storage layer classifies it
}
func (d faultDisk) Flush() error { return fmt.Errorf("fdatasync: %w", syscall.EIO) }
func (d faultDisk) Trim(off, n int64, fua bool) error {
	return fmt.Errorf("punch: %w: %w", pool.ErrNotSupported, syscall.EOPNOTSUPP)
}
func (d faultDisk) Zero(off, n int64, flags pool.ZeroFlags) error {
	if flags&pool.ZeroFast != 0 {
		return fmt.Errorf("zero: %w", pool.ErrNotSupported)
	}
	return d.Disk.Zero(off, n, flags)
}

// TestStorageErrors: errors from the storage reach the client as the
// mapped error value, a READ error as a single error chunk (or a simple
// reply without payload), and the connection stays usable.
func TestStorageErrors(t *testing.T) {
	e := newEnv(t, Config{}, func(x Exports) Exports { return faultExports{x} })
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			c := e.connect(t, hsOpts{export: exportRoot, structured: structured, meta: metaIf(structured)})
			cases := []txCase{
				{"read of the bad block", testReq{typ: cmdRead, off: faultOff, length: 4096}, same(errIO)},
				{"read overlapping the bad block", testReq{typ: cmdRead, off: faultOff - 100, length: 200}, same(errIO)},
				{"sparse read with the bad block", testReq{typ: cmdRead, off: faultOff - 512<<10, length: 1 << 20}, same(errIO)},
				{"sparse read where extents fail", testReq{typ: cmdRead, off: extentFaultOff - 256<<10, length: 512 << 10}, same(0)},
				{"sparse read with the bad block, DF", testReq{typ: cmdRead, flags: cmdFlagDF, off: 0, length: 2 << 20}, [2]uint32{errInval, errIO}},
				{"read next to the bad block", testReq{typ: cmdRead, off: faultOff + 4096, length: 4096}, same(0)},
				{"sparse read next to the bad block", testReq{typ: cmdRead, off: faultOff + 4096, length: 512 << 10}, same(0)},
				{"write", withPayload(testReq{typ: cmdWrite, off: 0, length: 4096}, 70), same(errNoSpc)},
				{"flush", testReq{typ: cmdFlush}, same(errIO)},
				{"trim", testReq{typ: cmdTrim, off: 0, length: 4096}, same(errNotSup)},
				{"fast zero", testReq{typ: cmdWriteZeroes, flags: cmdFlagFastZero, off: 0, length: 4096}, same(errNotSup)},
				{"read after the errors", testReq{typ: cmdRead, off: 0, length: 65536}, same(0)},
			}
			if structured {
				cases = append(cases,
					txCase{"block status where extents fail", testReq{typ: cmdBlockStatus, off: extentFaultOff, length: 4096}, same(errIO)},
					txCase{"block status elsewhere", testReq{typ: cmdBlockStatus, off: 0, length: 65536}, same(0)})
			}
			runTxCases(t, e, c, "root", cases)
		})
	}
	e.waitIdle()
	e.checkDisks()
}

func metaIf(on bool) []string {
	if on {
		return []string{metaContextBaseAllocation}
	}
	return nil
}
