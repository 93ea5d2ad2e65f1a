package server

import (
	"crypto/tls"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestSetupTLS: the NBD mode and the API's handling of client
// certificates each combination of flags gives, and the combinations
// refused.
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
		client  tls.ClientAuthType // of the API
	}{
		{"nothing", TLSConfig{}, "127.0.0.1:10809", TLSOff, false, 0},
		{"certificates on loopback", nbdTLS(""), "127.0.0.1:10809", TLSOn, false, 0},
		{"certificates on localhost", nbdTLS(""), "localhost:10809", TLSOn, false, 0},
		{"certificates beyond loopback", nbdTLS(""), "0.0.0.0:10809", TLSRequire, false, 0},
		{"certificates on all interfaces", nbdTLS(""), ":10809", TLSRequire, false, 0},
		{"explicitly off beyond loopback", nbdTLS("off"), "0.0.0.0:10809", TLSOff, false, 0},
		{"require on loopback", nbdTLS("require"), "127.0.0.1:10809", TLSRequire, false, 0},
		{"on beyond loopback", nbdTLS("on"), "10.0.0.1:10809", TLSOn, false, 0},
		{"client CA", TLSConfig{NBDCertFile: cert, NBDKeyFile: key, NBDClientCAFile: caFile}, "127.0.0.1:1", TLSOn, false, 0},
		{"API only", TLSConfig{CertFile: cert, KeyFile: key}, "127.0.0.1:1", TLSOff, true, 0},
		{"require without certificates", TLSConfig{NBDMode: "require"}, "127.0.0.1:1", "", false, 0},
		{"unknown mode", nbdTLS("maybe"), "127.0.0.1:1", "", false, 0},
		{"NBD certificate without key", TLSConfig{NBDCertFile: cert}, "127.0.0.1:1", "", false, 0},
		{"API key without certificate", TLSConfig{KeyFile: key}, "127.0.0.1:1", "", false, 0},
		{"client CA without TLS", TLSConfig{NBDClientCAFile: caFile}, "127.0.0.1:1", "", false, 0},
		{"client CA and API TLS: the API asks", TLSConfig{CertFile: cert, KeyFile: key, NBDCertFile: cert, NBDKeyFile: key,
			NBDClientCAFile: caFile}, "127.0.0.1:1", TLSOn, true, tls.VerifyClientCertIfGiven},
		{"client CA for the API alone", TLSConfig{CertFile: cert, KeyFile: key, NBDClientCAFile: caFile},
			"127.0.0.1:1", TLSOff, true, tls.VerifyClientCertIfGiven},
		{"API requires", TLSConfig{CertFile: cert, KeyFile: key, NBDClientCAFile: caFile, APIClientCert: "require"},
			"127.0.0.1:1", TLSOff, true, tls.RequireAndVerifyClientCert},
		{"API off, NBD on", TLSConfig{CertFile: cert, KeyFile: key, NBDCertFile: cert, NBDKeyFile: key,
			NBDClientCAFile: caFile, APIClientCert: "off"}, "127.0.0.1:1", TLSOn, true, tls.NoClientCert},
		{"API off and no NBD TLS", TLSConfig{CertFile: cert, KeyFile: key, NBDClientCAFile: caFile, APIClientCert: "off"},
			"127.0.0.1:1", "", false, 0},
		{"API client certificates without a client CA", TLSConfig{CertFile: cert, KeyFile: key, APIClientCert: "on"},
			"127.0.0.1:1", "", false, 0},
		{"API client certificates without HTTPS", TLSConfig{NBDCertFile: cert, NBDKeyFile: key, NBDClientCAFile: caFile,
			APIClientCert: "require"}, "127.0.0.1:1", "", false, 0},
		{"unknown API client mode", TLSConfig{CertFile: cert, KeyFile: key, NBDClientCAFile: caFile, APIClientCert: "ask"},
			"127.0.0.1:1", "", false, 0},
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
			if s.api != nil && (s.api.ClientAuth != tc.client || (tc.client != tls.NoClientCert) != (s.api.ClientCAs != nil)) {
				t.Fatalf("API client certificates %v (CAs %v), want %v", s.api.ClientAuth, s.api.ClientCAs != nil, tc.client)
			}
			if s.nbd != nil && tc.cfg.NBDClientCAFile != "" && s.nbd.ClientAuth != tls.RequireAndVerifyClientCert {
				t.Fatalf("NBD client certificates %v, want required", s.nbd.ClientAuth)
			}
			cas := 0
			for _, f := range s.files {
				if len(f.Files()) == 1 {
					cas++
				}
			}
			if want := min(1, len(tc.cfg.NBDClientCAFile)); cas != want {
				t.Fatalf("%d client CA files to reload, want %d (one for both listeners)", cas, want)
			}
		})
	}
}
