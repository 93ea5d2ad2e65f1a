package clustertest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestClusterHTTPS (docs/cluster.md, "Any node's API", TLS): every node
// serves its API over HTTPS only (--tls-cert, --tls-key: a certificate for
// its address whose file carries the cluster's CA after the leaf, which is
// what its hops trust). Through the node without a copy of a replicated
// volume, an attachment and a snapshot are carried over HTTPS to the
// primary and served there; the writes through the attachment reach both
// copies; the CLI with --ca-file reads and snapshots through every node,
// and without it refuses the node's certificate.
func TestClusterHTTPS(t *testing.T) {
	ca := certtest.NewCA(t, "cluster CA")
	pki := t.TempDir()
	caFile := filepath.Join(pki, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c := startClusterWith(t, func(_ int, nd *node) {
		leaf := ca.Server(t, false, nd.ip)
		dir := filepath.Join(pki, nd.name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		cert, key := certtest.Pair{Cert: append(leaf.Cert, ca.PEM...), Key: leaf.Key}.Write(t, dir)
		nd.args = append(nd.args, "--tls-cert", cert, "--tls-key", key)
		nd.tls = &tls.Config{RootCAs: roots}
	})
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	for _, nd := range c.nodes {
		if !strings.Contains(nd.proc.Log.String(), "https=true") {
			t.Fatalf("%s does not serve its API over HTTPS", nd.name)
		}
	}
	v, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "web", Capacity: 4 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	prim := c.byName(v.Primary)
	cp := c.byName(copyNodes(v)[0])
	if cp == prim {
		cp = c.byName(copyNodes(v)[1])
	}
	spare := c.other(prim, cp)

	att, err := spare.api().Attach(ctx, v.Name, api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatalf("attach through %s (no copy), carried to the primary %s over HTTPS: %v", spare.name, prim.name, err)
	}
	if !strings.HasPrefix(att.URIs["root"], "nbd://"+prim.ip+":") {
		t.Fatalf("the attachment through %s: %v, want the primary %s's URI", spare.name, att.URIs, prim.name)
	}
	c.qemuIO(t, att.URIs["root"], "write -P 0x6b 0 1M", "flush")
	for _, nd := range []*node{prim, cp} {
		if !allBytes(fileBytes(t, nd, v.Name, "root", 0, mib), 0x6b) {
			t.Errorf("the write through the attachment is not on %s's copy", nd.name)
		}
	}
	if _, err := spare.api().CreateSnapshot(ctx, v.Name, "s1"); err != nil {
		t.Fatalf("snapshot through %s, carried to the primary %s over HTTPS: %v", spare.name, prim.name, err)
	}
	if err := spare.api().Detach(ctx, v.Name, att.ID); err != nil {
		t.Fatalf("detach through %s: %v", spare.name, err)
	}

	quiver := func(nd *node, withCA bool, args ...string) (string, error) {
		full := []string{"netns", "exec", c.net.Hub, quiverBin, "--server", "https://" + nd.ip + ":7480",
			"--token-file", c.tokenFile(apiToken)}
		if withCA {
			full = append(full, "--ca-file", caFile)
		}
		out, err := exec.Command("ip", append(full, args...)...).CombinedOutput()
		return string(out), err
	}
	for _, nd := range c.nodes {
		out, err := quiver(nd, true, "volume", "get", v.Name, "-o", "json")
		var got api.Volume
		if err == nil {
			err = json.Unmarshal([]byte(out), &got)
		}
		if err != nil || got.Name != v.Name || got.Primary != prim.name {
			t.Errorf("quiver --ca-file volume get through %s: %+v %v\n%s", nd.name, got, err, out)
		}
		if out, err := quiver(nd, true, "snapshot", "create", v.Name, "cli-"+nd.name); err != nil {
			t.Errorf("quiver --ca-file snapshot create through %s: %v\n%s", nd.name, err, out)
		}
		if out, err := quiver(nd, false, "volume", "get", v.Name); err == nil || !strings.Contains(out, "certificate") {
			t.Errorf("quiver without --ca-file through %s: %v, want the node's certificate refused\n%s", nd.name, err, out)
		}
	}
	for _, nd := range []*node{prim, cp} {
		for _, s := range []string{"s1", "cli-n1", "cli-n2", "cli-n3"} {
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", v.Name, "snapshots", s)); err != nil {
				t.Errorf("snapshot %s on %s's copy: %v", s, nd.name, err)
			}
		}
	}
}
