package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

func TestAttachCreatePrintsExports(t *testing.T) {
	f, url := newFakeAPI(t)
	tok := strings.Repeat("ab", 32)
	f.reply("POST /v1/volumes/web01/attachments", 201, api.Attachment{ID: "att-1", Volume: "web01", Node: "worker-2",
		Mode: "rw", Token: tok, CreatedAt: testNow})
	f.reply("GET /v1/volumes/web01", 200, testVolumes[0])
	got := run(t, context.Background(), url, nil, "attach", "create", "web01", "worker-2")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	var spec api.AttachmentSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/volumes/web01/attachments")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec != (api.AttachmentSpec{Node: "worker-2", Mode: "rw"}) {
		t.Fatalf("spec %+v", spec)
	}
	for _, want := range []string{"Token:", tok, "web01/root/" + tok, "web01/data/" + tok} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, got.stdout)
		}
	}
}

func TestAttachListStates(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/volumes/web01/attachments", 200, api.List[api.Attachment]{Items: []api.Attachment{
		{ID: "att-1", Node: "src", Mode: "rw", Fenced: true, Conns: 2, CreatedAt: testNow.Add(-time.Hour)},
		{ID: "att-2", Node: "dst", Mode: "rw", Writer: true, Conns: 2, CreatedAt: testNow.Add(-time.Minute)},
		{ID: "att-3", Node: "backup", Mode: "ro", CreatedAt: testNow},
		{ID: "implicit-1", Node: "127.0.0.1:4000", Mode: "rw", Implicit: true, Fenced: true, Conns: 1, CreatedAt: testNow},
		{ID: "implicit-2", Node: "127.0.0.1:4001", Mode: "rw", Implicit: true, State: api.AttachmentReadOnly, Conns: 1, CreatedAt: testNow},
		{ID: "att-4", Node: "spare", Mode: "rw", State: api.AttachmentStandby, CreatedAt: testNow},
	}})
	got := run(t, context.Background(), url, nil, "attach", "list", "web01")
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 7 {
		t.Fatalf("want a header and 6 rows:\n%s", got.stdout)
	}
	// An ro attachment is read-only, never standby or fenced; the server's
	// state is shown as it is.
	for i, want := range []string{"fenced", "writer", "read-only", "fenced (implicit)", "read-only (implicit)", "standby"} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("row %d lacks %q: %q", i+1, want, lines[i+1])
		}
	}
	got = run(t, context.Background(), url, nil, "attach", "list", "web01", "-o", "json")
	var list api.List[api.Attachment]
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil || len(list.Items) != 6 {
		t.Fatalf("json: %v %s", err, got.stdout)
	}
}

func TestSharedDiskOption(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("POST /v1/volumes", 201, testVolumes[0])
	got := run(t, context.Background(), url, nil, "volume", "create", "vm", "--capacity", "2Gi",
		"--disk", "root=1Gi", "--disk", "quorum=64Mi,shared")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	var spec api.VolumeSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/volumes")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Disks[0].Shared || !spec.Disks[1].Shared {
		t.Fatalf("disks %+v: only quorum is shared", spec.Disks)
	}
	got = run(t, context.Background(), url, nil, "volume", "create", "vm", "--capacity", "2Gi", "--disk", "quorum=64Mi,sharde")
	if got.code == 0 || !strings.Contains(got.stderr, `unknown option "sharde"`) {
		t.Fatalf("bad disk option: exit %d, stderr %q", got.code, got.stderr)
	}
}

// TestForceFlag: --force of `disk remove` and `rollback` becomes
// ?force=true; without it the server's InUse refusal is an error with a
// hint.
func TestForceFlag(t *testing.T) {
	f, url := newFakeAPI(t)
	f.routes["DELETE /v1/volumes/web01/disks/data"] = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("force") != "true" {
			writeJSON(w, http.StatusConflict, api.ErrorBody{Error: api.Error{Code: api.CodeInUse, Message: "connected writers"}})
			return
		}
		writeJSON(w, http.StatusOK, testVolumes[0])
	}
	got := run(t, context.Background(), url, nil, "disk", "remove", "web01", "data")
	if got.code != ExitError || !strings.Contains(got.stderr, "connected writers") || !strings.Contains(got.stderr, "quiver attach list") {
		t.Errorf("without --force: exit %d, stderr %q", got.code, got.stderr)
	}
	if got := run(t, context.Background(), url, nil, "disk", "remove", "web01", "data", "--force"); got.code != ExitOK {
		t.Errorf("with --force: exit %d, stderr %q", got.code, got.stderr)
	}
	f.reply("POST /v1/volumes/web01/rollback", http.StatusConflict, api.ErrorBody{Error: api.Error{Code: api.CodeInUse, Message: "busy"}})
	run(t, context.Background(), url, nil, "rollback", "web01", "s", "--force")
	if !f.sent("POST /v1/volumes/web01/rollback?async=true&force=true") {
		t.Errorf("rollback --force sent %v", f.requests)
	}
}
