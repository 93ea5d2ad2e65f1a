package interop

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"testing"
)

// TestDirtyBitmapOverNBD (issue 33, acceptance 2): the changes between two
// snapshots, and between a snapshot and the live disk, read by QEMU's and
// libnbd's own tools through the qemu:dirty-bitmap:<snapshot> context,
// are exactly the 64 KiB granules the test wrote, trimmed or zeroed in
// between: `nbdinfo --map=qemu:dirty-bitmap:a` (NBD_STATE_DIRTY on the
// changed extents) and `qemu-img map` with x-dirty-bitmap (which shows a
// dirty extent as "data": false) agree with the writes, disk by disk, and
// nbdinfo lists the bitmaps each export offers.
func TestDirtyBitmapOverNBD(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo", "qemu-io", "qemu-img")
	s := startServer(t)
	s.createVolume(t, "cbt", disk("root", 16*miB), disk("data", 8*miB))
	qemuIO(t, s.URI("cbt/root"), false, "write -P 0x01 0 16M", "flush")
	qemuIO(t, s.URI("cbt/data"), false, "write -P 0x02 0 4M", "flush")
	s.snapshot(t, "cbt", "a")
	qemuIO(t, s.URI("cbt/root"), false,
		"write -P 0x11 1M 64k",     // one granule
		"write -P 0x12 5242980 1",  // one byte: its granule, 5M
		"write -P 0x13 10M 200k",   // four granules
		"discard 14M 128k",         // a trim changes its granules too
		"write -z 15M 4k",          // and so do zeros
		"write -P 0x14 16320k 64k", // the last granule
		"flush")
	qemuIO(t, s.URI("cbt/data"), false, "write -P 0x15 3M 4k", "flush")
	s.snapshot(t, "cbt", "b")
	qemuIO(t, s.URI("cbt/root"), false, "write -P 0x16 12M 64k", "flush") // after b: live only

	rng := func(off, n int64) [2]int64 { return [2]int64{off, n} }
	aToB := [][2]int64{rng(miB, 64*kiB), rng(5*miB, 64*kiB), rng(10*miB, 256*kiB), rng(14*miB, 128*kiB),
		rng(15*miB, 64*kiB), rng(16320*kiB, 64*kiB)}
	aToLive := [][2]int64{rng(miB, 64*kiB), rng(5*miB, 64*kiB), rng(10*miB, 256*kiB), rng(12*miB, 64*kiB),
		rng(14*miB, 128*kiB), rng(15*miB, 64*kiB), rng(16320*kiB, 64*kiB)}
	for _, c := range []struct {
		export, since string
		size          int64
		want          [][2]int64
	}{
		{"cbt@b/root", "a", 16 * miB, aToB},
		{"cbt@b/data", "a", 8 * miB, [][2]int64{rng(3*miB, 64*kiB)}},
		{"cbt@a/root", "b", 16 * miB, aToB}, // either way round
		{"cbt/root", "a", 16 * miB, aToLive},
		{"cbt/root", "b", 16 * miB, [][2]int64{rng(12*miB, 64*kiB)}},
		{"cbt/data", "b", 8 * miB, nil},
	} {
		ctxName := "qemu:dirty-bitmap:" + c.since
		if got := nbdinfoDirty(t, s.URI(c.export), ctxName, c.size); !slices.Equal(got, c.want) {
			t.Errorf("nbdinfo --map=%s %s: dirty %v, want %v", ctxName, c.export, got, c.want)
		}
		if got := qemuImgDirty(t, s.NBDAddr, c.export, ctxName, c.size); !slices.Equal(got, c.want) {
			t.Errorf("qemu-img map x-dirty-bitmap=%s %s: dirty %v, want %v", ctxName, c.export, got, c.want)
		}
	}

	// nbdinfo lists, per export, the bitmaps it can select: a snapshot's
	// every other snapshot, the live disk's every snapshot.
	for export, want := range map[string][]string{
		"cbt@b/root": {"qemu:dirty-bitmap:a"},
		"cbt@a/data": {"qemu:dirty-bitmap:b"},
		"cbt/root":   {"qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b"},
	} {
		info := nbdinfoJSON(t, s.URI(export))
		if len(info.Exports) != 1 {
			t.Fatalf("nbdinfo %s: %d exports", export, len(info.Exports))
		}
		var got []string
		for _, ctx := range info.Exports[0].Contexts {
			if ctx != "base:allocation" {
				got = append(got, ctx)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) || !slices.Contains(info.Exports[0].Contexts, "base:allocation") {
			t.Errorf("nbdinfo %s: contexts %q, want base:allocation and %q", export, info.Exports[0].Contexts, want)
		}
	}

	// A bitmap that is not offered leaves the client without it: nbdinfo
	// says so and fails, the server serves on.
	for _, name := range []string{"qemu:dirty-bitmap:nosuch", "qemu:dirty-bitmap:b"} {
		out := runFails(t, "nbdinfo", "--map="+name, s.URI("cbt@b/root"))
		t.Logf("nbdinfo --map=%s cbt@b/root (not offered): %s", name, out)
	}
	if got := nbdinfoDirty(t, s.URI("cbt@b/data"), "qemu:dirty-bitmap:a", 8*miB); len(got) != 1 {
		t.Errorf("after the refusals: dirty %v", got)
	}
}

// nbdinfoDirty runs `nbdinfo --map=<context> --json` and returns the
// dirty ranges (NBD_STATE_DIRTY, bit 0), merged; the extents must cover
// the disk exactly.
func nbdinfoDirty(t *testing.T, uri, context string, size int64) [][2]int64 {
	t.Helper()
	out := run(t, "nbdinfo", "--map="+context, "--json", uri)
	var raw []struct {
		Offset int64  `json:"offset"`
		Length int64  `json:"length"`
		Type   uint32 `json:"type"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("nbdinfo --map=%s --json %s: %v\n%s", context, uri, err, out)
	}
	ext := make([]extent, 0, len(raw))
	for _, r := range raw {
		if r.Type&^1 != 0 {
			t.Errorf("nbdinfo --map=%s %s: extent %+v has flags beyond NBD_STATE_DIRTY", context, uri, r)
		}
		ext = append(ext, extent{Start: r.Offset, Length: r.Length, Data: r.Type&1 != 0})
	}
	return dirtyRuns(t, "nbdinfo "+uri, ext, size)
}

// qemuImgDirty runs `qemu-img map` through QEMU's NBD driver with
// x-dirty-bitmap=<context>: QEMU then reads that context instead of
// base:allocation and shows a dirty extent as a hole ("data": false).
func qemuImgDirty(t *testing.T, addr, export, context string, size int64) [][2]int64 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("driver=nbd,server.type=inet,server.host=%s,server.port=%s,export=%s,x-dirty-bitmap=%s",
		host, port, export, context)
	out := run(t, "qemu-img", "map", "--output=json", "--image-opts", opts)
	var raw []extent
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("qemu-img map %s: %v\n%s", opts, err, out)
	}
	ext := make([]extent, 0, len(raw))
	for _, e := range raw {
		ext = append(ext, extent{Start: e.Start, Length: e.Length, Data: !e.Data})
	}
	return dirtyRuns(t, "qemu-img map "+opts, ext, size)
}

// dirtyRuns checks that ext covers [0, size) without gaps and returns its
// merged runs marked Data (dirty).
func dirtyRuns(t *testing.T, what string, ext []extent, size int64) [][2]int64 {
	t.Helper()
	var off int64
	var out [][2]int64
	for _, e := range merge(ext) {
		if e.Start != off {
			t.Fatalf("%s: extent at %d, want %d (the map has a gap or an overlap)", what, e.Start, off)
		}
		off += e.Length
		if e.Data {
			out = append(out, [2]int64{e.Start, e.Length})
		}
	}
	if off != size {
		t.Fatalf("%s: the map ends at %d, want %d", what, off, size)
	}
	return out
}
