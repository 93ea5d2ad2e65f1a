package interop

import (
	"path/filepath"
	"testing"
)

// TestQemuImgConvertRoundTrip copies a patterned sparse image into a disk
// with qemu-img convert, copies it back out, and compares the three both
// ways; once over TCP and once over the unix socket. The disk size is not a
// multiple of 4 KiB, so the last request is a partial block.
func TestQemuImgConvertRoundTrip(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-img")
	s := startServer(t)
	const size = 16*miB + 1536
	s.createVolume(t, "conv", disk("tcp", size), disk("unix", size))
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	if data := writePatternedImage(t, src, size, 1); data == 0 {
		t.Fatal("the patterned image holds no data")
	}

	for _, tc := range []struct {
		name string
		uri  string
	}{
		{"tcp", s.URI("conv/tcp")},
		{"unix", s.UnixURI("conv/unix")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// -n: the target exists. -W -m 16: sixteen coroutines writing
			// out of order, so many requests are in flight at once.
			run(t, "qemu-img", "convert", "-n", "-W", "-m", "16", "-f", "raw", "-O", "raw", src, tc.uri)
			out := filepath.Join(dir, tc.name+".out.img")
			run(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", tc.uri, out)
			for _, pair := range [][2]string{{src, tc.uri}, {tc.uri, src}, {src, out}, {out, tc.uri}} {
				// Not -s (strict): that also compares allocation, and zeros
				// written to a file may well become a hole in a disk.
				run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", pair[0], pair[1])
			}
			if off := sameFile(t, src, out); off >= 0 {
				t.Errorf("%s and %s differ at byte %d", src, out, off)
			}
		})
	}
}
