package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/quiverstorage/quiver/internal/api"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

const mib = int64(1) << 20

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestAPI opens a pool in a fresh directory and returns the API over it.
// The job manager is shut down before the pool is closed.
func newTestAPI(t *testing.T, token string) (*Server, *pool.Pool) {
	t.Helper()
	p, err := pool.Open(context.Background(), t.TempDir(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	jobs := job.NewManager()
	t.Cleanup(func() { _ = jobs.Shutdown(context.Background()) })
	return NewServer(p, jobs, token, quietLog()), p
}

// apiClient sends requests to a real HTTP server (httptest.NewServer).
type apiClient struct {
	t     *testing.T
	base  string
	token string
}

func startAPI(t *testing.T, token string) (*apiClient, *pool.Pool) {
	t.Helper()
	s, p := newTestAPI(t, token)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &apiClient{t: t, base: srv.URL, token: token}, p
}

// do sends in (marshalled to JSON, unless nil) and returns the status and
// body. Every answer must be JSON, except a 204 which must be empty.
func (c *apiClient) do(method, path string, in any) (int, []byte) {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			c.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	if resp.StatusCode == http.StatusNoContent {
		if len(out) != 0 {
			c.t.Errorf("%s %s: 204 with a body: %s", method, path, out)
		}
	} else if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		c.t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return resp.StatusCode, out
}

// expect sends a request, fails the test unless the status is want, and
// decodes the body into out (when out is not nil).
func (c *apiClient) expect(method, path string, in any, want int, out any) {
	c.t.Helper()
	status, body := c.do(method, path, in)
	if status != want {
		c.t.Fatalf("%s %s: status %d, want %d; body: %s", method, path, status, want, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			c.t.Fatalf("%s %s: decode %T: %v; body: %s", method, path, out, err, body)
		}
	}
}

// expectError sends a request and checks the status and error code.
func (c *apiClient) expectError(method, path string, in any, status int, code string) api.Error {
	c.t.Helper()
	var eb api.ErrorBody
	c.expect(method, path, in, status, &eb)
	if eb.Error.Code != code || eb.Error.Message == "" {
		c.t.Fatalf("%s %s: error %+v, want code %s and a message", method, path, eb.Error, code)
	}
	return eb.Error
}

// waitJob polls a job until it is no longer running.
func (c *apiClient) waitJob(id string) api.Job {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var j api.Job
		c.expect("GET", "/v1/jobs/"+id, nil, http.StatusOK, &j)
		if j.State != api.JobRunning {
			return j
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("job %s still running after a minute: %+v", id, j)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writeDisk writes data at off through a disk handle, durably.
func writeDisk(t *testing.T, p *pool.Pool, vol, disk string, off int64, data []byte) {
	t.Helper()
	v, err := p.Volume(vol)
	if err != nil {
		t.Fatal(err)
	}
	d, err := v.OpenDisk(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteAt(data, off, true); err != nil {
		t.Fatal(err)
	}
}

// readImage reads n bytes at off of a disk image file.
func readImage(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func diskNames(ds []api.Disk) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

func findDisk(t *testing.T, ds []api.Disk, name string) api.Disk {
	t.Helper()
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no disk %q in %v", name, diskNames(ds))
	return api.Disk{}
}

func volumeNames(vs []api.Volume) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

func TestVolumeLifecycle(t *testing.T) {
	c, _ := startAPI(t, "")
	spec := api.VolumeSpec{Name: "web01", Capacity: 16 * mib, Labels: map[string]string{"app": "web", "tier": "front"},
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 2 * mib}}}

	var created api.Volume
	c.expect("POST", "/v1/volumes", spec, http.StatusCreated, &created)
	if created.Name != "web01" || created.UID == "" || created.Capacity != 16*mib || created.Path == "" ||
		!slices.Equal(diskNames(created.Disks), []string{"root", "data"}) {
		t.Fatalf("created %+v", created)
	}
	for _, d := range created.Disks {
		if got := fileSize(t, d.Path); got != d.Size {
			t.Errorf("disk %s: image of %d bytes, want %d", d.Name, got, d.Size)
		}
	}

	// A taken name is a conflict, even with the same spec, unless the
	// caller asks for idempotent create (TestCreateOfATakenName: keys).
	c.expectError("POST", "/v1/volumes", spec, http.StatusConflict, api.CodeConflict)
	var again api.Volume
	c.expect("POST", "/v1/volumes?idempotent=true", spec, http.StatusOK, &again)
	if again.UID != created.UID {
		t.Errorf("same spec again: uid %s, want the existing %s", again.UID, created.UID)
	}
	other := spec
	other.Capacity = 32 * mib
	c.expectError("POST", "/v1/volumes?idempotent=true", other, http.StatusConflict, api.CodeConflict)

	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "db01", Capacity: mib, Labels: map[string]string{"app": "db"}},
		http.StatusCreated, nil)

	var got api.Volume
	c.expect("GET", "/v1/volumes/web01", nil, http.StatusOK, &got)
	if got.UID != created.UID || got.Labels["tier"] != "front" {
		t.Errorf("get: %+v", got)
	}

	for _, tt := range []struct {
		selector string
		want     []string
	}{
		{"", []string{"db01", "web01"}},
		{"app=web", []string{"web01"}},
		{"app in (web,db)", []string{"db01", "web01"}},
		{"tier", []string{"web01"}},
		{"app!=web", []string{"db01"}},
		{"app=nothing", []string{}},
	} {
		path := "/v1/volumes"
		if tt.selector != "" {
			path += "?" + url.Values{"selector": {tt.selector}}.Encode()
		}
		var list api.List[api.Volume]
		c.expect("GET", path, nil, http.StatusOK, &list)
		if got := volumeNames(list.Items); !slices.Equal(got, tt.want) {
			t.Errorf("selector %q: %v, want %v", tt.selector, got, tt.want)
		}
	}

	capacity := 32 * mib
	var patched api.Volume
	c.expect("PATCH", "/v1/volumes/web01", api.VolumeUpdate{Capacity: &capacity}, http.StatusOK, &patched)
	if patched.Capacity != capacity || patched.Labels["app"] != "web" {
		t.Errorf("patch capacity: %+v", patched)
	}
	c.expect("PATCH", "/v1/volumes/web01", api.VolumeUpdate{Labels: map[string]string{"app": "web", "tier": "back"}},
		http.StatusOK, &patched)
	if patched.Capacity != capacity || len(patched.Labels) != 2 || patched.Labels["tier"] != "back" {
		t.Errorf("patch labels: %+v", patched)
	}

	var vol api.Volume
	c.expect("POST", "/v1/volumes/web01/disks", api.DiskSpec{Name: "logs", Size: mib}, http.StatusCreated, &vol)
	logs := findDisk(t, vol.Disks, "logs")
	if logs.Size != mib || fileSize(t, logs.Path) != mib {
		t.Errorf("add disk: %+v", logs)
	}
	c.expect("PATCH", "/v1/volumes/web01/disks/logs", api.DiskUpdate{Size: 2 * mib}, http.StatusOK, &vol)
	if d := findDisk(t, vol.Disks, "logs"); d.Size != 2*mib || fileSize(t, d.Path) != 2*mib {
		t.Errorf("grow disk: %+v", d)
	}
	c.expect("DELETE", "/v1/volumes/web01/disks/logs", nil, http.StatusOK, &vol)
	if !slices.Equal(diskNames(vol.Disks), []string{"root", "data"}) {
		t.Errorf("after remove disk: %v", diskNames(vol.Disks))
	}
	if _, err := os.Stat(logs.Path); !os.IsNotExist(err) {
		t.Errorf("removed disk image: %v, want gone", err)
	}

	var info api.PoolInfo
	c.expect("GET", "/v1/pool", nil, http.StatusOK, &info)
	if info.Volumes != 2 || info.ID == "" {
		t.Errorf("pool: %+v", info)
	}

	c.expect("DELETE", "/v1/volumes/web01", nil, http.StatusNoContent, nil)
	c.expectError("GET", "/v1/volumes/web01", nil, http.StatusNotFound, api.CodeNotFound)
	if _, err := os.Stat(created.Path); !os.IsNotExist(err) {
		t.Errorf("deleted volume's disks directory: %v, want gone", err)
	}
}

func TestSnapshotsClonesRollback(t *testing.T) {
	c, p := startAPI(t, "")
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "golden", Capacity: 4 * mib, Labels: map[string]string{"app": "vdi"},
		Disks: []api.DiskSpec{{Name: "root", Size: mib}, {Name: "data", Size: mib}}}, http.StatusCreated, nil)
	v1 := bytes.Repeat([]byte("v1"), 2048)
	v2 := bytes.Repeat([]byte("v2"), 2048)
	writeDisk(t, p, "golden", "root", 0, v1)
	writeDisk(t, p, "golden", "data", 8192, v1)

	// Synchronous snapshot, then the same again: a conflict, unless asked
	// to be idempotent.
	var snap api.Snapshot
	c.expect("POST", "/v1/volumes/golden/snapshots", api.SnapshotSpec{Name: "v1"}, http.StatusCreated, &snap)
	if snap.Name != "v1" || snap.Volume != "golden" || len(snap.Disks) != 2 ||
		(snap.Method != "reflink" && snap.Method != "copy") {
		t.Fatalf("snapshot: %+v", snap)
	}
	c.expectError("POST", "/v1/volumes/golden/snapshots", api.SnapshotSpec{Name: "v1"}, http.StatusConflict, api.CodeConflict)
	c.expectError("POST", "/v1/volumes/golden/snapshots?async=true", api.SnapshotSpec{Name: "v1"}, http.StatusConflict, api.CodeConflict)
	var same api.Snapshot
	c.expect("POST", "/v1/volumes/golden/snapshots?idempotent=true", api.SnapshotSpec{Name: "v1"}, http.StatusOK, &same)
	if same.UID != snap.UID {
		t.Errorf("snapshot again: uid %s, want %s", same.UID, snap.UID)
	}

	// Asynchronous snapshot: 202 with a job to poll.
	var j api.Job
	c.expect("POST", "/v1/volumes/golden/snapshots?async=true", api.SnapshotSpec{Name: "v2"}, http.StatusAccepted, &j)
	if j.ID == "" || j.Kind != "snapshot" || j.Target != "golden@v2" {
		t.Fatalf("async snapshot job: %+v", j)
	}
	if done := c.waitJob(j.ID); done.State != api.JobSucceeded || !slices.Equal(done.Result, []string{"v2"}) || done.Error != nil {
		t.Fatalf("snapshot job ended %+v", done)
	}
	var jobs api.List[api.Job]
	c.expect("GET", "/v1/jobs", nil, http.StatusOK, &jobs)
	if !slices.ContainsFunc(jobs.Items, func(x api.Job) bool { return x.ID == j.ID }) {
		t.Errorf("job %s not listed in %+v", j.ID, jobs.Items)
	}
	// Cancelling a finished job is accepted and changes nothing.
	var cancelled api.Job
	c.expect("DELETE", "/v1/jobs/"+j.ID, nil, http.StatusAccepted, &cancelled)
	if cancelled.State != api.JobSucceeded {
		t.Errorf("cancel of a finished job: %+v", cancelled)
	}

	c.expect("GET", "/v1/volumes/golden/snapshots/v2", nil, http.StatusOK, &snap)
	var snaps api.List[api.Snapshot]
	c.expect("GET", "/v1/volumes/golden/snapshots", nil, http.StatusOK, &snaps)
	if len(snaps.Items) != 2 {
		t.Errorf("snapshots: %+v", snaps.Items)
	}

	// Bulk clone from a snapshot.
	fromSnap := api.CloneSpec{Source: api.Source{Volume: "golden", Snapshot: "v1"}, Names: []string{"c1", "c2", "c3"},
		Labels: map[string]string{"role": "desktop"}}
	var clones api.List[api.Volume]
	c.expect("POST", "/v1/clones", fromSnap, http.StatusCreated, &clones)
	if got := volumeNames(clones.Items); !slices.Equal(got, fromSnap.Names) {
		t.Fatalf("clones %v, want %v", got, fromSnap.Names)
	}
	for _, cl := range clones.Items {
		if cl.Source == nil || *cl.Source != fromSnap.Source || cl.Labels["app"] != "vdi" || cl.Labels["role"] != "desktop" {
			t.Errorf("clone %s: source %+v labels %v", cl.Name, cl.Source, cl.Labels)
		}
		if got := readImage(t, findDisk(t, cl.Disks, "root").Path, 0, len(v1)); !bytes.Equal(got, v1) {
			t.Errorf("clone %s: root does not hold the snapshot's data", cl.Name)
		}
		if got := readImage(t, findDisk(t, cl.Disks, "data").Path, 8192, len(v1)); !bytes.Equal(got, v1) {
			t.Errorf("clone %s: data does not hold the snapshot's data", cl.Name)
		}
	}
	// The same request again is a conflict; asked to be idempotent, it
	// finds the clones made.
	c.expectError("POST", "/v1/clones", fromSnap, http.StatusConflict, api.CodeConflict)
	var again api.List[api.Volume]
	c.expect("POST", "/v1/clones?idempotent=true", fromSnap, http.StatusCreated, &again)
	for i := range again.Items {
		if again.Items[i].UID != clones.Items[i].UID {
			t.Errorf("clone again: %s has uid %s, want %s", again.Items[i].Name, again.Items[i].UID, clones.Items[i].UID)
		}
	}

	// Bulk clone from the live volume, after a write the snapshots lack.
	writeDisk(t, p, "golden", "root", 0, v2)
	fromLive := api.CloneSpec{Source: api.Source{Volume: "golden"}, Names: []string{"l1", "l2", "l3"}}
	c.expect("POST", "/v1/clones", fromLive, http.StatusCreated, &clones)
	if got := volumeNames(clones.Items); !slices.Equal(got, fromLive.Names) {
		t.Fatalf("live clones %v, want %v", got, fromLive.Names)
	}
	for _, cl := range clones.Items {
		if got := readImage(t, findDisk(t, cl.Disks, "root").Path, 0, len(v2)); !bytes.Equal(got, v2) {
			t.Errorf("live clone %s: root does not hold the live data", cl.Name)
		}
	}

	// Asynchronous bulk clone.
	c.expect("POST", "/v1/clones?async=true", api.CloneSpec{Source: api.Source{Volume: "golden", Snapshot: "v2"},
		Names: []string{"a1", "a2", "a3"}}, http.StatusAccepted, &j)
	if done := c.waitJob(j.ID); done.State != api.JobSucceeded || done.ItemsDone != 3 || len(done.Result) != 3 {
		t.Fatalf("clone job ended %+v", done)
	}

	// Rollback to v1 brings back its data, synchronously and as a job.
	var rolled api.Volume
	c.expect("POST", "/v1/volumes/golden/rollback", api.RollbackSpec{Snapshot: "v1"}, http.StatusOK, &rolled)
	if got := readImage(t, findDisk(t, rolled.Disks, "root").Path, 0, len(v1)); !bytes.Equal(got, v1) {
		t.Errorf("after rollback to v1: root does not hold v1's data")
	}
	writeDisk(t, p, "golden", "root", 0, v2)
	c.expect("POST", "/v1/volumes/golden/rollback?async=true", api.RollbackSpec{Snapshot: "v1"}, http.StatusAccepted, &j)
	if done := c.waitJob(j.ID); done.State != api.JobSucceeded || done.Kind != "rollback" {
		t.Fatalf("rollback job ended %+v", done)
	}
	if got := readImage(t, findDisk(t, rolled.Disks, "root").Path, 0, len(v1)); !bytes.Equal(got, v1) {
		t.Errorf("after async rollback to v1: root does not hold v1's data")
	}

	c.expect("DELETE", "/v1/volumes/golden/snapshots/v2", nil, http.StatusNoContent, nil)
	c.expectError("GET", "/v1/volumes/golden/snapshots/v2", nil, http.StatusNotFound, api.CodeNotFound)
	c.expect("GET", "/v1/volumes/golden", nil, http.StatusOK, &rolled)
	if rolled.Snapshots != 1 {
		t.Errorf("snapshots after delete: %d, want 1", rolled.Snapshots)
	}

	// A volume with snapshots goes only with recursive=true, as with zfs
	// destroy -r; the refusal changes nothing.
	c.expectError("DELETE", "/v1/volumes/golden", nil, http.StatusConflict, api.CodeHasSnapshots)
	c.expectError("DELETE", "/v1/volumes/golden?recursive=maybe", nil, http.StatusBadRequest, api.CodeInvalid)
	c.expect("GET", "/v1/volumes/golden/snapshots/v1", nil, http.StatusOK, nil)
	// Clones are independent of their source.
	c.expect("DELETE", "/v1/volumes/golden?recursive=true", nil, http.StatusNoContent, nil)
	var c1 api.Volume
	c.expect("GET", "/v1/volumes/c1", nil, http.StatusOK, &c1)
	if got := readImage(t, findDisk(t, c1.Disks, "root").Path, 0, len(v1)); !bytes.Equal(got, v1) {
		t.Errorf("clone c1 lost its data when its source was deleted")
	}
}

