package apiserver

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestPrimary reads where a volume is served: the primary named in its
// placement, with that node's NBD address; 503 while the primary is down
// (a compute node's endpoint asks again), 404 for an unknown volume; on a
// single node this node's NBD address, 422 when it serves no NBD over TCP.
func TestPrimary(t *testing.T) {
	_, _, aURL, fa, _ := hopNodes(t, "k")
	c := &apiClient{t: t, base: aURL}
	get := func(c *apiClient, path string) (int, api.Primary, string) {
		t.Helper()
		status, body := c.do("GET", path, nil)
		var pr api.Primary
		if status == http.StatusOK {
			if err := json.Unmarshal(body, &pr); err != nil {
				t.Fatal(err)
			}
		}
		return status, pr, errCode(t, body)
	}
	status, pr, _ := get(c, "/v1/volumes/v/primary")
	if want := (api.Primary{Volume: "v", Node: "b", NBD: "nbd.b:10809", Term: 1}); status != http.StatusOK || pr != want {
		t.Fatalf("primary of v: %d %+v, want 200 %+v", status, pr, want)
	}
	fa.mu.Lock()
	up := fa.addrs["b"]
	fa.addrs["b"] = ""
	fa.mu.Unlock()
	if status, _, code := get(c, "/v1/volumes/v/primary"); status != http.StatusServiceUnavailable || code != api.CodeUnavailable {
		t.Fatalf("primary down: %d %s, want 503 %s", status, code, api.CodeUnavailable)
	}
	fa.mu.Lock()
	fa.addrs["b"] = up
	fa.prim["v"] = ""
	fa.mu.Unlock()
	if status, _, code := get(c, "/v1/volumes/v/primary"); status != http.StatusServiceUnavailable || code != api.CodeUnavailable {
		t.Fatalf("no primary named: %d %s, want 503 %s", status, code, api.CodeUnavailable)
	}
	if status, _, code := get(c, "/v1/volumes/nope/primary"); status != http.StatusNotFound || code != api.CodeNotFound {
		t.Fatalf("unknown volume: %d %s, want 404", status, code)
	}

	// A single node.
	s, p := newTestAPI(t, "")
	if _, _, err := p.Create(context.Background(), pool.VolumeSpec{Name: "w", Capacity: 8 * mib, Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	single := &apiClient{t: t, base: srv.URL}
	if status, _, code := get(single, "/v1/volumes/w/primary"); status != http.StatusUnprocessableEntity || code != api.CodeNotSupported {
		t.Fatalf("no NBD served: %d %s, want 422 %s", status, code, api.CodeNotSupported)
	}
	s.SetNBD(NBDEndpoint{Addr: "0.0.0.0:10809"})
	status, pr, _ = get(single, "/v1/volumes/w/primary")
	h, _, _ := net.SplitHostPort(srv.Listener.Addr().String())
	if want := (api.Primary{Volume: "w", Node: "local", NBD: h + ":10809"}); status != http.StatusOK || pr != want {
		t.Fatalf("single node: %d %+v, want 200 %+v", status, pr, want)
	}
}
