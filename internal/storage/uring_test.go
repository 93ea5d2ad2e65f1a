package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/quiverstorage/quiver/internal/testfs"
	"golang.org/x/sys/unix"
)

// batchModes are the two ways TryBatch runs: through the file's ring, and
// one system call per IO (io_uring unavailable or refused).
var batchModes = []struct {
	name string
	ring bool
}{{"io_uring", true}, {"syscalls", false}}

// openBatchFile opens a fresh file of size bytes, filled with a pattern,
// on fc, and returns it with the pattern. ring false makes the file's
// batches take one system call per IO, as after a failed ring setup.
func openBatchFile(t *testing.T, fc testfs.FS, size int, ring bool) (*osFile, []byte) {
	t.Helper()
	if ring {
		if err := IOUring(); err != nil {
			t.Skipf("io_uring: %v", err)
		}
	}
	fsys, err := OpenOS(fc.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	f, err := fsys.OpenFile("disk", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i/4096)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	o := f.(*osFile)
	o.ringOff = !ring
	return o, data
}

func TestTryBatch(t *testing.T) {
	for _, fc := range []testfs.FS{testfs.OnTempDir, testfs.OnXFS} {
		for _, m := range batchModes {
			t.Run(fc.Name+"/"+m.name, func(t *testing.T) {
				const size = 1 << 20
				f, data := openBatchFile(t, fc, size, m.ring)
				// Reads of cached data, a read that runs past the end (short),
				// one at the end (nothing), a skipped IO and writes.
				ios := make([]IO, 0, 100)
				for i := range 70 { // more than one ring's worth
					ios = append(ios, IO{P: make([]byte, 4096), Off: int64(i*13%256) * 4096})
				}
				ios = append(ios,
					IO{P: make([]byte, 8192), Off: size - 4096},
					IO{P: make([]byte, 512), Off: size},
					IO{P: make([]byte, 512), Off: 0, Err: ErrWouldBlock},
					IO{Write: true, P: bytes.Repeat([]byte{0xaa}, 4096), Off: 8192},
					IO{Write: true, P: bytes.Repeat([]byte{0xbb}, 100), Off: 100000},
				)
				f.TryBatch(ios)
				for i, io := range ios[:70] {
					if io.Err != nil || io.N != 4096 || !bytes.Equal(io.P, data[io.Off:io.Off+4096]) {
						t.Fatalf("read %d at %d: n %d, err %v, data equal %v", i, io.Off, io.N, io.Err, bytes.Equal(io.P, data[io.Off:io.Off+4096]))
					}
				}
				if io := ios[70]; io.Err != nil || io.N != 4096 || !bytes.Equal(io.P[:4096], data[size-4096:]) {
					t.Errorf("read past the end: n %d, err %v; want a short read of 4096", io.N, io.Err)
				}
				if io := ios[71]; io.Err != nil || io.N != 0 {
					t.Errorf("read at the end: n %d, err %v; want 0, nil", io.N, io.Err)
				}
				if io := ios[72]; io.Err != ErrWouldBlock || io.N != 0 {
					t.Errorf("skipped IO: n %d, err %v; want it left alone", io.N, io.Err)
				}
				for _, io := range ios[73:] {
					if io.Err != nil && !errors.Is(io.Err, ErrWouldBlock) && !errors.Is(io.Err, ErrNotSupported) {
						t.Fatalf("write at %d: %v", io.Off, io.Err)
					}
					if io.Err != nil {
						continue // the filesystem takes no RWF_NOWAIT writes
					}
					if io.N != len(io.P) {
						t.Fatalf("write at %d: n %d, want %d", io.Off, io.N, len(io.P))
					}
					got := make([]byte, len(io.P))
					if _, err := f.ReadAt(got, io.Off); err != nil || !bytes.Equal(got, io.P) {
						t.Fatalf("write at %d not in the file (err %v)", io.Off, err)
					}
				}
				if m.ring != (f.ring != nil) {
					t.Errorf("the file's ring is %v; want one: %v", f.ring, m.ring)
				}
			})
		}
	}
}

// TestTryBatchErrors checks that errors from the ring are classified as
// those of preadv2 and pwritev2 are.
func TestTryBatchErrors(t *testing.T) {
	for _, m := range batchModes {
		t.Run("xfs/"+m.name, func(t *testing.T) {
			f, _ := openBatchFile(t, testfs.OnXFS, 64<<10, m.ring)
			ios := []IO{
				// A negative offset: EINVAL, "not supported" for a Try call.
				{P: make([]byte, 4096), Off: -4096},
				{P: make([]byte, 4096)},
				{Write: true, P: make([]byte, 4096), Off: -8192},
			}
			f.TryBatch(ios)
			if !errors.Is(ios[0].Err, ErrNotSupported) || !errors.Is(ios[0].Err, unix.EOPNOTSUPP) {
				t.Errorf("read at a negative offset: %v; want ErrNotSupported", ios[0].Err)
			}
			if ios[1].Err != nil || ios[1].N != 4096 {
				t.Errorf("read beside the failures: n %d, err %v", ios[1].N, ios[1].Err)
			}
			if !errors.Is(ios[2].Err, ErrNotSupported) {
				t.Errorf("write at a negative offset: %v; want ErrNotSupported", ios[2].Err)
			}
			// A write to a file open for reading only: EBADF, which has
			// no class and is returned as it is.
			ro, err := os.Open(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			rf := newOSFile(ro)
			defer rf.Close()
			rf.ringOff = !m.ring
			ios = []IO{{Write: true, P: make([]byte, 512)}, {P: make([]byte, 512)}}
			rf.TryBatch(ios)
			if !errors.Is(ios[0].Err, unix.EBADF) || ios[1].Err != nil {
				t.Errorf("write, read of a read-only file: %v, %v; want EBADF, nil", ios[0].Err, ios[1].Err)
			}
		})
		// ext4 takes no RWF_NOWAIT buffered writes: pwritev2 says
		// EOPNOTSUPP, io_uring EAGAIN. Both must read as ErrNotSupported,
		// in every batch, so that the pool stops trying.
		t.Run("ext4/"+m.name, func(t *testing.T) {
			f, _ := openBatchFile(t, testfs.OnExt4, 64<<10, m.ring)
			for round := range 3 {
				ios := []IO{
					{P: make([]byte, 4096)},
					{Write: true, P: make([]byte, 4096), Off: 4096},
					{Write: true, P: make([]byte, 4096), Off: 8192},
				}
				f.TryBatch(ios)
				if ios[0].Err != nil {
					t.Errorf("round %d: read: %v", round, ios[0].Err)
				}
				for _, io := range ios[1:] {
					if !errors.Is(io.Err, ErrNotSupported) {
						t.Errorf("round %d: write at %d: %v; want ErrNotSupported", round, io.Off, io.Err)
					}
				}
			}
		})
	}
}

// TestTryBatchWouldBlock reads data that is not in the page cache: RWF_NOWAIT
// refuses it through the ring as through preadv2.
func TestTryBatchWouldBlock(t *testing.T) {
	for _, m := range batchModes {
		t.Run(m.name, func(t *testing.T) {
			f, _ := openBatchFile(t, testfs.OnXFS, 4<<20, m.ring)
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := f.Advise(0, 0, AdviseDontNeed); err != nil {
				t.Fatal(err)
			}
			ios := []IO{{P: make([]byte, 4096), Off: 1 << 20}, {P: make([]byte, 4096), Off: 3 << 20}}
			f.TryBatch(ios)
			for _, io := range ios {
				if !errors.Is(io.Err, ErrWouldBlock) {
					t.Errorf("read of evicted data at %d: n %d, err %v; want ErrWouldBlock", io.Off, io.N, io.Err)
				}
			}
		})
	}
}

func TestIOUringFallback(t *testing.T) {
	for _, errno := range []unix.Errno{unix.ENOSYS, unix.EPERM, unix.EINVAL} {
		err := probeRing(func(uint32, *uringParams) (int, error) { return -1, errno })
		if !errors.Is(err, errno) {
			t.Errorf("probe with io_uring_setup failing with %v: %v", errno, err)
		}
	}
	// Features missing: the ring is refused, and its descriptor closed.
	var fd int
	err := probeRing(func(n uint32, p *uringParams) (int, error) {
		var e error
		fd, e = sysSetup(n, p)
		p.features &^= uringFeatNodrop
		return fd, e
	})
	if err == nil {
		t.Fatal("a ring without IORING_FEAT_NODROP was accepted")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("the refused ring's descriptor %d is still open (%v)", fd, err)
	}
	if err := IOUring(); err != nil {
		t.Logf("io_uring unavailable here: %v", err)
	}
}

func TestTryBatchAllocations(t *testing.T) {
	for _, m := range batchModes {
		t.Run(m.name, func(t *testing.T) {
			f, _ := openBatchFile(t, testfs.OnTempDir, 1<<20, m.ring)
			ios := make([]IO, 32)
			bufs := make([]byte, 32*4096)
			allocs := testing.AllocsPerRun(100, func() {
				for i := range ios {
					ios[i] = IO{P: bufs[i*4096 : (i+1)*4096], Off: int64(i) * 8192}
				}
				f.TryBatch(ios)
			})
			if allocs != 0 {
				t.Errorf("%v allocations per batch, want 0", allocs)
			}
		})
	}
}

func cpuTime(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkTryBatch compares 32 cached 4k reads in one batch through the
// ring with one preadv2 each.
func BenchmarkTryBatch(b *testing.B) {
	for _, m := range batchModes {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/%d", m.name, n), func(b *testing.B) {
				dir := b.TempDir()
				fsys, err := OpenOS(dir)
				if err != nil {
					b.Fatal(err)
				}
				defer fsys.Close()
				ff, err := fsys.OpenFile("disk", os.O_RDWR|os.O_CREATE, 0o600)
				if err != nil {
					b.Fatal(err)
				}
				defer ff.Close()
				if _, err := ff.WriteAt(make([]byte, 1<<20), 0); err != nil {
					b.Fatal(err)
				}
				f := ff.(*osFile)
				f.ringOff = !m.ring
				ios := make([]IO, n)
				bufs := make([]byte, n*4096)
				b.SetBytes(int64(n) * 4096)
				cpu0 := cpuTime(b)
				for b.Loop() {
					for i := range ios {
						ios[i] = IO{P: bufs[i*4096 : (i+1)*4096], Off: int64(i*37%256) * 4096}
					}
					f.TryBatch(ios)
				}
				// The process's CPU time moves less with a busy machine
				// than the time per batch does.
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N*n), "cpu-ns/io")
			})
		}
	}
}

// TestRingABI checks the layouts against include/uapi/linux/io_uring.h.
func TestRingABI(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_params", unsafe.Sizeof(uringParams{}), 120},
		{"io_uring_sqe", unsafe.Sizeof(uringSQE{}), 64},
		{"io_uring_cqe", unsafe.Sizeof(uringCQE{}), 16},
		{"io_uring_params.sq_off", unsafe.Offsetof(uringParams{}.sqOff), 40},
		{"io_uring_params.cq_off", unsafe.Offsetof(uringParams{}.cqOff), 80},
		{"io_uring_sqe.user_data", unsafe.Offsetof(uringSQE{}.userData), 32},
		{"io_uring_sqe.rw_flags", unsafe.Offsetof(uringSQE{}.rwFlags), 28},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}
