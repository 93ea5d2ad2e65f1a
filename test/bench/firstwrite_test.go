package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestFirstWriteBenchmark measures what the first write into a chunk costs
// on XFS, with the guard against blocks another file's copy on write just
// left to the image (internal/pool/unshare.go) and without it, in the same
// run: 4 KiB writes at QD1, each into a chunk not written since (a) a
// snapshot, where the chunk is shared and the guard clones it from a
// scratch file instead of letting XFS copy it on write, and (b) the pool's
// reopening, where the chunk is the image's alone and the guard forces the
// log before the write goes in place. Then the same number of writes into
// chunks already written (owned), which the guard does not touch.
func TestFirstWriteBenchmark(t *testing.T) {
	requireBench(t)
	mnt := testfs.MountXFS(t, 8*gib)
	ctx := context.Background()
	const size, writes, rounds = gib, 512, 3
	r := &report{}
	r.add("case (4 KiB writes, QD1, each into another 1 MiB chunk)", "guard on: mean per write", "guard off", "on / off")
	type result struct{ snap, reopen, owned time.Duration }
	res := map[bool][]result{}
	for round := range rounds {
		for _, guard := range []bool{round%2 == 0, round%2 != 0} {
			dir := filepath.Join(mnt, fmt.Sprintf("pool-%v-%d", guard, round))
			rr := firstWrites(t, ctx, dir, guard, size, writes)
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			res[guard] = append(res[guard], result{rr[0], rr[1], rr[2]})
			t.Logf("round %d guard=%v: after snapshot %v, after reopen %v, owned %v per write", round, guard, rr[0], rr[1], rr[2])
		}
	}
	best := func(rs []result, f func(result) time.Duration) time.Duration {
		m := f(rs[0])
		for _, x := range rs[1:] {
			m = min(m, f(x))
		}
		return m
	}
	for _, c := range []struct {
		name string
		f    func(result) time.Duration
	}{
		{"first write after a snapshot (chunk shared)", func(x result) time.Duration { return x.snap }},
		{"first write after the pool reopened (chunk not shared)", func(x result) time.Duration { return x.reopen }},
		{"later write (chunk owned)", func(x result) time.Duration { return x.owned }},
	} {
		on, off := best(res[true], c.f), best(res[false], c.f)
		r.add(c.name, us(on), us(off), ratio(on, off))
	}
	r.print(os.Stdout, fmt.Sprintf("First writes into chunks on XFS, best of %d rounds", rounds))
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f us", float64(d.Nanoseconds())/1000) }

// firstWrites makes a pool in dir with one volume of one disk of size
// bytes, fills it, and returns the mean time per write of writes 4 KiB
// writes into distinct chunks after a snapshot, after a reopen of the
// pool, and again into the same (now owned) chunks.
func firstWrites(t *testing.T, ctx context.Context, dir string, guard bool, size int64, writes int) [3]time.Duration {
	open := func() *pool.Pool {
		p, err := pool.OpenWith(ctx, dir, pool.Options{Logger: quietLog(), NoUnshareGuard: !guard})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := open()
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: size, Disks: []pool.DiskSpec{{Name: "d", Size: size}}}); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("vm")
	h, err := v.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	fill(t, h, size)
	if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	chunks := rng.Perm(int(size / pool.ChunkSize))
	block := make([]byte, 4096)
	run := func(h pool.Disk, cs []int) time.Duration {
		start := time.Now()
		for _, c := range cs {
			fillRandom(rng, block)
			off := int64(c)*pool.ChunkSize + rng.Int64N(pool.ChunkSize/4096)*4096
			if err := h.WriteAt(block, off, false); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start) / time.Duration(len(cs))
	}
	var out [3]time.Duration
	out[0] = run(h, chunks[:writes])
	if err := h.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	_ = p.Close()
	p = open()
	defer p.Close()
	v, _ = p.Volume("vm")
	if h, err = v.OpenDisk("d"); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	out[1] = run(h, chunks[writes:2*writes])
	out[2] = run(h, chunks[writes:2*writes])
	if err := h.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}
