package console

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// treeOf reads the lineage tree of the open volume page: each node
// (volume:NAME or snapshot:VOLUME@SNAP) with the node it hangs from ("" for
// the root).
func (b *browser) treeOf() map[string]string {
	b.t.Helper()
	js := eval[string](b, `JSON.stringify(Object.fromEntries([...document.querySelectorAll('[data-tree] [data-node]')].map(
		(e) => [e.dataset.node, (e.parentElement.closest('[data-node]') || {dataset: {node: ''}}).dataset.node])))`)
	out := map[string]string{}
	if err := json.Unmarshal([]byte(js), &out); err != nil {
		b.t.Fatalf("lineage tree %s: %v", js, err)
	}
	return out
}

// lineageFromAPI is the oracle: the tree below root as the API's volumes
// and root's snapshots describe it. A clone hangs from the snapshot it was
// cloned from, or from its volume when cloned live; a snapshot from its
// volume.
func lineageFromAPI(t *testing.T, ctx context.Context, c interface {
	ListVolumes(context.Context, string) ([]api.Volume, error)
	ListSnapshots(context.Context, string) ([]api.Snapshot, error)
}, root string) map[string]string {
	t.Helper()
	vols, err := c.ListVolumes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := c.ListSnapshots(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	tree := map[string]string{"volume:" + root: ""}
	for _, s := range snaps {
		tree["snapshot:"+root+"@"+s.Name] = "volume:" + root
	}
	for grew := true; grew; {
		grew = false
		for _, v := range vols {
			if v.Source == nil || tree["volume:"+v.Name] != "" {
				continue
			}
			parent := "volume:" + v.Source.Volume
			if _, ok := tree[parent]; !ok {
				continue
			}
			if v.Source.Snapshot != "" {
				snap := "snapshot:" + v.Source.Volume + "@" + v.Source.Snapshot
				tree[snap] = parent
				parent = snap
			}
			tree["volume:"+v.Name] = parent
			grew = true
		}
	}
	return tree
}

// TestConsoleLineage: a golden volume with two snapshots, clones of one
// of them and of the live volume, a clone of a clone's snapshot, and a
// snapshot deleted after it was cloned. The golden volume's page draws the
// tree the API's volumes describe, node for node, and a grandchild's page
// names its sources up to the golden volume.
func TestConsoleLineage(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	mk := func(name string) {
		if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: name, Capacity: 1 << 30,
			Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
			t.Fatal(err)
		}
	}
	snap := func(vol, name string) {
		if _, err := srv.API.CreateSnapshot(ctx, vol, name); err != nil {
			t.Fatal(err)
		}
	}
	clone := func(vol, snap string, names ...string) {
		if _, err := srv.API.Clone(ctx, api.CloneSpec{Source: api.Source{Volume: vol, Snapshot: snap}, Names: names}); err != nil {
			t.Fatal(err)
		}
	}
	mk("gold")
	mk("other") // unrelated: in no tree
	snap("gold", "v1")
	snap("gold", "v2")
	snap("gold", "v3")
	clone("gold", "v1", "web01", "web02")
	clone("gold", "", "scratch")
	snap("web01", "pre-upgrade")
	clone("web01", "pre-upgrade", "web01-test")
	clone("gold", "v3", "old")
	if err := srv.API.DeleteSnapshot(ctx, "gold", "v3"); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/gold", `[data-tree] [data-node="volume:web01-test"]`)
	want := lineageFromAPI(t, ctx, srv.API, "gold")
	want["snapshot:gold@v3"] = "volume:gold" // deleted, still the source of "old"
	if got := b.treeOf(); !maps.Equal(got, want) {
		t.Fatalf("gold's lineage in the page:\n%s\nthe API's:\n%s", show(got), show(want))
	}
	if len(want) != 10 {
		t.Fatalf("the oracle's tree has %d nodes, want 10:\n%s", len(want), show(want))
	}
	if got := b.text(`[data-node="snapshot:gold@v3"] > .node`); !strings.Contains(got, "(deleted)") {
		t.Fatalf("a deleted snapshot with a clone shows %q", got)
	}
	if got := b.text(`[data-node="volume:scratch"] > .node`); got != "scratch (live clone)" {
		t.Fatalf("a live clone shows %q", got)
	}
	b.scrollTo(`[data-tree]`)
	b.checkPage("volume-lineage")

	// A grandchild: its sources up to gold, and its own (empty) tree.
	b.goTo("#/volumes/web01-test", `[data-ancestry] strong`)
	if got := b.text(`[data-ancestry]`); got != "gold@v1 → web01@pre-upgrade → web01-test" {
		t.Fatalf("web01-test's sources: %q", got)
	}
	if got, want := b.treeOf(), lineageFromAPI(t, ctx, srv.API, "web01-test"); !maps.Equal(got, want) {
		t.Fatalf("web01-test's lineage in the page:\n%s\nthe API's:\n%s", show(got), show(want))
	}
	b.goTo("#/volumes/web01", `[data-tree] [data-node="volume:web01-test"]`)
	if got, want := b.treeOf(), lineageFromAPI(t, ctx, srv.API, "web01"); !maps.Equal(got, want) {
		t.Fatalf("web01's lineage in the page:\n%s\nthe API's:\n%s", show(got), show(want))
	}
	if got := b.text(`[data-ancestry]`); got != "gold@v1 → web01" {
		t.Fatalf("web01's sources: %q", got)
	}
}

