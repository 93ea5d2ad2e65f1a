package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// recorded is one request as the fake server saw it.
type recorded struct {
	Method, Path, Query, Body, Auth string
}

// fakeServer answers every request with the next canned response and
// records what it was sent.
type fakeServer struct {
	mu        sync.Mutex
	requests  []recorded
	responses []cannedResponse
}

type cannedResponse struct {
	status int
	body   string
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, recorded{
		Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		Body: string(body), Auth: r.Header.Get("Authorization"),
	})
	resp := cannedResponse{status: http.StatusOK, body: "{}"}
	if len(f.responses) > 0 {
		resp = f.responses[0]
		if len(f.responses) > 1 {
			f.responses = f.responses[1:]
		}
	}
	f.mu.Unlock()
	if resp.body != "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(resp.status)
	io.WriteString(w, resp.body)
}

func (f *fakeServer) last(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		t.Fatal("server got no request")
	}
	return f.requests[len(f.requests)-1]
}

func newFake(t *testing.T, responses ...cannedResponse) (*fakeServer, *Client) {
	t.Helper()
	f := &fakeServer{responses: responses}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, WithToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func TestRoutes(t *testing.T) {
	ctx := context.Background()
	size := int64(300 << 30)
	tests := []struct {
		name   string
		call   func(c *Client) error
		status int
		reply  string
		want   recorded
	}{
		{
			name:  "pool",
			call:  func(c *Client) error { _, err := c.Pool(ctx); return err },
			reply: `{"id":"p1"}`,
			want:  recorded{Method: "GET", Path: "/v1/pool"},
		},
		{
			name:  "list volumes",
			call:  func(c *Client) error { _, err := c.ListVolumes(ctx, "app=web,tier=1"); return err },
			reply: `{"items":[]}`,
			want:  recorded{Method: "GET", Path: "/v1/volumes", Query: "selector=app%3Dweb%2Ctier%3D1"},
		},
		{
			name: "create volume",
			call: func(c *Client) error {
				_, err := c.CreateVolume(ctx, api.VolumeSpec{Name: "web01", Capacity: 1024, Disks: []api.DiskSpec{{Name: "root", Size: 512}}})
				return err
			},
			status: http.StatusCreated,
			want:   recorded{Method: "POST", Path: "/v1/volumes", Body: `{"name":"web01","capacity":1024,"disks":[{"name":"root","size":512}]}`},
		},
		{
			name: "get volume escapes",
			call: func(c *Client) error { _, err := c.GetVolume(ctx, "a/b c"); return err },
			want: recorded{Method: "GET", Path: "/v1/volumes/a%2Fb%20c"},
		},
		{
			name: "primary",
			call: func(c *Client) error { _, err := c.Primary(ctx, "web01"); return err },
			want: recorded{Method: "GET", Path: "/v1/volumes/web01/primary"},
		},
		{
			name: "update volume",
			call: func(c *Client) error {
				_, err := c.UpdateVolume(ctx, "web01", api.VolumeUpdate{Capacity: &size})
				return err
			},
			want: recorded{Method: "PATCH", Path: "/v1/volumes/web01", Body: `{"capacity":322122547200,"labels":null}`},
		},
		{
			name:   "delete volume",
			call:   func(c *Client) error { _, err := c.DeleteVolume(ctx, "web01"); return err },
			status: http.StatusNoContent,
			want:   recorded{Method: "DELETE", Path: "/v1/volumes/web01"},
		},
		{
			name: "add disk",
			call: func(c *Client) error {
				_, err := c.AddDisk(ctx, "web01", api.DiskSpec{Name: "data", Size: 4096})
				return err
			},
			status: http.StatusCreated,
			want:   recorded{Method: "POST", Path: "/v1/volumes/web01/disks", Body: `{"name":"data","size":4096}`},
		},
		{
			name: "grow disk",
			call: func(c *Client) error { _, err := c.GrowDisk(ctx, "web01", "data", 8192); return err },
			want: recorded{Method: "PATCH", Path: "/v1/volumes/web01/disks/data", Body: `{"size":8192}`},
		},
		{
			name: "remove disk",
			call: func(c *Client) error { _, err := c.RemoveDisk(ctx, "web01", "data"); return err },
			want: recorded{Method: "DELETE", Path: "/v1/volumes/web01/disks/data"},
		},
		{
			name:  "list snapshots",
			call:  func(c *Client) error { _, err := c.ListSnapshots(ctx, "web01"); return err },
			reply: `{"items":[]}`,
			want:  recorded{Method: "GET", Path: "/v1/volumes/web01/snapshots"},
		},
		{
			name:   "create snapshot",
			call:   func(c *Client) error { _, err := c.CreateSnapshot(ctx, "web01", "nightly"); return err },
			status: http.StatusCreated,
			want:   recorded{Method: "POST", Path: "/v1/volumes/web01/snapshots", Body: `{"name":"nightly"}`},
		},
		{
			name:   "start snapshot",
			call:   func(c *Client) error { _, err := c.StartSnapshot(ctx, "web01", "nightly"); return err },
			status: http.StatusAccepted,
			reply:  `{"id":"j1","state":"running"}`,
			want:   recorded{Method: "POST", Path: "/v1/volumes/web01/snapshots", Query: "async=true", Body: `{"name":"nightly"}`},
		},
		{
			name: "get snapshot",
			call: func(c *Client) error { _, err := c.GetSnapshot(ctx, "web01", "nightly"); return err },
			want: recorded{Method: "GET", Path: "/v1/volumes/web01/snapshots/nightly"},
		},
		{
			name: "snapshot changes",
			call: func(c *Client) error { _, err := c.SnapshotChanges(ctx, "web01", "mon", "tue"); return err },
			want: recorded{Method: "GET", Path: "/v1/volumes/web01/snapshots/mon/changes", Query: "to=tue"},
		},
		{
			name: "snapshot allocated",
			call: func(c *Client) error {
				_, err := c.SnapshotAllocated(ctx, "web01", "mon", "root", 1<<20, 16)
				return err
			},
			want: recorded{Method: "GET", Path: "/v1/volumes/web01/snapshots/mon/allocated", Query: "disk=root&limit=16&offset=1048576"},
		},
		{
			name: "snapshot allocated from the start",
			call: func(c *Client) error { _, err := c.SnapshotAllocated(ctx, "web01", "mon", "root", 0, 0); return err },
			want: recorded{Method: "GET", Path: "/v1/volumes/web01/snapshots/mon/allocated", Query: "disk=root"},
		},
		{
			name:   "delete snapshot",
			call:   func(c *Client) error { return c.DeleteSnapshot(ctx, "web01", "nightly") },
			status: http.StatusNoContent,
			want:   recorded{Method: "DELETE", Path: "/v1/volumes/web01/snapshots/nightly"},
		},
		{
			name: "rollback",
			call: func(c *Client) error { _, err := c.Rollback(ctx, "web01", "nightly"); return err },
			want: recorded{Method: "POST", Path: "/v1/volumes/web01/rollback", Body: `{"snapshot":"nightly"}`},
		},
		{
			name:   "start rollback",
			call:   func(c *Client) error { _, err := c.StartRollback(ctx, "web01", "nightly"); return err },
			status: http.StatusAccepted,
			reply:  `{"id":"j2","state":"running"}`,
			want:   recorded{Method: "POST", Path: "/v1/volumes/web01/rollback", Query: "async=true", Body: `{"snapshot":"nightly"}`},
		},
		{
			name: "clone",
			call: func(c *Client) error {
				_, err := c.Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "golden", Snapshot: "v1"}, Names: []string{"a", "b"}})
				return err
			},
			status: http.StatusCreated,
			reply:  `{"items":[]}`,
			want:   recorded{Method: "POST", Path: "/v1/clones", Body: `{"source":{"volume":"golden","snapshot":"v1"},"names":["a","b"]}`},
		},
		{
			name: "start clone",
			call: func(c *Client) error {
				_, err := c.StartClone(ctx, api.CloneSpec{Source: api.Source{Volume: "golden"}, Names: []string{"a"}, Labels: map[string]string{"k": "v"}})
				return err
			},
			status: http.StatusAccepted,
			reply:  `{"id":"j3","state":"running"}`,
			want:   recorded{Method: "POST", Path: "/v1/clones", Query: "async=true", Body: `{"source":{"volume":"golden"},"names":["a"],"labels":{"k":"v"}}`},
		},
		{
			name:  "list jobs",
			call:  func(c *Client) error { _, err := c.ListJobs(ctx); return err },
			reply: `{"items":[]}`,
			want:  recorded{Method: "GET", Path: "/v1/jobs"},
		},
		{
			name: "get job",
			call: func(c *Client) error { _, err := c.GetJob(ctx, "j1"); return err },
			want: recorded{Method: "GET", Path: "/v1/jobs/j1"},
		},
		{
			name:   "cancel job",
			call:   func(c *Client) error { _, err := c.CancelJob(ctx, "j1"); return err },
			status: http.StatusAccepted,
			want:   recorded{Method: "DELETE", Path: "/v1/jobs/j1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, reply := tt.status, tt.reply
			if status == 0 {
				status = http.StatusOK
			}
			if reply == "" && status != http.StatusNoContent {
				reply = "{}"
			}
			f, c := newFake(t, cannedResponse{status: status, body: reply})
			if err := tt.call(c); err != nil {
				t.Fatalf("call: %v", err)
			}
			got := f.last(t)
			want := tt.want
			want.Auth = "Bearer s3cret"
			if got != want {
				t.Fatalf("request\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestDecodesAnswers(t *testing.T) {
	_, c := newFake(t, cannedResponse{status: 200, body: `{"items":[{"name":"web01","capacity":1024,"disks":[{"name":"root","size":512}],"snapshots":2,"future":"ignored"}]}`})
	vols, err := c.ListVolumes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Name != "web01" || vols[0].Disks[0].Size != 512 || vols[0].Snapshots != 2 {
		t.Fatalf("volumes = %+v", vols)
	}
}

// TestDeletePending: a delete answered 204 is done (no volume returned); one
// answered 202 is pending, and the volume in state deleting comes back with
// its reason, so that the CLI does not say "deleted".
func TestDeletePending(t *testing.T) {
	_, c := newFake(t, cannedResponse{status: http.StatusNoContent},
		cannedResponse{status: http.StatusAccepted, body: `{"name":"web01","state":"deleting","reason":"the copy on n3 is left"}`})
	v, err := c.DeleteVolume(context.Background(), "web01")
	if err != nil || v != nil {
		t.Fatalf("finished delete: %+v, %v; want nil, nil", v, err)
	}
	v, err = c.DeleteVolume(context.Background(), "web01")
	if err != nil || v == nil || v.State != api.VolumeDeleting || v.Reason != "the copy on n3 is left" {
		t.Fatalf("pending delete: %+v, %v; want the deleting volume", v, err)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		wantMsg   string
		wantCode  string
		notFound  bool
		conflict  bool
		busy      bool
		wantField string
	}{
		{name: "not found", status: 404, body: `{"error":{"code":"NotFound","message":"volume \"x\" not found"}}`,
			wantMsg: `volume "x" not found`, wantCode: api.CodeNotFound, notFound: true},
		{name: "conflict", status: 409, body: `{"error":{"code":"AlreadyExists","message":"volume \"x\" exists with another spec"}}`,
			wantMsg: `volume "x" exists with another spec`, wantCode: api.CodeConflict, conflict: true},
		{name: "busy", status: 409, body: `{"error":{"code":"Busy","message":"volume \"x\" is busy"}}`,
			wantMsg: `volume "x" is busy`, wantCode: api.CodeBusy, busy: true},
		{name: "invalid with field", status: 400, body: `{"error":{"code":"Invalid","message":"disk name \"Root!\": must be a DNS label","field":"disks[0].name"}}`,
			wantMsg: `disk name "Root!": must be a DNS label`, wantCode: api.CodeInvalid, wantField: "disks[0].name"},
		{name: "not json", status: 502, body: "bad gateway\n", wantMsg: "bad gateway"},
		{name: "empty body", status: 503, body: "", wantMsg: "503 Service Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newFake(t, cannedResponse{status: tt.status, body: tt.body})
			_, err := c.GetVolume(context.Background(), "x")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v is not *Error", err, err)
			}
			if e.Status != tt.status || e.Error() != tt.wantMsg || e.Detail.Code != tt.wantCode || e.Detail.Field != tt.wantField {
				t.Fatalf("error = %+v (%q)", e, e.Error())
			}
			if IsNotFound(err) != tt.notFound || IsConflict(err) != tt.conflict || IsBusy(err) != tt.busy {
				t.Fatalf("IsNotFound/IsConflict/IsBusy = %v/%v/%v", IsNotFound(err), IsConflict(err), IsBusy(err))
			}
		})
	}
}

func TestEmptyNameIsRefused(t *testing.T) {
	f, c := newFake(t)
	if _, err := c.GetVolume(context.Background(), ""); err == nil {
		t.Fatal("GetVolume(\"\") succeeded")
	}
	if _, err := c.GrowDisk(context.Background(), "v", "", 1); err == nil {
		t.Fatal("GrowDisk with empty disk succeeded")
	}
	if _, err := c.SnapshotAllocated(context.Background(), "v", "s", "", 0, 0); err == nil {
		t.Fatal("SnapshotAllocated with empty disk succeeded")
	}
	if len(f.requests) != 0 {
		t.Fatalf("requests were sent: %+v", f.requests)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:7480", true},
		{"http://127.0.0.1:7480/", true},
		{"https://quiver.example:7480/prefix", true},
		{"unix:///run/quiver.sock", true},
		{"127.0.0.1:7480", false},
		{"ftp://host", false},
		{"http://", false},
		{"unix://relative/sock", false},
		{"http://host?x=1", false},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := New(tt.url)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%q) error = %v, want ok=%v", tt.url, err, tt.ok)
			}
		})
	}
}

