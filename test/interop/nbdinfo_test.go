package interop

import (
	"encoding/json"
	"maps"
	"math/bits"
	"slices"
	"testing"
)

// nbdinfoExport is one export as `nbdinfo --json` reports it.
type nbdinfoExport struct {
	Name           string   `json:"export-name"`
	Description    string   `json:"description"`
	Size           int64    `json:"export-size"`
	Contexts       []string `json:"contexts"`
	IsReadOnly     bool     `json:"is_read_only"`
	CanCache       bool     `json:"can_cache"`
	CanDF          bool     `json:"can_df"`
	CanFastZero    bool     `json:"can_fast_zero"`
	CanFlush       bool     `json:"can_flush"`
	CanFUA         bool     `json:"can_fua"`
	CanMultiConn   bool     `json:"can_multi_conn"`
	CanTrim        bool     `json:"can_trim"`
	CanZero        bool     `json:"can_zero"`
	BlockMinimum   uint32   `json:"block_size_minimum"`
	BlockPreferred uint32   `json:"block_size_preferred"`
	BlockMaximum   uint32   `json:"block_size_maximum"`
}

type nbdinfoOutput struct {
	Protocol   string          `json:"protocol"`
	Structured bool            `json:"structured"`
	Exports    []nbdinfoExport `json:"exports"`
}

func nbdinfoJSON(t *testing.T, args ...string) nbdinfoOutput {
	t.Helper()
	out := run(t, "nbdinfo", append([]string{"--json"}, args...)...)
	var info nbdinfoOutput
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("nbdinfo --json %v: %v\n%s", args, err, out)
	}
	return info
}

// TestNbdinfoListsEveryExport: NBD_OPT_LIST names every disk of every
// volume and every disk of every snapshot, over TCP and the unix socket,
// and NBD_OPT_INFO on each reports its size and whether it is read-only.
func TestNbdinfoListsEveryExport(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo")
	s := startServer(t)
	s.createVolume(t, "alpha", disk("root", 16*miB), disk("data", 8*miB), disk("swap", 4*miB))
	s.createVolume(t, "beta", disk("root", 32*miB))
	s.snapshot(t, "alpha", "s1")
	want := map[string]struct {
		size     int64
		readOnly bool
	}{
		"alpha/root":    {16 * miB, false},
		"alpha/data":    {8 * miB, false},
		"alpha/swap":    {4 * miB, false},
		"beta/root":     {32 * miB, false},
		"alpha@s1/root": {16 * miB, true},
		"alpha@s1/data": {8 * miB, true},
		"alpha@s1/swap": {4 * miB, true},
	}
	for _, uri := range []string{"nbd://" + s.NBDAddr, "nbd+unix:///?socket=" + s.Socket} {
		info := nbdinfoJSON(t, "--list", uri)
		var got []string
		for _, e := range info.Exports {
			got = append(got, e.Name)
			w, ok := want[e.Name]
			if !ok {
				t.Errorf("%s lists unexpected export %q", uri, e.Name)
				continue
			}
			if e.Size != w.size || e.IsReadOnly != w.readOnly {
				t.Errorf("%s export %q: size %d, read-only %v; want %d, %v", uri, e.Name, e.Size, e.IsReadOnly, w.size, w.readOnly)
			}
			if e.Description == "" {
				t.Errorf("%s export %q has no description", uri, e.Name)
			}
		}
		slices.Sort(got)
		if names := slices.Sorted(maps.Keys(want)); !slices.Equal(got, names) {
			t.Errorf("%s lists %q, want %q", uri, got, names)
		}
	}
}

// TestNbdinfoMap: `nbdinfo --map` (base:allocation, many extents per reply)
// shows the layout the test wrote, for the disk and its snapshot, and
// agrees with the image file's SEEK_DATA/SEEK_HOLE.
func TestNbdinfoMap(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo", "qemu-io")
	s := startServer(t)
	const size = 16 * miB
	v := s.createVolume(t, "m", disk("d", size))
	qemuIO(t, s.URI("m/d"), false,
		"write -P 0x11 0 128k",
		"write -P 0x12 1M 1M",
		"discard 1280k 256k",
		"write -P 0x13 5M 64k",
		"write -P 0x14 16320k 64k", // the last 64 KiB
		"flush")
	data := func(off, n int64) extent { return extent{Start: off, Length: n, Data: true} }
	hole := func(off, n int64) extent { return extent{Start: off, Length: n, Zero: true} }
	want := []extent{
		data(0, 128*kiB),
		hole(128*kiB, 896*kiB),
		data(miB, 256*kiB),
		hole(1280*kiB, 256*kiB),
		data(1536*kiB, 512*kiB),
		hole(2*miB, 3*miB),
		data(5*miB, 64*kiB),
		hole(5184*kiB, 16320*kiB-5184*kiB),
		data(16320*kiB, 64*kiB),
	}
	snap := s.snapshot(t, "m", "s")
	for _, c := range []struct{ uri, file string }{
		{s.URI("m/d"), diskPath(t, v.Disks, "d")},
		{s.URI("m@s/d"), diskPath(t, snap.Disks, "d")},
	} {
		got := nbdinfoMap(t, c.uri)
		if d := diffExtents(got, want); d != "" {
			t.Errorf("nbdinfo --map %s:\n%s", c.uri, d)
		}
		if d := diffExtents(got, seekLayout(t, c.file)); d != "" {
			t.Errorf("nbdinfo --map %s (left) differs from SEEK_DATA/SEEK_HOLE of %s (right):\n%s", c.uri, c.file, d)
		}
	}
}

