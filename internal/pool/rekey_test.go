package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/storage/crashfs"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// rekeySpec is a 3-disk encrypted VM of small disks; its third disk's
// size is not a whole number of rekey steps.
func rekeySpec(name string) VolumeSpec {
	return VolumeSpec{Name: name, Capacity: 16 * mib, Encrypt: true,
		Disks: []DiskSpec{{Name: "root", Size: mib}, {Name: "data", Size: mib + 256<<10}, {Name: "logs", Size: 300 << 12}}}
}

// fillRekey writes each disk of a rekeySpec volume: written blocks, runs of
// plaintext zeros and holes, unaligned writes.
func fillRekey(t *testing.T, v *Volume) encModel {
	t.Helper()
	m := encModel{}
	for _, d := range v.manifest().Disks {
		m[d.Name] = make([]byte, d.Size)
	}
	m.write(t, v, "root", plainPattern(300<<10, 1), 0)           // across the first step boundary
	m.write(t, v, "root", plainPattern(5000, 2), 700<<10+123)    // unaligned
	m.write(t, v, "data", plainPattern(64<<10, 3), mib)          // in the last step
	m.write(t, v, "data", make([]byte, 64<<10), 16<<10)          // plaintext zeros
	m.write(t, v, "logs", plainPattern(200<<12, 4), 50<<12)      // most of a disk of odd size
	m.write(t, v, "logs", plainPattern(4096, 5), (300<<12)-4096) // its last block
	return m
}

