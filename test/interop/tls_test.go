package interop

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// tlsServer is a quiver server with NBD over TLS and the API over HTTPS,
// both with the certificate files in certDir.
type tlsServer struct {
	*server
	ca      *certtest.CA
	certDir string // cert.pem and key.pem, as the server reads them
	caFile  string // the CA's certificate, for --ca-file
}

// startTLSServer starts a server whose certificate ca issues for pair (nil:
// a valid one for 127.0.0.1 and localhost), with the NBD TLS mode and
// extra flags.
func startTLSServer(t *testing.T, ca *certtest.CA, pair *certtest.Pair, mode string, args ...string) *tlsServer {
	t.Helper()
	if pair == nil {
		p := ca.Server(t, false, "127.0.0.1", "localhost")
		pair = &p
	}
	dir := t.TempDir()
	certFile, keyFile := pair.Write(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	args = append([]string{"--tls-cert", certFile, "--tls-key", keyFile,
		"--nbd-tls-cert", certFile, "--nbd-tls-key", keyFile, "--nbd-tls", mode}, args...)
	p := testserver.StartT(t, quiverBin, testserver.Options{NBDTCP: true, LogLevel: "debug", Args: args,
		TLS: &tls.Config{RootCAs: roots}})
	s := &tlsServer{server: &server{Process: p, api: p.API}, ca: ca, certDir: dir, caFile: caFile}
	s.createVolume(t, "vm", disk("root", 4*miB))
	return s
}

// nbds is the libnbd URI of an export over TLS with the certificates of dir.
func (s *tlsServer) nbds(export, dir string) string {
	return "nbds://" + s.NBDAddr + "/" + export + "?tls-certificates=" + dir
}

// qemuOpts are qemu-img's and qemu-io's options for export over TLS with
// the x509 credentials in dir, checked against hostname.
func (s *tlsServer) qemuOpts(t *testing.T, export, dir, hostname string) (object, image string) {
	host, port, err := net.SplitHostPort(s.NBDAddr)
	if err != nil {
		t.Fatal(err)
	}
	return "tls-creds-x509,id=tls0,dir=" + dir + ",endpoint=client",
		fmt.Sprintf("driver=nbd,host=%s,port=%s,export=%s,tls-creds=tls0,tls-hostname=%s", host, port, export, hostname)
}

// TestTLSPeers: qemu-img, qemu-io, nbdinfo and nbdcopy read and write over
// TLS, with TLS required.
func TestTLSPeers(t *testing.T) {
	requireTools(t, "qemu-img", "qemu-io", "nbdinfo", "nbdcopy")
	s := startTLSServer(t, certtest.NewCA(t, "quiver CA"), nil, "require")
	dir := certtest.ClientDir(t, s.ca, nil)

	obj, img := s.qemuOpts(t, "vm/root", dir, "localhost")
	out := run(t, "qemu-io", "--object", obj, "--image-opts", img,
		"-c", "write -P 0xab 0 1M", "-c", "read -P 0xab 0 1M", "-c", "flush")
	if bad := qemuIOFailure(out); bad != "" {
		t.Fatalf("qemu-io over TLS: %s\n%s", bad, out)
	}

	src := filepath.Join(t.TempDir(), "src.raw")
	data := bytes.Repeat([]byte("quiver over tls "), int(4*miB/16))
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, img = s.qemuOpts(t, "vm/root", dir, "127.0.0.1")
	run(t, "qemu-img", "convert", "-n", "-f", "raw", "--object", obj, "--target-image-opts", src, img)
	run(t, "qemu-img", "compare", "--object", obj, "--image-opts", "driver=file,filename="+src, img)
	if out := run(t, "qemu-img", "info", "--object", obj, "--image-opts", img); !strings.Contains(out, "4 MiB") {
		t.Errorf("qemu-img info over TLS: no 4 MiB in\n%s", out)
	}

	uri := s.nbds("vm/root", dir)
	if out := run(t, "nbdinfo", "--size", uri); strings.TrimSpace(out) != fmt.Sprint(4*miB) {
		t.Errorf("nbdinfo --size over TLS: %q", out)
	}
	if out := run(t, "nbdinfo", "--list", "nbds://"+s.NBDAddr+"?tls-certificates="+dir); !strings.Contains(out, "vm/root") {
		t.Errorf("nbdinfo --list over TLS does not list vm/root:\n%s", out)
	}
	dst := filepath.Join(t.TempDir(), "dst.raw")
	run(t, "nbdcopy", uri, dst)
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("nbdcopy from TLS: the copy differs from what qemu-img wrote (%v)", err)
	}
	zeros := filepath.Join(t.TempDir(), "zeros.raw")
	if err := os.WriteFile(zeros, make([]byte, 4*miB), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "nbdcopy", zeros, uri)
	run(t, "qemu-io", "--object", obj, "--image-opts", img, "-c", "read -P 0 0 4M")
}

