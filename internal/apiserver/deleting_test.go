package apiserver

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
)

// TestDeletingVolume (issue 32, "Deletes that keep their promise"): a
// volume being deleted, held on node b only, is listed through node a in
// state deleting (never vanished while a copy remains), its GET says so,
// and an attach, a snapshot and a clone of it are refused with Deleting
// and a message naming the copy left; a detach is not refused.
func TestDeletingVolume(t *testing.T) {
	_, _, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.listed, f.deleting = true, map[string]bool{"v": true}
		f.mu.Unlock()
	}
	c := &apiClient{t: t, base: aURL}
	status, body := c.do("GET", "/v1/volumes", nil)
	var l api.List[api.Volume]
	if status != http.StatusOK || json.Unmarshal(body, &l) != nil {
		t.Fatalf("list through a: %d %s", status, body)
	}
	if len(l.Items) != 1 || l.Items[0].Name != "v" || l.Items[0].State != api.VolumeDeleting {
		t.Fatalf("list through a: %s; want v, deleting", body)
	}
	status, body = c.do("GET", "/v1/volumes/v", nil)
	var v api.Volume
	if status != http.StatusOK || json.Unmarshal(body, &v) != nil || v.State != api.VolumeDeleting {
		t.Fatalf("get through a: %d %s; want state deleting", status, body)
	}
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/volumes/v/attachments", api.AttachmentSpec{Node: "worker-1"}},
		{"POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"}},
		{"POST", "/v1/clones", api.CloneSpec{Source: api.Source{Volume: "v"}, Names: []string{"w"}}},
	} {
		status, body := c.do(req.method, req.path, req.body)
		if status != http.StatusConflict || errCode(t, body) != api.CodeDeleting {
			t.Errorf("%s %s of a deleting volume: %d %s; want 409 Deleting", req.method, req.path, status, body)
		}
	}
	if status, body := c.do("DELETE", "/v1/volumes/v/attachments/a1", nil); errCode(t, body) == api.CodeDeleting {
		t.Errorf("a detach of a deleting volume: %d %s; want it carried on", status, body)
	}
}

// TestDeletingCopyStates (issue 32, "volume get shows the real state
// words"): the copy of a deleting volume that its node deleted (its record
// gone with it) is answered deleted, not "" (which says being made); the
// copy left keeps its state, and a copy of an active volume without a
// record is still "" (its node is making it).
func TestDeletingCopyStates(t *testing.T) {
	_, _, aURL, fa, _ := hopNodes(t, "the-cluster-key-0123456789")
	fa.mu.Lock()
	fa.deleting = map[string]bool{"v": true}
	fa.copies = map[string][]cluster.CopyInfo{
		"v": {{Node: "b"}, {Node: "c", State: cluster.CopyInSync}},
		"w": {{Node: "b", State: cluster.CopyInSync}, {Node: "c"}},
	}
	fa.prim["w"] = "b"
	fa.mu.Unlock()
	c := &apiClient{t: t, base: aURL}
	for _, tc := range []struct {
		volume string
		want   []string // each copy's state, in order
	}{
		{"v", []string{api.CopyDeleted, api.CopyInSync}},
		{"w", []string{api.CopyInSync, ""}},
	} {
		status, body := c.do("GET", "/v1/volumes/"+tc.volume, nil)
		var v api.Volume
		if status != http.StatusOK || json.Unmarshal(body, &v) != nil {
			t.Fatalf("get %s through a: %d %s", tc.volume, status, body)
		}
		var got []string
		for _, cp := range v.Copies {
			got = append(got, cp.State)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("get %s through a: copy states %q, want %q", tc.volume, got, tc.want)
		}
	}
}

// TestDeleteAsksTheCopysNode (issue 32, found by the one-view helper in
// passing): a plain delete asked of node a, which holds no copy of v, is
// carried to v's primary b, whose copy has a snapshot: it is refused
// HasSnapshots, the cluster is never asked to delete, and b keeps v and its
// snapshot. Before, a went straight to the cluster delete, and every copy's
// node deleted its copy with its snapshots.
func TestDeleteAsksTheCopysNode(t *testing.T) {
	_, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	v, err := b.pool.Volume("v")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.CreateSnapshot(t.Context(), "s1", nil); err != nil {
		t.Fatal(err)
	}
	c := &apiClient{t: t, base: aURL}
	status, body := c.do("DELETE", "/v1/volumes/v", nil)
	if status != http.StatusConflict || errCode(t, body) != api.CodeHasSnapshots {
		t.Errorf("plain delete through a of a volume whose copy on b has a snapshot: %d %s; want 409 HasSnapshots", status, body)
	}
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		if len(f.deleted) != 0 {
			t.Errorf("node %s asked the cluster to delete %v", f.name, f.deleted)
		}
		f.mu.Unlock()
	}
	if v, err := b.pool.Volume("v"); err != nil || len(v.Snapshots()) != 1 {
		t.Errorf("b's copy after the refused delete: %v, %v; want v with its snapshot", v, err)
	}
}
