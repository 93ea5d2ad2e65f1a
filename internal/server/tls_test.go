package server

import (
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestSetupTLS: the NBD mode each combination of flags gives, and the
// combinations refused.
func TestSetupTLS(t *testing.T) {
	ca := certtest.NewCA(t, "ca")
	cert, key := ca.Server(t, false, "127.0.0.1").Write(t, t.TempDir())
	caFile := t.TempDir() + "/ca.pem"
	certtest.WriteFile(t, caFile, ca.PEM)
	nbdTLS := func(mode string) TLSConfig { return TLSConfig{NBDCertFile: cert, NBDKeyFile: key, NBDMode: mode} }
	for _, tc := range []struct {
		name    string
		cfg     TLSConfig
		addr    string
		want    string // NBD mode, or "" for an error
		wantAPI bool
	}{
		{"nothing", TLSConfig{}, "127.0.0.1:10809", TLSOff, false},
		{"certificates on loopback", nbdTLS(""), "127.0.0.1:10809", TLSOn, false},
		{"certificates on localhost", nbdTLS(""), "localhost:10809", TLSOn, false},
		{"certificates beyond loopback", nbdTLS(""), "0.0.0.0:10809", TLSRequire, false},
		{"certificates on all interfaces", nbdTLS(""), ":10809", TLSRequire, false},
		{"explicitly off beyond loopback", nbdTLS("off"), "0.0.0.0:10809", TLSOff, false},
		{"require on loopback", nbdTLS("require"), "127.0.0.1:10809", TLSRequire, false},
		{"on beyond loopback", nbdTLS("on"), "10.0.0.1:10809", TLSOn, false},
		{"client CA", TLSConfig{NBDCertFile: cert, NBDKeyFile: key, NBDClientCAFile: caFile}, "127.0.0.1:1", TLSOn, false},
		{"API only", TLSConfig{CertFile: cert, KeyFile: key}, "127.0.0.1:1", TLSOff, true},
		{"require without certificates", TLSConfig{NBDMode: "require"}, "127.0.0.1:1", "", false},
		{"unknown mode", nbdTLS("maybe"), "127.0.0.1:1", "", false},
		{"NBD certificate without key", TLSConfig{NBDCertFile: cert}, "127.0.0.1:1", "", false},
		{"API key without certificate", TLSConfig{KeyFile: key}, "127.0.0.1:1", "", false},
		{"client CA without TLS", TLSConfig{NBDClientCAFile: caFile}, "127.0.0.1:1", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := setupTLS(tc.cfg, tc.addr)
			if tc.want == "" {
				if !errors.Is(err, ErrTLSConfig) {
					t.Fatalf("setupTLS: %v, want ErrTLSConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mode := TLSOff
			if s.nbd != nil {
				mode = TLSOn
				if s.nbdReq {
					mode = TLSRequire
				}
			}
			if mode != tc.want || (s.api != nil) != tc.wantAPI {
				t.Fatalf("NBD %s, API TLS %v; want NBD %s, API TLS %v", mode, s.api != nil, tc.want, tc.wantAPI)
			}
		})
	}
}
