package console

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// trusting is the Chromium option that trusts the certificates of ca: a
// chain the server presents that holds ca's key is accepted. (Chromium on
// Linux reads its roots from an NSS database, which only NSS's certutil
// writes; this flag needs no tool.)
func trusting(ca *certtest.CA) chromedp.ExecAllocatorOption {
	sum := sha256.Sum256(ca.Cert.RawSubjectPublicKeyInfo)
	return chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(sum[:]))
}

// TestConsoleOverTLS: the server started with --tls-cert and --tls-key
// (its certificate issued by the test's CA, sent with the CA's) serves the
// console over HTTPS; a browser that trusts the test's CA signs in and
// reads a volume's page through the API over HTTPS. A browser trusting
// another CA gets no page at all.
func TestConsoleOverTLS(t *testing.T) {
	ca := certtest.NewCA(t, "quiver console test CA")
	pair := ca.Server(t, false, "127.0.0.1", "localhost")
	pair.Cert = append(pair.Cert, ca.PEM...) // the chain up to the test's CA
	dir := t.TempDir()
	certFile, keyFile := pair.Write(t, dir)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	srv := testserver.StartT(t, quiverBin, testserver.Options{Token: adminToken, Pool: filepath.Join(dir, "pool"),
		Args: []string{"--tls-cert", certFile, "--tls-key", keyFile}, TLS: &tls.Config{RootCAs: roots}})
	base := "https://" + srv.APIAddr

	// Not trusted: the browser refuses the server's certificate.
	other := newBrowser(t, base, trusting(certtest.NewCA(t, "another CA")))
	_, err := chromedp.Run(other.ctx, chromedp.Navigate(base+"/ui/"))
	if err == nil || !strings.Contains(err.Error(), "ERR_CERT_AUTHORITY_INVALID") {
		t.Fatalf("a browser trusting another CA opened %s/ui/: %v, want ERR_CERT_AUTHORITY_INVALID", base, err)
	}

	b := newBrowser(t, base, trusting(ca))
	b.login(adminToken)
	if got := eval[string](b, "location.protocol"); got != "https:" {
		t.Fatalf("the console's page: %s, want https:", got)
	}
	b.goTo("#/volumes", `input[name="search"]`)
	b.act("create-volume", map[string]string{"name": "tls01", "size": "1"})
	b.run("the volume made over HTTPS", chromedp.WaitVisible(chromedp.CSS(`[data-volume-page="tls01"] [data-disk="root"]`)))
	if _, err := srv.API.GetVolume(b.ctx, "tls01"); err != nil {
		t.Fatalf("the volume created in the console over HTTPS: %v", err)
	}
	b.checkPage("volume-https")
}
