package tlscert_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/tlscert"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

func leaf(t *testing.T, p *tlscert.Pair) []byte {
	t.Helper()
	c, err := p.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Certificate[0]
}

// loadServer writes a server certificate of ca for 127.0.0.1 into dir
// and loads it.
func loadServer(t *testing.T, ca *certtest.CA, dir string) (p *tlscert.Pair, certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = ca.Server(t, false, "127.0.0.1").Write(t, dir)
	p, err := tlscert.Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return p, certFile, keyFile
}

// loadCAFile writes the certificate of ca to file and loads it as a CA
// file.
func loadCAFile(t *testing.T, ca *certtest.CA, file string) *tlscert.CAFile {
	t.Helper()
	certtest.WriteFile(t, file, ca.PEM)
	cas, err := tlscert.LoadCAFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return cas
}

// TestReload: Reload swaps the pair that new handshakes get, and a pair
// that does not load leaves the previous one in use.
func TestReload(t *testing.T) {
	ca := certtest.NewCA(t, "ca")
	dir := t.TempDir()
	p, certFile, _ := loadServer(t, ca, dir)
	first := leaf(t, p)

	ca.Server(t, false, "127.0.0.1").Write(t, dir)
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	second := leaf(t, p)
	if bytes.Equal(first, second) {
		t.Fatal("Reload kept the old certificate")
	}

	certtest.WriteFile(t, certFile, []byte("not a certificate"))
	if err := p.Reload(); err == nil {
		t.Fatal("Reload of a broken file succeeded")
	}
	if !bytes.Equal(leaf(t, p), second) {
		t.Fatal("a failed Reload changed the certificate in use")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlscert.Load("", ""); err == nil {
		t.Error("Load without files succeeded")
	}
	if _, err := tlscert.Load(filepath.Join(dir, "no.pem"), filepath.Join(dir, "no.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of missing files: %v, want ErrNotExist", err)
	}
	empty := filepath.Join(dir, "empty.pem")
	certtest.WriteFile(t, empty, []byte("nothing here"))
	if _, err := tlscert.CAPool(empty); !errors.Is(err, tlscert.ErrNoCertificates) {
		t.Errorf("CAPool of a file without certificates: %v, want ErrNoCertificates", err)
	}
	if _, err := tlscert.ClientConfig(filepath.Join(dir, "no.pem"), "", ""); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ClientConfig with a missing CA file: %v, want ErrNotExist", err)
	}
}

// TestServerConfigClientCA: with a client CA, the server asks for and
// verifies client certificates.
func TestServerConfigClientCA(t *testing.T) {
	ca := certtest.NewCA(t, "ca")
	p, _, _ := loadServer(t, ca, t.TempDir())
	cas := loadCAFile(t, ca, filepath.Join(t.TempDir(), "ca.pem"))
	cfg := tlscert.ServerConfig(p, cas, tls.RequireAndVerifyClientCert)
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil {
		t.Fatalf("ClientAuth %v, ClientCAs %v: want client certificates required", cfg.ClientAuth, cfg.ClientCAs)
	}
	if cfg := tlscert.ServerConfig(p, nil, tls.RequireAndVerifyClientCert); cfg.ClientAuth != tls.NoClientCert {
		t.Fatalf("without a client CA: ClientAuth %v", cfg.ClientAuth)
	}
}

// TestReloadIfChanged: unchanged files are not read again; a rotation is
// picked up; a half-done rotation (new certificate, old key) fails once and
// keeps the pair in use, and is tried again when the key arrives.
func TestReloadIfChanged(t *testing.T) {
	ca := certtest.NewCA(t, "ca")
	dir := t.TempDir()
	p, certFile, keyFile := loadServer(t, ca, dir)
	first := leaf(t, p)
	if tried, err := p.ReloadIfChanged(); tried || err != nil {
		t.Fatalf("unchanged files: tried %v, err %v", tried, err)
	}

	second := ca.Server(t, false, "127.0.0.1")
	second.Write(t, dir)
	if tried, err := p.ReloadIfChanged(); !tried || err != nil {
		t.Fatalf("rotated files: tried %v, err %v", tried, err)
	}
	if bytes.Equal(leaf(t, p), first) {
		t.Fatal("the rotation was not picked up")
	}
	current := leaf(t, p)

	third := ca.Server(t, false, "127.0.0.1")
	certtest.WriteFile(t, certFile, third.Cert) // the key is still second's
	if tried, err := p.ReloadIfChanged(); !tried || err == nil {
		t.Fatalf("half-rotated files: tried %v, err %v; want a failed try", tried, err)
	}
	if !bytes.Equal(leaf(t, p), current) {
		t.Fatal("a failed reload changed the certificate in use")
	}
	if tried, _ := p.ReloadIfChanged(); tried {
		t.Fatal("a failed reload was tried again without any change to the files")
	}
	certtest.WriteFile(t, keyFile, third.Key)
	if tried, err := p.ReloadIfChanged(); !tried || err != nil {
		t.Fatalf("completed rotation: tried %v, err %v", tried, err)
	}
	if bytes.Equal(leaf(t, p), current) {
		t.Fatal("the completed rotation was not picked up")
	}
}

