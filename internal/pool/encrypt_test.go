package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// switchable is the key-file provider behind a switch that makes the key
// manager unreachable, as a KMS behind a cut network is: every call fails
// with crypt.ErrUnreachable while down.
type switchable struct {
	*keyfile.Provider
	down atomic.Bool
}

func (s *switchable) check() error {
	if s.down.Load() {
		return fmt.Errorf("key manager 127.0.0.1:5696: %w", crypt.ErrUnreachable)
	}
	return nil
}

func (s *switchable) Unwrap(ctx context.Context, w crypt.WrappedKey) (*crypt.DataKey, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Provider.Unwrap(ctx, w)
}

func (s *switchable) CreateKEK(ctx context.Context) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	return s.Provider.CreateKEK(ctx)
}

// openKeyFile opens (or makes) the key file at path, outside any pool.
func openKeyFile(t testing.TB, path string) *switchable {
	t.Helper()
	kf, err := keyfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return &switchable{Provider: kf}
}

// openEncPool opens the pool at dir with the key provider kp (nil: none).
func openEncPool(t testing.TB, dir string, kp crypt.Provider) *Pool {
	t.Helper()
	var ring crypt.Keyring
	if kp != nil {
		var err error
		if ring, err = crypt.NewKeyring(kp); err != nil {
			t.Fatal(err)
		}
	}
	p, err := OpenWith(context.Background(), dir, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Keyring: ring})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// marker is a pattern no ciphertext holds by chance: the image files of an
// encrypted volume must not contain it.
var marker = []byte("quiver-plaintext-marker:0123456789abcdef")

// plainPattern is n bytes of marker repeated, stamped with seed.
func plainPattern(n int, seed byte) []byte {
	b := bytes.Repeat(marker, n/len(marker)+1)[:n]
	for i := len(marker) - 1; i < n; i += len(marker) {
		b[i] = seed
	}
	return b
}

