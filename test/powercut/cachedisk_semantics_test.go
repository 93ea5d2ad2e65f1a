package powercut

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
)

// TestCacheDiskLosesWhatWasNotFlushed proves the backend's semantics
// through NBD, as QEMU sees them: a write without FLUSH is readable at once
// but lost at a power cut; a write followed by a FLUSH, and a FUA write,
// survive it; a cut that keeps a random subset of the cache keeps some
// blocks whole and loses the others whole; nothing reaches the medium after
// the cut.
func TestCacheDiskLosesWhatWasNotFlushed(t *testing.T) {
	const blocks = 256
	f, err := os.Create(filepath.Join(t.TempDir(), "medium"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(blocks * cacheBlock); err != nil {
		t.Fatal(err)
	}
	m := &medium{f: f, size: blocks * cacheBlock}
	data := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, cacheBlock) }
	rng := rand.New(rand.NewPCG(1, 2))

	// power up serves the medium through a new cacheDisk over NBD.
	powerUp := func() (*cacheDisk, *nbdClient) {
		d := newCacheDisk(m)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := nbd.NewServer(cacheExports{d}, nbd.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		go srv.Serve(ln)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
		cl, err := dialNBD(ln.Addr().String(), cacheExport)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.close)
		return d, cl
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	readBlock := func(cl *nbdClient, b int) []byte {
		t.Helper()
		buf := make([]byte, cacheBlock)
		must(cl.read(buf, int64(b)*cacheBlock))
		return buf
	}
	expect := func(cl *nbdClient, b int, want []byte, why string) {
		t.Helper()
		if got := readBlock(cl, b); !bytes.Equal(got, want) {
			t.Errorf("block %d: holds %#x..., want %#x...: %s", b, got[0], want[0], why)
		}
	}
	zero := make([]byte, cacheBlock)

	d, cl := powerUp()
	must(cl.write(data(2), 1*cacheBlock, false))
	must(cl.flush())
	must(cl.write(data(3), 2*cacheBlock, true))
	must(cl.write(data(1), 0*cacheBlock, false))
	expect(cl, 0, data(1), "a cached write is readable at once")
	must(cl.write(data(4), 3*cacheBlock, false))
	// A partial block merges with what the block held.
	must(cl.write(bytes.Repeat([]byte{5}, 512), 1*cacheBlock+512, false))
	if dirty, kept, err := d.cut(0, rng); err != nil || dirty != 3 || kept != 0 {
		t.Fatalf("cut: %d dirty, %d kept, %v; want 3 dirty (blocks 0, 3 and the partial write to 1), none kept", dirty, kept, err)
	}
	if err := d.writeAt(data(9), 5*cacheBlock, true); !errors.Is(err, errPowerCut) {
		t.Errorf("a write after the cut: %v, want %v", err, errPowerCut)
	}
	if err := d.flush(); !errors.Is(err, errPowerCut) {
		t.Errorf("a flush after the cut: %v, want %v", err, errPowerCut)
	}

	d, cl = powerUp()
	expect(cl, 0, zero, "written without FLUSH before the cut")
	expect(cl, 1, data(2), "written and flushed before the cut (its later partial write not flushed)")
	expect(cl, 2, data(3), "written with FUA before the cut")
	expect(cl, 3, zero, "written without FLUSH before the cut")
	expect(cl, 5, zero, "written after the cut")

	// A cut that keeps everything (a drive that destaged it all in time).
	must(cl.write(data(6), 4*cacheBlock, false))
	if _, kept, err := d.cut(1, rng); err != nil || kept != 1 {
		t.Fatalf("cut keeping all: %d kept, %v", kept, err)
	}
	d, cl = powerUp()
	expect(cl, 4, data(6), "kept by a cut that keeps the whole cache")

	// A random subset: every block is whole, old or new, and both occur.
	for b := 10; b < blocks; b++ {
		must(cl.write(data(7), int64(b)*cacheBlock, false))
	}
	_, kept, err := d.cut(0.5, rng)
	must(err)
	_, cl = powerUp()
	var newer int
	for b := 10; b < blocks; b++ {
		switch got := readBlock(cl, b); {
		case bytes.Equal(got, data(7)):
			newer++
		case !bytes.Equal(got, zero):
			t.Errorf("block %d after a cut keeping a subset: neither the old nor the new content", b)
		}
	}
	if newer != kept || newer == 0 || newer == blocks-10 {
		t.Errorf("a cut keeping each block with probability 1/2 kept %d of %d blocks (it reported %d)", newer, blocks-10, kept)
	}
}
