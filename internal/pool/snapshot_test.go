package pool

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// setCaptureHooks replaces afterFirstPass and reflinkRange (either may be
// nil to keep it) until the test ends.
func setCaptureHooks(t *testing.T, after func(), clone func(dst, src storage.File, off, length int64) error) {
	t.Helper()
	oldAfter, oldClone := afterFirstPass, reflinkRange
	t.Cleanup(func() { afterFirstPass, reflinkRange = oldAfter, oldClone })
	if after != nil {
		afterFirstPass = after
	}
	if clone != nil {
		reflinkRange = clone
	}
}

// setRoundAbove sets roundAbove until the test ends: 0 makes live captures
// re-clone with the gate open as long as any range is dirty, MaxInt leaves
// everything to the catch-up with the gate closed.
func setRoundAbove(t *testing.T, n int) {
	old := roundAbove
	t.Cleanup(func() { roundAbove = old })
	roundAbove = n
}

func unsupportedRange(dst, src storage.File, off, length int64) error {
	return fmt.Errorf("injected: %w", storage.ErrNotSupported)
}

// modelDisk is a disk handle and the bytes it must hold.
type modelDisk struct {
	d    Disk
	want []byte
}

func (m *modelDisk) write(t *testing.T, seed uint64, off, n int64) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b)
	if err := m.d.WriteAt(b, off, false); err != nil {
		t.Fatal(err)
	}
	copy(m.want[off:], b)
}

func (m *modelDisk) trim(t *testing.T, off, n int64) {
	t.Helper()
	if err := m.d.Trim(off, n, false); err != nil {
		t.Fatal(err)
	}
	clear(m.want[off : off+n])
}

func (m *modelDisk) zero(t *testing.T, off, n int64, mayTrim bool) {
	t.Helper()
	var flags ZeroFlags
	if mayTrim {
		flags = ZeroMayTrim
	}
	if err := m.d.Zero(off, n, flags); err != nil {
		t.Fatal(err)
	}
	clear(m.want[off : off+n])
}