// TestClientCAReload: a reloaded client CA file applies to the next
// handshake (a client of the new CA gets in, one of the old CA no longer
// does), a connection made before keeps working, and a CA file that does
// not load keeps the CAs in use.
func TestClientCAReload(t *testing.T) {
	serverCA := certtest.NewCA(t, "server CA")
	dir := t.TempDir()
	p, _, _ := loadServer(t, serverCA, dir)
	oldCA, newCA := certtest.NewCA(t, "old clients"), certtest.NewCA(t, "new clients")
	caFile := filepath.Join(dir, "clients.pem")
	cas := loadCAFile(t, oldCA, caFile)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlscert.ServerConfig(p, cas, tls.RequireAndVerifyClientCert))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	roots := x509.NewCertPool()
	roots.AddCert(serverCA.Cert)
	dial := func(client certtest.Pair) (*tls.Conn, error) {
		pair, err := tls.X509KeyPair(client.Cert, client.Key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair},
			ClientSessionCache: tls.NewLRUClientSessionCache(8)})
		if err != nil {
			return nil, err
		}
		// TLS 1.3 clients learn of a refused certificate on their
		// first read.
		if err := echo(c); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	oldClient, newClient := oldCA.Client(t, "old"), newCA.Client(t, "new")
	held, err := dial(oldClient)
	if err != nil {
		t.Fatalf("client of the CA in use: %v", err)
	}
	defer held.Close()
	if c, err := dial(newClient); err == nil {
		c.Close()
		t.Fatal("a client of a CA not yet in the file got in")
	}

	certtest.WriteFile(t, caFile, newCA.PEM)
	if tried, err := cas.ReloadIfChanged(); !tried || err != nil {
		t.Fatalf("replaced CA file: tried %v, err %v", tried, err)
	}
	if c, err := dial(newClient); err != nil {
		t.Fatalf("client of the new CA after the reload: %v", err)
	} else {
		c.Close()
	}
	if c, err := dial(oldClient); err == nil {
		c.Close()
		t.Fatal("a client of the removed CA got in after the reload")
	}
	if err := echo(held); err != nil {
		t.Fatalf("the connection made before the reload: %v", err)
	}

	certtest.WriteFile(t, caFile, []byte("not a certificate"))
	if err := cas.Reload(); !errors.Is(err, tlscert.ErrNoCertificates) {
		t.Fatalf("Reload of a broken CA file: %v, want ErrNoCertificates", err)
	}
	if c, err := dial(newClient); err != nil {
		t.Fatalf("a broken CA file replaced the CAs in use: %v", err)
	} else {
		c.Close()
	}
}

func echo(c *tls.Conn) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != "ping" {
		return fmt.Errorf("echo %q", b)
	}
	return nil
}

// TestVerifyClientCertIfGiven: the API's mode. A client without a
// certificate gets in with no verified chain; one of the client CA gets in
// with its certificate verified; one of another CA and an expired one fail
// the handshake. ClientConfig presents its certificate, and a renewed one
// after its files change.
func TestVerifyClientCertIfGiven(t *testing.T) {
	serverCA, clientCA, otherCA := certtest.NewCA(t, "server CA"), certtest.NewCA(t, "clients"), certtest.NewCA(t, "other")
	dir := t.TempDir()
	certFile, keyFile := serverCA.Server(t, false, "127.0.0.1").Write(t, dir)
	p, err := tlscert.Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caFile, serverCAFile := filepath.Join(dir, "clients.pem"), filepath.Join(dir, "server-ca.pem")
	certtest.WriteFile(t, caFile, clientCA.PEM)
	certtest.WriteFile(t, serverCAFile, serverCA.PEM)
	cas, err := tlscert.LoadCAFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlscert.ServerConfig(p, cas, tls.VerifyClientCertIfGiven)
	if cfg.ClientAuth != tls.VerifyClientCertIfGiven || !cfg.SessionTicketsDisabled {
		t.Fatalf("ClientAuth %v, tickets off %v", cfg.ClientAuth, cfg.SessionTicketsDisabled)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	seen := make(chan string, 16) // the verified client's common name, or "-"
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				name := "-"
				if ch := tc.ConnectionState().VerifiedChains; len(ch) > 0 {
					name = ch[0][0].Subject.CommonName
				}
				seen <- name
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	clientDir := t.TempDir()
	dial := func(pair *certtest.Pair) (string, error) {
		var tc *tls.Config
		var err error
		if pair == nil {
			tc, err = tlscert.ClientConfig(serverCAFile, "", "")
		} else {
			c, k := pair.Write(t, clientDir)
			tc, err = tlscert.ClientConfig(serverCAFile, c, k)
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), tc)
		if err != nil {
			return "", err
		}
		defer c.Close()
		if err := echo(c); err != nil { // TLS 1.3: a refusal shows on the first read
			return "", err
		}
		return <-seen, nil
	}
	if name, err := dial(nil); err != nil || name != "-" {
		t.Errorf("without a certificate: %q, %v; want in, unverified", name, err)
	}
	good := clientCA.Client(t, "good")
	if name, err := dial(&good); err != nil || name != "good" {
		t.Errorf("a certificate of the client CA: %q, %v; want in, verified", name, err)
	}
	other, expired := otherCA.Client(t, "other"), clientCA.ExpiredClient(t, "expired")
	for what, pair := range map[string]*certtest.Pair{"another CA's": &other, "an expired": &expired} {
		if name, err := dial(pair); err == nil {
			t.Errorf("%s certificate got in (as %q)", what, name)
		}
	}

	// A long-lived client config presents the renewed certificate after
	// its files change.
	c, k := good.Write(t, clientDir)
	tc, err := tlscert.ClientConfig(serverCAFile, c, k)
	if err != nil {
		t.Fatal(err)
	}
	renewed := clientCA.Client(t, "renewed")
	renewed.Write(t, clientDir)
	conn, err := tls.Dial("tcp", ln.Addr().String(), tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := echo(conn); err != nil {
		t.Fatal(err)
	}
	if name := <-seen; name != "renewed" {
		t.Errorf("after the renewal the client presented %q, want the renewed certificate", name)
	}
	if _, err := tlscert.ClientConfig(serverCAFile, c, ""); err == nil {
		t.Error("ClientConfig with a certificate and no key: no error")
	}
}
