package pool

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// BenchmarkWrite4K: 4 KiB writes at random block offsets of a 64 MiB disk
// through Disk.WriteAt (the path the NBD server's write executor takes on a
// filesystem without RWF_NOWAIT for writes, as ext4), plain and encrypted,
// on the test's temporary directory: what encryption adds per write in the
// pool, without the server's scheduling around it (issue 35, acceptance 5).
// The file stays in the page cache; nothing is synced.
func BenchmarkWrite4K(b *testing.B) {
	for _, enc := range []bool{false, true} {
		name := "plain"
		if enc {
			name = "encrypted"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			var kp crypt.Provider
			if enc {
				kp = openKeyFile(b, filepath.Join(dir, "keys.json"))
			}
			p := openEncPool(b, filepath.Join(dir, "pool"), kp)
			const size = 64 * mib
			mustCreate(b, p, VolumeSpec{Name: "vm", Capacity: size, Encrypt: enc, Disks: []DiskSpec{{Name: "d", Size: size}}})
			v, err := p.Volume("vm")
			if err != nil {
				b.Fatal(err)
			}
			d, err := v.OpenDisk("d")
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			buf := make([]byte, 4096)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			for off := int64(0); off < size; off += 1 << 20 { // allocate: the benchmark overwrites
				if err := d.WriteAt(make([]byte, 1<<20), off, false); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(4096)
			b.ResetTimer()
			for b.Loop() {
				buf[0]++
				if err := d.WriteAt(buf, r.Int64N(size/4096)*4096, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
