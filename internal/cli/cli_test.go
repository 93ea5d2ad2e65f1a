package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
)

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeAPI serves canned answers by "METHOD /path" and records requests.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	routes   map[string]http.HandlerFunc
	requests []string          // "METHOD /path?query"
	bodies   map[string]string // last body by "METHOD /path"
	auth     string
}

func newFakeAPI(t *testing.T) (*fakeAPI, string) {
	f := &fakeAPI{t: t, routes: map[string]http.HandlerFunc{}, bodies: map[string]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// reply makes route answer status with v as JSON.
func (f *fakeAPI) reply(route string, status int, v any) {
	f.routes[route] = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, status, v) }
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		json.NewEncoder(w).Encode(v)
	}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	route := r.Method + " " + r.URL.EscapedPath()
	f.mu.Lock()
	f.requests = append(f.requests, strings.TrimSuffix(route+"?"+r.URL.RawQuery, "?"))
	f.bodies[route] = string(body)
	f.auth = r.Header.Get("Authorization")
	h := f.routes[route]
	f.mu.Unlock()
	if h == nil {
		writeJSON(w, http.StatusNotFound, api.ErrorBody{Error: api.Error{Code: api.CodeNotFound, Message: "no route " + route}})
		return
	}
	h(w, r)
}

func (f *fakeAPI) body(route string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[route]
}