func TestBearerToken(t *testing.T) {
	c, _ := startAPI(t, "s3cret")
	for _, tt := range []struct {
		name, header string
		status       int
	}{
		{"no header", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", http.StatusUnauthorized},
		{"token prefix", "Bearer s3cre", http.StatusUnauthorized},
		{"not bearer", "Basic s3cret", http.StatusUnauthorized},
		{"bare token", "s3cret", http.StatusUnauthorized},
		{"right token", "Bearer s3cret", http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", c.base+"/v1/pool", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %q, want %d JSON", resp.StatusCode, resp.Header.Get("Content-Type"), tt.status)
			}
			if tt.status != http.StatusUnauthorized {
				return
			}
			var eb api.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatal(err)
			}
			if eb.Error.Code != api.CodeUnauthorized || !strings.Contains(eb.Error.Message, "token") {
				t.Errorf("error %+v", eb.Error)
			}
			if strings.Contains(eb.Error.Message, "s3cret") {
				t.Errorf("error message reveals the token: %q", eb.Error.Message)
			}
		})
	}
	// Every route is guarded, including unknown ones.
	c.token = ""
	c.expectError("POST", "/v1/volumes", api.VolumeSpec{Name: "web", Capacity: mib}, http.StatusUnauthorized, api.CodeUnauthorized)
	c.expectError("GET", "/v1/nothing", nil, http.StatusUnauthorized, api.CodeUnauthorized)
}

