package interop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// writePatternedImage makes a sparse raw image of size bytes at path and
// returns how many bytes of it hold non-zero data. Each 64 KiB chunk is,
// at random but reproducibly: a hole, random data, explicit zeros (written,
// so allocated), or a hole with a short unaligned run of data inside.
func writePatternedImage(t *testing.T, path string, size int64, seed uint64) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	var data int64
	for off := int64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		var p []byte
		at := off
		switch rng.IntN(4) {
		case 0: // hole
			continue
		case 1: // random data
			p = buf[:n]
			fillRandom(rng, p)
			data += n
		case 2: // zeros written out
			p = buf[:n]
			clear(p)
		case 3: // an unaligned run inside a hole
			start := rng.Int64N(n)
			l := 1 + rng.Int64N(min(10000, n-start))
			p = buf[:l]
			fillRandom(rng, p)
			at = off + start
			data += l
		}
		if _, err := f.WriteAt(p, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return data
}

// fillRandom fills p with random bytes that are never zero, so that a run
// of data cannot be mistaken for (or detected as) a hole.
func fillRandom(rng *rand.Rand, p []byte) {
	for i := range p {
		p[i] = byte(1 + rng.IntN(255))
	}
}

// allocated returns the bytes a file occupies on its filesystem.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// extent is one run of a map: data or not, zero or not.
type extent struct {
	Start  int64 `json:"start"`
	Length int64 `json:"length"`
	Data   bool  `json:"data"`
	Zero   bool  `json:"zero"`
}

func (e extent) String() string {
	kind := "hole"
	if e.Data {
		kind = "data"
	}
	if e.Zero {
		kind += ",zero"
	}
	return fmt.Sprintf("[%d, +%d) %s", e.Start, e.Length, kind)
}

// merge joins adjacent extents of the same kind: clients and the kernel
// split runs differently (qemu-img map at its request size, SEEK_DATA at
// extent boundaries), and only the layout matters.
func merge(in []extent) []extent {
	var out []extent
	for _, e := range in {
		if e.Length == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Data == e.Data && out[n-1].Zero == e.Zero &&
			out[n-1].Start+out[n-1].Length == e.Start {
			out[n-1].Length += e.Length
			continue
		}
		out = append(out, e)
	}
	return out
}

// qemuImgMap runs `qemu-img map --output=json` on an image (a file or an
// NBD URI), read-only and without taking locks, and returns its merged
// extents. The fields depth, present and offset are dropped: for a raw
// image they say nothing about the layout.
func qemuImgMap(t *testing.T, image string) []extent {
	t.Helper()
	out := run(t, "qemu-img", "map", "--output=json", "-U", "-f", "raw", image)
	var ext []extent
	if err := json.Unmarshal([]byte(out), &ext); err != nil {
		t.Fatalf("qemu-img map %s: %v\n%s", image, err, out)
	}
	return merge(ext)
}

// seekLayout maps a file with SEEK_DATA and SEEK_HOLE, as the kernel sees
// it: data extents, and holes (which read as zeros).
func seekLayout(t *testing.T, path string) []extent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fd, size := int(f.Fd()), st.Size()
	var out []extent
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size
		} else if err != nil {
			t.Fatalf("SEEK_DATA %s at %d: %v", path, off, err)
		}
		if data > off {
			out = append(out, extent{Start: off, Length: data - off, Zero: true})
			off = data
			continue
		}
		hole, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil {
			t.Fatalf("SEEK_HOLE %s at %d: %v", path, off, err)
		}
		out = append(out, extent{Start: off, Length: hole - off, Data: true})
		off = hole
	}
	return merge(out)
}

// diffExtents describes how got differs from want, or returns "".
func diffExtents(got, want []extent) string {
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		mark := "  "
		if g != w {
			mark = "! "
		}
		fmt.Fprintf(&b, "%s%-40s %s\n", mark, g, w)
	}
	if strings.Contains(b.String(), "! ") {
		return "got (left) vs want (right):\n" + b.String()
	}
	return ""
}

// sameFile compares two files byte for byte and returns the first
// differing offset, or -1.
func sameFile(t *testing.T, a, b string) int64 {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		na, ea := fa.ReadAt(ba, off)
		nb, eb := fb.ReadAt(bb, off)
		if na != nb {
			return off + int64(min(na, nb))
		}
		if !bytes.Equal(ba[:na], bb[:nb]) {
			for i := range na {
				if ba[i] != bb[i] {
					return off + int64(i)
				}
			}
		}
		off += int64(na)
		if ea != nil || eb != nil {
			if (ea == nil) != (eb == nil) {
				return off
			}
			return -1
		}
	}
}
