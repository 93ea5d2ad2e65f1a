package apiserver

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestProbes: /healthz and /readyz answer without the token (kubelet and
// load balancers have none), and only those: every other path still needs
// it. /readyz turns 503 once the server drains.
func TestProbes(t *testing.T) {
	s, _ := newTestAPI(t, "secret")
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	get := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get("GET", path); code != 200 || body != "ok\n" {
			t.Errorf("GET %s = %d %q, want 200 ok", path, code, body)
		}
		if code, _ := get("HEAD", path); code != 200 {
			t.Errorf("HEAD %s = %d, want 200", path, code)
		}
		if code, _ := get("POST", path); code != http.StatusUnauthorized {
			t.Errorf("POST %s = %d, want 401 (only GET and HEAD are probes)", path, code)
		}
	}
	for _, path := range []string{"/v1/version", "/v1/pool", "/healthz/x", "/metrics"} {
		if code, _ := get("GET", path); code != http.StatusUnauthorized {
			t.Errorf("GET %s without token = %d, want 401", path, code)
		}
	}
	s.Drain()
	if code, _ := get("GET", "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz while draining = %d, want 503", code)
	}
	if code, _ := get("GET", "/healthz"); code != 200 {
		t.Errorf("GET /healthz while draining = %d, want 200", code)
	}
	local := httptest.NewServer(s.Local())
	t.Cleanup(local.Close)
	resp, err := http.Get(local.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /healthz on the local handler = %d", resp.StatusCode)
	}
}

func TestVersion(t *testing.T) {
	c, _ := startAPI(t, "secret")
	var v api.BuildInfo
	c.expect("GET", "/v1/version", nil, 200, &v)
	if v.Version == "" || v.GoVersion == "" || v.Platform == "" {
		t.Fatalf("version = %+v", v)
	}
}

// TestFindAttachments: GET /v1/attachments lists the attachments of every
// volume, filtered by the volumes' labels, without tokens.
func TestFindAttachments(t *testing.T) {
	c, _ := startAPI(t, "")
	for _, v := range []api.VolumeSpec{
		{Name: "web01", Capacity: 8 * mib, Labels: map[string]string{"app": "web"}, Disks: []api.DiskSpec{{Name: "root", Size: mib}}},
		{Name: "db01", Capacity: 8 * mib, Labels: map[string]string{"app": "db"}, Disks: []api.DiskSpec{{Name: "root", Size: mib}}},
		{Name: "idle", Capacity: 8 * mib},
	} {
		c.expect("POST", "/v1/volumes", v, 201, nil)
	}
	c.expect("POST", "/v1/volumes/web01/attachments", api.AttachmentSpec{Node: "n1"}, 201, nil)
	c.expect("POST", "/v1/volumes/db01/attachments", api.AttachmentSpec{Node: "n2", Mode: api.ModeReadOnly}, 201, nil)
	var all api.List[api.Attachment]
	c.expect("GET", "/v1/attachments", nil, 200, &all)
	if len(all.Items) != 2 || all.Items[0].Volume != "db01" || all.Items[1].Volume != "web01" {
		t.Fatalf("all attachments = %+v", all.Items)
	}
	for _, a := range all.Items {
		if a.Token != "" {
			t.Fatalf("a list shows a token: %+v", a)
		}
	}
	var web api.List[api.Attachment]
	c.expect("GET", "/v1/attachments?selector=app%3Dweb", nil, 200, &web)
	if len(web.Items) != 1 || web.Items[0].Node != "n1" {
		t.Fatalf("app=web attachments = %+v", web.Items)
	}
	c.expectError("GET", "/v1/attachments?selector=%3D%3D", nil, 400, api.CodeInvalid)
}

