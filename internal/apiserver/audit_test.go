package apiserver

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/audit"
)

// TestAuditLog: a change and each kind of refusal are recorded with who
// (token, role, tenant, certificate), what (route, names) and the result
// (status, code); reads are not; no secret reaches the log; a tenant's
// token reads only its tenant's events, a monitor's all of them.
func TestAuditLog(t *testing.T) {
	const fileToken = "file-token-0123456789"
	c := startCertAPI(t, fileToken, true)
	l, err := audit.Open(c.s.pool.FS(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c.s.Audit = l
	_, monitor, err := c.store.Create("", "monitor", "events reader")
	if err != nil {
		t.Fatal(err)
	}

	spec := api.VolumeSpec{Name: "db", Capacity: 4 * mib, Disks: []api.DiskSpec{{Name: "root", Size: mib}}}
	steps := []struct {
		cert, token, method, path string
		in                        any
		status                    int
	}{
		{"", c.secret["a/tenant"], "POST", "/v1/volumes", spec, http.StatusCreated},      // a change
		{"", c.secret["a/tenant"], "GET", "/v1/volumes/db", nil, http.StatusOK},          // a read: not recorded
		{"", c.secret["b/tenant"], "DELETE", "/v1/volumes/db", nil, http.StatusNotFound}, // another tenant's
		{"a/attach", "", "DELETE", "/v1/volumes/db", nil, http.StatusForbidden},          // the role refuses
		{"", "qvt_not-a-token", "POST", "/v1/volumes", spec, http.StatusUnauthorized},    // the credential refused
		{"", "qvt_not-a-token", "GET", "/v1/volumes", nil, http.StatusUnauthorized},      // a read refused: recorded
	}
	for i, s := range steps {
		if status, e := c.do(t, s.cert, s.token, s.method, s.path, s.in, nil); status != s.status {
			t.Fatalf("step %d %s %s: %d %+v, want %d", i, s.method, s.path, status, e, s.status)
		}
	}

	var all api.List[api.Event]
	if status, e := c.do(t, "", fileToken, "GET", "/v1/events", nil, &all); status != http.StatusOK {
		t.Fatalf("events: %d %+v", status, e)
	}
	type want struct {
		tokenID, role, tenant, cert, route, names string
		status                                    int
		code                                      string
	}
	wants := []want{
		{c.ids["a/tenant"], "tenant", "a", "", "POST /v1/volumes", "name=db", 201, ""},
		{c.ids["b/tenant"], "tenant", "b", "", "DELETE /v1/volumes/{volume}", "volume=db", 404, api.CodeNotFound},
		{c.ids["cert:a/attach"], "attach", "a", "a-attach", "DELETE /v1/volumes/{volume}", "volume=db", 403, api.CodeForbidden},
		{"", "", "", "", "POST /v1/volumes", "", 401, api.CodeUnauthorized}, // an unauthenticated body is not read
		{"", "", "", "", "GET /v1/volumes", "", 401, api.CodeUnauthorized},
	}
	if len(all.Items) != len(wants) {
		t.Fatalf("%d events, want %d: %+v", len(all.Items), len(wants), all.Items)
	}
	for i, w := range wants {
		ev := all.Items[i]
		var names []string
		for k, v := range ev.Names {
			names = append(names, k+"="+v)
		}
		got := want{ev.Who.TokenID, ev.Who.Role, ev.Who.Tenant, ev.Who.Cert, ev.Route, strings.Join(names, ","), ev.Status, ev.Code}
		if w.cert != "" && strings.Contains(got.cert, w.cert) {
			got.cert = w.cert
		}
		if got != w || ev.Seq != int64(i+1) || ev.Time.IsZero() || ev.Who.Remote != "127.0.0.1" {
			t.Errorf("event %d: %+v\n got %+v\nwant %+v", i, ev, got, w)
		}
	}

	// Scope: a tenant's token reads its tenant's events only; a monitor
	// token reads all; ?after reads those after a number.
	var ofB api.List[api.Event]
	if status, e := c.do(t, "", c.secret["b/tenant"], "GET", "/v1/events", nil, &ofB); status != http.StatusOK ||
		len(ofB.Items) != 1 || ofB.Items[0].Who.Tenant != "b" {
		t.Errorf("b's events: %d %+v %+v", status, e, ofB.Items)
	}
	var mon api.List[api.Event]
	if status, e := c.do(t, "", monitor, "GET", "/v1/events?after=3", nil, &mon); status != http.StatusOK ||
		len(mon.Items) != 2 || mon.Items[0].Seq != 4 {
		t.Errorf("a monitor's events after 3: %d %+v %+v", status, e, mon.Items)
	}
	if status, e := c.do(t, "", fileToken, "GET", "/v1/events?since=yesterday", nil, nil); status != http.StatusBadRequest ||
		e.Field != "since" {
		t.Errorf("since=yesterday: %d %+v", status, e)
	}

	// No secret in the log: neither the tokens sent nor the file token.
	data, err := os.ReadFile(filepath.Join(c.s.pool.Dir(), audit.Dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{fileToken, c.secret["a/tenant"], c.secret["b/tenant"], "qvt_not-a-token", monitor} {
		if strings.Contains(string(data), secret) {
			t.Errorf("the audit log holds a secret")
		}
	}
}