// TestTLSRefusals: clients that skip TLS, trust another CA, meet an
// expired certificate or the wrong name get nothing.
func TestTLSRefusals(t *testing.T) {
	requireTools(t, "qemu-io", "nbdinfo")
	ca := certtest.NewCA(t, "quiver CA")
	s := startTLSServer(t, ca, nil, "require")
	good := certtest.ClientDir(t, ca, nil)

	t.Run("plain client", func(t *testing.T) {
		// libnbd reports NBD_REP_ERR_TLS_REQD as ENOTSUP.
		out := refused(t, "Operation not supported", "nbdinfo", s.URI("vm/root"))
		t.Logf("nbdinfo without TLS: %s", out)
		out = refused(t, "Operation not supported", "nbdinfo", "--list", "nbd://"+s.NBDAddr)
		if strings.Contains(out, "vm/") {
			t.Errorf("nbdinfo --list without TLS learnt an export name:\n%s", out)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		other := certtest.ClientDir(t, certtest.NewCA(t, "another CA"), nil)
		refused(t, "certificate verification", "nbdinfo", s.nbds("vm/root", other))
		obj, img := s.qemuOpts(t, "vm/root", other, "localhost")
		refused(t, "known issuer", "qemu-io", "--object", obj, "--image-opts", img, "-c", "read 0 4k")
	})
	t.Run("wrong hostname", func(t *testing.T) {
		obj, img := s.qemuOpts(t, "vm/root", good, "other.example")
		refused(t, "hostname", "qemu-io", "--object", obj, "--image-opts", img, "-c", "read 0 4k")
	})
	t.Run("expired certificate", func(t *testing.T) {
		expired := ca.Server(t, true, "127.0.0.1", "localhost")
		e := startExpired(t, ca, expired)
		refused(t, "certificate verification", "nbdinfo", e.nbds("vm/root", good))
		obj, img := e.qemuOpts(t, "vm/root", good, "localhost")
		refused(t, "not trusted", "qemu-io", "--object", obj, "--image-opts", img, "-c", "read 0 4k")
	})
	t.Run("certificate for another host", func(t *testing.T) {
		p := ca.Server(t, false, "other.example")
		e := startExpired(t, ca, p)
		refused(t, "certificate verification", "nbdinfo", e.nbds("vm/root", good))
	})
}

// startExpired starts a server presenting pair for NBD only (its API
// keeps a valid certificate, so that the test can create a volume).
func startExpired(t *testing.T, ca *certtest.CA, pair certtest.Pair) *tlsServer {
	t.Helper()
	dir := t.TempDir()
	nbdCert, nbdKey := pair.Write(t, dir)
	return startTLSServer(t, ca, nil, "require", "--nbd-tls-cert", nbdCert, "--nbd-tls-key", nbdKey)
}

// TestTLSClientCertificates: with --nbd-tls-client-ca a client must present
// a certificate that CA issued.
func TestTLSClientCertificates(t *testing.T) {
	requireTools(t, "nbdinfo", "qemu-io")
	ca := certtest.NewCA(t, "quiver CA")
	clientCA := certtest.NewCA(t, "clients CA")
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	certtest.WriteFile(t, caFile, clientCA.PEM)
	s := startTLSServer(t, ca, nil, "require", "--nbd-tls-client-ca", caFile)

	mine := clientCA.Client(t, "vm-client")
	dir := certtest.ClientDir(t, ca, &mine, clientCA)
	if out := run(t, "nbdinfo", "--size", s.nbds("vm/root", dir)); strings.TrimSpace(out) != fmt.Sprint(4*miB) {
		t.Errorf("nbdinfo with a client certificate: %q", out)
	}
	obj, img := s.qemuOpts(t, "vm/root", dir, "localhost")
	run(t, "qemu-io", "--object", obj, "--image-opts", img, "-c", "write -P 0x5a 0 64k", "-c", "read -P 0x5a 0 64k")

	foreign := certtest.NewCA(t, "another CA").Client(t, "intruder")
	refused(t, "fatal alert", "nbdinfo", s.nbds("vm/root", certtest.ClientDir(t, ca, &foreign)))
	refused(t, "fatal alert", "nbdinfo", s.nbds("vm/root", certtest.ClientDir(t, ca, nil)))
}

// TestTLSClientCARotation: the client CA file of --nbd-tls-client-ca is
// replaced and the server gets SIGHUP: a client of the new CA gets in, one
// of the old CA no longer does, and a connection made before keeps working.
// Then the file is replaced again without SIGHUP and the server notices by
// itself.
func TestTLSClientCARotation(t *testing.T) {
	requireTools(t, "nbdinfo")
	py := libnbdPython(t)
	ca := certtest.NewCA(t, "quiver CA")
	oldCA, newCA := certtest.NewCA(t, "old clients CA"), certtest.NewCA(t, "new clients CA")
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	certtest.WriteFile(t, caFile, oldCA.PEM)
	s := startTLSServer(t, ca, nil, "require", "--nbd-tls-client-ca", caFile, "--tls-watch-interval", "200ms")

	oldClient, newClient := oldCA.Client(t, "old-client"), newCA.Client(t, "new-client")
	oldDir := certtest.ClientDir(t, ca, &oldClient, oldCA)
	newDir := certtest.ClientDir(t, ca, &newClient, newCA)
	held := startDriver(t, py, s.nbds("vm/root", oldDir), "connection from before the CA rotation")
	held.do("write 0x33 0 4096", "ok")
	refused(t, "fatal alert", "nbdinfo", "--size", s.nbds("vm/root", newDir))

	certtest.WriteFile(t, caFile, newCA.PEM)
	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Count(s.Log.String(), "TLS certificate reloaded") >= 3 }) // API pair, NBD pair, client CA
	run(t, "nbdinfo", "--size", s.nbds("vm/root", newDir))
	refused(t, "fatal alert", "nbdinfo", "--size", s.nbds("vm/root", oldDir))
	held.do("read 0", "ok 0x33")
	held.do("write 0x44 4096 4096", "ok")
	held.do("flush", "ok")
	held.do("read 4096", "ok 0x44")

	// Back to the old CA by replacing the file alone.
	certtest.WriteFile(t, caFile, oldCA.PEM)
	waitFor(t, func() bool {
		return strings.Contains(s.Log.String(), "TLS certificate files changed and were reloaded")
	})
	run(t, "nbdinfo", "--size", s.nbds("vm/root", oldDir))
	refused(t, "fatal alert", "nbdinfo", "--size", s.nbds("vm/root", newDir))
	held.do("read 4096", "ok 0x44")
}