func (f *fakeAPI) sent(route string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.requests {
		if r == route {
			return true
		}
	}
	return false
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes the command line against server with a fixed clock.
func run(t *testing.T, ctx context.Context, server string, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Execute(ctx, append([]string{"--server", server}, args...), Env{
		Stdout:       &stdout,
		Stderr:       &stderr,
		Getenv:       func(k string) string { return env[k] },
		Now:          func() time.Time { return testNow },
		PollInterval: time.Millisecond,
	})
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

var testVolumes = []api.Volume{
	{
		Name: "web01", UID: "u1", Capacity: 200 << 30, Labels: map[string]string{"tier": "1", "app": "web"},
		Disks:     []api.Disk{{Name: "root", Size: 40 << 30, Allocated: 3 << 29, Path: "/p/web01/root.img"}, {Name: "data", Size: 100 << 30, Path: "/p/web01/data.img"}},
		Snapshots: 2, CreatedAt: testNow.Add(-3 * time.Hour), Path: "/p/web01",
	},
	{
		Name: "vdi-001", UID: "u2", Capacity: 40 << 30,
		Disks:     []api.Disk{{Name: "root", Size: 40 << 30}},
		Source:    &api.Source{Volume: "golden", Snapshot: "v1"},
		CreatedAt: testNow.Add(-90 * time.Second),
	},
}

func TestVolumeListTable(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: testVolumes})
	got := run(t, context.Background(), url, nil, "volume", "list", "-l", "app=web")
	want := `NAME      CAPACITY   DISKS                  SNAPSHOTS   LABELS           AGE
web01     200Gi      root=40Gi,data=100Gi   2           app=web,tier=1   3h
vdi-001   40Gi       root=40Gi              0           <none>           90s
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	if !f.sent("GET /v1/volumes?selector=app%3Dweb") {
		t.Fatalf("requests = %v", f.requests)
	}
}

func TestVolumeListJSON(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: testVolumes})
	got := run(t, context.Background(), url, nil, "-o", "json", "volume", "list")
	var list api.List[api.Volume]
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil || got.code != 0 {
		t.Fatalf("exit %d, stdout %q: %v", got.code, got.stdout, err)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "web01" || list.Items[1].Source.Snapshot != "v1" {
		t.Fatalf("list = %+v", list)
	}
	if !strings.Contains(got.stdout, "\n  \"items\": [") {
		t.Fatalf("not indented:\n%s", got.stdout)
	}
}

func TestEmptyListJSONIsArray(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/jobs", 200, api.List[api.Job]{})
	got := run(t, context.Background(), url, nil, "job", "list", "-o", "json")
	if got.code != 0 || strings.TrimSpace(got.stdout) != "{\n  \"items\": []\n}" {
		t.Fatalf("exit %d, stdout %q", got.code, got.stdout)
	}
}

func TestVolumeGet(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes/web01", 200, testVolumes[0])
	got := run(t, context.Background(), url, nil, "volume", "get", "web01")
	for _, want := range []string{
		"Name:       web01\n",
		"Capacity:   200Gi (140Gi in disks)\n",
		"Labels:     app=web,tier=1\n",
		"Snapshots:  2\n",
		"Disks:\n  NAME   SIZE    ALLOCATED   PATH\n  root   40Gi    1.5Gi       /p/web01/root.img\n",
	} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, got.stdout)
		}
	}
}

func TestVolumeCreateSendsSpec(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("POST /v1/volumes", 201, testVolumes[0])
	got := run(t, context.Background(), url, nil, "volume", "create", "web01",
		"--capacity", "200Gi", "--disk", "root=40Gi", "--disk", "data=100Gi", "--label", "app=web", "--label", "tier=1")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	var spec api.VolumeSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/volumes")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Name != "web01" || spec.Capacity != 200<<30 || len(spec.Disks) != 2 ||
		spec.Disks[0] != (api.DiskSpec{Name: "root", Size: 40 << 30}) || spec.Disks[1].Name != "data" ||
		spec.Labels["app"] != "web" || spec.Labels["tier"] != "1" {
		t.Fatalf("spec = %+v", spec)
	}
	if !strings.HasPrefix(got.stdout, "NAME ") || !strings.Contains(got.stdout, "web01") {
		t.Fatalf("stdout = %q", got.stdout)
	}
}

// refusedBeforeSending runs the CLI with args against a fake API: it must
// exit with ExitError, print "error: " and want, and send no request.
func refusedBeforeSending(t *testing.T, args []string, want string) {
	t.Helper()
	f, url := newFakeAPI(t)
	got := run(t, context.Background(), url, nil, args...)
	if got.code != ExitError || !strings.Contains(got.stderr, "error: "+want) {
		t.Fatalf("exit %d, stderr %q; want %q", got.code, got.stderr, want)
	}
	if len(f.requests) != 0 {
		t.Fatalf("requests sent: %v", f.requests)
	}
}

func TestBadInputIsRefusedBeforeSending(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "create", "v", "--capacity", "10GB"}, `--capacity: size "10GB": not a size`},
		{[]string{"volume", "create", "v", "--capacity", "10Gi", "--disk", "root"}, `--disk: disk "root": want NAME=SIZE`},
		{[]string{"volume", "create", "v", "--capacity", "10Gi", "--label", "novalue"}, `--label: label "novalue": want KEY=VALUE`},
		{[]string{"disk", "grow", "--", "v", "root", "-5Gi"}, `disk root: size "-5Gi": must not be negative`},
		{[]string{"clone", "a@", "b"}, `source "a@": want VOLUME@SNAPSHOT or VOLUME`},
		{[]string{"clone", "a@s", "b{1..2"}, `name pattern "b{1..2"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) { refusedBeforeSending(t, tt.args, tt.want) })
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "get"}, "hint: see 'quiver volume get --help'"},
		{[]string{"volume", "create", "v"}, `required flag(s) "capacity" not set`},
		{[]string{"-o", "xml", "pool", "info"}, `--output "xml": want one of table, wide, json, yaml, name`},
		{[]string{"volume", "label"}, "hint: see 'quiver volume label --help'"},
		// The typos of issue 14: each printed the group's help and exited 0.
		{[]string{"snapshot", "craete", "db01", "x"}, "unknown command \"craete\" for \"quiver snapshot\"\n\nDid you mean this?\n\tcreate"},
		{[]string{"volume", "lst"}, "\tlist\n"},
		{[]string{"pool", "inf"}, "Did you mean this?\n\tinfo"},
		// A client certificate needs its key, and HTTPS.
		{[]string{"--cert-file", "c.pem", "pool", "info"}, "--cert-file and --key-file go together"},
		{[]string{"--key-file", "k.pem", "pool", "info"}, "--cert-file and --key-file go together"},
		{[]string{"--cert-file", "c.pem", "--key-file", "k.pem", "pool", "info"}, "a client certificate needs an https:// --server"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, url := newFakeAPI(t)
			got := run(t, context.Background(), url, nil, tt.args...)
			if got.code != ExitError || !strings.Contains(got.stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want %q", got.code, got.stderr, tt.want)
			}
		})
	}
}

func TestServerErrorsAndHints(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   api.Error
		want   string
	}{
		{"not found", 404, api.Error{Code: api.CodeNotFound, Message: `volume "web01" not found`}, "error: volume \"web01\" not found\n"},
		{"busy", 409, api.Error{Code: api.CodeBusy, Message: `volume "web01" is busy`},
			"error: volume \"web01\" is busy\nhint: another operation holds the volume; `quiver job list` shows what is running\n"},
		{"unauthorized", 401, api.Error{Code: api.CodeUnauthorized, Message: "missing bearer token"},
			"error: missing bearer token\nhint: the server wants its bearer token: pass --token-file (QUIVER_TOKEN_FILE), " +
				"or a client certificate mapped to a token (--cert-file, --key-file)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply("DELETE /v1/volumes/web01", tt.status, api.ErrorBody{Error: tt.body})
			got := run(t, context.Background(), url, nil, "volume", "delete", "web01")
			if got.code != ExitError || got.stderr != tt.want || got.stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %q", got.code, got.stdout, got.stderr, tt.want)
			}
		})
	}
}

