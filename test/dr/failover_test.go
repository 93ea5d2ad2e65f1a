package drtest

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestFailoverBootsAGuest (issue 34, acceptance 2): site A's VM (an XFS
// root with a file and a 4 MiB blob, and a data disk) is shipped to site
// B; then A writes 48 MiB more and a cycle starts over a slow link, and A
// is SIGKILLed in the middle of it. B's last point is the first one,
// whole: byte for byte the snapshot A took of it (read from A's pool on
// disk). B's promote takes under 10 s, and a guest (TCG) boots from B's
// volume, mounts its root, reads the file and the blob, and writes.
func TestFailoverBootsAGuest(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "qemu-io", "mkfs.xfs", "mount"} {
		testfs.RequireTool(t, tool)
	}
	testfs.RequireRoot(t)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioXFS, initrd, `echo 1 >/proc/sys/kernel/printk
mkdir -p /mnt
mount -t xfs /dev/vda /mnt || echo "failover: mount failed"
echo "failover: hello $(cat /mnt/hello.txt)"
echo "failover: blob $(md5sum /mnt/blob | cut -d' ' -f1)"
echo "the VM ran on site B" >/mnt/after.txt
sync
umount /mnt || echo "failover: umount failed"
echo "failover: done"
poweroff -f
`)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}

	b := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "b"), NBDTCP: true, Token: tokenB})
	l := newLink(t, b.APIAddr)
	tokFile := filepath.Join(dir, "b.token")
	cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "http://" + l.ln.Addr().String(), "tokenFile": tokFile}}})
	cfgFile := filepath.Join(dir, "dr.json")
	for f, data := range map[string][]byte{tokFile: []byte(tokenB + "\n"), cfgFile: cfg} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	aPool := filepath.Join(dir, "a")
	a, err := testserver.Spawn(bin, testserver.Options{Pool: aPool, NBDTCP: true, Args: []string{"--dr-config", cfgFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Kill)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cli := func(p *testserver.Process, args ...string) (string, error) {
		full := []string{"--server", "http://" + p.APIAddr}
		if p == b {
			full = append(full, "--token-file", tokFile)
		}
		out, err := exec.Command(bin, append(full, args...)...).CombinedOutput()
		return string(out), err
	}
	must := func(p *testserver.Process, args ...string) string {
		t.Helper()
		out, err := cli(p, args...)
		if err != nil {
			t.Fatalf("quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}

	must(a, "volume", "create", "vm", "--capacity", "1Gi", "--disk", "root=512Mi", "--disk", "data=64Mi")
	token := rand.Text()
	blob := make([]byte, 4<<20)
	_, _ = rand.Read(blob)
	sum := md5.Sum(blob)
	img := filepath.Join(dir, "root.img")
	testfs.MakeXFS(t, img, 512<<20, map[string][]byte{"hello.txt": []byte(token + "\n"), "blob": blob})
	run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", img, a.URI("vm/root"))
	must(b, "dr", "target", "accept", "db", "vm-dr")
	var first api.DRCycle
	if err := json.Unmarshal([]byte(must(a, "-o", "json", "dr", "sync", "vm", "--site", "b", "--relationship", "db")), &first); err != nil {
		t.Fatal(err)
	}

	// 48 MiB more, then a cycle over a link of 8 MB/s: A dies in it.
	data := make([]byte, 48<<20)
	_, _ = rand.Read(data)
	dataImg := filepath.Join(dir, "data.img")
	if err := os.WriteFile(dataImg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", dataImg, a.URI("vm/data"))
	l.rate.Store(8 << 20)
	before := l.sent.Load()
	syncDone := make(chan error, 1)
	go func() {
		_, err := cli(a, "dr", "sync", "vm", "--site", "b", "--relationship", "db")
		syncDone <- err
	}()
	for l.sent.Load()-before < 16<<20 {
		select {
		case err := <-syncDone:
			t.Fatalf("the cycle ended before A was killed (%v): the link is not slow enough", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := a.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.Exited()
	<-syncDone
	t.Logf("A killed with %d MiB of the second point sent", (l.sent.Load()-before)>>20)

	// B's last point is the first, whole: what A's snapshot of it holds.
	var tgs api.List[api.DRTarget]
	if err := json.Unmarshal([]byte(must(b, "-o", "json", "dr", "target", "list")), &tgs); err != nil || len(tgs.Items) != 1 {
		t.Fatalf("site B's targets: %v %+v", err, tgs)
	}
	tg := tgs.Items[0]
	if n := len(tg.Points); n == 0 || tg.Points[n-1].Snapshot != first.Point.Snapshot {
		t.Fatalf("site B's points after A died mid-cycle: %+v, want the last to be %s", tg.Points, first.Point.Snapshot)
	}
	ro := must(b, "-o", "json", "attach", "create", "vm-dr", "checker", "--mode", "ro")
	var roAtt api.Attachment
	if err := json.Unmarshal([]byte(ro), &roAtt); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"root", "data"} {
		snapImg := filepath.Join(aPool, "volumes", "vm", "snapshots", first.Point.Snapshot, d+".img")
		run("qemu-img", "compare", "-f", "raw", "-F", "raw", snapImg, b.URI("vm-dr@"+first.Point.Snapshot+"/"+d+"/"+roAtt.Token))
	}
	must(b, "attach", "delete", "vm-dr", roAtt.ID)

	// The promote, timed; the VM boots from B.
	start := time.Now()
	must(b, "dr", "target", "promote", "db")
	took := time.Since(start)
	if took > 10*time.Second {
		t.Fatalf("promote took %v, want under 10 s", took)
	}
	var rw api.Attachment
	if err := json.Unmarshal([]byte(must(b, "-o", "json", "attach", "create", "vm-dr", "vm-host")), &rw); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(b.NBDAddr)
	if err != nil {
		t.Fatal(err)
	}
	args := testguest.QEMUArgs(k, initrd, filepath.Join(dir, "console"))
	for _, d := range []string{"root", "data"} {
		args = append(args, "-blockdev", fmt.Sprintf("driver=nbd,node-name=%s,server.type=inet,server.host=%s,server.port=%s,export=vm-dr/%s/%s",
			d, host, port, d, rw.Token), "-device", "virtio-blk-pci,drive="+d)
	}
	qemuOut := &testserver.LogBuffer{}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = qemuOut, qemuOut
	vm, err := testguest.StartVM(cmd, filepath.Join(dir, "console"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Kill)
	select {
	case <-vm.Exited():
	case <-ctx.Done():
		vm.Kill()
	}
	text := vm.ConsoleText()
	if !strings.Contains(text, "failover: done") || strings.Contains(text, "failover: mount failed") ||
		strings.Contains(text, "failover: umount failed") ||
		!strings.Contains(text, "failover: hello "+token) || !strings.Contains(text, "failover: blob "+hex.EncodeToString(sum[:])) {
		t.Fatalf("the guest on site B did not run cleanly (%v)\n--- console ---\n%s\n--- QEMU ---\n%s",
			vm.Err(), testserver.Tail(text, 40), qemuOut.String())
	}
	if bytes.Contains([]byte(text), []byte("I/O error")) {
		t.Fatalf("the guest saw I/O errors:\n%s", testserver.Tail(text, 40))
	}
	t.Logf("promote took %v; the guest booted from site B's last point", took.Round(time.Millisecond))
}
