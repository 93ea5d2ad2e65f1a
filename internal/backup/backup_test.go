package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/tests3"
)

// memVM is a VM's disks in memory: a Source and a Sink.
type memVM struct {
	mu    sync.Mutex
	disks map[string][]byte
	order []string
}

func newVM(sizes map[string]int64, order ...string) *memVM {
	vm := &memVM{disks: map[string][]byte{}, order: order}
	for _, n := range order {
		vm.disks[n] = make([]byte, sizes[n])
	}
	return vm
}

func (v *memVM) Disks() []Disk {
	var out []Disk
	for _, n := range v.order {
		out = append(out, Disk{n, int64(len(v.disks[n]))})
	}
	return out
}

func (v *memVM) ReadAt(disk string, p []byte, off int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	copy(p, v.disks[disk][off:])
	return nil
}

func (v *memVM) WriteAt(disk string, p []byte, off int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, ok := v.disks[disk]
	if !ok || off+int64(len(p)) > int64(len(d)) {
		return fmt.Errorf("write beyond disk %s", disk)
	}
	copy(d[off:], p)
	return nil
}

func (v *memVM) clone() *memVM {
	c := &memVM{disks: map[string][]byte{}, order: v.order}
	for n, d := range v.disks {
		c.disks[n] = bytes.Clone(d)
	}
	return c
}

// fill writes random data over a fraction of each disk, chunk-aligned
// runs, and returns the ranges written per disk.
func (v *memVM) fill(rng *rand.Rand, fraction float64) map[string]Change {
	out := map[string]Change{}
	for _, n := range v.order {
		d := v.disks[n]
		var ch Change
		for off := int64(0); off < int64(len(d)); off += 64 << 10 {
			if rng.Float64() < fraction {
				n := int64(1 + rng.IntN(8192))
				n = min(n, int64(len(d))-off)
				for i := range n {
					d[off+i] = byte(rng.UintN(256))
				}
				ch.Ranges = append(ch.Ranges, Range{off, n})
			}
		}
		out[n] = ch
	}
	return out
}

func testRepo(t *testing.T) (*tests3.Server, objstore.Store, *Repository, []byte) {
	t.Helper()
	srv := tests3.Start(t)
	store, err := objstore.NewS3(context.Background(), srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte("k"), 32)
	r, err := Init(context.Background(), store, key)
	if err != nil {
		t.Fatal(err)
	}
	return srv, store, r, key
}

func sameDisks(t *testing.T, what string, got, want *memVM) {
	t.Helper()
	for _, n := range want.order {
		if !bytes.Equal(got.disks[n], want.disks[n]) {
			t.Fatalf("%s: disk %s differs", what, n)
		}
	}
}