func TestUnknownRouteAndMethod(t *testing.T) {
	c, _ := startAPI(t, "")
	for _, path := range []string{"/", "/v1", "/v1/nothing", "/v2/volumes", "/v1/volumes/web/nothing"} {
		e := c.expectError("GET", path, nil, http.StatusNotFound, api.CodeNotFound)
		if !strings.Contains(e.Message, path) {
			t.Errorf("GET %s: message %q does not name the path", path, e.Message)
		}
	}
	req, err := http.NewRequest("PUT", c.base+"/v1/volumes/web", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusMethodNotAllowed || eb.Error.Code != api.CodeInvalid || !strings.Contains(eb.Error.Message, "PUT") {
		t.Errorf("PUT: %d %+v, want 405 naming the method", resp.StatusCode, eb.Error)
	}
	if allow := resp.Header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "PATCH") ||
		!strings.Contains(allow, "DELETE") {
		t.Errorf("Allow %q, want GET, PATCH and DELETE", allow)
	}
}

func TestSnapshotChanges(t *testing.T) {
	c, p := startAPI(t, "")
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "vm", Capacity: 8 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 2 * mib}, {Name: "data", Size: 2 * mib}}}, http.StatusCreated, nil)
	c.expect("POST", "/v1/volumes/vm/snapshots", api.SnapshotSpec{Name: "a"}, http.StatusCreated, nil)
	writeDisk(t, p, "vm", "data", mib+10, []byte("changed"))
	c.expect("POST", "/v1/volumes/vm/snapshots", api.SnapshotSpec{Name: "b"}, http.StatusCreated, nil)
	writeDisk(t, p, "vm", "root", 0, []byte("changed later"))

	var ab api.SnapshotChanges
	c.expect("GET", "/v1/volumes/vm/snapshots/a/changes?to=b", nil, http.StatusOK, &ab)
	want := api.SnapshotChanges{Volume: "vm", From: "a", To: "b", Disks: []api.DiskChanges{
		{Disk: "root", Size: 2 * mib, BaseSize: 2 * mib, Ranges: []api.Range{}},
		{Disk: "data", Size: 2 * mib, BaseSize: 2 * mib, Changed: 64 << 10, Ranges: []api.Range{{Offset: mib, Length: 64 << 10}}},
	}}
	if fmt.Sprint(ab) != fmt.Sprint(want) {
		t.Errorf("a..b = %+v\nwant %+v", ab, want)
	}
	var alive api.SnapshotChanges
	c.expect("GET", "/v1/volumes/vm/snapshots/b/changes", nil, http.StatusOK, &alive)
	if len(alive.Disks) != 2 || alive.Disks[0].Changed != 64<<10 || alive.Disks[1].Changed != 0 {
		t.Errorf("b..live = %+v", alive)
	}
	c.expectError("GET", "/v1/volumes/vm/snapshots/nope/changes", nil, http.StatusNotFound, api.CodeNotFound)
	c.expectError("GET", "/v1/volumes/vm/snapshots/a/changes?to=nope", nil, http.StatusNotFound, api.CodeNotFound)
	c.expectError("GET", "/v1/volumes/vm/snapshots/a/changes?to=..", nil, http.StatusBadRequest, api.CodeInvalid)
}

