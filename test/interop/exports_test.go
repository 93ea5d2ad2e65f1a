package interop

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestExportsFollowTheAPI checks that NBD sees every change made through the
// API: a grown disk has its new size on the next connection, added and
// removed disks and deleted snapshots appear in and vanish from the export
// list, a clone serves its source's data, a rollback is what the next read
// sees, and names that do not resolve are refused.
func TestExportsFollowTheAPI(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo", "qemu-io", "qemu-img")
	s := startServer(t)
	ctx := t.Context()
	s.createVolume(t, "v", disk("root", 8*miB))
	_, err := s.api.UpdateVolume(ctx, "v", api.VolumeUpdate{Capacity: new(64 * miB)})
	if err != nil {
		t.Fatal(err)
	}
	root := s.URI("v/root")
	qemuIO(t, root, false, "write -P 0x21 0 1M")

	if _, err := s.api.GrowDisk(ctx, "v", "root", 16*miB); err != nil {
		t.Fatal(err)
	}
	if got := nbdSize(t, root); got != 16*miB {
		t.Errorf("after growing to 16 MiB, nbdinfo --size says %d", got)
	}
	qemuIO(t, root, false, "read -P 0x21 0 1M", "read -P 0 1M 15M", "write -P 0x22 15M 1M", "read -P 0x22 15M 1M")

	if _, err := s.api.AddDisk(ctx, "v", disk("extra", 4*miB)); err != nil {
		t.Fatal(err)
	}
	s.snapshot(t, "v", "s")
	wantList(t, s, "v/root", "v/extra", "v@s/root", "v@s/extra")

	if err := s.api.DeleteSnapshot(ctx, "v", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.RemoveDisk(ctx, "v", "extra"); err != nil {
		t.Fatal(err)
	}
	wantList(t, s, "v/root")
	for _, name := range []string{"v/extra", "v@s/root", "v/nope", "nope/root", "v@/root", "v", "/root", "v/root/x"} {
		runFails(t, "nbdinfo", s.URI(name))
	}

	if _, err := s.api.Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "v"}, Names: []string{"w"}}); err != nil {
		t.Fatal(err)
	}
	wantList(t, s, "v/root", "w/root")
	run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", root, s.URI("w/root"))

	s.snapshot(t, "v", "r")
	qemuIO(t, root, false, "write -P 0x23 0 16M")
	if _, err := s.api.Rollback(ctx, "v", "r"); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, root, true, "read -P 0x21 0 1M", "read -P 0 1M 14M", "read -P 0x22 15M 1M")
	// The clone is its own disk: neither the write nor the rollback of v
	// touched it.
	qemuIO(t, s.URI("w/root"), true, "read -P 0x21 0 1M", "read -P 0x22 15M 1M")

	if _, err := s.api.DeleteVolume(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	wantList(t, s, "v/root", "v@r/root")
}

// nbdSize returns the size of an export as `nbdinfo --size` reports it.
func nbdSize(t *testing.T, uri string) int64 {
	t.Helper()
	out := strings.TrimSpace(run(t, "nbdinfo", "--size", uri))
	n, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("nbdinfo --size %s: %q: %v", uri, out, err)
	}
	return n
}

// wantList checks that NBD_OPT_LIST names exactly the exports given.
func wantList(t *testing.T, s *server, want ...string) {
	t.Helper()
	var got []string
	for _, e := range nbdinfoJSON(t, "--list", "nbd://"+s.NBDAddr).Exports {
		got = append(got, e.Name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("exports %q, want %q", got, want)
	}
}