// grepPool fails the test if any file under dir holds marker.
func grepPool(t *testing.T, dir string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if bytes.Contains(b, marker[:24]) {
			t.Errorf("%s holds the plaintext pattern", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no file in the pool")
	}
}

// encModel is a disk in plain memory, the oracle of the encrypted disk.
type encModel map[string][]byte

func (m encModel) clone() encModel {
	c := encModel{}
	for k, v := range m {
		c[k] = bytes.Clone(v)
	}
	return c
}

// checkDisks reads every disk of m through open and compares.
func checkDisks(t *testing.T, what string, m encModel, open func(disk string) (Disk, error)) {
	t.Helper()
	for name, want := range m {
		d, err := open(name)
		if err != nil {
			t.Fatalf("%s: open %s: %v", what, name, err)
		}
		got := make([]byte, len(want))
		err = d.ReadAt(got, 0)
		_ = d.Close()
		if err != nil {
			t.Fatalf("%s: read %s: %v", what, name, err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%s: disk %s differs from the model first at byte %d", what, name, i)
		}
		// An unaligned read across blocks agrees with the model too.
		part := got[:10000]
		if err := readVia(open, name, part, 4000); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(part, want[4000:14000]) {
			t.Fatalf("%s: unaligned read of %s differs from the model", what, name)
		}
	}
}

func readVia(open func(string) (Disk, error), name string, p []byte, off int64) error {
	d, err := open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.ReadAt(p, off)
}

// write writes p at off through a handle of disk and into the model.
func (m encModel) write(t *testing.T, v *Volume, disk string, p []byte, off int64) {
	t.Helper()
	d, err := v.OpenDisk(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	orig := bytes.Clone(p)
	if err := d.WriteAt(p, off, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, orig) {
		t.Fatal("the write changed the caller's buffer")
	}
	copy(m[disk][off:], p)
}

// TestEncryptedVolume: an encrypted volume on XFS (reflink snapshots and
// clones) holds no plaintext of what was written in any file of the pool,
// and reads back what a plain-memory model holds: live, after a snapshot,
// in a clone of the snapshot and of the live volume, after a rollback, and
// after the pool is closed and opened again with the key file.
func TestEncryptedVolume(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 400<<20), "pool")
	keys := filepath.Join(t.TempDir(), "keys.json")
	kp := openKeyFile(t, keys)
	p := openEncPool(t, dir, kp)
	info := mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Encrypt: true,
		Disks: []DiskSpec{{Name: "root", Size: 8 * mib}, {Name: "data", Size: 4 * mib}}})
	if info.Encryption == nil || info.Encryption.Provider != keyfile.Name || info.Encryption.KeyID == "" {
		t.Fatalf("Info().Encryption = %+v, want the key file's KEK", info.Encryption)
	}
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	m := encModel{"root": make([]byte, 8*mib), "data": make([]byte, 4*mib)}
	m.write(t, v, "root", plainPattern(256<<10, 1), 0)            // aligned, 64 blocks
	m.write(t, v, "root", plainPattern(10000, 2), 5*mib+1234)     // unaligned both ends
	m.write(t, v, "root", plainPattern(100, 3), 7*mib+4090)       // straddles two blocks
	m.write(t, v, "data", plainPattern(int(mib)+4096*3, 4), 4096) // beyond one buffer segment
	m.write(t, v, "data", make([]byte, 8192), 8192)               // plaintext zeros: stored as zeros
	m.write(t, v, "root", plainPattern(3000, 5), 300)             // inside one written block
	checkDisks(t, "live", m, v.OpenDisk)
	grepPool(t, dir)

	// Trim and write-zeroes, aligned and not, read as zeros.
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Trim(1000, 20000, false); err != nil {
		t.Fatal(err)
	}
	clear(m["root"][1000:21000])
	if err := d.Zero(5*mib+2000, 5000, ZeroMayTrim); err != nil {
		t.Fatal(err)
	}
	clear(m["root"][5*mib+2000 : 5*mib+7000])
	if err := d.Zero(64<<10, 64<<10, 0); err != nil {
		t.Fatal(err)
	}
	clear(m["root"][64<<10 : 128<<10])
	_ = d.Close()
	checkDisks(t, "after trim and zero", m, v.OpenDisk)

	ctx := context.Background()
	if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	atSnap := m.clone()
	m.write(t, v, "root", plainPattern(20000, 6), 4096*10+7)
	m.write(t, v, "data", plainPattern(4096, 7), 0)
	checkDisks(t, "live after the snapshot", m, v.OpenDisk)
	checkDisks(t, "snapshot", atSnap, func(disk string) (Disk, error) { return v.OpenSnapshotDisk("s1", disk) })

	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm", Snapshot: "s1"}, Names: []string{"c1"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm"}, Names: []string{"c2"}}, nil); err != nil {
		t.Fatal(err)
	}
	c1, err := p.Volume("c1")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.Volume("c2")
	if err != nil {
		t.Fatal(err)
	}
	if e := c1.Info().Encryption; e == nil || e.KeyID == info.Encryption.KeyID {
		t.Fatalf("clone's encryption %+v: want a KEK of its own, not %s", e, info.Encryption.KeyID)
	}
	checkDisks(t, "clone of the snapshot", atSnap, c1.OpenDisk)
	checkDisks(t, "clone of the live volume", m, c2.OpenDisk)
	clone1 := atSnap.clone()
	clone1.write(t, c1, "root", plainPattern(5000, 8), 3*mib+17)
	checkDisks(t, "clone after its own write", clone1, c1.OpenDisk)
	checkDisks(t, "source after the clone's write", m, v.OpenDisk)

	if _, err := v.Rollback(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	m = atSnap.clone()
	checkDisks(t, "after rollback", m, v.OpenDisk)
	m.write(t, v, "root", plainPattern(777, 9), 2*mib+5)
	grepPool(t, dir)

	// Closed and opened again: the key file unwraps the keys anew.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openEncPool(t, dir, openKeyFile(t, keys))
	for name, want := range map[string]encModel{"vm": m, "c1": clone1} {
		v, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		checkDisks(t, "reopened "+name, want, v.OpenDisk)
	}
	v, _ = p.Volume("vm")
	checkDisks(t, "reopened snapshot", atSnap, func(disk string) (Disk, error) { return v.OpenSnapshotDisk("s1", disk) })
	grepPool(t, dir)
}