func TestSnapshotAllocated(t *testing.T) {
	c, p := startAPI(t, "")
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "vm", Capacity: 8 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 2 * mib}}}, http.StatusCreated, nil)
	const k64 = 64 << 10
	writeDisk(t, p, "vm", "root", 0, bytes.Repeat([]byte{1}, k64))
	writeDisk(t, p, "vm", "root", mib, bytes.Repeat([]byte{2}, 2*k64))
	writeDisk(t, p, "vm", "root", 3*mib, bytes.Repeat([]byte{3}, k64))
	c.expect("POST", "/v1/volumes/vm/snapshots", api.SnapshotSpec{Name: "a"}, http.StatusCreated, nil)
	writeDisk(t, p, "vm", "root", 2*mib, bytes.Repeat([]byte{4}, k64)) // after a: not in a

	get := func(query string) api.SnapshotAllocated {
		t.Helper()
		var out api.SnapshotAllocated
		c.expect("GET", "/v1/volumes/vm/snapshots/a/allocated?"+query, nil, http.StatusOK, &out)
		if out.Volume != "vm" || out.Snapshot != "a" || out.Disk != "root" || out.Size != 4*mib {
			t.Errorf("%s: answer %+v names the wrong disk or size", query, out)
		}
		return out
	}
	check := func(query string, want []api.Range, next int64) {
		t.Helper()
		got := get(query)
		if fmt.Sprint(got.Ranges) != fmt.Sprint(want) || got.Next != next {
			t.Errorf("%s: ranges %v next %d, want %v next %d", query, got.Ranges, got.Next, want, next)
		}
	}
	all := []api.Range{{Offset: 0, Length: k64}, {Offset: mib, Length: 2 * k64}, {Offset: 3 * mib, Length: k64}}
	check("disk=root", all, 0)
	// Pages: the second starts where the first one's last range ends.
	check("disk=root&limit=2", all[:2], mib+2*k64)
	check("disk=root&limit=2&offset=1179648", all[2:], 0)
	check("disk=root&limit=1&offset=65536", all[1:2], mib+2*k64)
	// An offset inside a range starts the answer there.
	check("disk=root&offset=1114112", []api.Range{{Offset: mib + k64, Length: k64}, all[2]}, 0)
	check("disk=root&offset=4194304", []api.Range{}, 0)
	var data api.SnapshotAllocated
	c.expect("GET", "/v1/volumes/vm/snapshots/a/allocated?disk=data", nil, http.StatusOK, &data)
	if len(data.Ranges) != 0 || data.Size != 2*mib {
		t.Errorf("data: %+v, want no range of 2 MiB", data)
	}

	bad := []struct {
		query  string
		status int
		code   string
		field  string
	}{
		{"", http.StatusBadRequest, api.CodeInvalid, "disk"},
		{"disk=nope", http.StatusNotFound, api.CodeNotFound, "nope"},
		{"disk=Root!", http.StatusBadRequest, api.CodeInvalid, "disk"},
		{"disk=root&offset=-1", http.StatusBadRequest, api.CodeInvalid, "offset"},
		{"disk=root&offset=x", http.StatusBadRequest, api.CodeInvalid, "offset"},
		{"disk=root&offset=4194305", http.StatusBadRequest, api.CodeInvalid, "offset"},
		{"disk=root&limit=0", http.StatusBadRequest, api.CodeInvalid, "limit"},
		{"disk=root&limit=4097", http.StatusBadRequest, api.CodeInvalid, "limit"},
	}
	for _, b := range bad {
		e := c.expectError("GET", "/v1/volumes/vm/snapshots/a/allocated?"+b.query, nil, b.status, b.code)
		if !strings.Contains(e.Message, b.field) {
			t.Errorf("%q: message %q does not name %q", b.query, e.Message, b.field)
		}
	}
	c.expectError("GET", "/v1/volumes/vm/snapshots/nope/allocated?disk=root", nil, http.StatusNotFound, api.CodeNotFound)
	c.expectError("GET", "/v1/volumes/nope/snapshots/a/allocated?disk=root", nil, http.StatusNotFound, api.CodeNotFound)
}