func TestConnectionRefusedHint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	got := run(t, context.Background(), addr, nil, "pool", "info")
	want := "hint: is `quiver server` running at " + addr + "?"
	if got.code != ExitError || !strings.Contains(got.stderr, want) {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
}

func TestTokenFileFromEnv(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/pool", 200, api.PoolInfo{ID: "p1", TotalBytes: 100 << 30, FreeBytes: 25 << 30,
		Capabilities: api.Capabilities{Reflink: true, SeekHole: true}})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := run(t, context.Background(), url, map[string]string{envTokenFile: tokenFile}, "pool", "info")
	if got.code != 0 || f.auth != "Bearer s3cret" {
		t.Fatalf("exit %d (%s), auth %q", got.code, got.stderr, f.auth)
	}
	for _, want := range []string{"Capabilities:     reflink, seek_hole\n", "Free:             25Gi (25%)\n", "Chunk ownership:  off\n"} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, got.stdout)
		}
	}
}

// jobSequence answers GET /v1/jobs/{id} with each state in turn, then the
// last one forever.
func (f *fakeAPI) jobSequence(id string, states ...api.Job) {
	var mu sync.Mutex
	f.routes["GET /v1/jobs/"+id] = func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		j := states[0]
		if len(states) > 1 {
			states = states[1:]
		}
		mu.Unlock()
		writeJSON(w, 200, j)
	}
}

func TestSnapshotCreateWaitsForJob(t *testing.T) {
	f, url := newFakeAPI(t)
	running := api.Job{ID: "j1", Kind: "snapshot", Target: "web01@nightly", State: api.JobRunning, BytesTotal: 100}
	done := running
	done.State, done.BytesDone = api.JobSucceeded, 100
	f.reply("POST /v1/volumes/web01/snapshots", 202, running)
	f.jobSequence("j1", running, running, done)
	f.reply("GET /v1/volumes/web01/snapshots/nightly", 200, api.Snapshot{Name: "nightly", Volume: "web01",
		Disks: testVolumes[0].Disks, Method: "reflink", GateHeld: 1500 * time.Microsecond, CreatedAt: testNow})
	got := run(t, context.Background(), url, nil, "snapshot", "create", "web01", "nightly")
	want := `NAME      VOLUME   DISKS                  METHOD    GATE-HELD   AGE
nightly   web01    root=40Gi,data=100Gi   reflink   1.5ms       0s
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", got.code, got.stderr, got.stdout)
	}
	if !f.sent("POST /v1/volumes/web01/snapshots?async=true") || f.body("POST /v1/volumes/web01/snapshots") != `{"name":"nightly"}` {
		t.Fatalf("requests = %v", f.requests)
	}
}

func TestJobFailureIsReported(t *testing.T) {
	f, url := newFakeAPI(t)
	job := api.Job{ID: "j1", Kind: "rollback", Target: "web01@nightly", State: api.JobRunning}
	failed := job
	failed.State, failed.Error = api.JobFailed, &api.Error{Code: api.CodeNoSpace, Message: "pool is full"}
	f.reply("POST /v1/volumes/web01/rollback", 202, job)
	f.jobSequence("j1", failed)
	got := run(t, context.Background(), url, nil, "rollback", "web01", "nightly")
	want := "error: pool is full\nhint: the pool is full; `quiver pool info` shows its free space\n"
	if got.code != ExitError || got.stderr != want {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
}

func TestCloneExpandsNamesAndPrintsClones(t *testing.T) {
	f, url := newFakeAPI(t)
	job := api.Job{ID: "j9", Kind: "clone", State: api.JobSucceeded, Result: []string{"vdi-01", "vdi-02"}}
	f.reply("POST /v1/clones", 202, job)
	f.jobSequence("j9", job)
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: []api.Volume{
		{Name: "vdi-02", Capacity: 1 << 30}, {Name: "other"}, {Name: "vdi-01", Capacity: 1 << 30},
	}})
	got := run(t, context.Background(), url, nil, "-o", "json", "clone", "golden@v1", "vdi-{01..02}", "--label", "pool=vdi")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	var spec api.CloneSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/clones")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Source != (api.Source{Volume: "golden", Snapshot: "v1"}) || strings.Join(spec.Names, " ") != "vdi-01 vdi-02" || spec.Labels["pool"] != "vdi" {
		t.Fatalf("spec = %+v", spec)
	}
	var list api.List[api.Volume]
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "vdi-01" || list.Items[1].Name != "vdi-02" {
		t.Fatalf("printed %+v", list.Items)
	}
}

func TestInterruptCancelsJob(t *testing.T) {
	f, url := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job := api.Job{ID: "j7", Kind: "clone", Target: "golden@v1 -> a", State: api.JobRunning}
	f.reply("POST /v1/clones", 202, job)
	f.routes["GET /v1/jobs/j7"] = func(w http.ResponseWriter, _ *http.Request) {
		cancel() // as Ctrl-C would, while the command waits
		writeJSON(w, 200, job)
	}
	cancelled := job
	cancelled.State = api.JobCancelled
	f.reply("DELETE /v1/jobs/j7", 202, cancelled)
	got := run(t, ctx, url, nil, "clone", "golden@v1", "a")
	if got.code != ExitInterrupted || !strings.Contains(got.stderr, "interrupted: asked the server to cancel job j7") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	if !f.sent("DELETE /v1/jobs/j7") {
		t.Fatalf("job not cancelled; requests = %v", f.requests)
	}
}

func TestJobTable(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/jobs", 200, api.List[api.Job]{Items: []api.Job{
		{ID: "j1", Kind: "clone", Target: "golden@v1 -> vdi-001..vdi-500", State: api.JobRunning,
			BytesDone: 10 << 30, BytesTotal: 40 << 30, ItemsDone: 12, ItemsTotal: 500, StartedAt: testNow.Add(-5 * time.Minute)},
		{ID: "j2", Kind: "snapshot", Target: "web01@nightly", State: api.JobSucceeded, StartedAt: testNow.Add(-50 * time.Hour)},
	}})
	got := run(t, context.Background(), url, nil, "job", "list")
	want := `ID   KIND       TARGET                          STATE       PROGRESS                      AGE
j1   clone      golden@v1 -> vdi-001..vdi-500   running     25% 10Gi/40Gi, 12/500 items   5m
j2   snapshot   web01@nightly                   succeeded   -                             2d
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
}

