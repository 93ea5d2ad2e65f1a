package csi

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestCAFile: with Config.CAFile the driver's API client trusts that CA
// for an https:// server, and without it the server is not trusted.
func TestCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.PoolInfo{ID: "p1"})
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := newClient(Config{Server: srv.URL, CAFile: caFile, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Pool(t.Context()); err != nil || info.ID != "p1" {
		t.Fatalf("Pool with --ca-file: %+v, %v", info, err)
	}
	c, err = newClient(Config{Server: srv.URL, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(t.Context()); err == nil {
		t.Fatal("Pool without --ca-file trusted the test CA")
	}
	if _, err := newClient(Config{Server: srv.URL, CAFile: filepath.Join(t.TempDir(), "none.pem")}, ""); err == nil {
		t.Fatal("a missing CA file: no error")
	}
}
