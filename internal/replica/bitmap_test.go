package replica

import (
	"errors"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/faultio"
)

// TestBitmapMarkFailedWriteSetsNothing: a Mark whose write fails (a full
// pool) sets no bit, so the resend's Mark writes the word again and the
// granule is dirty after a reopen; a Mark that said nothing was written
// cannot count as durable.
func TestBitmapMarkFailedWriteSetsNothing(t *testing.T) {
	fsys := faultio.New(openFS(t))
	rel := BitmapPath("uid1", "root", "n2")
	b, _, err := OpenBitmap(fsys, rel, diskSize, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	fsys.LimitWrites(0)
	if err := b.Mark(1<<20, 4096); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("mark on a full pool: %v, want ENOSPC", err)
	}
	if n, _ := b.Granules(); n != 0 {
		t.Fatalf("%d granules set after a failed mark: %v", n, b.Ranges())
	}
	fsys.LimitWrites(-1)
	if err := b.Mark(1<<20, 4096); err != nil { // the request sent again
		t.Fatal(err)
	}
	b.Close()
	b, _, err = OpenBitmap(fsys, rel, diskSize, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Ranges(); len(got) != 1 || got[0] != [2]int64{1 << 20, 64 << 10} {
		t.Fatalf("after a reopen: %v, want the granule at 1 MiB", got)
	}
}

// TestBitmapFailedSyncIsFinal: once the bitmap's fdatasync failed, every
// later Mark fails with that error, although the storage's next sync would
// succeed (the kernel may have dropped the words it could not write), and
// the failed Mark's granule stays in Ranges (its change may be applied).
func TestBitmapFailedSyncIsFinal(t *testing.T) {
	fsys := faultio.New(openFS(t))
	b, _, err := OpenBitmap(fsys, BitmapPath("uid1", "root", "n2"), diskSize, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fsys.FailSync(1, syscall.EIO)
	if err := b.Mark(0, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("mark with a failing sync: %v, want EIO", err)
	}
	for _, r := range [][2]int64{{0, 4096}, {2 << 20, 4096}} {
		if err := b.Mark(r[0], r[1]); !errors.Is(err, syscall.EIO) {
			t.Fatalf("mark %v after the failed sync: %v, want the sync's EIO", r, err)
		}
	}
	if fsys.Failures() != 1 {
		t.Fatalf("%d faults injected, want 1", fsys.Failures())
	}
	if got := b.Ranges(); len(got) != 1 || got[0] != [2]int64{0, 64 << 10} {
		t.Fatalf("ranges after the failed sync: %v, want the granule at 0", got)
	}
}