func storeBytes(t *testing.T, s objstore.Store, prefix string) (n int64) {
	t.Helper()
	if err := s.List(context.Background(), prefix, func(_ string, size int64) error { n += size; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBackupIncrementalRestoreVerify(t *testing.T) {
	ctx := context.Background()
	srv, store, r, key := testRepo(t)
	rng := rand.New(rand.NewPCG(1, 2))
	vm := newVM(map[string]int64{"root": 8 << 20, "data": 6<<20 + 4096, "logs": 3 << 20}, "root", "data", "logs")
	vm.fill(rng, 0.5)
	full, err := r.Backup(ctx, vm, Options{Volume: "vm1", Snapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if full.Stats.ChunksZero == 0 || full.Stats.ChunksNew == 0 || full.Stats.BytesRead != full.Stats.Logical {
		t.Errorf("full backup stats %+v", full.Stats)
	}
	v1 := vm.clone()

	// 1% changed: only the blocks that hold a change are read.
	changes := vm.fill(rng, 0.01)
	inc, err := r.Backup(ctx, vm, Options{Volume: "vm1", Snapshot: "s2", Parent: full, Changes: changes})
	if err != nil {
		t.Fatal(err)
	}
	touched := map[string]bool{}
	for d, ch := range changes {
		for _, rg := range ch.Ranges {
			for i := rg.Offset / BlockSize; i <= (rg.Offset+rg.Length-1)/BlockSize; i++ {
				touched[fmt.Sprint(d, i)] = true
			}
		}
	}
	if inc.Stats.BytesRead > int64(len(touched))*BlockSize || inc.Parent != full.ID {
		t.Errorf("incremental read %d bytes for %d blocks touched; parent %q", inc.Stats.BytesRead, len(touched), inc.Parent)
	}

	// Each backup restores to exactly its point, through a repository
	// opened afresh with the key.
	r2, err := Open(ctx, store, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		want *memVM
	}{{full.ID, v1}, {inc.ID, vm}} {
		m, err := r2.Get(ctx, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		out := newVM(map[string]int64{"root": 8 << 20, "data": 6<<20 + 4096, "logs": 3 << 20}, "root", "data", "logs")
		if err := r2.Restore(ctx, m, nil, out, nil, 4); err != nil {
			t.Fatal(err)
		}
		sameDisks(t, "restore of "+tc.id, out, tc.want)
		bad, err := r2.Verify(ctx, m, nil, 4)
		if err != nil || len(bad) != 0 {
			t.Fatalf("verify %s: %v %v", tc.id, bad, err)
		}
	}
	// One disk alone.
	one := newVM(map[string]int64{"data": 6<<20 + 4096}, "data")
	if err := r2.Restore(ctx, inc, []string{"data"}, one, nil, 2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one.disks["data"], vm.disks["data"]) {
		t.Fatal("one-disk restore differs")
	}
	if err := r2.Restore(ctx, inc, []string{"nope"}, one, nil, 2); !errors.Is(err, ErrInvalid) {
		t.Errorf("restore of a disk not in the backup: %v", err)
	}

	// The store holds no plaintext: a recognisable pattern written to a
	// disk appears in no object.
	marker := []byte("QUIVER-PLAINTEXT-MARKER-0123456789")
	copy(vm.disks["logs"][1<<20:], bytes.Repeat(marker, 100))
	if _, err := r.Backup(ctx, vm, Options{Volume: "vm1", Snapshot: "s3", Parent: inc,
		Changes: map[string]Change{"root": {}, "data": {}, "logs": {Ranges: []Range{{1 << 20, 4096}}}}}); err != nil {
		t.Fatal(err)
	}
	err = store.List(ctx, "", func(k string, _ int64) error {
		data, err := store.Get(ctx, k, 8<<20)
		if err != nil {
			return err
		}
		if bytes.Contains(data, marker[:16]) || bytes.Contains(data, []byte("vm1")) {
			return fmt.Errorf("object %s holds plaintext", k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = srv
}

func TestBackupFaults(t *testing.T) {
	ctx := context.Background()
	srv, store, r, key := testRepo(t)
	rng := rand.New(rand.NewPCG(3, 4))
	vm := newVM(map[string]int64{"root": 4 << 20, "data": 4 << 20}, "root", "data")
	vm.fill(rng, 0.6)
	good, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "a"})
	if err != nil {
		t.Fatal(err)
	}
	before := vm.clone()

	// The store goes away mid-backup: an error, and no backup visible.
	vm.fill(rng, 0.9)
	srv.FailAfter(3)
	if _, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "b"}); !errors.Is(err, objstore.ErrUnreachable) {
		t.Fatalf("backup with the store down midway: %v, want ErrUnreachable", err)
	}
	srv.Down(false)
	list, _, err := r.List(ctx, "vm")
	if err != nil || len(list) != 1 || list[0].ID != good.ID {
		t.Fatalf("after a failed backup: %v %v, want only %s", list, err, good.ID)
	}

	// A wrong key opens nothing.
	if _, err := Open(ctx, store, bytes.Repeat([]byte("x"), 32)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("wrong key: %v", err)
	}
	if _, err := Init(ctx, store, key); !errors.Is(err, ErrExists) {
		t.Errorf("init over a repository: %v", err)
	}
	if _, err := r.Get(ctx, "../config"); !errors.Is(err, ErrInvalid) {
		t.Errorf("path trick: %v", err)
	}

	// A damaged block in a pack: verify names it (disk, offset, pack),
	// restore refuses the point.
	var victim BlockID
	var victimOff int64
	for i, id := range good.Disks[1].Blocks {
		if !id.IsZero() {
			victim, victimOff = id, int64(i)*BlockSize
			break
		}
	}
	loc, ok := r.idx.lookup(victim)
	if !ok {
		t.Fatalf("block %s of the backup is in no pack", victim)
	}
	srv.CorruptAt(t, packKey(loc.pack), int64(loc.offset+loc.length/2))
	bad, err := r.Verify(ctx, good, nil, 2)
	if err != nil || len(bad) != 1 || bad[0].ID != victim.String() || bad[0].Disk != "data" || bad[0].Offset != victimOff ||
		bad[0].Pack != loc.pack {
		t.Fatalf("verify of a damaged backup: %+v %v; want block %s of data at %d in pack %s", bad, err, victim, victimOff, loc.pack)
	}
	out := newVM(map[string]int64{"root": 4 << 20, "data": 4 << 20}, "root", "data")
	if err := r.Restore(ctx, good, nil, out, nil, 2); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), victim.String()) ||
		!strings.Contains(err.Error(), loc.pack) {
		t.Fatalf("restore of a damaged backup: %v", err)
	}
	// The root disk alone does not need the damaged chunk.
	if err := r.Restore(ctx, good, []string{"root"}, out, nil, 2); err != nil || !bytes.Equal(out.disks["root"], before.disks["root"]) {
		t.Fatalf("restore of the intact disk: %v", err)
	}
}

func TestBackupDedupDeleteCollect(t *testing.T) {
	ctx := context.Background()
	_, store, r, _ := testRepo(t)
	rng := rand.New(rand.NewPCG(5, 6))
	golden := newVM(map[string]int64{"root": 8 << 20}, "root")
	// Every byte random: what a manifest costs (32 bytes a block) is
	// weighed against blocks that do not compress.
	for i := range golden.disks["root"] {
		golden.disks["root"][i] = byte(rng.UintN(256))
	}
	first, err := r.Backup(ctx, golden, Options{Volume: "golden", Snapshot: "s"})
	if err != nil {
		t.Fatal(err)
	}
	one := storeBytes(t, store, "")
	for i := range 20 {
		if _, err := r.Backup(ctx, golden.clone(), Options{Volume: fmt.Sprintf("vdi-%02d", i), Snapshot: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	if all := storeBytes(t, store, ""); float64(all) > 1.1*float64(one) {
		t.Errorf("21 backups of one image take %d bytes, one takes %d: more than 1.1x", all, one)
	}
	// A changed clone, then deleted: collect removes its own packs only,
	// and the store is back to what it was.
	other := golden.clone()
	other.fill(rng, 1)
	before := storeBytes(t, store, "")
	ob, err := r.Backup(ctx, other, Options{Volume: "other", Snapshot: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if ob.Stats.ChunksNew != 128 || ob.Stats.Packs == 0 {
		t.Fatalf("a clone with every block changed: %+v", ob.Stats)
	}
	if err := r.Delete(ctx, ob.ID); err != nil {
		t.Fatal(err)
	}
	removed, _, err := r.Collect(ctx)
	if err != nil || removed != ob.Stats.Packs {
		t.Fatalf("collect removed %d packs, %v; want the %d packs of the deleted backup", removed, err, ob.Stats.Packs)
	}
	if after := storeBytes(t, store, ""); after != before {
		t.Errorf("store after collect: %d bytes, before the deleted backup %d", after, before)
	}
	if bad, err := r.Verify(ctx, first, nil, 2); err != nil || len(bad) != 0 {
		t.Fatalf("first backup after collect: %v %v", bad, err)
	}
	if _, err := r.Get(ctx, ob.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted backup: %v", err)
	}
}

func TestKeyRotation(t *testing.T) {
	ctx := context.Background()
	_, store, r, oldKey := testRepo(t)
	newKey := bytes.Repeat([]byte("n"), 40)
	id, err := r.AddKey(ctx, newKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveKey(ctx, r.KeyID()); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, store, oldKey); !errors.Is(err, ErrWrongKey) {
		t.Errorf("old key after rotation: %v", err)
	}
	r2, err := Open(ctx, store, newKey)
	if err != nil || r2.KeyID() != id {
		t.Fatalf("new key: %v", err)
	}
	if err := r2.RemoveKey(ctx, id); !errors.Is(err, ErrInvalid) {
		t.Errorf("removing the last key: %v", err)
	}
	if _, err := r2.AddKey(ctx, []byte("short")); !errors.Is(err, ErrInvalid) {
		t.Errorf("short key: %v", err)
	}
}

func TestKeepPolicy(t *testing.T) {
	day := func(d, h int) *Manifest {
		return &Manifest{ID: fmt.Sprintf("d%02d-%02d", d, h), CreatedAt: time.Date(2026, 11, d, h, 0, 0, 0, time.UTC)}
	}
	var list []*Manifest
	for d := 1; d <= 30; d++ {
		list = append(list, day(d, 1), day(d, 13))
	}
	keep, drop := KeepPolicy{Last: 3, Daily: 7}.Select(list)
	var ids []string
	for _, m := range keep {
		ids = append(ids, m.ID)
	}
	want := "d24-13 d25-13 d26-13 d27-13 d28-13 d29-13 d30-01 d30-13"
	if strings.Join(ids, " ") != want || len(drop) != len(list)-len(keep) {
		t.Errorf("keep %v, want %s", ids, want)
	}
	if k, d := (KeepPolicy{}).Select(list); len(k) != len(list) || d != nil {
		t.Error("a zero policy drops")
	}
}