// rawUnder checks that every block of the volume's image files is, under
// the data key w wraps, what the model holds (zeros stored as zeros).
func rawUnder(t *testing.T, kp crypt.Provider, w crypt.WrappedKey, read func(disk string) []byte, m encModel) {
	t.Helper()
	dk, err := kp.Unwrap(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	c, err := crypt.NewCipher(dk)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range m {
		raw := read(name)
		if len(raw) < len(want) {
			raw = append(raw, make([]byte, len(want)-len(raw))...)
		}
		for off := 0; off < len(want); off += crypt.BlockSize {
			blk := bytes.Clone(raw[off : off+crypt.BlockSize])
			if !isZero(blk) {
				_ = c.DecryptAt(blk, int64(off))
			}
			if !bytes.Equal(blk, want[off:off+crypt.BlockSize]) {
				t.Fatalf("disk %s: block at %d is not the model's under the key", name, off)
			}
		}
	}
}

// TestRekeyShallow: a shallow rekey puts the data key under a new KEK,
// destroys the old one, changes no block, and the volume reads back after
// the pool is opened again.
func TestRekeyShallow(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	kp := openKeyFile(t, filepath.Join(t.TempDir(), "keys.json"))
	p := openEncPool(t, dir, kp)
	mustCreate(t, p, rekeySpec("vm"))
	v := vol(p, "vm")
	m := fillRekey(t, v)
	if _, _, err := v.CreateSnapshot(context.Background(), "s1", nil); err != nil {
		t.Fatal(err)
	}
	before := *v.manifest().Key
	img := filepath.Join(dir, "volumes", "vm", "disks", "root.img")
	raw, _ := os.ReadFile(img)
	start := time.Now()
	info, err := v.Rekey(context.Background(), RekeyOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shallow rekey took %v", time.Since(start))
	if info.Encryption.KeyID == before.KeyID {
		t.Fatal("the KEK did not change")
	}
	if _, err := kp.Unwrap(context.Background(), before); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("the old KEK unwraps after the rekey (err %v), want ErrKEKNotFound", err)
	}
	if raw2, _ := os.ReadFile(img); !bytes.Equal(raw, raw2) {
		t.Fatal("a shallow rekey changed the image")
	}
	checkDisks(t, "after a shallow rekey", m, v.OpenDisk)
	_ = p.Close()
	p = openEncPool(t, dir, kp)
	checkDisks(t, "reopened", m, vol(p, "vm").OpenDisk)
	checkDisks(t, "its snapshot", m, func(d string) (Disk, error) { return vol(p, "vm").OpenSnapshotDisk("s1", d) })
	if _, err := vol(p, "vm").Rekey(context.Background(), RekeyOptions{Provider: "kmip"}, nil); !errors.Is(err, ErrNoKeyProvider) {
		t.Fatalf("rekey into a provider not configured: %v, want ErrNoKeyProvider", err)
	}
	mustCreate(t, p, VolumeSpec{Name: "plain", Capacity: mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	if _, err := vol(p, "plain").Rekey(context.Background(), RekeyOptions{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rekey of a volume in the clear: %v, want ErrInvalid", err)
	}
}

// TestRekeyDeep: a deep rekey of a 3-disk VM while it is written and read:
// no I/O error, every byte as the model says, during and after; in the end
// every block of the images is under the new data key, the old KEK is
// destroyed, a clone made before still reads under its own copy of the old
// key, and nothing is in the clear. Snapshots are refused during it, and a
// volume with snapshots is refused.
func TestRekeyDeep(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	kp := openKeyFile(t, filepath.Join(t.TempDir(), "keys.json"))
	p := openEncPool(t, dir, kp)
	ctx := context.Background()
	mustCreate(t, p, rekeySpec("vm"))
	v := vol(p, "vm")
	m := fillRekey(t, v)
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm"}, Names: []string{"c1"}}, nil); err != nil {
		t.Fatal(err)
	}
	cloneModel := m.clone()
	if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Rekey(ctx, RekeyOptions{Deep: true}, nil); !errors.Is(err, ErrHasSnapshots) {
		t.Fatalf("deep rekey with a snapshot: %v, want ErrHasSnapshots", err)
	}
	if err := v.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	old := *v.manifest().Key
	oldUID := v.manifest().KeyUID

	// The VM: a writer on the first half of "data" and "root" (the model
	// follows it), a reader checking the second half of each disk, which
	// stays as written, all along the rekey.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ios atomic.Int64
	errc := make(chan error, 4)
	for _, disk := range []string{"root", "data"} {
		d, err := v.OpenDisk(disk)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		half := int(d.Size() / 2)
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(half), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := 1 + r.IntN(12000)
				off := r.IntN(half - n)
				b := plainPattern(n, byte(i))
				if i%5 == 0 {
					b = make([]byte, n)
				}
				mu.Lock() // one writer per disk: the model follows the disk
				err := d.WriteAt(b, int64(off), i%7 == 0)
				copy(m[disk][off:], b)
				mu.Unlock()
				if err != nil {
					errc <- fmt.Errorf("write %s: %w", disk, err)
					return
				}
				ios.Add(1)
			}
		}()
		go func() { // reader of the half nobody writes
			defer wg.Done()
			want := bytes.Clone(m[disk][half:])
			got := make([]byte, len(want))
			r := rand.New(rand.NewPCG(uint64(half), 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := r.IntN(len(want) - 9000)
				n := 1 + r.IntN(9000)
				if err := d.ReadAt(got[off:off+n], int64(half+off)); err != nil {
					errc <- fmt.Errorf("read %s: %w", disk, err)
					return
				}
				if !bytes.Equal(got[off:off+n], want[off:off+n]) {
					errc <- fmt.Errorf("read %s at %d+%d during the rekey: not what was written", disk, half+off, n)
					return
				}
				ios.Add(1)
			}
		}()
	}
	type result struct {
		info VolumeInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := v.Rekey(ctx, RekeyOptions{Deep: true, Rate: 8 << 20}, nil)
		done <- result{info, err}
	}()
	// Meanwhile: progress shows, snapshots and clones are refused.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ri := v.Info().Encryption.Rekey; ri != nil && ri.Running && ri.Done > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no rekey progress shows")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, _, err := v.CreateSnapshot(ctx, "s2", nil); !errors.Is(err, ErrBusy) {
		t.Fatalf("snapshot during a deep rekey: %v, want ErrBusy", err)
	}
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm"}, Names: []string{"c2"}}, nil); !errors.Is(err, ErrBusy) {
		t.Fatalf("clone during a deep rekey: %v, want ErrBusy", err)
	}
	res := <-done
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Logf("%d I/Os of the VM during the rekey", ios.Load())
	if ios.Load() < 100 {
		t.Fatalf("only %d I/Os during the rekey: the test did not overlap it", ios.Load())
	}
	nm := v.manifest()
	switch {
	case nm.Rekey != nil || res.info.Encryption.Rekey != nil:
		t.Fatal("the rekey is still recorded")
	case nm.Key.KeyID == old.KeyID || nm.KeyUID == oldUID || nm.KeyUID == "":
		t.Fatalf("key %s (uid %s), before %s (uid %s): not a new key", nm.Key.KeyID, nm.KeyUID, old.KeyID, oldUID)
	}
	if _, err := kp.Unwrap(ctx, old); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("the old KEK unwraps after the deep rekey (err %v)", err)
	}
	checkDisks(t, "after the deep rekey", m, v.OpenDisk)
	readImg := func(vol string) func(string) []byte {
		return func(disk string) []byte {
			b, err := os.ReadFile(filepath.Join(dir, "volumes", vol, "disks", disk+".img"))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	rawUnder(t, kp, *nm.Key, readImg("vm"), m)
	grepPool(t, dir)
	if _, err := os.Stat(filepath.Join(dir, "volumes", "vm", "rekey")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the rekey journals are left: %v", err)
	}
	// The clone kept its own copy of the old data key.
	checkDisks(t, "the clone made before", cloneModel, vol(p, "c1").OpenDisk)
	if vol(p, "c1").manifest().KeyUID != oldUID {
		t.Fatal("the clone's key uid changed")
	}
	// Snapshots work again, under the new key; the pool reopens.
	if _, _, err := v.CreateSnapshot(ctx, "s3", nil); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	p = openEncPool(t, dir, kp)
	checkDisks(t, "reopened", m, vol(p, "vm").OpenDisk)
	checkDisks(t, "the snapshot after", m, func(d string) (Disk, error) { return vol(p, "vm").OpenSnapshotDisk("s3", d) })
}

// crashEncPool opens a pool on the crash twin with the key provider kp.
func crashEncPool(t *testing.T, cfs *crashfs.FS, kp crypt.Provider) *Pool {
	t.Helper()
	ring, err := crypt.NewKeyring(kp)
	if err != nil {
		t.Fatal(err)
	}
	p, err := OpenWith(context.Background(), "/crash", Options{FS: cfs, Keyring: ring,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("open the pool on the crash twin: %v", err)
	}
	return p
}

// TestRekeyDeepCrash cuts the power before and after each sync point of a
// deep rekey in turn, keeping a random part of what was not synced: after
// the reboot every byte reads as written, whatever the mix of keys on
// disk, and running the rekey again finishes it with every block under the
// new key.
func TestRekeyDeepCrash(t *testing.T) {
	kp := openKeyFile(t, filepath.Join(t.TempDir(), "keys.json"))
	ctx := context.Background()
	prepare := func(cfs *crashfs.FS) (*Pool, encModel) {
		p := crashEncPool(t, cfs, kp)
		mustCreate(t, p, rekeySpec("vm"))
		m := fillRekey(t, vol(p, "vm"))
		for name := range m { // durable before the rekey starts
			d, err := vol(p, "vm").OpenDisk(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Flush(); err != nil {
				t.Fatal(err)
			}
			_ = d.Close()
		}
		return p, m
	}
	read := func(p *Pool) func(string) []byte {
		return func(disk string) []byte {
			f, err := p.fs.OpenRegular(vol(p, "vm").pool.rel(vol(p, "vm").diskPath(disk)), os.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, vol(p, "vm").manifest().Disks[0].Size*2)
			n, err := f.ReadAt(b, 0)
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			return b[:n]
		}
	}
	cfs := crashfs.New("/crash")
	p, m := prepare(cfs)
	s0 := len(cfs.Syncs())
	if _, err := vol(p, "vm").Rekey(ctx, RekeyOptions{Deep: true, Rate: 1 << 40}, nil); err != nil {
		t.Fatal(err)
	}
	syncs := cfs.Syncs()[s0:]
	rawUnder(t, kp, *vol(p, "vm").manifest().Key, read(p), m)
	_ = p.Close()
	t.Logf("%d sync points", len(syncs))
	if len(syncs) < 20 {
		t.Fatalf("only %d sync points: the rekey did not journal its steps", len(syncs))
	}
	for k := 1; k <= len(syncs); k++ {
		for _, late := range []bool{false, true} {
			cfs := crashfs.New("/crash")
			p, m := prepare(cfs)
			cfs.KeepPartial(uint64(k))
			cfs.CutAtSync(len(cfs.Syncs())+k, late)
			_, err := vol(p, "vm").Rekey(ctx, RekeyOptions{Deep: true, Rate: 1 << 40}, nil)
			where := fmt.Sprintf("cut %s sync %d of %d (%s)", map[bool]string{false: "before", true: "after"}[late], k, len(syncs), syncs[k-1].Label)
			if err == nil && k < len(syncs) {
				t.Fatalf("%s: the rekey succeeded", where)
			}
			_ = p.Close()
			cfs.CutPower()
			cfs.Reboot()
			p = crashEncPool(t, cfs, kp)
			checkDisks(t, where, m, vol(p, "vm").OpenDisk)
			if _, err := vol(p, "vm").Rekey(ctx, RekeyOptions{Deep: true, Rate: 1 << 40}, nil); err != nil {
				t.Fatalf("%s: rekey again: %v", where, err)
			}
			checkDisks(t, where+", rekeyed again", m, vol(p, "vm").OpenDisk)
			rawUnder(t, kp, *vol(p, "vm").manifest().Key, read(p), m)
			_ = p.Close()
		}
	}
}

// TestShred: shredding a volume destroys the KEKs of every volume that
// shares its data key, which must be named; then no wrapped copy of the
// data key opens and the volumes are gone.
func TestShred(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	kp := openKeyFile(t, filepath.Join(t.TempDir(), "keys.json"))
	p := openEncPool(t, dir, kp)
	ctx := context.Background()
	mustCreate(t, p, rekeySpec("vm"))
	fillRekey(t, vol(p, "vm"))
	if _, _, err := vol(p, "vm").CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm", Snapshot: "s1"}, Names: []string{"c1", "c2"}}, nil); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, p, rekeySpec("other"))
	keys := map[string]crypt.WrappedKey{}
	for _, n := range []string{"vm", "c1", "c2", "other"} {
		keys[n] = *vol(p, n).manifest().Key
	}
	err := p.DeleteWith(ctx, "vm", DeleteOptions{Shred: true})
	if !errors.Is(err, ErrKeyShared) {
		t.Fatalf("shred with clones sharing the key: %v, want ErrKeyShared", err)
	}
	t.Log(err)
	if err := p.DeleteWith(ctx, "vm", DeleteOptions{Shred: true, ShredAlso: []string{"c1", "other"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shred naming a volume that does not share the key: %v, want ErrInvalid", err)
	}
	if err := p.DeleteWith(ctx, "vm", DeleteOptions{Shred: true, ShredAlso: []string{"c1"}}); !errors.Is(err, ErrKeyShared) {
		t.Fatalf("shred naming one clone of two: %v, want ErrKeyShared", err)
	}
	for n, w := range keys { // the refusals changed nothing
		if _, err := kp.Unwrap(ctx, w); err != nil {
			t.Fatalf("%s: its key does not unwrap after a refused shred: %v", n, err)
		}
	}
	if err := p.DeleteWith(ctx, "vm", DeleteOptions{Shred: true, ShredAlso: []string{"c1", "c2"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"vm", "c1", "c2"} {
		if _, err := kp.Unwrap(ctx, keys[n]); !errors.Is(err, crypt.ErrKEKNotFound) {
			t.Fatalf("%s: its wrapped key still unwraps after the shred (err %v)", n, err)
		}
		if _, err := p.Volume(n); !errors.Is(err, ErrVolumeNotFound) {
			t.Fatalf("%s: still in the pool: %v", n, err)
		}
	}
	if _, err := kp.Unwrap(ctx, keys["other"]); err != nil {
		t.Fatalf("another volume's key: %v", err)
	}
	mustCreate(t, p, VolumeSpec{Name: "plain", Capacity: mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	if err := p.DeleteWith(ctx, "plain", DeleteOptions{Shred: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shred of a volume in the clear: %v, want ErrInvalid", err)
	}
}
