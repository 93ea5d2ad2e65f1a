package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// randomVM is a VM of one disk of random bytes (they do not compress),
// with its first MiB zeros.
func randomVM(rng *rand.Rand, size int64) *memVM {
	vm := newVM(map[string]int64{"root": size}, "root")
	for i := int64(1 << 20); i < size; i++ {
		vm.disks["root"][i] = byte(rng.UintN(256))
	}
	return vm
}

func keys(t *testing.T, store objstore.Store, prefix string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if err := store.List(context.Background(), prefix, func(k string, n int64) error { out[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBlocksTravelInPacks(t *testing.T) {
	ctx := context.Background()
	_, store, r, _ := testRepo(t)
	vm := randomVM(rand.New(rand.NewPCG(11, 12)), 40<<20)
	m, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "s"})
	if err != nil {
		t.Fatal(err)
	}
	packs, indexes := keys(t, store, "packs/"), keys(t, store, "index/")
	if m.Stats.ChunksNew != 39<<20/BlockSize || m.Stats.ChunksZero != 16 || m.Stats.Packs != 3 || len(packs) != 3 || len(indexes) != 3 {
		t.Fatalf("40 MiB (39 random): %+v; %d packs, %d indexes; want 624 blocks in 3 packs", m.Stats, len(packs), len(indexes))
	}
	for k, n := range packs {
		if n > PackSize+readRun*(BlockSize+64) {
			t.Errorf("pack %s: %d bytes, more than a pack and one read's blocks", k, n)
		}
		if _, ok := indexes["index/"+k[strings.LastIndexByte(k, '/')+1:]]; !ok {
			t.Errorf("pack %s has no index", k)
		}
	}
	out := newVM(map[string]int64{"root": 40 << 20}, "root")
	if err := r.Restore(ctx, m, nil, out, nil, 3); err != nil {
		t.Fatal(err)
	}
	sameDisks(t, "restore", out, vm)
}

func TestFormat1RepositoryIsRefused(t *testing.T) {
	ctx := context.Background()
	srv := testRepoStore(t)
	if err := srv.Put(ctx, "config", []byte(`{"version":1,"id":"0011223344556677","chunkSize":1048576}`)); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, srv, bytes.Repeat([]byte("k"), 32))
	if !errors.Is(err, ErrNoRepository) || !strings.Contains(err.Error(), "made by an older quiver") {
		t.Fatalf("open of a format-1 repository: %v", err)
	}
}

func testRepoStore(t *testing.T) objstore.Store {
	t.Helper()
	_, store, _, _ := testRepo(t)
	for k := range keys(t, store, "") {
		if err := store.Delete(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	return store
}

// The index cache spares the GETs of indexes already seen, and is never
// trusted beyond what it can prove: a damaged copy is fetched again, a copy
// of a pack no longer listed is dropped.
func TestIndexCache(t *testing.T) {
	ctx := context.Background()
	srv, store, r, key := testRepo(t)
	cache := t.TempDir()
	vm := randomVM(rand.New(rand.NewPCG(13, 14)), 36<<20)
	r1, err := OpenWith(ctx, store, key, RepoOptions{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r1.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "s"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, r.ID(), "index")
	cached, err := os.ReadDir(dir)
	if err != nil || len(cached) != m.Stats.Packs || m.Stats.Packs < 2 {
		t.Fatalf("cache after a backup of %d packs: %v %v", m.Stats.Packs, cached, err)
	}
	requests := func(r *Repository) int64 {
		t.Helper()
		n := srv.Requests()
		if err := r.refresh(ctx); err != nil {
			t.Fatal(err)
		}
		return srv.Requests() - n
	}
	restores := func(r *Repository) {
		t.Helper()
		out := newVM(map[string]int64{"root": 36 << 20}, "root")
		if err := r.Restore(ctx, m, nil, out, nil, 2); err != nil {
			t.Fatal(err)
		}
		sameDisks(t, "restore", out, vm)
	}
	open := func(dir string) *Repository {
		t.Helper()
		r, err := OpenWith(ctx, store, key, RepoOptions{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// Warm: the listing alone. Cold: the listing and every index.
	warm := open(cache)
	if n := requests(warm); n != 1 {
		t.Errorf("refresh with every index cached: %d requests, want 1 (the listing)", n)
	}
	restores(warm)
	if n := requests(open(t.TempDir())); n != int64(1+m.Stats.Packs) {
		t.Errorf("refresh with an empty cache: %d requests, want %d", n, 1+m.Stats.Packs)
	}

	// A damaged copy: fetched again, and the copy mended.
	victim := filepath.Join(dir, cached[0].Name())
	data, _ := os.ReadFile(victim)
	data[len(data)/2] ^= 1
	if err := os.WriteFile(victim, data, 0o600); err != nil {
		t.Fatal(err)
	}
	mended := open(cache)
	if n := requests(mended); n != 2 {
		t.Errorf("refresh with one cached index damaged: %d requests, want 2", n)
	}
	restores(mended)
	stored, err := store.Get(ctx, indexKey(cached[0].Name()), maxMeta)
	if got, _ := os.ReadFile(victim); err != nil || !bytes.Equal(got, stored) {
		t.Errorf("damaged cache entry not replaced: %v", err)
	}

	// A copy of a pack the store does not list: dropped, never used.
	ghost := filepath.Join(dir, strings.Repeat("ab", 16))
	if err := os.WriteFile(ghost, stored, 0o600); err != nil {
		t.Fatal(err)
	}
	g := open(cache)
	requests(g)
	if _, err := os.Stat(ghost); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cached index of a pack not in the store kept: %v", err)
	}
	if len(g.idx.snapshot()) != m.Stats.Packs {
		t.Errorf("index holds %d packs, the store %d", len(g.idx.snapshot()), m.Stats.Packs)
	}
}

// A base deleted and collected after the incremental chose it: the blocks
// it no longer has are read again, and the backup is whole.
func TestIncrementalFromACollectedBase(t *testing.T) {
	ctx := context.Background()
	_, _, r, _ := testRepo(t)
	rng := rand.New(rand.NewPCG(15, 16))
	vm := randomVM(rng, 4<<20)
	base, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, base.ID); err != nil {
		t.Fatal(err)
	}
	if n, _, err := r.Collect(ctx); err != nil || n != base.Stats.Packs {
		t.Fatalf("collect of the base: %d %v", n, err)
	}
	copy(vm.disks["root"][2<<20:], "changed")
	inc, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "b", Parent: base,
		Changes: map[string]Change{"root": {Ranges: []Range{{2 << 20, 7}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if inc.Stats.BytesRead != 3<<20 || inc.Parent != base.ID {
		t.Errorf("incremental from a collected base read %d bytes, want the 3 MiB of stored blocks", inc.Stats.BytesRead)
	}
	out := newVM(map[string]int64{"root": 4 << 20}, "root")
	if err := r.Restore(ctx, inc, nil, out, nil, 2); err != nil {
		t.Fatal(err)
	}
	sameDisks(t, "restore", out, vm)
}

// Collect rewrites a pack mostly unused (its used blocks into a new pack)
// and removes it; the backup that uses them restores and verifies, and a
// disk of it served over NBD while that happened reads on.
func TestCollectRepacks(t *testing.T) {
	ctx := context.Background()
	_, store, r, key := testRepo(t)
	rng := rand.New(rand.NewPCG(17, 18))
	vm := randomVM(rng, 8<<20)
	a, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// Three blocks in four change.
	var ch Change
	for off := int64(1 << 20); off < 8<<20; off += BlockSize {
		if off/BlockSize%4 != 0 {
			vm.disks["root"][off] ^= 0xff
			ch.Ranges = append(ch.Ranges, Range{off, 1})
		}
	}
	b, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "b", Parent: a, Changes: map[string]Change{"root": ch}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Stats.ChunksNew != 84 || b.Stats.ChunksReused != 28 {
		t.Fatalf("incremental: %+v, want 84 new blocks and 28 reused", b.Stats)
	}
	// Served by another node: its index does not see the repack coming.
	other, err := Open(ctx, store, key)
	if err != nil {
		t.Fatal(err)
	}
	disk, err := other.OpenDisk(ctx, b.ID, "root")
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	if err := r.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	before := storeBytes(t, store, "packs/")
	oldPacks := keys(t, store, "packs/")
	removed, freed, err := r.Collect(ctx)
	if err != nil || removed != 1 {
		t.Fatalf("collect: removed %d packs (%v), want a's, a quarter used", removed, err)
	}
	after := storeBytes(t, store, "packs/")
	if after >= before-5<<20 || freed < 5<<20 {
		t.Errorf("packs: %d bytes before, %d after (freed %d): a's unused three quarters (5.25 MiB) stay", before, after, freed)
	}
	newPacks := keys(t, store, "packs/")
	moved := 0
	for k := range newPacks {
		if _, ok := oldPacks[k]; !ok {
			moved++
		}
	}
	if moved != 1 || len(newPacks) != 2 {
		t.Errorf("packs after collect: %d, %d new; want b's and one of a's blocks", len(newPacks), moved)
	}
	out := newVM(map[string]int64{"root": 8 << 20}, "root")
	if err := r.Restore(ctx, b, nil, out, nil, 2); err != nil {
		t.Fatal(err)
	}
	sameDisks(t, "restore after a repack", out, vm)
	if bad, err := r.Verify(ctx, b, nil, 2); err != nil || len(bad) != 0 {
		t.Fatalf("verify after a repack: %v %v", bad, err)
	}
	if n, _, err := r.Collect(ctx); err != nil || n != 0 {
		t.Errorf("a second collect removed %d packs (%v)", n, err)
	}
	// The export opened before the repack reads the moved blocks.
	got := make([]byte, 8<<20)
	for off := int64(0); off < 8<<20; {
		n := min(int64(1+rng.IntN(300<<10)), 8<<20-off)
		if err := disk.ReadAt(got[off:off+n], off); err != nil {
			t.Fatalf("export read at %d: %v", off, err)
		}
		off += n
	}
	if !bytes.Equal(got, vm.disks["root"]) {
		t.Fatal("export differs from the disk")
	}
	ext, err := disk.Extents(0, 8<<20, 0)
	if err != nil || len(ext) != 2 || !ext[0].Hole || ext[0].Length != 1<<20 || ext[1].Hole {
		t.Errorf("extents: %+v %v, want a hole of the first MiB, then data", ext, err)
	}
}

// failingStore refuses the Put of keys under a prefix, as a store that goes
// down at that step would.
type failingStore struct {
	objstore.Store
	prefix string
}

func (s failingStore) Put(ctx context.Context, key string, data []byte) error {
	if strings.HasPrefix(key, s.prefix) {
		return fmt.Errorf("put %s: %w", key, objstore.ErrUnreachable)
	}
	return s.Store.Put(ctx, key, data)
}

// A backup that fails after some of its packs are stored (before their
// index, or before its manifest) shows nothing, and leaves only packs that
// Collect removes; the backups before it are untouched.
func TestFailedBackupLeavesOnlyGarbage(t *testing.T) {
	ctx := context.Background()
	_, store, r, key := testRepo(t)
	rng := rand.New(rand.NewPCG(19, 20))
	vm := randomVM(rng, 20<<20)
	good, err := r.Backup(ctx, vm, Options{Volume: "vm", Snapshot: "good"})
	if err != nil {
		t.Fatal(err)
	}
	clean := keys(t, store, "")
	for _, step := range []string{"index/", "backups/"} {
		t.Run(step, func(t *testing.T) {
			broken, err := Open(ctx, failingStore{store, step}, key)
			if err != nil {
				t.Fatal(err)
			}
			other := randomVM(rng, 20<<20)
			if _, err := broken.Backup(ctx, other, Options{Volume: "vm", Snapshot: "bad"}); !errors.Is(err, objstore.ErrUnreachable) {
				t.Fatalf("backup with the store failing at %s: %v", step, err)
			}
			if list, _, err := r.List(ctx, ""); err != nil || len(list) != 1 || list[0].ID != good.ID {
				t.Fatalf("backups after a failed one: %v %v", list, err)
			}
			if len(keys(t, store, "packs/")) <= good.Stats.Packs {
				t.Fatal("the failed backup stored no pack: the test tests nothing")
			}
			if _, _, err := r.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			left := keys(t, store, "")
			for k := range left {
				if _, ok := clean[k]; !ok {
					t.Errorf("after collect: %s of the failed backup is left", k)
				}
			}
			if len(left) != len(clean) {
				t.Errorf("after collect: %d objects, before the failed backup %d", len(left), len(clean))
			}
			if bad, err := r.Verify(ctx, good, nil, 2); err != nil || len(bad) != 0 {
				t.Fatalf("verify of the good backup: %v %v", bad, err)
			}
		})
	}
}
