package clustertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestFailoverQEMUClient: QEMU's NBD client (qemu-io, the block layer QEMU
// itself uses) writes a replicas=2 volume through the node that holds no
// copy, which forwards to the primary; the primary is SIGKILLed mid-run.
// Every write and flush must succeed (the forwarding node holds the
// requests and sends them again to the promoted copy), and every block
// must be on the new primary afterwards. This is the client side of
// acceptance 4 without a guest: the test/migration guest is not run here.
func TestFailoverQEMUClient(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	v, exports := c.failoverVolume(t, c.nodes[0], "qemu", 1)
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	third := c.other(prim, cp)
	const blocks, size = 60, 64 << 10 // 3.75 MiB of the 4 MiB disk
	ex := exports[0]
	opts := fmt.Sprintf("driver=raw,file.driver=nbd,file.server.type=inet,file.server.host=%s,file.server.port=10809,"+
		"file.export=%s,file.reconnect-delay=60", third.ip, ex)
	args := []string{"netns", "exec", c.net.Hub, "qemu-io", "--image-opts", opts}
	for i := range blocks {
		args = append(args, "-c", fmt.Sprintf("write -P %d %d %d", i%250+1, i*size, size))
		if i%8 == 7 {
			args = append(args, "-c", "flush")
		}
		args = append(args, "-c", "sleep 100")
	}
	args = append(args, "-c", "flush")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill the primary once a tenth of the writes are answered.
	var out strings.Builder
	wrote := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc, n := bufio.NewScanner(pr), 0
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "wrote ") {
				if n++; n == blocks/10 {
					close(wrote)
				}
			}
		}
	}()
	select {
	case <-wrote:
	case <-time.After(time.Minute):
		t.Fatal("qemu-io wrote nothing in a minute")
	}
	prim.proc.Kill()
	killed := time.Now()
	err := cmd.Wait()
	pw.Close()
	<-scanned
	t.Logf("qemu-io through %s ended %v after the primary %s was killed", third.name, time.Since(killed).Round(time.Millisecond), prim.name)
	if err != nil || strings.Contains(out.String(), "error") || strings.Contains(out.String(), "failed") {
		t.Fatalf("qemu-io: %v\n%s", err, out.String())
	}
	got := c.waitVolume(t, third, "qemu", "the copy promoted", func(x api.Volume) bool { return x.Primary == cp.name })
	if got.Term != v.Term+1 {
		t.Fatalf("promoted at term %d, want %d", got.Term, v.Term+1)
	}
	for i := range blocks {
		if b := fileBytes(t, cp, "qemu", "d0", int64(i*size), size); !allBytes(b, byte(i%250+1)) {
			t.Fatalf("block %d on the new primary %s lacks its write", i, cp.name)
		}
	}
	t.Logf("%d writes of 64 KiB and %d flushes through a failover, all on %s at term %d", blocks, blocks/8+1, cp.name, got.Term)

	// The old primary comes back: it follows term+1 and the new primary
	// resyncs it, copied whole (it may hold writes it never acknowledged),
	// until both copies are byte-identical.
	c.spawn(prim)
	c.waitReady(prim)
	back := time.Now()
	seen := c.waitInSync(t, cp, "qemu", prim.name, 2*time.Minute)
	if a, b := diskSum(t, cp, "qemu", "d0"), diskSum(t, prim, "qemu", "d0"); a != b {
		t.Fatalf("after the old primary's resync: %s on %s, %s on %s", a, cp.name, b, prim.name)
	}
	// Whole: every granule of the disk, not only the 54 blocks it missed.
	const diskSize = 4 << 20
	if got := scrapeSum(t, c, cp, "quiver_cluster_resync_bytes_total"); got < diskSize {
		t.Fatalf("the new primary resynced %.0f bytes to the old one, want the whole disk (%d)", got, diskSize)
	}
	t.Logf("the old primary %s back in sync %v after its restart (states %v), copied whole, byte-identical",
		prim.name, time.Since(back).Round(time.Millisecond), seen)
}

func testTail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
