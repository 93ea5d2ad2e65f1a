package pool

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// writeSeeded writes n bytes of data unique to seed at off of a disk.
func writeSeeded(t testing.TB, v *Volume, disk string, off, n, seed int64) {
	t.Helper()
	d, err := v.OpenDisk(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, 4*mib)
	for done := int64(0); done < n; done += int64(len(buf)) {
		for i := 0; i < len(buf); i += 32 {
			copy(buf[i:], sha256Sum(seed<<40+off+done+int64(i)))
		}
		if err := d.WriteAt(buf[:min(int64(len(buf)), n-done)], off+done, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
}

func usedBytes(t testing.TB, dir string) int64 {
	t.Helper()
	if err := syncFS(dir); err != nil {
		t.Fatal(err)
	}
	total, free, err := fscap.Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	return total - free
}

// TestSpaceUsageAddsUp is acceptance 2 of the operators issue: after a
// snapshot and three clones, each changed, the bytes unique to each object
// plus the shared bytes add up to what the filesystem says the pool uses
// (df), within 5%; on XFS the clones share their source's data, on ext4
// they are copies and share nothing.
func TestSpaceUsageAddsUp(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 300 MiB")
	}
	for _, fs := range []struct {
		name    string
		mount   func(testing.TB, int64) string
		reflink bool
	}{{"xfs", testfs.MountXFS, true}, {"ext4", testfs.MountExt4, false}} {
		t.Run(fs.name, func(t *testing.T) {
			dir := fs.mount(t, 2<<30)
			p := openTestPool(t, filepath.Join(dir, "pool"))
			base := usedBytes(t, dir)
			ctx := context.Background()
			mustCreate(t, p, VolumeSpec{Name: "golden", Capacity: 1 << 30, Disks: []DiskSpec{{Name: "root", Size: 256 * mib}, {Name: "data", Size: 256 * mib}}})
			g, _ := p.Volume("golden")
			writeSeeded(t, g, "root", 0, 96*mib, 1)
			writeSeeded(t, g, "data", 0, 32*mib, 2)
			if _, _, err := g.CreateSnapshot(ctx, "v1", nil); err != nil {
				t.Fatal(err)
			}
			names := []string{"c1", "c2", "c3"}
			if _, err := p.Clone(ctx, CloneRequest{Source: Source{"golden", "v1"}, Names: names}, nil); err != nil {
				t.Fatal(err)
			}
			for i, n := range names {
				c, _ := p.Volume(n)
				writeSeeded(t, c, "root", 0, 16*mib, int64(10+i)) // overwrites: the clone's own now
			}
			writeSeeded(t, g, "data", 32*mib, 8*mib, 3) // new data in the live volume only
			used := usedBytes(t, dir) - base

			u, err := p.SpaceUsage(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !u.Exact {
				t.Fatalf("%s gave no extent maps", fs.name)
			}
			byName := map[string]ObjectUsage{}
			sum := u.Shared
			for _, o := range u.Objects {
				name := o.Volume
				if o.Snapshot != "" {
					name += "@" + o.Snapshot
				}
				byName[name] = o
				sum += o.Unique
				t.Logf("%-10s provisioned %4d MiB, allocated %4d MiB, unique %4d MiB", name, o.Provisioned>>20, o.Allocated>>20, o.Unique>>20)
			}
			t.Logf("shared %d MiB; unique + shared %d MiB; df used %d MiB", u.Shared>>20, sum>>20, used>>20)
			if len(byName) != 5 {
				t.Fatalf("objects %v, want golden, golden@v1, c1, c2, c3", byName)
			}
			if diff := float64(sum - used); diff > 0.05*float64(used) || -diff > 0.05*float64(used) {
				t.Fatalf("unique + shared = %d MiB, df used %d MiB: more than 5%% apart", sum>>20, used>>20)
			}
			for _, n := range names {
				c := byName[n]
				if c.Provisioned != 512*mib {
					t.Errorf("%s provisioned %d", n, c.Provisioned)
				}
				want := 16 * mib // what it changed
				if !fs.reflink {
					want = c.Allocated // a copy shares nothing
				}
				if c.Unique < want-mib || c.Unique > want+mib {
					t.Errorf("%s unique %d MiB, want about %d MiB", n, c.Unique>>20, want>>20)
				}
				if len(c.Disks) != 2 || c.Disks[0].Unique+c.Disks[1].Unique != c.Unique {
					t.Errorf("%s disks %+v do not add up to %d", n, c.Disks, c.Unique)
				}
			}
			if fs.reflink {
				// The snapshot shares everything; only golden's new 8 MiB is its own.
				if g := byName["golden"]; g.Unique < 7*mib || g.Unique > 9*mib {
					t.Errorf("golden unique %d MiB, want about 8", g.Unique>>20)
				}
				if u.Shared < 120*mib {
					t.Errorf("shared %d MiB, want the snapshot's ~128 MiB", u.Shared>>20)
				}
			} else if u.Shared != 0 {
				t.Errorf("ext4 copies share %d bytes", u.Shared)
			}
			sel, err := p.SpaceUsage(func(l map[string]string) bool { return false })
			if err != nil || len(sel.Objects) != 0 || sel.Shared != u.Shared {
				t.Errorf("a selector matching nothing: %+v, %v", sel, err)
			}
		})
	}
}