func TestBasePathPrefix(t *testing.T) {
	f := &fakeServer{responses: []cannedResponse{{status: 200, body: "{}"}}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL + "/quiver/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t); got.Path != "/quiver/v1/pool" || got.Auth != "" {
		t.Fatalf("request = %+v", got)
	}
}

func TestUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "quiver.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Skipf("unix sockets unavailable: %v", err)
	}
	f := &fakeServer{responses: []cannedResponse{{status: 200, body: `{"id":"pool-1"}`}}}
	srv := &http.Server{Handler: f}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c, err := New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Pool(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != "pool-1" || f.last(t).Path != "/v1/pool" {
		t.Fatalf("info = %+v, request = %+v", info, f.last(t))
	}
}

func TestWaitJob(t *testing.T) {
	job := func(state string, done int64) string {
		b, _ := json.Marshal(api.Job{ID: "j1", Kind: "clone", State: state, BytesDone: done, BytesTotal: 100})
		return string(b)
	}
	t.Run("succeeds", func(t *testing.T) {
		_, c := newFake(t,
			cannedResponse{200, job(api.JobRunning, 10)},
			cannedResponse{200, job(api.JobRunning, 60)},
			cannedResponse{200, job(api.JobSucceeded, 100)},
		)
		var seen []int64
		got, err := c.WaitJob(context.Background(), "j1", time.Millisecond, func(j api.Job) { seen = append(seen, j.BytesDone) })
		if err != nil || got.State != api.JobSucceeded {
			t.Fatalf("WaitJob = %+v, %v", got, err)
		}
		if fmtInts(seen) != "[10,60,100]" {
			t.Fatalf("progress seen = %v", seen)
		}
	})
	t.Run("fails", func(t *testing.T) {
		failed := `{"id":"j1","state":"failed","error":{"code":"NoSpace","message":"pool is full"}}`
		_, c := newFake(t, cannedResponse{200, failed})
		got, err := c.WaitJob(context.Background(), "j1", time.Millisecond, nil)
		var e *Error
		if !errors.As(err, &e) || e.Status != 0 || e.Detail.Code != api.CodeNoSpace || err.Error() != "pool is full" || got.State != api.JobFailed {
			t.Fatalf("WaitJob = %+v, %v", got, err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		_, c := newFake(t, cannedResponse{200, job(api.JobCancelled, 5)})
		_, err := c.WaitJob(context.Background(), "j1", time.Millisecond, nil)
		if !IsCancelled(err) {
			t.Fatalf("err = %v, want cancelled", err)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		_, c := newFake(t, cannedResponse{200, job(api.JobRunning, 5)})
		ctx, cancel := context.WithCancel(context.Background())
		got, err := c.WaitJob(ctx, "j1", time.Hour, func(api.Job) { cancel() })
		if !errors.Is(err, context.Canceled) || got.BytesDone != 5 {
			t.Fatalf("WaitJob = %+v, %v", got, err)
		}
	})
	t.Run("job gone", func(t *testing.T) {
		_, c := newFake(t, cannedResponse{404, `{"error":{"code":"NotFound","message":"job \"j1\" not found"}}`})
		_, err := c.WaitJob(context.Background(), "j1", time.Millisecond, nil)
		if !IsNotFound(err) {
			t.Fatalf("err = %v, want not found", err)
		}
	})
}

func fmtInts(xs []int64) string {
	b, _ := json.Marshal(xs)
	return string(b)
}
