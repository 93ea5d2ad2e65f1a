package clustertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/quiverstorage/quiver/internal/tlscert"
)

// The nodes' etcd runs over TLS with client certificates made by `quiver
// cluster certs` (docs/cluster.md, "Securing etcd"); QUIVER_ETCD_PLAINTEXT=1
// runs it in plaintext with --etcd-insecure instead.
func etcdPlaintext() bool { return os.Getenv("QUIVER_ETCD_PLAINTEXT") == "1" }

// spareNode is the node number joinRefused starts beside the three.
const spareNode = 4

// lastNode is the highest node number with certificates: TestNodesInAndOut
// grows the cluster to n5.
const lastNode = 5

// makeEtcdCerts runs `quiver cluster certs` for nodes n1 to n5 (their
// addresses in the test's network) into c.certs.
func (c *cluster) makeEtcdCerts() {
	c.t.Helper()
	if etcdPlaintext() {
		return
	}
	c.certs = filepath.Join(c.dir, "etcd-certs")
	args := []string{"cluster", "certs", "--out", c.certs}
	for i := 1; i <= lastNode; i++ {
		args = append(args, "--node", fmt.Sprintf("n%d=%s%d", i, subnet, 10+i))
	}
	if out, err := exec.Command(quiverBin, args...).CombinedOutput(); err != nil {
		c.t.Fatalf("quiver cluster certs: %v\n%s", err, out)
	}
}

// etcdScheme is the scheme of the nodes' etcd URLs.
func (c *cluster) etcdScheme() string {
	if c.certs == "" {
		return "http"
	}
	return "https"
}

// etcdFlags are the etcd security flags of the node named name.
func (c *cluster) etcdFlags(name string) []string {
	if c.certs == "" {
		// Plaintext between the namespaces: refused beyond loopback
		// without this.
		return []string{"--etcd-insecure"}
	}
	return []string{"--etcd-cert", filepath.Join(c.certs, name+".crt"), "--etcd-key", filepath.Join(c.certs, name+".key"),
		"--etcd-ca", filepath.Join(c.certs, "ca.crt")}
}

// etcdTLS is the test's etcd client TLS: the admin certificate (nil in
// plaintext).
func (c *cluster) etcdTLS() *tls.Config {
	c.t.Helper()
	if c.certs == "" {
		return nil
	}
	cfg, err := tlscert.ClientConfig(filepath.Join(c.certs, "ca.crt"), filepath.Join(c.certs, "admin.crt"),
		filepath.Join(c.certs, "admin.key"))
	if err != nil {
		c.t.Fatal(err)
	}
	return cfg
}

// etcdHTTP is a client of the etcd members' JSON gateway from the hub
// namespace, and the base URL of nd's member.
func (c *cluster) etcdHTTP(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: c.etcdTLS(),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return c.net.Dial(ctx, network, addr)
		}}}
}

// etcdURL is nd's etcd client URL.
func (c *cluster) etcdURL(nd *node) string { return c.etcdScheme() + "://" + nd.ip + ":2379" }
