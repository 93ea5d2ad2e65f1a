package interop

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestNbdcopySparse copies a 1 GiB sparse disk (4 MiB of data at scattered,
// partly unaligned offsets) into quiver, out of it into a file and back into
// another disk, with one and with four connections, and checks the content
// and that every copy stayed sparse. It runs under -short only when CI is
// set.
func TestNbdcopySparse(t *testing.T) {
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skip("-short: skipping the 1 GiB copy (it always runs under CI)")
	}
	t.Parallel()
	requireTools(t, "nbdcopy", "qemu-img")
	s := startServer(t)
	const size = giB
	// The bound for "stayed sparse": the data plus filesystem slack, far
	// below the 1 GiB a non-sparse copy takes.
	const sparseLimit = 64 * miB
	v := s.createVolume(t, "big", disk("a", size), disk("b", size), disk("c", size))
	dir := t.TempDir()

	src := filepath.Join(dir, "src.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 512*kiB)
	for i := range int64(8) {
		fillRandom(rng, buf)
		off := i*(size/8) + rng.Int64N(size/8-int64(len(buf))) // unaligned
		if i == 7 {
			off = size - int64(len(buf)) // the very end
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	out1, out4 := filepath.Join(dir, "out1.img"), filepath.Join(dir, "out4.img")
	steps := []struct {
		args []string
		dst  string // file that must stay sparse
	}{
		{[]string{src, s.URI("big/a")}, diskPath(t, v.Disks, "a")},
		{[]string{s.URI("big/a"), out1}, out1},
		{[]string{out1, s.URI("big/b")}, diskPath(t, v.Disks, "b")},
		{[]string{"--connections=4", s.UnixURI("big/a"), out4}, out4},
		{[]string{"--connections=4", out4, s.UnixURI("big/c")}, diskPath(t, v.Disks, "c")},
	}
	for _, st := range steps {
		run(t, "nbdcopy", st.args...)
		if a := allocated(t, st.dst); a > sparseLimit {
			t.Errorf("after nbdcopy %v: %s occupies %d bytes, want at most %d", st.args, st.dst, a, sparseLimit)
		}
	}
	for _, img := range []string{s.URI("big/a"), out1, s.URI("big/b"), out4, s.URI("big/c")} {
		run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, img)
	}
}
