package cli

import (
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/quiverstorage/quiver/internal/api"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/golden")

// golden compares got with testdata/golden/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

var testSnapshots = []api.Snapshot{
	{Name: "nightly", UID: "s1", Volume: "web01", Method: "reflink", GateHeld: 1500 * time.Microsecond,
		Disks: []api.Disk{{Name: "root", Size: 40 << 30}}, CreatedAt: testNow.Add(-5 * time.Hour)},
	{Name: "v1", UID: "s2", Volume: "golden", Method: "copy", GateHeld: 2 * time.Millisecond,
		Disks: []api.Disk{{Name: "root", Size: 10 << 30}}, CreatedAt: testNow.Add(-50 * time.Hour)},
}

var testAttachments = []api.Attachment{
	{ID: "att-1", Volume: "web01", Node: "node-a", Mode: api.ModeReadWrite, Writer: true, State: api.AttachmentWriter,
		Conns: 2, CreatedAt: testNow.Add(-10 * time.Minute)},
	{ID: "att-2", Volume: "db01", Node: "node-b", Mode: api.ModeReadOnly, State: api.AttachmentReadOnly,
		CreatedAt: testNow.Add(-30 * time.Second)},
}

// TestOutputFormats: every list prints in each -o format as its golden
// file says.
func TestOutputFormats(t *testing.T) {
	for _, tc := range []struct {
		name  string
		route string
		reply any
		args  []string
	}{
		{"volume-list", "GET /v1/volumes", api.List[api.Volume]{Items: testVolumes}, []string{"volume", "list"}},
		{"snapshot-list-all", "GET /v1/snapshots", api.List[api.Snapshot]{Items: testSnapshots}, []string{"snapshot", "list"}},
		{"attach-list-all", "GET /v1/attachments", api.List[api.Attachment]{Items: testAttachments}, []string{"attach", "list"}},
		{"volume-get", "GET /v1/volumes/web01", testVolumes[0], []string{"volume", "get", "web01"}},
	} {
		for _, format := range outputFormats {
			t.Run(tc.name+"-"+format, func(t *testing.T) {
				f, url := newFakeAPI(t)
				f.reply(tc.route, 200, tc.reply)
				got := run(t, context.Background(), url, nil, append(tc.args, "-o", format)...)
				if got.code != 0 {
					t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
				}
				golden(t, tc.name+"."+format, got.stdout)
			})
		}
	}
}

// TestOutputYAMLMatchesJSON: -o yaml is the JSON answer with the same
// field names, not Go's.
func TestOutputYAMLMatchesJSON(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes/web01", 200, testVolumes[0])
	got := run(t, context.Background(), url, nil, "volume", "get", "web01", "-o", "yaml")
	for _, want := range []string{"name: web01", "createdAt: ", "snapshots: 2", "capacity: 214748364800"} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("yaml lacks %q:\n%s", want, got.stdout)
		}
	}
	if strings.Contains(got.stdout, "CreatedAt") {
		t.Errorf("yaml uses Go field names:\n%s", got.stdout)
	}
}

func TestUnknownOutputFormat(t *testing.T) {
	f, url := newFakeAPI(t)
	got := run(t, context.Background(), url, nil, "volume", "list", "-o", "xml")
	if got.code != ExitError || !strings.Contains(got.stderr, "want one of table, wide, json, yaml, name") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	if len(f.requests) != 0 {
		t.Fatalf("a bad -o still called the API: %v", f.requests)
	}
}

func TestNameOutputOfUnnamedAnswer(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/pool", 200, api.PoolInfo{ID: "p1"})
	got := run(t, context.Background(), url, nil, "pool", "info", "-o", "name")
	if got.code != ExitError || !strings.Contains(got.stderr, "-o name needs objects with names") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
}