// nbdinfoMap returns the merged base:allocation map of an export.
func nbdinfoMap(t *testing.T, uri string) []extent {
	t.Helper()
	out := run(t, "nbdinfo", "--map", "--json", uri)
	var raw []struct {
		Offset int64  `json:"offset"`
		Length int64  `json:"length"`
		Type   uint32 `json:"type"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("nbdinfo --map --json %s: %v\n%s", uri, err, out)
	}
	ext := make([]extent, 0, len(raw))
	for _, r := range raw {
		// NBD_STATE_HOLE is bit 0, NBD_STATE_ZERO bit 1.
		ext = append(ext, extent{Start: r.Offset, Length: r.Length, Data: r.Type&1 == 0, Zero: r.Type&2 != 0})
	}
	return merge(ext)
}

// TestNbdinfoExportFlags checks what a read-write and a read-only export
// advertise, and that the block size constraints follow the specification
// ("Block size constraints").
func TestNbdinfoExportFlags(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo")
	s := startServer(t)
	s.createVolume(t, "f", disk("d", 8*miB))
	s.snapshot(t, "f", "s")
	for _, c := range []struct {
		uri      string
		readOnly bool
	}{
		{s.URI("f/d"), false},
		{s.UnixURI("f@s/d"), true},
	} {
		info := nbdinfoJSON(t, c.uri)
		if !info.Structured {
			t.Errorf("%s: structured replies not negotiated", c.uri)
		}
		if len(info.Exports) != 1 {
			t.Fatalf("%s: %d exports, want 1", c.uri, len(info.Exports))
		}
		e := info.Exports[0]
		writable := !c.readOnly
		for _, f := range []struct {
			name      string
			got, want bool
		}{
			{"is_read_only", e.IsReadOnly, c.readOnly},
			{"can_flush", e.CanFlush, true},
			{"can_multi_conn", e.CanMultiConn, true},
			{"can_cache", e.CanCache, true},
			{"can_df", e.CanDF, true},
			{"can_fua", e.CanFUA, writable},
			{"can_trim", e.CanTrim, writable},
			{"can_zero", e.CanZero, writable},
			{"can_fast_zero", e.CanFastZero, writable},
		} {
			if f.got != f.want {
				t.Errorf("%s: %s is %v, want %v", c.uri, f.name, f.got, f.want)
			}
		}
		if !slices.Contains(e.Contexts, "base:allocation") {
			t.Errorf("%s: contexts %q, want base:allocation", c.uri, e.Contexts)
		}
		if e.Size != 8*miB {
			t.Errorf("%s: size %d, want %d", c.uri, e.Size, 8*miB)
		}
		minBS, prefBS, maxBS := e.BlockMinimum, e.BlockPreferred, e.BlockMaximum
		pow2 := func(x uint32) bool { return bits.OnesCount32(x) == 1 }
		switch {
		case !pow2(minBS) || minBS > 64<<10:
			t.Errorf("%s: minimum block size %d: must be a power of 2 up to 64 KiB", c.uri, minBS)
		case !pow2(prefBS) || prefBS < 512 || prefBS < minBS:
			t.Errorf("%s: preferred block size %d: must be a power of 2, at least 512 and the minimum %d", c.uri, prefBS, minBS)
		case maxBS != 0xffffffff && (maxBS%minBS != 0 || maxBS < prefBS):
			t.Errorf("%s: maximum payload %d: must be a multiple of the minimum %d and at least the preferred %d", c.uri, maxBS, minBS, prefBS)
		}
		t.Logf("%s: block sizes %d/%d/%d", c.uri, minBS, prefBS, maxBS)
	}
}
