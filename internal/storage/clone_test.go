package storage

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// cloneFile creates dstPath (exclusively, 0600) as a copy of srcPath with
// CloneOrCopy (reflink when caps has it) and syncs it, through an OS FS
// rooted at their directory, as the pool makes an image from another. On an
// error dstPath is removed.
func cloneFile(t testing.TB, ctx context.Context, dstPath, srcPath string, caps Caps, progress func(int64)) (string, error) {
	t.Helper()
	fsys, err := OpenOS(filepath.Dir(srcPath))
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	src, err := fsys.OpenRegular(filepath.Base(srcPath), os.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst, err := fsys.OpenFile(filepath.Base(dstPath), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	method, err := CloneOrCopy(ctx, dst, src, caps.Reflink, progress)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = fsys.Remove(filepath.Base(dstPath))
		return "", err
	}
	return method, nil
}

func TestClone(t *testing.T) {
	// Clone must give 0600 whatever the umask.
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })

	tests := []struct {
		name       string
		fs         testfs.FS
		caps       func(probed Caps) Caps // nil: use the probed caps
		wantMethod string                 // "": reflink if the probe found it, else copy
	}{
		{name: "tempdir", fs: testfs.OnTempDir},
		{name: "ext4", fs: testfs.OnExt4, wantMethod: MethodCopy},
		{name: "ext4 claiming reflink", fs: testfs.OnExt4, wantMethod: MethodCopy,
			caps: func(c Caps) Caps { c.Reflink = true; return c }},
		{name: "tmpfs", fs: testfs.OnTmpfs, wantMethod: MethodCopy},
		{name: "xfs", fs: testfs.OnXFS, wantMethod: MethodReflink},
		{name: "xfs without reflink in caps", fs: testfs.OnXFS, wantMethod: MethodCopy,
			caps: func(c Caps) Caps { c.Reflink = false; return c }},
		{name: "btrfs", fs: testfs.OnBtrfs, wantMethod: MethodReflink},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.fs.Dir(t)
			caps := mustProbe(t, dir)
			if tc.caps != nil {
				caps = tc.caps(caps)
			}
			want := tc.wantMethod
			if want == "" {
				want = map[bool]string{true: MethodReflink, false: MethodCopy}[caps.Reflink]
			}
			srcPath := testfs.MakeSparse(t, dir, "src")
			dstPath := filepath.Join(dir, "dst")

			var sum int64
			method, err := cloneFile(t, context.Background(), dstPath, srcPath, caps, func(n int64) { sum += n })
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			if method != want {
				t.Errorf("method = %q, want %q", method, want)
			}
			testfs.AssertSameFile(t, dstPath, srcPath)
			srcMap, dstMap := testfs.SeekMap(t, srcPath), testfs.SeekMap(t, dstPath)
			if !testfs.Within(dstMap, srcMap) {
				t.Errorf("holes not preserved: dst data runs %v, src %v", dstMap, srcMap)
			}
			if method == MethodCopy && sum != testfs.SumRuns(srcMap) || method == MethodReflink && sum != 0 {
				t.Errorf("progress adds up to %d, want the %d data bytes of src for a copy, 0 for a reflink", sum, testfs.SumRuns(srcMap))
			}
			fi, err := os.Stat(dstPath)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != 0o600 {
				t.Errorf("mode = %v, want -rw-------", fi.Mode())
			}
			if method == MethodCopy {
				alloc, err := fscap.Allocated(dstPath)
				if err != nil {
					t.Fatal(err)
				}
				if data := testfs.SumRuns(dstMap); alloc > data+1<<20 {
					t.Errorf("copy allocates %d bytes for %d data bytes: not sparse", alloc, data)
				}
			}
		})
	}
}

