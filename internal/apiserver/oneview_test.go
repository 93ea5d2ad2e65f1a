package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestOneUIDFromEveryNode (issue 32, "One view from every node"): a
// placed volume with a copy on a and on b (each copy with a local UID of
// its own) answers the cluster record's UID through either node, in its
// GET and in the list.
func TestOneUIDFromEveryNode(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	if _, _, err := a.pool.Create(context.Background(), pool.VolumeSpec{Name: "v", Capacity: 8 * mib,
		Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.listed = true
		f.mu.Unlock()
	}
	va, _ := a.pool.Volume("v")
	vb, _ := b.pool.Volume("v")
	if va.Info().UID == vb.Info().UID {
		t.Fatalf("the copies on a and b have one local UID %s; the test needs two", va.Info().UID)
	}
	want, _, _ := fa.Placement(context.Background(), "v")
	sb := httptest.NewServer(b)
	t.Cleanup(sb.Close)
	for node, base := range map[string]string{"a": aURL, "b": sb.URL} {
		c := &apiClient{t: t, base: base}
		status, body := c.do("GET", "/v1/volumes/v", nil)
		var v api.Volume
		if status != http.StatusOK || json.Unmarshal(body, &v) != nil {
			t.Fatalf("get through %s: %d %s", node, status, body)
		}
		if v.UID != want.UID {
			t.Errorf("get through %s: UID %s, want the cluster's %s", node, v.UID, want.UID)
		}
		status, body = c.do("GET", "/v1/volumes", nil)
		var l api.List[api.Volume]
		if status != http.StatusOK || json.Unmarshal(body, &l) != nil || len(l.Items) != 1 {
			t.Fatalf("list through %s: %d %s", node, status, body)
		}
		if l.Items[0].UID != want.UID {
			t.Errorf("list through %s: UID %s, want the cluster's %s", node, l.Items[0].UID, want.UID)
		}
	}
}