// TestLiveCaptureCatchesUp makes writes, trims and zeroes land after the
// first pass of a snapshot has cloned the disks, deterministically through
// the test hooks, and checks that the snapshot holds exactly them and
// nothing written after it returned; on XFS also down each fallback path
// (an overflowed dirty set, ranges that will not clone).
func TestLiveCaptureCatchesUp(t *testing.T) {
	mountXFS := func(t testing.TB) string { return testfs.MountXFS(t, 1<<30) }
	tests := []struct {
		name  string
		mount func(t testing.TB) string
		fault string
	}{
		{name: "default", mount: func(t testing.TB) string { return t.TempDir() }},
		{name: "xfs-reflink", mount: mountXFS},
		{name: "btrfs-reflink", mount: func(t testing.TB) string { return testfs.MountBtrfs(t, 1<<30) }},
		{name: "ext4-copy", mount: func(t testing.TB) string { return testfs.MountExt4(t, 512<<20) }},
		{name: "xfs write during first pass", mount: mountXFS, fault: "write during first pass"},
		{name: "xfs write during a round", mount: mountXFS, fault: "write during a round"},
		{name: "xfs dirty sets overflow before a round", mount: mountXFS, fault: "overflow before a round"},
		{name: "xfs dirty sets overflow at catch-up", mount: mountXFS, fault: "overflow at catch-up"},
		{name: "xfs ranges fail at catch-up", mount: mountXFS, fault: "catch-up unsupported"},
		{name: "xfs ranges fail in first pass", mount: mountXFS, fault: "first pass unsupported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := openTestPool(t, filepath.Join(tc.mount(t), "pool"))
			// b's size is off the block size: its last range ends at an
			// unaligned end of file.
			spec := VolumeSpec{Name: "vm", Capacity: 32 * mib,
				Disks: []DiskSpec{{Name: "a", Size: 8 * mib}, {Name: "b", Size: 8*mib + 512}, {Name: "c", Size: 1 * mib}}}
			mustCreate(t, p, spec)
			v, _ := p.Volume("vm")
			disks := map[string]*modelDisk{}
			for i, d := range spec.Disks {
				h, err := v.OpenDisk(d.Name)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { h.Close() })
				m := &modelDisk{d: h, want: make([]byte, d.Size)}
				m.write(t, uint64(i), 0, d.Size)
				disks[d.Name] = m
			}
			a, b, c := disks["a"], disks["b"], disks["c"]

			reflink := p.Caps().Reflink
			hookRan := false
			setCaptureHooks(t, func() {
				hookRan = true
				a.write(t, 10, 100<<10, 4096)
				a.write(t, 11, 8*mib-512, 512)
				a.trim(t, 2*mib, 256<<10)
				a.trim(t, 5*mib+4096, 8192)
				b.write(t, 12, 8*mib, 512)
				b.zero(t, 1*mib, 64<<10, false)
				b.zero(t, 3*mib+512, 1024, true)
				c.write(t, 13, 0, 1*mib)
				switch tc.fault {
				case "overflow before a round", "overflow at catch-up":
					for _, s := range v.dirty.Load().disks {
						s.mu.Lock()
						s.spans, s.merged, s.overflow = nil, 0, true
						s.mu.Unlock()
					}
				case "catch-up unsupported":
					reflinkRange = unsupportedRange
				}
			}, nil)
			switch tc.fault {
			case "write during first pass":
				calls := 0
				setCaptureHooks(t, nil, func(dst, src storage.File, off, length int64) error {
					err := dst.CloneRange(src, off, length)
					if calls++; calls == 1 { // a's first piece, which covers all of it, is cloned
						a.write(t, 14, 0, 64<<10)
						a.write(t, 15, 7*mib, 4096)
					}
					return err
				})
			case "write during a round":
				setRoundAbove(t, 0)
				calls := 0
				setCaptureHooks(t, nil, func(dst, src storage.File, off, length int64) error {
					err := dst.CloneRange(src, off, length)
					if hookRan {
						if calls++; calls == 1 { // the first range of the first round is cloned
							a.write(t, 16, 100<<10, 4096)
							c.write(t, 17, 512<<10, 512)
						}
					}
					return err
				})
			case "overflow at catch-up", "catch-up unsupported":
				setRoundAbove(t, math.MaxInt)
			case "first pass unsupported":
				setCaptureHooks(t, nil, unsupportedRange)
			}

			before := map[string][]byte{}
			for n, m := range disks {
				before[n] = append([]byte(nil), m.want...)
			}
			info, _, err := v.CreateSnapshot(context.Background(), "s", nil)
			if err != nil {
				t.Fatal(err)
			}
			inSnapshot := before
			if hookRan {
				inSnapshot = map[string][]byte{}
				// The hook's writes are in the model now; they must be in
				// the snapshot too.
				for n, m := range disks {
					inSnapshot[n] = append([]byte(nil), m.want...)
				}
			}
			wantHook := reflink && tc.fault != "first pass unsupported"
			if hookRan != wantHook {
				t.Errorf("afterFirstPass ran: %v, want %v (reflink %v)", hookRan, wantHook, reflink)
			}
			wantMethod := map[bool]string{true: MethodReflink, false: MethodCopy}[reflink]
			if info.Method != wantMethod {
				t.Errorf("method %q, want %q", info.Method, wantMethod)
			}

			// Writes after the snapshot must not reach it.
			a.write(t, 20, 100<<10, 4096)
			a.write(t, 21, 2*mib, 64<<10)
			b.write(t, 22, 8*mib, 512)
			c.write(t, 23, 0, 1*mib)

			for _, d := range spec.Disks {
				img, err := os.ReadFile(filepath.Join(v.snapshotDir("s"), d.Name+".img"))
				if err != nil {
					t.Fatal(err)
				}
				if len(img) != len(inSnapshot[d.Name]) {
					t.Fatalf("snapshot of %s is %d bytes, want %d", d.Name, len(img), len(inSnapshot[d.Name]))
				}
				if i := firstDiff(img, inSnapshot[d.Name]); i >= 0 {
					t.Errorf("snapshot of %s differs from the disk at the cut from byte %d", d.Name, i)
				}
				live := make([]byte, d.Size)
				if err := disks[d.Name].d.ReadAt(live, 0); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(live, disks[d.Name].want); i >= 0 {
					t.Errorf("disk %s differs from what was written from byte %d", d.Name, i)
				}
			}
			if v.dirty.Load() != nil {
				t.Error("writes are still tracked after the snapshot")
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
