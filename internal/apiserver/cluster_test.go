package apiserver

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestSingleNodeReplicas: without cluster flags a volume has one copy;
// replicas above 1 are refused with NotEnoughNodes and nothing is made, and
// a count out of range is Invalid naming the field.
func TestSingleNodeReplicas(t *testing.T) {
	c, p := startAPI(t, "")
	for _, tc := range []struct {
		replicas int
		status   int
		code     string
	}{
		{2, http.StatusUnprocessableEntity, api.CodeNotEnoughNodes},
		{pool.MaxReplicas + 1, http.StatusBadRequest, api.CodeInvalid},
		{-1, http.StatusBadRequest, api.CodeInvalid},
	} {
		status, body := c.do("POST", "/v1/volumes", api.VolumeSpec{Name: "web01", Capacity: 64 * mib, Replicas: tc.replicas})
		var e api.ErrorBody
		_ = json.Unmarshal(body, &e)
		if status != tc.status || e.Error.Code != tc.code {
			t.Fatalf("replicas %d: %d %s, want %d %s", tc.replicas, status, body, tc.status, tc.code)
		}
		if tc.code == api.CodeInvalid && e.Error.Field != "replicas" {
			t.Errorf("replicas %d: field %q, want replicas", tc.replicas, e.Error.Field)
		}
		if _, err := p.Volume("web01"); err == nil {
			t.Fatalf("replicas %d: the volume was made", tc.replicas)
		}
	}
	for _, n := range []int{0, 1} {
		status, body := c.do("POST", "/v1/volumes", api.VolumeSpec{Name: "web01", Capacity: 64 * mib, Replicas: n})
		var v api.Volume
		_ = json.Unmarshal(body, &v)
		if status != http.StatusCreated || v.Replicas != 1 || v.Copies != nil {
			t.Fatalf("replicas %d: %d %s", n, status, body)
		}
		if status, body := c.do("DELETE", "/v1/volumes/web01", nil); status != http.StatusNoContent {
			t.Fatalf("delete: %d %s", status, body)
		}
	}
}

func TestSingleNodeListsItself(t *testing.T) {
	c, _ := startAPI(t, "")
	c.do("POST", "/v1/volumes", api.VolumeSpec{Name: "web01", Capacity: 64 * mib})
	status, body := c.do("GET", "/v1/nodes", nil)
	var l api.List[api.Node]
	if err := json.Unmarshal(body, &l); err != nil || status != http.StatusOK || len(l.Items) != 1 {
		t.Fatalf("%d %s", status, body)
	}
	n := l.Items[0]
	if n.Name != "local" || n.State != api.NodeUp || !n.Self || n.Volumes != 1 || n.CapacityBytes <= 0 || n.Address == "" {
		t.Fatalf("node %+v", n)
	}
}