// TestEncryptedTryPaths: the non-blocking paths decrypt what they read, and
// step aside for what they cannot do on an encrypted disk: writes,
// unaligned reads and sendfile, which would send ciphertext.
func TestEncryptedTryPaths(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	p := openEncPool(t, dir, openKeyFile(t, filepath.Join(t.TempDir(), "keys.json")))
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Encrypt: true, Disks: []DiskSpec{{Name: "root", Size: 8 * mib}}})
	v, _ := p.Volume("vm")
	m := encModel{"root": make([]byte, 8*mib)}
	m.write(t, v, "root", plainPattern(64<<10, 1), 0)
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := CapabilitiesOf(d)
	if c.Sender != nil {
		t.Error("an encrypted disk declares sendfile")
	}
	if _, err := d.(Sender).TrySendTo(-1, nil, 0, 4096); !errors.Is(err, ErrWouldBlock) {
		t.Errorf("TrySendTo: %v, want ErrWouldBlock", err)
	}
	if err := c.Nonblocking.TryWriteAt(plainPattern(100, 2), 4000); !errors.Is(err, ErrWouldBlock) {
		t.Errorf("unaligned TryWriteAt: %v, want ErrWouldBlock", err)
	}
	// A write of whole blocks is encrypted on the spot, not in the
	// caller's buffer; it may have to wait (a new timestamp tick): retried.
	w := plainPattern(8192, 2)
	for range 100 {
		if err := d.WriteAt(plainPattern(4096, 9), 16384+8192, false); err != nil {
			t.Fatal(err)
		}
		if err = c.Nonblocking.TryWriteAt(w, 0); !errors.Is(err, ErrWouldBlock) {
			break
		}
	}
	if err != nil {
		t.Fatalf("TryWriteAt of two cached, owned blocks: %v", err)
	}
	if !bytes.Equal(w, plainPattern(8192, 2)) {
		t.Fatal("TryWriteAt changed the caller's buffer")
	}
	copy(m["root"], w)
	grepPool(t, dir)
	if err := c.Nonblocking.TryReadAt(make([]byte, 100), 10); !errors.Is(err, ErrWouldBlock) {
		t.Errorf("unaligned TryReadAt: %v, want ErrWouldBlock", err)
	}
	buf := make([]byte, 16<<10)
	if err := c.Nonblocking.TryReadAt(buf, 8192); err != nil {
		t.Fatalf("TryReadAt of cached blocks: %v", err)
	}
	if !bytes.Equal(buf, m["root"][8192:8192+16<<10]) {
		t.Fatal("TryReadAt returned other bytes than were written")
	}
	// A batch: reads of whole blocks decrypted, writes of whole blocks
	// encrypted from copies (tried again while they would wait), an
	// unaligned write stepping aside.
	wb := plainPattern(8192, 3)
	var ios []IO
	for range 100 {
		// An ordinary write first: the first write of a clock tick
		// updates the file's timestamps, which RWF_NOWAIT refuses.
		if err := d.WriteAt(plainPattern(4096, 9), 16384+8192, false); err != nil {
			t.Fatal(err)
		}
		ios = []IO{{P: make([]byte, 4096), Off: 4096}, {P: wb, Off: 16384, Write: true}, {P: make([]byte, 4096), Off: mib},
			{P: plainPattern(100, 4), Off: 5000, Write: true}}
		c.Batcher.TryBatch(ios)
		if !errors.Is(ios[1].Err, ErrWouldBlock) {
			break
		}
	}
	if ios[0].Err != nil || !bytes.Equal(ios[0].P, m["root"][4096:8192]) {
		t.Errorf("TryBatch read: %v, or other bytes than were written", ios[0].Err)
	}
	if ios[1].Err != nil {
		t.Fatalf("TryBatch write of whole cached, owned blocks: %v", ios[1].Err)
	}
	if &ios[1].P[0] != &wb[0] || !bytes.Equal(wb, plainPattern(8192, 3)) {
		t.Fatal("TryBatch did not give the caller's buffer back unchanged")
	}
	copy(m["root"][16384:], wb)
	copy(m["root"][16384+8192:], plainPattern(4096, 9))
	if ios[2].Err == nil && !bytes.Equal(ios[2].P, make([]byte, 4096)) {
		t.Error("TryBatch read of a hole is not zeros")
	}
	if !errors.Is(ios[3].Err, ErrWouldBlock) {
		t.Errorf("unaligned TryBatch write: %v, want ErrWouldBlock", ios[3].Err)
	}
	grepPool(t, dir)
	// A read-modify-write of a block holds its lock exclusively: a Try
	// write of the block steps aside rather than wait.
	e := d.(*liveDisk).df.enc
	e.locks[(16384/4096)%encStripes].Lock()
	tick := func() { // as above: the Try write may not wait for the timestamps
		if err := d.WriteAt(plainPattern(4096, 9), 16384+8192, false); err != nil {
			t.Fatal(err)
		}
	}
	tick()
	if err := c.Nonblocking.TryWriteAt(wb, 16384); !errors.Is(err, ErrWouldBlock) {
		t.Errorf("TryWriteAt of a block locked by a read-modify-write: %v, want ErrWouldBlock", err)
	}
	tick()
	ios = []IO{{P: wb, Off: 16384, Write: true}}
	c.Batcher.TryBatch(ios)
	if !errors.Is(ios[0].Err, ErrWouldBlock) {
		t.Errorf("TryBatch write of a block locked by a read-modify-write: %v, want ErrWouldBlock", ios[0].Err)
	}
	e.locks[(16384/4096)%encStripes].Unlock()
	checkDisks(t, "after the Try calls", m, v.OpenDisk)
}