// TestAttachURIs: an attach answer carries a ready NBD URI per disk, with
// the token, the scheme the node requires, and a host the client can reach
// when NBD listens on a wildcard address; lists and gets carry none.
func TestAttachURIs(t *testing.T) {
	for _, tc := range []struct {
		name string
		nbd  NBDEndpoint
		want string // URI of disk root, with TOKEN for the token and HOST for the API's host
	}{
		{"tcp", NBDEndpoint{Addr: "127.0.0.1:10809"}, "nbd://127.0.0.1:10809/vm/root/TOKEN"},
		{"tls", NBDEndpoint{Addr: "127.0.0.1:10809", TLS: true}, "nbds://127.0.0.1:10809/vm/root/TOKEN"},
		{"wildcard", NBDEndpoint{Addr: "0.0.0.0:10809"}, "nbd://HOST:10809/vm/root/TOKEN"},
		{"wildcard v6", NBDEndpoint{Addr: "[::]:10809"}, "nbd://HOST:10809/vm/root/TOKEN"},
		{"socket", NBDEndpoint{Socket: "/run/quiver/nbd.sock"}, "nbd+unix:///vm/root/TOKEN?socket=%2Frun%2Fquiver%2Fnbd.sock"},
		{"none", NBDEndpoint{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestAPI(t, "")
			s.SetNBD(tc.nbd)
			srv := httptest.NewServer(s)
			t.Cleanup(srv.Close)
			c := &apiClient{t: t, base: srv.URL}
			c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "vm", Capacity: 8 * mib,
				Disks: []api.DiskSpec{{Name: "root", Size: mib}, {Name: "data", Size: mib}}}, 201, nil)
			var a api.Attachment
			c.expect("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "n1"}, 201, &a)
			host, _, _ := net.SplitHostPort(srv.Listener.Addr().String())
			want := strings.NewReplacer("TOKEN", a.Token, "HOST", host).Replace(tc.want)
			if got := a.URIs["root"]; got != want {
				t.Fatalf("URI of root = %q, want %q (all: %v)", got, want, a.URIs)
			}
			if tc.want != "" && len(a.URIs) != 2 {
				t.Fatalf("URIs = %v, want one per disk", a.URIs)
			}
			var got api.Attachment
			c.expect("GET", "/v1/volumes/vm/attachments/"+a.ID, nil, 200, &got)
			if got.URIs != nil || got.Token != "" {
				t.Fatalf("a get shows the token: %+v", got)
			}
		})
	}
}

// TestMaxOvercommit: the pool reports what is provisioned, and with a limit
// a create, a clone, a new disk or a grow that would provision past it is
// refused (507 NoSpace) with the pool unchanged; without one thin
// provisioning has no bound.
func TestMaxOvercommit(t *testing.T) {
	s, p := newTestAPI(t, "")
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := &apiClient{t: t, base: srv.URL}
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	half := (info.TotalBytes / 2) &^ 511
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "big", Capacity: 4 * half, Disks: []api.DiskSpec{{Name: "root", Size: half}}}, 201, nil)
	c.expect("POST", "/v1/volumes/big/snapshots", api.SnapshotSpec{Name: "s"}, 201, nil)
	var pi api.PoolInfo
	c.expect("GET", "/v1/pool", nil, 200, &pi)
	if pi.ProvisionedBytes != half {
		t.Fatalf("provisioned %d, want %d", pi.ProvisionedBytes, half)
	}
	s.MaxOvercommit = 0.75
	for _, tc := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/volumes", api.VolumeSpec{Name: "more", Capacity: half, Disks: []api.DiskSpec{{Name: "root", Size: half}}}},
		{"POST", "/v1/clones", api.CloneSpec{Source: api.Source{Volume: "big", Snapshot: "s"}, Names: []string{"c1"}}},
		{"POST", "/v1/volumes/big/disks", api.DiskSpec{Name: "data", Size: half}},
		{"PATCH", "/v1/volumes/big/disks/root", api.DiskUpdate{Size: 2 * half}},
	} {
		e := c.expectError(tc.method, tc.path, tc.body, http.StatusInsufficientStorage, api.CodeNoSpace)
		if !strings.Contains(e.Message, "--max-overcommit 0.75x") {
			t.Errorf("%s %s: message %q", tc.method, tc.path, e.Message)
		}
	}
	c.expect("GET", "/v1/pool", nil, 200, &pi)
	if pi.ProvisionedBytes != half || pi.Volumes != 1 {
		t.Fatalf("after refusals: %+v", pi)
	}
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "small", Capacity: mib, Disks: []api.DiskSpec{{Name: "root", Size: mib}}}, 201, nil)
	s.MaxOvercommit = 0
	c.expect("POST", "/v1/clones", api.CloneSpec{Source: api.Source{Volume: "big", Snapshot: "s"}, Names: []string{"c1", "c2"}}, 201, nil)
}
