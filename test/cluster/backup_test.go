package clustertest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/tests3"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// memSink is a restore's target in memory.
type memSink map[string][]byte

func (m memSink) WriteAt(disk string, p []byte, off int64) error {
	copy(m[disk][off:], p)
	return nil
}

// TestReplicatedVolumeBackup: a 3-disk volume with two copies is backed up
// through the node that holds no copy (the API carries the request to the
// primary); the backup's snapshot is on both copies, and the second backup
// is incremental. The primary then dies and comes back as a copy: the new
// primary's backup is incremental from the same base (its own change
// tracking answers the delta), and every backup restores to the volume's
// bytes at its point. The S3 server runs in the test, over TLS in the hub
// namespace for the nodes and on loopback for the test's own checks.
func TestReplicatedVolumeBackup(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s3 := tests3.Start(t)
	hubS3 := subnet + "1:9443"
	ca := certtest.NewCA(t, "s3 CA")
	write := func(name string, content []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := []byte(strings.Repeat("k", 44))
	cfg, _ := json.Marshal(map[string]any{"targets": []map[string]any{{"name": "offsite", "endpoint": hubS3,
		"bucket": s3.Config.Bucket, "prefix": "site", "caFile": write("ca.pem", ca.PEM),
		"accessKeyFile": write("access", []byte(s3.Config.AccessKey)), "secretKeyFile": write("secret", []byte(s3.Config.SecretKey)),
		"keyFile": write("repo.key", key)}}})
	cfgFile := write("backup.json", cfg)
	c := startClusterWith(t, func(i int, nd *node) { nd.args = append(nd.args, "--backup-config", cfgFile) })
	hubLn, err := c.net.Listen("tcp", hubS3)
	if err != nil {
		t.Fatal(err)
	}
	pair := ca.Server(t, false, subnet+"1")
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	s3.Serve(tls.NewListener(hubLn, &tls.Config{Certificates: []tls.Certificate{cert}}))

	const diskSize = 4 * mib
	disks := []string{"root", "data", "logs"}
	spec := api.VolumeSpec{Name: "vm", Capacity: 3 * diskSize, Replicas: 2}
	for _, d := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	prim, cp, token := c.placeAndAttach(t, spec)
	spare := c.other(prim, cp)
	want := map[string][]byte{}
	for _, d := range disks {
		want[d] = make([]byte, diskSize)
	}
	rng := rand.New(rand.NewPCG(33, 34))
	writeVia := func(nd *node, d string, off int64, n int) {
		t.Helper()
		cl, err := nbdclient.Dial(ctx, nd.ip+":10809", "vm/"+d+"/"+token, nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.UintN(256))
		}
		if err := cl.WriteAt(p, off, false); err != nil {
			t.Fatal(err)
		}
		if err := cl.Flush(); err != nil {
			t.Fatal(err)
		}
		copy(want[d][off:], p)
	}
	for _, d := range disks {
		writeVia(prim, d, 0, 3*mib)
	}
	create := func(what string) api.Backup {
		t.Helper()
		var b api.Backup
		if err := json.Unmarshal([]byte(c.cli(spare, "-o", "json", "backup", "create", "vm")), &b); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return b
	}
	c.cli(spare, "backup", "target", "init", "offsite")
	first := create("first backup")
	if first.Parent != "" || first.Stats.BytesRead != 3*diskSize {
		t.Fatalf("first backup: parent %q, read %d bytes", first.Parent, first.Stats.BytesRead)
	}
	for _, nd := range []*node{prim, cp} {
		if out := c.cli(nd, "snapshot", "list", "vm"); !strings.Contains(out, first.Snapshot) {
			t.Fatalf("the backup's snapshot %s is not on %s's copy:\n%s", first.Snapshot, nd.name, out)
		}
	}
	restored := func(b api.Backup) {
		t.Helper()
		store, err := objstore.NewS3(ctx, objstore.S3Config{Endpoint: s3.Config.Endpoint, Bucket: s3.Config.Bucket, Prefix: "site",
			AccessKey: s3.Config.AccessKey, SecretKey: s3.Config.SecretKey, Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		repo, err := backup.Open(ctx, store, key)
		if err != nil {
			t.Fatal(err)
		}
		m, err := repo.Get(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		sink := memSink{}
		for _, d := range disks {
			sink[d] = make([]byte, diskSize)
		}
		if err := repo.Restore(ctx, m, nil, sink, nil, 4); err != nil {
			t.Fatal(err)
		}
		for _, d := range disks {
			if !bytes.Equal(sink[d], want[d]) {
				t.Fatalf("backup %s: disk %s differs from the volume at its point", b.ID, d)
			}
		}
	}
	restored(first)

	writeVia(prim, "data", 1*mib, 4096)
	writeVia(prim, "logs", 3*mib+8192, 4096)
	second := create("second backup")
	if second.Parent != first.ID || second.Stats.BytesRead > 2*mib {
		t.Fatalf("second backup: parent %q (want %s), read %d bytes for two 4 KiB writes", second.Parent, first.ID, second.Stats.BytesRead)
	}
	restored(second)

	// The primary dies; the other copy takes over. Once the old primary is
	// back in sync as a copy, the new primary backs up from the same base.
	prim.proc.Kill()
	c.waitVolume(t, spare, "vm", "the other copy primary", func(v api.Volume) bool { return v.Primary == cp.name })
	writeVia(cp, "root", 2*mib, 8192)
	c.spawn(prim)
	c.waitReady(prim)
	c.waitInSync(t, cp, "vm", prim.name, 90*time.Second)
	third := create("third backup, on the new primary")
	if third.Parent != second.ID || third.Stats.BytesRead > 2*mib {
		t.Fatalf("backup on the new primary: parent %q (want %s), read %d bytes for one 8 KiB write",
			third.Parent, second.ID, third.Stats.BytesRead)
	}
	restored(third)
	// A schedule is not built for a cluster's volumes: refused, not kept
	// on one copy.
	if out, err := c.cliErr(spare, "volume", "policy", "vm", "--backup-every", "1h"); err == nil {
		t.Fatalf("a backup policy on a cluster's volume was accepted:\n%s", out)
	}
}