func TestProgressBarOnlyOnTerminal(t *testing.T) {
	for _, interactive := range []bool{false, true} {
		f, url := newFakeAPI(t)
		running := api.Job{ID: "j1", Kind: "rollback", Target: "web01@nightly", State: api.JobRunning, BytesDone: 1 << 30, BytesTotal: 4 << 30}
		done := running
		done.State, done.BytesDone = api.JobSucceeded, 4<<30
		f.reply("POST /v1/volumes/web01/rollback", 202, running)
		f.jobSequence("j1", running, done)
		var stdout, stderr bytes.Buffer
		code := Execute(context.Background(), []string{"--server", url, "rollback", "web01", "nightly"}, Env{
			Stdout: &stdout, Stderr: &stderr, Interactive: interactive, PollInterval: time.Millisecond,
		})
		if code != 0 || stdout.String() != "volume web01 rolled back to snapshot nightly\n" {
			t.Fatalf("interactive=%v: exit %d, stdout %q, stderr %q", interactive, code, stdout.String(), stderr.String())
		}
		if drew := strings.Contains(stderr.String(), "rollback web01@nightly"); drew != interactive {
			t.Fatalf("interactive=%v: stderr %q", interactive, stderr.String())
		}
	}
}

// TestUnknownSubcommand walks the whole command tree: every command group
// refuses a word that names none of its subcommands with a non-zero exit,
// and suggests the subcommand a typo was meant to be; no request is sent.
// Given no word, a group prints its help and exits 0.
func TestUnknownSubcommand(t *testing.T) {
	a := &app{env: Env{Getenv: func(string) string { return "" }}}
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.HasAvailableSubCommands() {
			groups = append(groups, path)
		}
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				walk(sub, append(slices.Clone(path), sub.Name()))
			}
		}
	}
	walk(a.rootCommand(), nil)
	if len(groups) < 6 {
		t.Fatalf("found %d command groups, the tree has more: %v", len(groups), groups)
	}
	for _, path := range groups {
		t.Run(strings.Join(append([]string{"quiver"}, path...), " "), func(t *testing.T) {
			f, url := newFakeAPI(t)
			got := run(t, context.Background(), url, nil, append(slices.Clone(path), "frobnicate")...)
			if got.code != ExitError || !strings.Contains(got.stderr, `unknown command "frobnicate"`) {
				t.Errorf("unknown word: exit %d, stderr %q; want exit %d and unknown command", got.code, got.stderr, ExitError)
			}
			// A typo of the group's first subcommand: two letters swapped
			// ("craete"), or the last one dropped ("inf").
			c, _, err := a.rootCommand().Find(path)
			if err != nil {
				t.Fatal(err)
			}
			name := c.Commands()[0].Name()
			typo := name[:len(name)-1]
			if len(name) >= 4 && name[2] != name[3] {
				typo = name[:2] + name[3:4] + name[2:3] + name[4:]
			}
			got = run(t, context.Background(), url, nil, append(slices.Clone(path), typo, "x", "y")...)
			if got.code != ExitError || !strings.Contains(got.stderr, "Did you mean this?\n\t"+name) {
				t.Errorf("typo %q: exit %d, stderr %q; want exit %d and a suggestion of %q", typo, got.code, got.stderr, ExitError, name)
			}
			if len(f.requests) != 0 {
				t.Errorf("requests sent: %v", f.requests)
			}
			got = run(t, context.Background(), url, nil, path...)
			if got.code != ExitOK || !strings.Contains(got.stdout, "Usage:") {
				t.Errorf("no word: exit %d, stdout %q; want the help and exit 0", got.code, got.stdout)
			}
		})
	}
}

