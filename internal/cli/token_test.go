package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

func TestTokenCreatePrintsTheSecretOnce(t *testing.T) {
	f, url := newFakeAPI(t)
	tok := api.Token{ID: "tk-0123456789ab", Tenant: "acme", Role: "attach", Description: "csi node",
		CreatedAt: testNow.Add(-time.Minute), Secret: "qvt_secret"}
	f.reply("POST /v1/tokens", 201, tok)
	got := run(t, context.Background(), url, nil, "token", "create", "--role", "attach", "--tenant", "acme", "--description", "csi node")
	want := `ID                TENANT   ROLE     CREDENTIAL   DESCRIPTION   AGE
tk-0123456789ab   acme     attach   secret       csi node      60s
secret: qvt_secret
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	var spec api.TokenSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/tokens")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec != (api.TokenSpec{Tenant: "acme", Role: "attach", Description: "csi node"}) {
		t.Errorf("sent %+v", spec)
	}
	got = run(t, context.Background(), url, nil, "-o", "json", "token", "create", "--role", "attach", "--tenant", "acme")
	var out api.Token
	if err := json.Unmarshal([]byte(got.stdout), &out); err != nil || out.Secret != "qvt_secret" {
		t.Errorf("-o json: %v %+v", err, out)
	}
	if got := run(t, context.Background(), url, nil, "token", "create"); got.code == 0 {
		t.Error("token create without --role succeeded")
	}
}

// TestTokenCreateForCertificate: --cert sends the PEM file and prints the
// fingerprint, no secret; a missing file is an error before any request.
func TestTokenCreateForCertificate(t *testing.T) {
	f, url := newFakeAPI(t)
	pemFile := filepath.Join(t.TempDir(), "node.pem")
	pemText := "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(pemFile, []byte(pemText), 0o600); err != nil {
		t.Fatal(err)
	}
	fp := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	f.reply("POST /v1/tokens", 201, api.Token{ID: "tk-0123456789ab", Tenant: "acme", Role: "attach",
		CreatedAt: testNow.Add(-time.Minute), CertSHA256: fp})
	got := run(t, context.Background(), url, nil, "token", "create", "--role", "attach", "--tenant", "acme", "--cert", pemFile)
	want := `ID                TENANT   ROLE     CREDENTIAL              DESCRIPTION   AGE
tk-0123456789ab   acme     attach   cert 0123456789abcdef   -             60s
certificate sha256: ` + fp + "\n"
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	var spec api.TokenSpec
	if err := json.Unmarshal([]byte(f.body("POST /v1/tokens")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec != (api.TokenSpec{Tenant: "acme", Role: "attach", Certificate: pemText}) {
		t.Errorf("sent %+v", spec)
	}
	if got := run(t, context.Background(), url, nil, "token", "create", "--role", "attach", "--tenant", "acme",
		"--cert", filepath.Join(t.TempDir(), "missing.pem")); got.code == 0 {
		t.Error("token create with a missing --cert file succeeded")
	}
}

func TestTokenListAndRevoke(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/tokens", 200, api.List[api.Token]{Items: []api.Token{
		{ID: "tk-000000000001", Role: "admin", Description: "made at first start (admin.token)", CreatedAt: testNow.Add(-50 * time.Hour)},
		{ID: "tk-000000000002", Tenant: "acme", Role: "tenant", CreatedAt: testNow.Add(-time.Hour)},
		{ID: "tk-000000000003", Tenant: "acme", Role: "attach", Description: "node 1", CreatedAt: testNow.Add(-time.Hour),
			CertSHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
	}})
	got := run(t, context.Background(), url, nil, "token", "list")
	want := `ID                TENANT   ROLE     CREDENTIAL              DESCRIPTION                         AGE
tk-000000000001   -        admin    secret                  made at first start (admin.token)   2d
tk-000000000002   acme     tenant   secret                  -                                   60m
tk-000000000003   acme     attach   cert 0123456789abcdef   node 1                              60m
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	got = run(t, context.Background(), url, nil, "-o", "json", "token", "list")
	var list api.List[api.Token]
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil || len(list.Items) != 3 {
		t.Errorf("-o json: %v %s", err, got.stdout)
	}
	f.reply("DELETE /v1/tokens/tk-000000000002", 204, nil)
	got = run(t, context.Background(), url, nil, "token", "revoke", "tk-000000000002")
	if got.code != 0 || !f.sent("DELETE /v1/tokens/tk-000000000002") || got.stderr != "token tk-000000000002 revoked\n" {
		t.Errorf("revoke: exit %d, stderr %q", got.code, got.stderr)
	}
}

func TestTenantSetAndList(t *testing.T) {
	f, url := newFakeAPI(t)
	acme := api.Tenant{Name: "acme", Quota: api.Quota{Volumes: 10, Capacity: 1 << 40, IOPS: 5000},
		Used: api.Quota{Volumes: 3, Capacity: 300 << 30, Snapshots: 7, IOPS: 1500}}
	f.reply("PUT /v1/tenants/acme", 200, acme)
	got := run(t, context.Background(), url, nil, "tenant", "set", "acme", "--volumes", "10", "--capacity", "1Ti", "--iops", "5000")
	want := `TENANT   VOLUMES   CAPACITY    SNAPSHOTS   IOPS
acme     3/10      300Gi/1Ti   7           1500/5000
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	var spec api.TenantSpec
	if err := json.Unmarshal([]byte(f.body("PUT /v1/tenants/acme")), &spec); err != nil || spec.Quota != (api.Quota{Volumes: 10, Capacity: 1 << 40, IOPS: 5000}) {
		t.Errorf("sent %+v (%v)", spec, err)
	}
	f.reply("GET /v1/tenants", 200, api.List[api.Tenant]{Items: []api.Tenant{acme}})
	if got := run(t, context.Background(), url, nil, "tenant", "list"); got.code != 0 || got.stdout != want {
		t.Errorf("list: exit %d, stdout:\n%s", got.code, got.stdout)
	}
	if got := run(t, context.Background(), url, nil, "tenant", "set", "acme", "--capacity", "lots"); got.code == 0 {
		t.Error("--capacity lots accepted")
	}
}