// TestEmptyListsSaySo: a table of nothing says so on stderr and prints
// nothing on stdout; the machine formats print an empty list.
func TestEmptyListsSaySo(t *testing.T) {
	for _, tc := range []struct {
		route string
		args  []string
		want  string
	}{
		{"GET /v1/volumes", []string{"volume", "list"}, "No volumes found.\n"},
		{"GET /v1/snapshots", []string{"snapshot", "list"}, "No snapshots found.\n"},
		{"GET /v1/volumes/web01/snapshots", []string{"snapshot", "list", "web01"}, "No snapshots found.\n"},
		{"GET /v1/attachments", []string{"attach", "list"}, "No attachments found.\n"},
		{"GET /v1/jobs", []string{"job", "list"}, "No jobs found.\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply(tc.route, 200, api.List[api.Volume]{Items: []api.Volume{}})
			got := run(t, context.Background(), url, nil, tc.args...)
			if got.code != 0 || got.stdout != "" || got.stderr != tc.want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want stderr %q", got.code, got.stdout, got.stderr, tc.want)
			}
			got = run(t, context.Background(), url, nil, append(tc.args, "-o", "json")...)
			if got.code != 0 || !strings.Contains(got.stdout, `"items": []`) || got.stderr != "" {
				t.Fatalf("-o json: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
			}
		})
	}
}

func TestListAllRefusesVolumeAndSelector(t *testing.T) {
	for _, cmd := range []string{"snapshot", "attach"} {
		f, url := newFakeAPI(t)
		got := run(t, context.Background(), url, nil, cmd, "list", "web01", "-l", "app=web")
		if got.code != ExitError || !strings.Contains(got.stderr, "not both") || len(f.requests) != 0 {
			t.Fatalf("%s: exit %d, stderr %q, requests %v", cmd, got.code, got.stderr, f.requests)
		}
	}
}

func TestListAllPassesSelector(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/attachments", 200, api.List[api.Attachment]{Items: testAttachments})
	f.reply("GET /v1/snapshots", 200, api.List[api.Snapshot]{Items: testSnapshots})
	run(t, context.Background(), url, nil, "attach", "list", "-l", "app=web")
	run(t, context.Background(), url, nil, "snapshot", "list", "-l", "app=web")
	if !f.sent("GET /v1/attachments?selector=app%3Dweb") || !f.sent("GET /v1/snapshots?selector=app%3Dweb") {
		t.Fatalf("requests = %v", f.requests)
	}
}