func TestCloneCancel(t *testing.T) {
	tests := []struct {
		name string
		fs   testfs.FS
		// cancelAfter is the number of progress calls before ctx is
		// cancelled; 0 cancels before Clone starts.
		cancelAfter int
	}{
		{"ext4 before start", testfs.OnExt4, 0},
		{"ext4 after first chunk", testfs.OnExt4, 1},
		{"ext4 after third chunk", testfs.OnExt4, 3},
		{"xfs before start", testfs.OnXFS, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.fs.Dir(t)
			caps := mustProbe(t, dir)
			srcPath := testfs.MakeSparse(t, dir, "src")
			dstPath := filepath.Join(dir, "dst")

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancelAfter == 0 {
				cancel()
			}
			calls := 0
			_, err := cloneFile(t, ctx, dstPath, srcPath, caps, func(int64) {
				calls++
				if calls == tc.cancelAfter {
					cancel()
				}
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Clone: err = %v, want context.Canceled", err)
			}
			if calls != tc.cancelAfter {
				t.Errorf("%d chunks copied after cancelling at %d: cancellation not checked per chunk", calls, tc.cancelAfter)
			}
			if _, err := os.Lstat(dstPath); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dst left behind after cancel: %v", err)
			}
		})
	}
}

// TestCloneReflinkLarge clones a file of 1 GiB of written data and checks
// that the clone costs next to no space, reads the same and is independent
// of the source afterwards.
func TestCloneReflinkLarge(t *testing.T) {
	const (
		size     = 1 << 30
		maxSpent = 64 << 20
		samples  = 64
	)
	for _, fsc := range []testfs.FS{testfs.OnXFS, testfs.OnBtrfs} {
		t.Run(fsc.Name, func(t *testing.T) {
			dir := fsc.Dir(t)
			caps := mustProbe(t, dir)
			if !caps.Reflink {
				t.Fatalf("Probe(%s) = %+v, want Reflink", dir, caps)
			}
			srcPath := filepath.Join(dir, "src")
			testfs.WriteRuns(t, srcPath, size, []testfs.Run{{Off: 0, Len: size}})
			dstPath := filepath.Join(dir, "dst")

			_, freeBefore := usageAfterSync(t, dir)
			var progress int64
			method, err := cloneFile(t, context.Background(), dstPath, srcPath, caps, func(n int64) { progress += n })
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			_, freeAfter := usageAfterSync(t, dir)

			if method != MethodReflink {
				t.Errorf("method = %q, want %q", method, MethodReflink)
			}
			if progress != 0 {
				t.Errorf("progress adds up to %d, want 0 for a reflink", progress)
			}
			if spent := freeBefore - freeAfter; spent >= maxSpent {
				t.Errorf("clone of 1 GiB used %d MiB of free space, want < %d MiB", spent>>20, maxSpent>>20)
			}

			// Sampled blocks first: a mismatch names the offset.
			src, err := os.Open(srcPath)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			dst, err := os.OpenFile(dstPath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			a, b := make([]byte, testfs.BlockSize), make([]byte, testfs.BlockSize)
			for range samples {
				off := rng.Int64N(size/testfs.BlockSize) * testfs.BlockSize
				if _, err := src.ReadAt(a, off); err != nil {
					t.Fatal(err)
				}
				if _, err := dst.ReadAt(b, off); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a, b) || !bytes.Equal(a, testfs.Content(off, testfs.BlockSize)) {
					t.Fatalf("block at %d differs between src, dst and what was written", off)
				}
			}
			testfs.AssertSameFile(t, dstPath, srcPath)

			// Copy on write: changing the clone leaves the source alone.
			if _, err := dst.WriteAt(bytes.Repeat([]byte{0xAB}, testfs.BlockSize), 0); err != nil {
				t.Fatal(err)
			}
			if err := dst.Sync(); err != nil {
				t.Fatal(err)
			}
			if _, err := src.ReadAt(a, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, testfs.Content(0, testfs.BlockSize)) {
				t.Error("writing to the clone changed the source")
			}
		})
	}
}

// usageAfterSync flushes the filesystem holding dir, so delayed allocations
// and btrfs transactions are counted, and returns Usage.
func usageAfterSync(t *testing.T, dir string) (total, free int64) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		t.Fatal(err)
	}
	total, free, err = fscap.Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if total <= 0 || free < 0 || free > total {
		t.Fatalf("Usage(%s) = %d, %d", dir, total, free)
	}
	return total, free
}