// TestTLSAPI: the API over HTTPS with the Go client (startTLSServer) and
// the CLI with --ca-file; plain HTTP and an unknown CA are refused.
func TestTLSAPI(t *testing.T) {
	s := startTLSServer(t, certtest.NewCA(t, "quiver CA"), nil, "on")
	url := "https://" + s.APIAddr
	if out := run(t, quiverBin, "--server", url, "--ca-file", s.caFile, "volume", "list"); !strings.Contains(out, "vm") {
		t.Errorf("quiver volume list over HTTPS: no vm in\n%s", out)
	}
	if _, err := s.api.GetVolume(t.Context(), "vm"); err != nil {
		t.Errorf("Go client over HTTPS: %v", err)
	}
	refused(t, "certificate", quiverBin, "--server", url, "volume", "list") // unknown CA
	refused(t, "HTTP request to an HTTPS server", quiverBin, "--server", "http://"+s.APIAddr, "volume", "list")
	pem, err := os.ReadFile(s.caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", s.caFile)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 30 * time.Second}
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("/metrics over HTTPS: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "quiver_") {
		t.Errorf("/metrics over HTTPS: status %d, err %v, no quiver_ metric in %.200s", resp.StatusCode, err, body)
	}
}

// TestTLSRotation: after the certificate files are replaced and the server
// gets SIGHUP, a new connection sees the new certificate, and a connection
// established before keeps working.
func TestTLSRotation(t *testing.T) {
	requireTools(t, "nbdinfo")
	py := libnbdPython(t)
	oldCA := certtest.NewCA(t, "old CA")
	s := startTLSServer(t, oldCA, nil, "require")
	oldDir := certtest.ClientDir(t, oldCA, nil)
	held := startDriver(t, py, s.nbds("vm/root", oldDir), "connection from before the rotation")
	held.do("write 0x11 0 4096", "ok")

	newCA := certtest.NewCA(t, "new CA")
	newDir := certtest.ClientDir(t, newCA, nil)
	newCA.Server(t, false, "127.0.0.1", "localhost").Write(t, s.certDir)
	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(s.Log.String(), "TLS certificate reloaded") })

	run(t, "nbdinfo", "--size", s.nbds("vm/root", newDir))
	refused(t, "certificate verification", "nbdinfo", "--size", s.nbds("vm/root", oldDir))
	held.do("read 0", "ok 0x11")
	held.do("write 0x22 4096 4096", "ok")
	held.do("flush", "ok")
	held.do("read 4096", "ok 0x22")

	// The API's certificate rotated too.
	if out, err := exe(t.Context(), quiverBin, "--server", "https://"+s.APIAddr, "--ca-file", s.caFile, "volume", "list"); err == nil {
		t.Errorf("the API still presents the old certificate after SIGHUP:\n%s", out)
	}
	caFile := filepath.Join(t.TempDir(), "new-ca.pem")
	certtest.WriteFile(t, caFile, newCA.PEM)
	run(t, quiverBin, "--server", "https://"+s.APIAddr, "--ca-file", caFile, "volume", "list")
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// refused runs a peer that must fail with want in its message (the reason:
// a certificate error, not any failure).
func refused(t *testing.T, want, name string, args ...string) string {
	t.Helper()
	out := runFails(t, name, args...)
	if !strings.Contains(out, want) {
		t.Errorf("%s failed without %q in its message:\n%s", commandLine(name, args), want, out)
	}
	return out
}

