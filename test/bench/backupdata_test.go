package bench

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// The content of the backup benchmark's disks: what a VM's disks hold,
// neither zeros nor pure noise. Each 64 KiB block is, by a coin of its
// seed, either random bytes (compressed or encrypted files, media) or
// text-like lines (logs, configuration, source) that zstd compresses about
// threefold. Every block is distinct: nothing deduplicates by accident.
const dataBlock = 64 << 10

// words is the vocabulary of the text blocks: 2,048 made-up words of 2 to 10
// letters, the same in every run.
var words = func() []string {
	r := rand.New(rand.NewPCG(33, 33))
	w := make([]string, 2048)
	for i := range w {
		b := make([]byte, 2+r.IntN(9))
		for j := range b {
			b[j] = byte('a' + r.IntN(26))
		}
		w[i] = string(b)
	}
	return w
}()

// fillBlock fills p (at most dataBlock bytes) with the block of seed.
func fillBlock(p []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	if r.IntN(2) == 0 {
		var key [32]byte
		binary.LittleEndian.PutUint64(key[:], seed)
		binary.LittleEndian.PutUint64(key[8:], 0x5eed)
		_, _ = rand.NewChaCha8(key).Read(p)
		return
	}
	buf := make([]byte, 0, len(p)+256)
	for len(buf) < len(p) {
		buf = append(buf, "2026-05-"...)
		buf = strconv.AppendUint(buf, uint64(10+r.IntN(18)), 10)
		buf = append(buf, 'T')
		buf = strconv.AppendUint(buf, uint64(10+r.IntN(14)), 10)
		buf = append(buf, ':')
		buf = strconv.AppendUint(buf, uint64(10+r.IntN(50)), 10)
		buf = append(buf, ":00."...)
		buf = strconv.AppendUint(buf, uint64(r.IntN(1000000)), 10)
		buf = append(buf, "Z vm01 "...)
		buf = append(buf, words[r.IntN(64)]...)
		buf = append(buf, '[')
		buf = strconv.AppendUint(buf, uint64(r.IntN(65536)), 10)
		buf = append(buf, "]:"...)
		for range 4 + r.IntN(12) {
			buf = append(buf, ' ')
			buf = append(buf, words[r.IntN(len(words))]...)
		}
		buf = append(buf, '\n')
	}
	copy(p, buf)
}

// blockSeed names the block at off of disk di in the data set of base.
func blockSeed(base uint64, di int, off int64) uint64 {
	return base*0x100000001b3 ^ uint64(di)<<48 ^ uint64(off/dataBlock)
}

// benchDisk is one disk of a benchmark volume.
type benchDisk struct {
	name string
	size int64
}

// dialDisks opens one NBD connection per disk of vol on addr.
func dialDisks(t *testing.T, ctx context.Context, addr, vol string, disks []benchDisk) []*nbdclient.Conn {
	t.Helper()
	conns := make([]*nbdclient.Conn, len(disks))
	for i, d := range disks {
		c, err := nbdclient.Dial(ctx, addr, vol+"/"+d.name, nbdclient.Options{Timeout: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if c.Size() != d.size {
			t.Fatalf("%s/%s: %d bytes over NBD, want %d", vol, d.name, c.Size(), d.size)
		}
		conns[i] = c
	}
	return conns
}

// fillVolume writes every byte of every disk of vol through NBD, with the
// data set of base, and flushes.
func fillVolume(t *testing.T, ctx context.Context, addr, vol string, disks []benchDisk, base uint64) {
	t.Helper()
	conns := dialDisks(t, ctx, addr, vol, disks)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	type job struct {
		disk int
		off  int64
	}
	const piece = 1 << 20
	jobs := make(chan job)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range 3 {
		wg.Go(func() {
			buf := make([]byte, piece)
			for j := range jobs {
				n := min(piece, disks[j.disk].size-j.off)
				for o := int64(0); o < n; o += dataBlock {
					fillBlock(buf[o:min(o+dataBlock, n)], blockSeed(base, j.disk, j.off+o))
				}
				if err := conns[j.disk].WriteAt(buf[:n], j.off, false); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for di, d := range disks {
		for off := int64(0); off < d.size; off += piece {
			jobs <- job{di, off}
		}
	}
	close(jobs)
	wg.Wait()
	if first != nil {
		t.Fatalf("writing %s: %v", vol, first)
	}
	for _, c := range conns {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// changeSummary says what changeVolume wrote.
type changeSummary struct {
	writes int
	bytes  int64
	chunks int // distinct 1 MiB chunks touched, over every disk
}

// changeVolume writes fraction of vol's bytes in writes of 4 KiB to 64 KiB
// (4 KiB aligned) scattered uniformly over its disks, through NBD (so that
// quiver's change tracking sees them), with new data of the same kind, and
// flushes.
func changeVolume(t *testing.T, ctx context.Context, addr, vol string, disks []benchDisk, fraction float64, seed uint64) changeSummary {
	t.Helper()
	var total int64
	for _, d := range disks {
		total += d.size
	}
	type write struct {
		disk     int
		off, len int64
		seed     uint64
	}
	r := rand.New(rand.NewPCG(seed, 1))
	var (
		ws      []write
		sum     changeSummary
		touched = map[[2]int64]bool{}
	)
	for sum.bytes < int64(fraction*float64(total)) {
		at := r.Int64N(total) &^ 4095
		di := 0
		for at >= disks[di].size {
			at -= disks[di].size
			di++
		}
		n := min(int64(4096*(1+r.IntN(16))), disks[di].size-at)
		ws = append(ws, write{di, at, n, r.Uint64()})
		sum.bytes += n
		for c := at >> 20; c <= (at+n-1)>>20; c++ {
			touched[[2]int64{int64(di), c}] = true
		}
	}
	sum.writes, sum.chunks = len(ws), len(touched)
	conns := dialDisks(t, ctx, addr, vol, disks)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	jobs := make(chan write)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range 4 {
		wg.Go(func() {
			buf := make([]byte, dataBlock)
			for w := range jobs {
				fillBlock(buf[:w.len], w.seed)
				if err := conns[w.disk].WriteAt(buf[:w.len], w.off, false); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for _, w := range ws {
		jobs <- w
	}
	close(jobs)
	wg.Wait()
	if first != nil {
		t.Fatalf("changing %s: %v", vol, first)
	}
	for _, c := range conns {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return sum
}