func TestSnapshotDiff(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes/web01/snapshots/mon/changes", 200, api.SnapshotChanges{Volume: "web01", From: "mon", To: "tue",
		Disks: []api.DiskChanges{
			{Disk: "root", Size: 40 << 30, BaseSize: 40 << 30, Changed: 2 << 30, Ranges: []api.Range{{Offset: 0, Length: 2 << 30}}},
			{Disk: "logs", Size: 1 << 30, Whole: true, Changed: 1 << 30, Ranges: []api.Range{{Offset: 0, Length: 1 << 30}}},
		}})
	got := run(t, context.Background(), url, nil, "snapshot", "diff", "web01@mon", "web01@tue")
	want := `DISK   SIZE   CHANGED   PERCENT   RANGES   NOTE
root   40Gi   2Gi       5.0%      1        
logs   1Gi    1Gi       100.0%    1        new since mon
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", got.code, got.stderr, got.stdout)
	}
	if !f.sent("GET /v1/volumes/web01/snapshots/mon/changes?to=tue") {
		t.Fatalf("requests = %v", f.requests)
	}
	for _, args := range [][]string{{"web01"}, {"web01@mon", "db01@tue"}, {"web01@"}} {
		got := run(t, context.Background(), url, nil, append([]string{"snapshot", "diff"}, args...)...)
		if got.code == 0 {
			t.Errorf("diff %v: exit 0, want an error", args)
		}
	}
}

// TestVolumeEncrypted: create --encrypt sends encrypt, and get and list show
// the key provider and KEK of an encrypted volume.
func TestVolumeEncrypted(t *testing.T) {
	f, url := newFakeAPI(t)
	v := testVolumes[0]
	v.Encryption = &api.Encryption{Provider: "keyfile", KeyID: "0a1b2c"}
	f.reply("POST /v1/volumes", 201, v)
	f.reply("GET /v1/volumes/web01", 200, v)
	got := run(t, context.Background(), url, nil, "volume", "create", "web01", "--capacity", "200Gi", "--disk", "root=40Gi", "--encrypt")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	var spec api.VolumeSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/volumes")), &spec); err != nil || !spec.Encrypt {
		t.Fatalf("spec %+v (%v): want encrypt", spec, err)
	}
	if !strings.Contains(got.stdout, "ENCRYPTION") || !strings.Contains(got.stdout, "keyfile:0a1b2c") {
		t.Errorf("create's table lacks the encryption:\n%s", got.stdout)
	}
	got = run(t, context.Background(), url, nil, "volume", "get", "web01")
	if want := "XTS-AES-256, data key wrapped by key provider keyfile, KEK 0a1b2c\n"; !strings.Contains(got.stdout, "Encryption: ") ||
		!strings.Contains(got.stdout, want) {
		t.Errorf("get lacks %q:\n%s", want, got.stdout)
	}
	run(t, context.Background(), url, nil, "volume", "create", "web01", "--capacity", "200Gi", "--disk", "root=40Gi")
	spec = api.VolumeSpec{}
	if err := json.Unmarshal([]byte(f.body("POST /v1/volumes")), &spec); err != nil || spec.Encrypt {
		t.Fatalf("spec %+v (%v): encrypt without --encrypt", spec, err)
	}
}