// TestTLSRotationUnderFio is the rotation acceptance of the TLS issue: the
// certificate files are replaced (no SIGHUP) while fio writes and verifies
// over TLS. fio's connections, made before, see no error; the server
// notices the new files by itself, and new connections get the new
// certificate.
func TestTLSRotationUnderFio(t *testing.T) {
	requireTools(t, "fio", "nbdinfo")
	oldCA := certtest.NewCA(t, "old CA")
	s := startTLSServer(t, oldCA, nil, "require", "--tls-watch-interval", "200ms")
	oldDir := certtest.ClientDir(t, oldCA, nil)
	out := filepath.Join(t.TempDir(), "fio.json")
	type result struct {
		stdout string
		err    error
	}
	done := make(chan result, 1)
	// fio's nbd engine does not let a URI name a certificate directory
	// (libnbd's tls-certificates is local file access, which it does not
	// allow), so fio finds the CA where libnbd looks by default:
	// $HOME/.pki/libnbd.
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(oldDir, filepath.Join(home, ".pki", "libnbd")); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd := exec.CommandContext(t.Context(), "fio", "--output-format=json", "--output="+out,
			"--ioengine=nbd", "--uri=nbds://"+s.NBDAddr+"/vm/root", "--rw=randwrite", "--iodepth=8",
			"--bs=4k", "--size=2m", "--numjobs=2", "--offset_increment=2m",
			"--time_based", "--runtime=8", "--verify=crc32c", "--verify_fatal=1", "--verify_backlog=64",
			"--verify_state_save=0", "--name=rotation")
		cmd.Env = append(os.Environ(), "HOME="+home)
		stdout, err := cmd.CombinedOutput()
		done <- result{string(stdout), err}
	}()

	// Rotate once fio has its connections and is writing.
	waitFor(t, func() bool { return strings.Count(s.Log.String(), "msg=transmission") >= 2 })
	time.Sleep(time.Second)
	newCA := certtest.NewCA(t, "new CA")
	newDir := certtest.ClientDir(t, newCA, nil)
	newCA.Server(t, false, "127.0.0.1", "localhost").Write(t, s.certDir)
	waitFor(t, func() bool {
		return strings.Contains(s.Log.String(), "TLS certificate files changed and were reloaded")
	})
	run(t, "nbdinfo", "--size", s.nbds("vm/root", newDir))
	refused(t, "certificate verification", "nbdinfo", "--size", s.nbds("vm/root", oldDir))

	r := <-done
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("fio wrote no report: %v (fio: %v)\n%s", err, r.err, r.stdout)
	}
	if r.err != nil {
		t.Fatalf("fio over TLS failed across the rotation: %v\n%s", r.err, r.stdout)
	}
	var res struct {
		Jobs []fioJob `json:"jobs"`
	}
	if err := json.Unmarshal(report, &res); err != nil {
		t.Fatalf("fio report: %v\n%s", err, report)
	}
	if len(res.Jobs) != 2 {
		t.Fatalf("fio ran %d jobs, want 2", len(res.Jobs))
	}
	for _, j := range res.Jobs {
		if j.Error != 0 || j.Write.Bytes == 0 || j.Read.Bytes == 0 {
			t.Errorf("fio job %s: error %d, wrote %d bytes, verified %d", j.Name, j.Error, j.Write.Bytes, j.Read.Bytes)
		}
	}
}