// TestVolumeLabelMerges: labels not named are kept, KEY- removes one, and
// changing a value needs --overwrite, as with kubectl label.
func TestVolumeLabelMerges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    map[string]string // labels sent; nil: nothing sent
		wantErr string
	}{
		{"add", []string{"owner=ops"}, map[string]string{"tier": "1", "app": "web", "owner": "ops"}, ""},
		{"remove", []string{"tier-"}, map[string]string{"app": "web"}, ""},
		{"remove absent", []string{"nope-"}, map[string]string{"tier": "1", "app": "web"}, ""},
		{"same value", []string{"app=web"}, map[string]string{"tier": "1", "app": "web"}, ""},
		{"change needs overwrite", []string{"tier=2"}, nil, `label tier is already "1": pass --overwrite`},
		{"overwrite", []string{"tier=2", "--overwrite"}, map[string]string{"tier": "2", "app": "web"}, ""},
		{"add and remove", []string{"owner=ops", "app-"}, map[string]string{"tier": "1", "owner": "ops"}, ""},
		{"key twice", []string{"a=1", "a-"}, nil, `key "a" is given twice`},
		{"bad word", []string{"justakey"}, nil, "want KEY=VALUE to set a label or KEY- to remove one"},
		{"empty key", []string{"=v"}, nil, "the key is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply("GET /v1/volumes/web01", 200, testVolumes[0])
			f.reply("PATCH /v1/volumes/web01", 200, testVolumes[0])
			got := run(t, context.Background(), url, nil, append([]string{"volume", "label", "web01"}, tc.args...)...)
			body := f.body("PATCH /v1/volumes/web01")
			if tc.wantErr != "" {
				if got.code != ExitError || !strings.Contains(got.stderr, tc.wantErr) || body != "" {
					t.Fatalf("exit %d, stderr %q, sent %q; want error %q and nothing sent", got.code, got.stderr, body, tc.wantErr)
				}
				return
			}
			if got.code != 0 {
				t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
			}
			var sent api.VolumeUpdate
			if err := json.Unmarshal([]byte(body), &sent); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if len(sent.Labels) != len(tc.want) {
				t.Fatalf("labels sent %v, want %v", sent.Labels, tc.want)
			}
			for k, v := range tc.want {
				if sent.Labels[k] != v {
					t.Fatalf("labels sent %v, want %v", sent.Labels, tc.want)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/version", 200, api.BuildInfo{Version: "v9.9.9", Commit: "abc", GoVersion: "go1.99", Platform: "linux/amd64"})
	got := run(t, context.Background(), url, nil, "version", "-o", "json")
	var v versions
	if err := json.Unmarshal([]byte(got.stdout), &v); err != nil || got.code != 0 {
		t.Fatalf("exit %d, stdout %q: %v", got.code, got.stdout, err)
	}
	if v.Server == nil || v.Server.Version != "v9.9.9" || v.Client.GoVersion == "" {
		t.Fatalf("versions = %+v", v)
	}
	got = run(t, context.Background(), "http://127.0.0.1:1", nil, "version")
	if got.code != 0 || !strings.Contains(got.stdout, "Client version:") || !strings.Contains(got.stdout, "Server:") ||
		!strings.Contains(got.stdout, "unreachable") {
		t.Fatalf("unreachable server: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
}

func TestVolumeDeleteRecursive(t *testing.T) {
	f, url := newFakeAPI(t)
	f.routes["DELETE /v1/volumes/web01"] = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("recursive") != "true" {
			writeJSON(w, http.StatusConflict, api.ErrorBody{Error: api.Error{Code: api.CodeHasSnapshots, Message: "delete volume \"web01\": it has 2 snapshots"}})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
	got := run(t, context.Background(), url, nil, "volume", "delete", "web01")
	if got.code != ExitError || !strings.Contains(got.stderr, "volume delete --recursive") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	got = run(t, context.Background(), url, nil, "volume", "delete", "web01", "--recursive")
	if got.code != 0 || got.stdout != "volume web01 deleted\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
}

// TestWatch: --watch prints again only when the object changes, and Ctrl-C
// (the context ending) ends it with success.
func TestWatch(t *testing.T) {
	f, url := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	f.routes["GET /v1/volumes"] = func(w http.ResponseWriter, _ *http.Request) {
		calls++
		vols := testVolumes[:1]
		if calls > 3 {
			vols = testVolumes
		}
		if calls == 6 {
			cancel()
		}
		writeJSON(w, 200, api.List[api.Volume]{Items: vols})
	}
	got := run(t, ctx, url, nil, "volume", "list", "--watch", "--watch-interval", "1ms")
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	if n := strings.Count(got.stdout, "NAME "); n != 2 {
		t.Fatalf("printed %d tables for 2 states, want 2:\n%s", n, got.stdout)
	}
	if !strings.Contains(got.stdout, "vdi-001") {
		t.Fatalf("the change was not printed:\n%s", got.stdout)
	}
	got = run(t, context.Background(), url, nil, "volume", "get", "web01", "-w", "--watch-interval", "0s")
	if got.code != ExitError || !strings.Contains(got.stderr, "want a positive duration") {
		t.Fatalf("zero interval: exit %d, stderr %q", got.code, got.stderr)
	}
}

// TestCompletion: the shell completes volume, snapshot, disk and attachment
// names from the server (cobra's __complete, which the completion scripts
// call).
func TestCompletion(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: testVolumes})
	f.reply("GET /v1/volumes/web01", 200, testVolumes[0])
	f.reply("GET /v1/volumes/web01/snapshots", 200, api.List[api.Snapshot]{Items: testSnapshots[:1]})
	f.reply("GET /v1/volumes/web01/attachments", 200, api.List[api.Attachment]{Items: testAttachments[:1]})
	f.reply("GET /v1/snapshots", 200, api.List[api.Snapshot]{Items: testSnapshots})
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"volume", "get", ""}, []string{"web01", "vdi-001"}},
		{[]string{"volume", "get", "we"}, []string{"web01"}},
		{[]string{"volume", "get", "web01", ""}, nil},
		{[]string{"snapshot", "delete", "web01", ""}, []string{"nightly"}},
		{[]string{"rollback", "web01", "n"}, []string{"nightly"}},
		{[]string{"disk", "grow", "web01", ""}, []string{"root", "data"}},
		{[]string{"attach", "writer", "web01", ""}, []string{"att-1"}},
		{[]string{"clone", "golden@"}, []string{"golden@v1"}},
		{[]string{"clone", "v"}, []string{"vdi-001"}},
	} {
		got := run(t, context.Background(), url, nil, append([]string{"__complete"}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
		names := lines[:len(lines)-1] // the last line is the directive, ":4"
		if got.code != 0 || lines[len(lines)-1] != ":4" || strings.Join(names, ",") != strings.Join(tc.want, ",") {
			t.Errorf("complete %q: exit %d, stdout %q, stderr %q; want %v", tc.args, got.code, got.stdout, got.stderr, tc.want)
		}
	}
}

// TestVolumeBulkDelete: names expand as for clone, a selector picks the
// volumes, a refusal does not stop the others, and the command fails
// naming what it could not delete.
func TestVolumeBulkDelete(t *testing.T) {
	f, url := newFakeAPI(t)
	for _, n := range []string{"vdi-001", "vdi-003", "web01", "vdi-001x"} {
		f.routes["DELETE /v1/volumes/"+n] = func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }
	}
	f.reply("DELETE /v1/volumes/vdi-002", http.StatusConflict, api.ErrorBody{Error: api.Error{Code: api.CodeHasSnapshots, Message: "it has 1 snapshots"}})
	got := run(t, context.Background(), url, nil, "volume", "delete", "vdi-{001..003}")
	if got.code != ExitError || got.stdout != "volume vdi-001 deleted\nvolume vdi-003 deleted\n" ||
		!strings.Contains(got.stderr, "error: vdi-002: it has 1 snapshots") || !strings.Contains(got.stderr, "1 of 3 volumes were not deleted (vdi-002)") {
		t.Fatalf("exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: testVolumes[:1]})
	got = run(t, context.Background(), url, nil, "volume", "delete", "-l", "app=web")
	if got.code != 0 || got.stdout != "volume web01 deleted\n" || !f.sent("GET /v1/volumes?selector=app%3Dweb") {
		t.Fatalf("selector: exit %d, stdout %q, stderr %q, requests %v", got.code, got.stdout, got.stderr, f.requests)
	}
	for _, args := range [][]string{{"volume", "delete"}, {"volume", "delete", "web01", "-l", "app=web"}} {
		got = run(t, context.Background(), url, nil, args...)
		if got.code != ExitError || !strings.Contains(got.stderr, "not both") {
			t.Fatalf("%v: exit %d, stderr %q", args, got.code, got.stderr)
		}
	}
}

func TestManPages(t *testing.T) {
	dir := t.TempDir()
	got := run(t, context.Background(), "http://127.0.0.1:1", nil, "man", "--dir", dir)
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	for page, want := range map[string]string{
		"quiver.1":               "Storage for virtual machines",
		"quiver-volume-import.1": "OVA",
		"quiver-volume-delete.1": "unless --recursive deletes",
	} {
		b, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) || !strings.HasPrefix(string(b), ".nh") && !strings.Contains(string(b), ".TH") {
			t.Errorf("%s lacks %q or is not a man page:\n%.300s", page, want, b)
		}
	}
}

// TestSystemdUnitFlags: every flag the systemd units pass exists, so the
// units do not rot as flags change.
func TestSystemdUnitFlags(t *testing.T) {
	for unitFile, command := range map[string]string{"quiver.service": "server", "quiver-endpoint.service": "endpoint"} {
		unit, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", unitFile))
		if err != nil {
			t.Fatal(err)
		}
		a := &app{env: Env{Getenv: func(string) string { return "" }}}
		cmd, _, err := a.rootCommand().Find([]string{command})
		if err != nil || cmd.Name() != command {
			t.Fatalf("quiver %s: %v", command, err)
		}
		n := 0
		_, exec, _ := strings.Cut(string(unit), "ExecStart=")
		exec, _, _ = strings.Cut(exec, "\nK")
		exec, _, _ = strings.Cut(exec, "ExecReload=")
		for _, word := range strings.Fields(exec) {
			if name, ok := strings.CutPrefix(word, "--"); ok {
				n++
				if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
					t.Errorf("%s passes --%s, which quiver %s does not have", unitFile, name, command)
				}
			}
		}
		if n < 5 {
			t.Fatalf("%s: found %d flags", unitFile, n)
		}
	}
}

func TestServerConfigFile(t *testing.T) {
	flagsAfter := func(t *testing.T, yamlText string, args ...string) (*cobra.Command, error) {
		t.Helper()
		a := &app{env: Env{Getenv: func(string) string { return "" }}}
		root := a.rootCommand()
		server, _, err := root.Find([]string{"server"})
		if err != nil {
			t.Fatal(err)
		}
		if err := server.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "server.yaml")
		os.WriteFile(path, []byte(yamlText), 0o600)
		return server, applyConfig(server.Flags(), path)
	}
	server, err := flagsAfter(t, "listen: 127.0.0.2:7481\nnbd-max-conns: 77\nlog-level: debug\ntoken-file: /etc/quiver/token\npprof: true\n", "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"listen": "127.0.0.2:7481", "nbd-max-conns": "77", "log-level": "warn", "token-file": "/etc/quiver/token", "pprof": "true"} {
		if got := server.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	for text, want := range map[string]string{
		"lisen: x\n":            `unknown setting "lisen"`,
		"nbd-max-conns: lots\n": "nbd-max-conns",
		"listen: [a, b]\n":      "want a single value",
		"config: other.yaml\n":  `unknown setting "config"`,
		"just some words\n":     "not YAML key: value lines",
	} {
		if _, err := flagsAfter(t, text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: err %v, want %q", text, err, want)
		}
	}
	if err := applyConfig(pflag.NewFlagSet("x", pflag.ContinueOnError), filepath.Join(t.TempDir(), "absent.yaml")); err == nil {
		t.Error("an absent --config file was accepted")
	}
}

func TestVolumeDu(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/usage", 200, api.SpaceUsage{Exact: true, SharedBytes: 128 << 20, PoolSizeBytes: 2 << 30, PoolUsedBytes: 200 << 20,
		Items: []api.ObjectUsage{
			{Volume: "golden", ProvisionedBytes: 512 << 20, AllocatedBytes: 136 << 20, UniqueBytes: 8 << 20,
				Disks: []api.DiskUsage{{Name: "root", ProvisionedBytes: 256 << 20, AllocatedBytes: 96 << 20}, {Name: "data", ProvisionedBytes: 256 << 20, AllocatedBytes: 40 << 20, UniqueBytes: 8 << 20}}},
			{Volume: "golden", Snapshot: "v1", ProvisionedBytes: 512 << 20, AllocatedBytes: 128 << 20},
			{Volume: "c1", ProvisionedBytes: 512 << 20, AllocatedBytes: 128 << 20, UniqueBytes: 16 << 20},
		}})
	got := run(t, context.Background(), url, nil, "volume", "du")
	want := `NAME        PROVISIONED   ALLOCATED   UNIQUE
golden      512Mi         136Mi       8Mi
golden@v1   512Mi         128Mi       0
c1          512Mi         128Mi       16Mi
<shared>    -             -           128Mi
<total>     1Gi           392Mi       152Mi

Pool: 200Mi used of 2Gi (df); 1Gi provisioned, 0.50x its size.
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	got = run(t, context.Background(), url, nil, "volume", "du", "golden", "--disks")
	if got.code != 0 || !strings.Contains(got.stdout, "  golden/data   256Mi") || strings.Contains(got.stdout, "c1 ") {
		t.Fatalf("du golden --disks: exit %d, stdout:\n%s", got.code, got.stdout)
	}
	got = run(t, context.Background(), url, nil, "volume", "du", "nope")
	if got.code != ExitError || !strings.Contains(got.stderr, `volume "nope": not found`) {
		t.Fatalf("du nope: exit %d, stderr %q", got.code, got.stderr)
	}
}
