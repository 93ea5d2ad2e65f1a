package apiserver

import (
	"net/http"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestFindSnapshots: GET /v1/snapshots lists the snapshots of every volume,
// narrowed by ?selector= (volume labels) and ?name=, so that a caller that
// names snapshots across volumes (the CSI driver) needs one request.
func TestFindSnapshots(t *testing.T) {
	c, _ := startAPI(t, "")
	for _, v := range []struct{ name, team string }{{"a", "x"}, {"b", "x"}, {"c", "y"}} {
		c.expect(http.MethodPost, "/v1/volumes", api.VolumeSpec{Name: v.name, Capacity: 8 * mib,
			Labels: map[string]string{"team": v.team}}, http.StatusCreated, nil)
	}
	for _, s := range []struct{ vol, snap string }{{"a", "nightly"}, {"b", "nightly"}, {"c", "nightly"}, {"a", "weekly"}} {
		c.expect(http.MethodPost, "/v1/volumes/"+s.vol+"/snapshots", api.SnapshotSpec{Name: s.snap}, http.StatusCreated, nil)
	}
	ids := func(path string) []string {
		var list api.List[api.Snapshot]
		c.expect(http.MethodGet, path, nil, http.StatusOK, &list)
		var out []string
		for _, s := range list.Items {
			out = append(out, s.Volume+"@"+s.Name)
		}
		return out
	}
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/v1/snapshots", []string{"a@nightly", "a@weekly", "b@nightly", "c@nightly"}},
		{"/v1/snapshots?name=nightly", []string{"a@nightly", "b@nightly", "c@nightly"}},
		{"/v1/snapshots?name=weekly", []string{"a@weekly"}},
		{"/v1/snapshots?name=nightly&selector=team=x", []string{"a@nightly", "b@nightly"}},
		{"/v1/snapshots?selector=team=y", []string{"c@nightly"}},
		{"/v1/snapshots?name=monthly", nil},
	} {
		if got := ids(tc.path); !slices.Equal(got, tc.want) {
			t.Errorf("GET %s: %v, want %v", tc.path, got, tc.want)
		}
	}
	c.expectError(http.MethodGet, "/v1/snapshots?name=Bad!", nil, http.StatusBadRequest, api.CodeInvalid)
	c.expectError(http.MethodGet, "/v1/snapshots?selector=a%20b%20c", nil, http.StatusBadRequest, api.CodeInvalid)
}
