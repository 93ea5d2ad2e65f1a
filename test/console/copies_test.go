package console

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// freePort returns a loopback TCP port free a moment ago (for the embedded
// etcd member's URLs, which take no port 0).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestConsoleCopies: a cluster of two nodes on loopback (n1 with the etcd
// member, n2 its client), a volume with a copy on each. The volume's page
// lists both copies in sync, as the API does. n2 stops, 8 MiB are written
// on the primary (n1): n2's copy goes out of sync; n2 comes back, and the
// open page shows its resync (throttled to 1 MiB/s) with a progress that
// grows, of the total the API reports, until the copy is in sync again.
func TestConsoleCopies(t *testing.T) {
	const written = 8 << 20
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cluster.token")
	if err := os.WriteFile(tokenFile, []byte("cluster-token-of-the-console-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	peer, etcd := freePort(t), freePort(t)
	common := []string{"--cluster-name", "console", "--cluster-token-file", tokenFile, "--node-lease-ttl", "3s",
		"--node-report-interval", "1s", "--resync-rate", "1Mi"}
	n1 := testserver.StartT(t, quiverBin, testserver.Options{Token: adminToken, Pool: filepath.Join(dir, "n1"), NBDTCP: true,
		Args: append([]string{"--node-name", "n1", "--initial-cluster", fmt.Sprintf("n1=http://127.0.0.1:%d", peer),
			"--etcd-listen-client", fmt.Sprintf("http://127.0.0.1:%d", etcd)}, common...)})
	n2opts := testserver.Options{Token: adminToken, Pool: filepath.Join(dir, "n2"), NBDTCP: true,
		Args: append([]string{"--node-name", "n2", "--etcd-endpoints", fmt.Sprintf("http://127.0.0.1:%d", etcd)}, common...)}
	ctx := context.Background()
	// Started without StartT, whose end wants a clean exit: this one is
	// killed.
	n2, err := testserver.Start(ctx, quiverBin, n2opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n2.Kill)
	if _, err := n1.API.CreateVolume(ctx, api.VolumeSpec{Name: "rep01", Capacity: 64 << 20, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 64 << 20}}}); err != nil {
		t.Fatal(err)
	}
	copyOf := func(node string) api.Copy {
		v, err := n1.API.GetVolume(ctx, "rep01")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range v.Copies {
			if c.Node == node {
				return c
			}
		}
		t.Fatalf("no copy of rep01 on %s: %+v", node, v.Copies)
		return api.Copy{}
	}

	b := newBrowser(t, "http://"+n1.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/rep01", `[data-copy="n2"]`)
	for _, node := range []string{"n1", "n2"} {
		if got, want := b.attr(`[data-copy="`+node+`"]`, "data-state"), copyOf(node).State; got != want || want != api.CopyInSync {
			t.Fatalf("%s's copy: %q in the page, %q in the API, want %s", node, got, want, api.CopyInSync)
		}
	}

	// n2 stops; the primary's writes leave its copy out of sync.
	n2.Kill()
	att, err := n1.API.Attach(ctx, "rep01", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := nbdclient.Dial(ctx, n1.NBDAddr, "rep01/root/"+att.Token, nbdclient.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i) | 1
	}
	for off := int64(0); off < written; off += int64(len(block)) {
		if err := conn.WriteAt(block, off, true); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	if c := copyOf("n2"); c.State == api.CopyInSync {
		t.Fatalf("n2's copy after writes while it was down: %+v", c)
	}

	// Once its lease is gone (so the primary sees the new process's
	// address only), n2 is back: its resync shows in the open page as it
	// goes.
	b.waitFor("n2 down for n1", 15*time.Second, func() bool {
		nodes, err := n1.API.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.Name == "n2" {
				return n.State == api.NodeDown
			}
		}
		return false
	})
	testserver.StartT(t, quiverBin, n2opts)
	var seen []float64
	var total int64
	b.waitFor("n2's copy back in sync in the page", 30*time.Second, func() bool {
		row := `[data-copy="n2"]`
		if p := b.attr(row+` [data-progress]`, "data-progress"); p != "" {
			f, _ := strconv.ParseFloat(p, 64)
			if len(seen) == 0 || seen[len(seen)-1] != f {
				seen = append(seen, f)
			}
			if total == 0 {
				if c := copyOf("n2"); c.State == api.CopyResyncing {
					total = c.TotalBytes
				}
			}
			if len(seen) == 2 {
				b.scrollTo(`[data-table="attachments"]`)
				b.checkPage("volume-resync")
			}
		}
		return b.attr(row, "data-state") == api.CopyInSync
	})
	t.Logf("resync progress seen in the page: %v (of %d bytes)", seen, total)
	if len(seen) < 2 || !sortedUp(seen) || seen[0] < 0 || seen[len(seen)-1] > 100 {
		t.Fatalf("resync progress in the page: %v, want at least two points, growing, within 0-100", seen)
	}
	if total < written {
		t.Fatalf("the API's resync total: %d bytes, want at least the %d written", total, written)
	}
	if c := copyOf("n2"); c.State != api.CopyInSync {
		t.Fatalf("n2's copy in the page is in sync, in the API %+v", c)
	}
}

func sortedUp(xs []float64) bool {
	for i := 1; i < len(xs); i++ {
		if xs[i] <= xs[i-1] {
			return false
		}
	}
	return true
}
