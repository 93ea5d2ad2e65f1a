package interop

import (
	"fmt"
	"testing"
)

// TestMapMatchesFile is an oracle test (after nbdkit's
// tests/test-file-extents.sh): lay out data and holes in a disk through
// NBD, then `qemu-img map` of the disk image file must equal `qemu-img map`
// of the same disk through NBD (base:allocation), and both must equal the
// file's own SEEK_DATA/SEEK_HOLE layout. The same holds for a snapshot's
// disk and its read-only export.
//
// Only start, length, data and zero are compared, after merging adjacent
// extents of one kind: qemu splits runs at its request boundaries and the
// server at the filesystem's extent boundaries, which says nothing about
// the layout. depth, present and offset describe qemu's block graph, not
// the disk. No other difference is tolerated. What a write of zeros
// without may-trim leaves (a hole, an unwritten extent that SEEK_DATA
// skips, or written zeros) depends on the filesystem; the oracle does not
// care, as long as the file and the export agree.
func TestMapMatchesFile(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "qemu-img")
	s := startServer(t)
	const size = 32*miB + 1536 // the tail is not a whole 4 KiB block
	v := s.createVolume(t, "map", disk("d", size))
	qemuIO(t, s.URI("map/d"), false,
		"write -P 0x01 0 4k",
		"write -P 0x02 65536 1",                       // one byte allocates one block
		"write -P 0x03 1M 3M",                         // a long run ...
		"write -z -u 2M 1M",                           // ... with a hole punched inside
		"write -z 5M 1M",                              // zeros without may-trim over a hole
		"write -P 0x04 8M 1M",                         // a run ...
		"discard 8448k 256k",                          // ... with a trimmed middle
		"write -P 0x05 16777316 8000",                 // unaligned, across a block boundary
		"write -P 0x07 20M 4M",                        // a run ...
		"write -z -u 20484k 4088k",                    // ... with only its first and last 4 KiB left
		fmt.Sprintf("write -P 0x06 %d 512", size-512), // the partial last block
		"flush")

	file := diskPath(t, v.Disks, "d")
	checkMaps(t, file, s.URI("map/d"), 6)

	snap := s.snapshot(t, "map", "s")
	checkMaps(t, diskPath(t, snap.Disks, "d"), s.URI("map@s/d"), 0)
}

// checkMaps compares the three maps of one disk and wants at least minData
// data extents, so that the comparison is not vacuous.
func checkMaps(t *testing.T, file, uri string, minData int) {
	t.Helper()
	fileMap := qemuImgMap(t, file)
	nbdMap := qemuImgMap(t, uri)
	seekMap := seekLayout(t, file)
	if d := diffExtents(nbdMap, fileMap); d != "" {
		t.Errorf("qemu-img map of %s (left) differs from that of %s (right):\n%s", uri, file, d)
	}
	if d := diffExtents(fileMap, seekMap); d != "" {
		t.Errorf("qemu-img map of %s (left) differs from SEEK_DATA/SEEK_HOLE (right):\n%s", file, d)
	}
	data := 0
	for _, e := range nbdMap {
		if e.Data {
			data++
		}
	}
	if data < minData {
		t.Errorf("%s has %d data extents, want at least %d:\n%v", uri, data, minData, nbdMap)
	}
	t.Logf("%s: %d extents, %d of data", uri, len(nbdMap), data)
}