func show(tree map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(tree)) {
		fmt.Fprintf(&b, "  %s <- %q\n", k, tree[k])
	}
	return b.String()
}

// TestConsoleWriterFencing: two read-write attachments of one volume, as
// during a live migration. The open volume page follows the writer role
// as it moves from the source's attachment to the destination's: the
// writer side, and the fenced side, as the API lists them. A volume of a
// single node has one copy.
func TestConsoleWriterFencing(t *testing.T) {
	var lastSides [2]string // the API's and the page's, last read
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %v", lastSides)
		}
	}()
	srv := startServer(t)
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm01", Capacity: 1 << 30,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	src, err := srv.API.Attach(ctx, "vm01", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	dst, err := srv.API.Attach(ctx, "vm01", api.AttachmentSpec{Node: "host-b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.TransferWriter(ctx, "vm01", src.ID); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/vm01", `[data-attachment="`+dst.ID+`"]`)

	// sides returns the writer and the fenced attachments, as the API
	// lists them and as the page shows them.
	sides := func() (fromAPI, inPage string) {
		atts, err := srv.API.ListAttachments(ctx, "vm01")
		if err != nil {
			t.Fatal(err)
		}
		var w, f []string
		for _, a := range atts {
			if a.Writer {
				w = append(w, a.ID)
			}
			if a.Fenced {
				f = append(f, a.ID)
			}
		}
		fromAPI = "writer " + strings.Join(w, " ") + ", fenced " + strings.Join(f, " ")
		inPage = "writer " + b.attr(`[data-writer]`, "data-writer") + ", fenced " + b.attr(`[data-fenced]`, "data-fenced")
		lastSides = [2]string{fromAPI, inPage}
		return fromAPI, inPage
	}
	// The role given to the source fences every other attachment.
	want := "writer " + src.ID + ", fenced " + dst.ID
	b.waitFor("the source's writer in the page", stepTimeout, func() bool { _, p := sides(); return p == want })
	if a, p := sides(); a != p {
		t.Fatalf("before the move: the page shows %q, the API %q", p, a)
	}
	if got := b.text(`[data-copies]`); got != "One copy, on this node." {
		t.Fatalf("copies of a single node's volume: %q", got)
	}
	if got := b.text(`[data-backups]`); got != "No backup target on this server." {
		t.Fatalf("backups on a server with no backup target: %q", got)
	}
	if got := b.text(`[data-dr]`); got != "No DR relationship." {
		t.Fatalf("DR of a volume with no policy: %q", got)
	}
	b.checkPage("volume-writer")

	// The destination takes the writer role: the open page follows.
	if _, err := srv.API.TransferWriter(ctx, "vm01", dst.ID); err != nil {
		t.Fatal(err)
	}
	want = "writer " + dst.ID + ", fenced " + src.ID
	b.waitFor("the move in the open page", stepTimeout, func() bool { _, p := sides(); return p == want })
	if a, p := sides(); a != p {
		t.Fatalf("after the move: the page shows %q, the API %q", p, a)
	}
	if got := b.attr(`[data-attachment="`+src.ID+`"]`, "data-state"); got != api.AttachmentFenced {
		t.Fatalf("the source's row: state %q, want %s", got, api.AttachmentFenced)
	}
	if got := b.text(`[data-fenced]`); !strings.Contains(got, "host-a") {
		t.Fatalf("the fenced side shows %q, want host-a", got)
	}
	b.scrollTo(`[data-table="attachments"]`)
	b.checkPage("volume-fenced")
}