// TestEncryptedConcurrentUnaligned: goroutines write and zero unaligned
// runs, many of them sharing 4 KiB blocks with other goroutines' runs; every
// byte ends as the plain-memory model says.
func TestEncryptedConcurrentUnaligned(t *testing.T) {
	p := openEncPool(t, t.TempDir(), openKeyFile(t, filepath.Join(t.TempDir(), "keys.json")))
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Encrypt: true, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	v, _ := p.Volume("vm")
	const (
		workers = 8
		slot    = 300 // bytes: slots straddle blocks, and a block holds slots of several workers
		slots   = 64 << 10 / slot
		rounds  = 300
	)
	want := make([]byte, mib)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			d, err := v.OpenDisk("root")
			if err != nil {
				t.Error(err)
				return
			}
			defer d.Close()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range rounds {
				s := r.IntN(slots/workers)*workers + g // a slot of this worker's
				lo := r.IntN(slot)
				hi := lo + 1 + r.IntN(slot-lo)
				off := int64(s*slot + lo)
				var err error
				if r.IntN(5) == 0 {
					err = d.Zero(off, int64(hi-lo), ZeroMayTrim)
					clear(want[off : off+int64(hi-lo)])
				} else {
					b := make([]byte, hi-lo)
					for i := range b {
						b[i] = byte(r.Uint32()) | 1
					}
					err = d.WriteAt(b, off, false)
					copy(want[off:], b)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := make([]byte, mib)
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, want); i >= 0 {
		lost := 0
		for j := range got {
			if got[j] != want[j] {
				lost++
			}
		}
		t.Fatalf("%d bytes differ from the model, the first at %d (block %d)", lost, i, i/4096)
	}
}

// TestEncryptedKeyUnavailable: a volume whose data key cannot be unwrapped
// refuses to open, naming the cause, while volumes whose keys are in
// memory, and volumes in the clear, keep being served.
func TestEncryptedKeyUnavailable(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(t.TempDir(), "keys.json")
	kp := openKeyFile(t, keys)
	p := openEncPool(t, dir, kp)
	spec := func(name string, enc bool) VolumeSpec {
		return VolumeSpec{Name: name, Capacity: 8 * mib, Encrypt: enc, Disks: []DiskSpec{{Name: "root", Size: mib}}}
	}
	a := mustCreate(t, p, spec("a", true))
	b := mustCreate(t, p, spec("b", true))
	mustCreate(t, p, spec("c", true))
	mustCreate(t, p, spec("plain", false))
	va, _ := p.Volume("a")
	vb, _ := p.Volume("b")
	if _, _, err := vb.CreateSnapshot(context.Background(), "s", nil); err != nil {
		t.Fatal(err)
	}
	ma := encModel{"root": make([]byte, mib)}
	ma.write(t, va, "root", plainPattern(8192, 1), 0) // a's key is now in memory

	t.Run("unreachable", func(t *testing.T) {
		kp.down.Store(true)
		defer kp.down.Store(false)
		vb, _ := p.Volume("b")
		_, err := vb.OpenDisk("root")
		if !errors.Is(err, ErrKeyUnavailable) || !errors.Is(err, crypt.ErrUnreachable) || !strings.Contains(err.Error(), "127.0.0.1:5696") {
			t.Fatalf("open with the key manager down: %v, want ErrKeyUnavailable naming the unreachable server", err)
		}
		if _, err := vb.OpenSnapshotDisk("s", "root"); !errors.Is(err, ErrKeyUnavailable) || !errors.Is(err, crypt.ErrUnreachable) {
			t.Fatalf("open a snapshot disk with the key manager down: %v, want ErrKeyUnavailable", err)
		}
		ma.write(t, va, "root", plainPattern(5000, 2), 3000) // a is served meanwhile
		checkDisks(t, "a with the key manager down", ma, va.OpenDisk)
		_, _, err = p.Create(context.Background(), spec("new", true))
		if !errors.Is(err, crypt.ErrUnreachable) {
			t.Fatalf("create with the key manager down: %v", err)
		}
		if _, err := p.Volume("new"); !errors.Is(err, ErrVolumeNotFound) {
			t.Fatalf("a failed create left volume new: %v", err)
		}
	})
	t.Run("back", func(t *testing.T) {
		vb, _ := p.Volume("b")
		d, err := vb.OpenDisk("root")
		if err != nil {
			t.Fatalf("open once the key manager is back: %v", err)
		}
		_ = d.Close()
	})
	t.Run("revoked", func(t *testing.T) {
		if err := kp.RevokeKEK(context.Background(), b.Encryption.KeyID); err != nil {
			t.Fatal(err)
		}
		if err := kp.DestroyKEK(context.Background(), a.Encryption.KeyID); err != nil {
			t.Fatal(err)
		}
		// In memory: a and b are still served until the pool closes.
		checkDisks(t, "a after its KEK is destroyed", ma, va.OpenDisk)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		p = openEncPool(t, dir, openKeyFile(t, keys))
		for _, c := range []struct {
			vol   string
			cause error
		}{{"b", crypt.ErrKEKRevoked}, {"a", crypt.ErrKEKNotFound}} {
			v, _ := p.Volume(c.vol)
			_, err := v.OpenDisk("root")
			if !errors.Is(err, ErrKeyUnavailable) || !errors.Is(err, c.cause) || !strings.Contains(err.Error(), `volume "`+c.vol+`"`) {
				t.Fatalf("open %s: %v, want ErrKeyUnavailable and %v", c.vol, err, c.cause)
			}
		}
		vc, _ := p.Volume("c")
		if d, err := vc.OpenDisk("root"); err != nil {
			t.Fatalf("c, whose KEK is intact: %v", err)
		} else {
			_ = d.Close()
		}
	})
	t.Run("no provider", func(t *testing.T) {
		_ = p.Close()
		p = openEncPool(t, dir, nil)
		vc, _ := p.Volume("c")
		if _, err := vc.OpenDisk("root"); !errors.Is(err, ErrKeyUnavailable) || !errors.Is(err, crypt.ErrProvider) {
			t.Fatalf("open without the provider: %v, want ErrKeyUnavailable and crypt.ErrProvider", err)
		}
		if _, _, err := p.Create(context.Background(), spec("new", true)); !errors.Is(err, ErrNoKeyProvider) {
			t.Fatalf("create encrypted without a provider: %v, want ErrNoKeyProvider", err)
		}
		vp, _ := p.Volume("plain")
		m := encModel{"root": make([]byte, mib)}
		m.write(t, vp, "root", plainPattern(4096, 1), 0)
		checkDisks(t, "plain volume", m, vp.OpenDisk)
	})
}

// TestEncryptedRefusals: direct access to the image files, a disk size that
// is not whole blocks, and a fill from a source are refused for an
// encrypted volume, leaving it as it was.
func TestEncryptedRefusals(t *testing.T) {
	p := openEncPool(t, t.TempDir(), openKeyFile(t, filepath.Join(t.TempDir(), "keys.json")))
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Encrypt: true, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	v, _ := p.Volume("vm")
	_, err := v.SetDirectAccess(context.Background(), "node-1", true)
	if !errors.Is(err, ErrEncrypted) || !strings.Contains(err.Error(), "encrypted") {
		t.Fatalf("direct access: %v, want ErrEncrypted", err)
	}
	if got := v.Info().DirectAccess; got != nil {
		t.Fatalf("direct access recorded: %v", got)
	}
	for _, bad := range []func() error{
		func() error {
			_, err := v.AddDisk(context.Background(), DiskSpec{Name: "odd", Size: mib + 512})
			return err
		},
		func() error { _, err := v.GrowDisk(context.Background(), "root", mib+512); return err },
		func() error {
			_, _, err := p.Create(context.Background(), VolumeSpec{Name: "odd", Capacity: 8 * mib, Encrypt: true,
				Disks: []DiskSpec{{Name: "root", Size: mib + 512}}})
			return err
		},
		func() error {
			_, _, err := p.Create(context.Background(), VolumeSpec{Name: "fill", Capacity: 8 * mib, Encrypt: true, Fill: "backup-1",
				Disks: []DiskSpec{{Name: "root", Size: mib}}})
			return err
		},
	} {
		if err := bad(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v, want ErrInvalid", err)
		}
	}
}

// TestEncryptedManifestChecked: an encrypted volume's manifest whose key
// is damaged, or whose disks are not whole blocks, is quarantined at start,
// not served; the other volumes are.
func TestEncryptedManifestChecked(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(t.TempDir(), "keys.json")
	p := openEncPool(t, dir, openKeyFile(t, keys))
	for _, n := range []string{"nokey", "oddsize", "fine"} {
		mustCreate(t, p, VolumeSpec{Name: n, Capacity: 8 * mib, Encrypt: true, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(m map[string]any){
		"nokey":   func(m map[string]any) { m["key"].(map[string]any)["keyId"] = "" },
		"oddsize": func(m map[string]any) { m["disks"].([]any)[0].(map[string]any)["size"] = mib + 512 },
	} {
		path := filepath.Join(dir, "volumes", name, "volume.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p = openEncPool(t, dir, openKeyFile(t, keys))
	for _, n := range []string{"nokey", "oddsize"} {
		v, err := p.Volume(n)
		if err != nil {
			t.Fatal(err)
		}
		if v.Info().Broken == "" {
			t.Errorf("volume %s with a damaged encrypted manifest is served", n)
		}
	}
	v, _ := p.Volume("fine")
	if d, err := v.OpenDisk("root"); err != nil {
		t.Fatal(err)
	} else {
		_ = d.Close()
	}
}
