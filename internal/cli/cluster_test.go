package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClusterCerts makes a cluster's etcd certificates, checks their names,
// usages, chains and file modes, and makes a later node's certificate of the
// same CA.
func TestClusterCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	got := run(t, context.Background(), "http://127.0.0.1:1", nil, "cluster", "certs", "--out", dir,
		"--node", "n1=10.0.0.11,store1.example", "--node", "n2=10.0.0.12")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	t.Logf("output:\n%s", got.stdout)
	modes := map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600, "n1.crt": 0o644, "n1.key": 0o600,
		"n2.crt": 0o644, "n2.key": 0o600, "admin.crt": 0o644, "admin.key": 0o600}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(modes) {
		t.Errorf("%d files in %s, want %d (no temporary file left)", len(entries), dir, len(modes))
	}
	for name, want := range modes {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	verify := func(file, host string, usage x509.ExtKeyUsage) error {
		_, err := readCert(t, filepath.Join(dir, file)).Verify(x509.VerifyOptions{Roots: roots, DNSName: host,
			KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	for _, c := range []struct {
		file, host string
		usage      x509.ExtKeyUsage
		ok         bool
	}{
		{"n1.crt", "10.0.0.11", x509.ExtKeyUsageServerAuth, true},
		{"n1.crt", "store1.example", x509.ExtKeyUsageServerAuth, true},
		{"n1.crt", "127.0.0.1", x509.ExtKeyUsageServerAuth, true},
		{"n1.crt", "", x509.ExtKeyUsageClientAuth, true},
		{"n1.crt", "10.0.0.12", x509.ExtKeyUsageServerAuth, false},
		{"n2.crt", "10.0.0.12", x509.ExtKeyUsageServerAuth, true},
		{"admin.crt", "", x509.ExtKeyUsageClientAuth, true},
		{"admin.crt", "", x509.ExtKeyUsageServerAuth, false},
	} {
		if err := verify(c.file, c.host, c.usage); (err == nil) != c.ok {
			t.Errorf("%s for %q (usage %v): %v, want ok %v", c.file, c.host, c.usage, err, c.ok)
		}
	}
	if n1 := readCert(t, filepath.Join(dir, "n1.crt")); !slices.ContainsFunc(n1.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.ParseIP("::1")) }) {
		t.Errorf("n1's addresses %v lack ::1", n1.IPAddresses)
	}

	// A later node: the CA in the directory issues its certificate.
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	got = run(t, context.Background(), "http://127.0.0.1:1", nil, "cluster", "certs", "--out", dir, "--node", "n3=10.0.0.13")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(now, caPEM) || !strings.Contains(got.stdout, "reused") {
		t.Errorf("the CA was not reused:\n%s", got.stdout)
	}
	if err := verify("n3.crt", "10.0.0.13", x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("n3.crt: %v", err)
	}

	half := t.TempDir()
	if err := os.WriteFile(filepath.Join(half, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no node", []string{"--out", t.TempDir()}, "--node"},
		{"no out", []string{"--node", "n1=10.0.0.1"}, "--out"},
		{"no host", []string{"--out", t.TempDir(), "--node", "n1"}, "NAME=HOST"},
		{"a bad name", []string{"--out", t.TempDir(), "--node", "N_1=10.0.0.1"}, "DNS label"},
		{"a bad host", []string{"--out", t.TempDir(), "--node", "n1=http://10.0.0.1"}, "IP address or a DNS name"},
		{"a name twice", []string{"--out", t.TempDir(), "--node", "n1=10.0.0.1", "--node", "n1=10.0.0.2"}, "twice"},
		{"the admin's name", []string{"--out", t.TempDir(), "--node", "admin=10.0.0.1"}, "reserved"},
		{"a CA without its key", []string{"--out", half, "--node", "n1=10.0.0.1"}, "only one of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := run(t, context.Background(), "http://127.0.0.1:1", nil, append([]string{"cluster", "certs"}, c.args...)...)
			if got.code == 0 || !strings.Contains(got.stderr, c.want) {
				t.Fatalf("exit %d, stderr %q: want a refusal naming %q", got.code, got.stderr, c.want)
			}
		})
	}
}

// TestNodeReplace: `quiver node replace OLD NEW` starts the replace job on
// the server (POST /v1/nodes/OLD/replace, {"new": NEW}), waits for it and
// says what it did; -o json prints the final job; a job that fails (a
// volume stuck on OLD) is a non-zero exit carrying the server's message.
func TestNodeReplace(t *testing.T) {
	running := api.Job{ID: "j3", Kind: "replace", Target: "n2 -> n4", State: api.JobRunning, ItemsTotal: 2}
	done := running
	done.State, done.ItemsDone, done.Result = api.JobSucceeded, 2, []string{"a", "b"}

	f, url := newFakeAPI(t)
	f.reply("POST /v1/nodes/n2/replace", 202, running)
	f.jobSequence("j3", running, done)
	got := run(t, context.Background(), url, nil, "node", "replace", "n2", "n4")
	if got.code != 0 || got.stdout != "node n2 replaced by n4: 2 volume(s) rebuilt; n2 removed from the cluster\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}
	var req api.NodeReplace
	if err := json.Unmarshal([]byte(f.body("POST /v1/nodes/n2/replace")), &req); err != nil || req.New != "n4" {
		t.Fatalf("body %q (%v): want new n4", f.body("POST /v1/nodes/n2/replace"), err)
	}
	if !f.sent("POST /v1/nodes/n2/replace?async=true") {
		t.Fatalf("requests %v: want the replace started as a job", f.requests)
	}

	f, url = newFakeAPI(t)
	f.reply("POST /v1/nodes/n2/replace", 202, running)
	f.jobSequence("j3", running, done)
	got = run(t, context.Background(), url, nil, "-o", "json", "node", "replace", "n2", "n4")
	var final api.Job
	if err := json.Unmarshal([]byte(got.stdout), &final); got.code != 0 || err != nil || final.State != api.JobSucceeded ||
		strings.Join(final.Result, ",") != "a,b" {
		t.Fatalf("-o json: exit %d, stdout %q (%v), stderr %q", got.code, got.stdout, err, got.stderr)
	}

	failed := running
	failed.State, failed.Error = api.JobFailed, &api.Error{Code: api.CodeDegraded,
		Message: "replace node n2: n2 is not removed, since it holds the only in-sync data of 1 volume(s) (c: its only copy is on n2)"}
	f, url = newFakeAPI(t)
	f.reply("POST /v1/nodes/n2/replace", 202, running)
	f.jobSequence("j3", running, failed)
	got = run(t, context.Background(), url, nil, "node", "replace", "n2", "n4")
	if got.code == 0 || !strings.Contains(got.stderr, "only in-sync data of 1 volume(s) (c: its only copy is on n2)") {
		t.Fatalf("failed job: exit %d, stdout %q, stderr %q", got.code, got.stdout, got.stderr)
	}

	// A refusal answered at once (OLD is up): no job to wait for.
	f, url = newFakeAPI(t)
	f.reply("POST /v1/nodes/n2/replace", 409, api.ErrorBody{Error: api.Error{Code: api.CodeNodeInUse,
		Message: "replace node n2: the node is up: ... quiver node remove n2 --drain"}})
	got = run(t, context.Background(), url, nil, "node", "replace", "n2", "n4")
	if got.code == 0 || !strings.Contains(got.stderr, "quiver node remove n2 --drain") {
		t.Fatalf("refused: exit %d, stderr %q", got.code, got.stderr)
	}
	if got := run(t, context.Background(), url, nil, "node", "replace", "n2"); got.code == 0 {
		t.Fatalf("one argument: exit 0")
	}
}
