package backup

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
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestInstantRestoreBootsAGuest (issue 33, acceptance 3): a VM's root disk
// holds an XFS filesystem with a file and a 4 MiB blob; the VM is backed
// up, and restored with --instant while the store answers slowly (every
// GET waits 500 ms). A guest (TCG) boots on the new volume's disks over
// NBD at once, mounts the root filesystem, reads the file and checks the
// blob, writes a file and 64 KiB onto its data disk, and powers off, all
// while the copy is still running. Once the copy ends, the new volume holds
// the guest's writes, and the backup (and the original volume) do not.
func TestInstantRestoreBootsAGuest(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "qemu-io", "mkfs.xfs", "mount"} {
		testfs.RequireTool(t, tool)
	}
	testfs.RequireRoot(t)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioXFS, initrd, `echo 1 >/proc/sys/kernel/printk
mkdir -p /mnt
mount -t xfs /dev/vda /mnt || echo "instant: mount failed"
echo "instant: hello $(cat /mnt/hello.txt)"
echo "instant: blob $(md5sum /mnt/blob | cut -d' ' -f1)"
echo "the restored VM was here" >/mnt/after.txt
head -c 65536 /dev/zero | tr '\000' '\167' | dd of=/dev/vdb bs=64k seek=80 count=1 iflag=fullblock oflag=direct 2>/dev/null || echo "instant: write error"
sync
umount /mnt || echo "instant: umount failed"
echo "instant: done"
poweroff -f
`)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}

	env := startWithBackups(t)
	srv, cli2 := env.srv, env.cli2
	cli2("volume", "create", "vm", "--capacity", "1Gi", "--disk", "root=512Mi", "--disk", "data=128Mi", "--disk", "logs=16Mi")
	// The root filesystem, made on the host and copied into the volume.
	token := rand.Text()
	blob := make([]byte, 4<<20)
	_, _ = rand.Read(blob)
	sum := md5.Sum(blob)
	img := filepath.Join(dir, "root.img")
	testfs.MakeXFS(t, img, 512<<20, map[string][]byte{"hello.txt": []byte(token + "\n"), "blob": blob})
	run(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", img, srv.URI("vm/root"))
	// The data disk full of random bytes: 128 chunks to fetch, so the copy
	// at 500 ms a GET takes a minute or more, past the guest's run.
	data := make([]byte, 128<<20)
	_, _ = rand.Read(data)
	dataImg := filepath.Join(dir, "data.img")
	if err := os.WriteFile(dataImg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", dataImg, srv.URI("vm/data"))
	var b api.Backup
	if err := json.Unmarshal([]byte(cli2("-o", "json", "backup", "create", "vm")), &b); err != nil {
		t.Fatal(err)
	}

	env.s3.Delay(500 * time.Millisecond)
	cli2("backup", "restore", "--instant", b.ID, "vm2")
	restoring := func() *api.RestoreProgress {
		var v api.Volume
		if err := json.Unmarshal([]byte(cli2("-o", "json", "volume", "get", "vm2")), &v); err != nil {
			t.Fatal(err)
		}
		return v.Restore
	}
	if restoring() == nil {
		t.Fatal("the instantly restored volume is not copying")
	}
	if out, err := exec.Command(bin, "--server", "http://"+srv.APIAddr, "snapshot", "create", "vm2", "early").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "being restored") {
		t.Fatalf("a snapshot while the copy runs: %v\n%s", err, out)
	}

	host, port, err := net.SplitHostPort(srv.NBDAddr)
	if err != nil {
		t.Fatal(err)
	}
	args := testguest.QEMUArgs(k, initrd, filepath.Join(dir, "console"))
	for _, d := range []string{"root", "data"} {
		args = append(args, "-blockdev", fmt.Sprintf("driver=nbd,node-name=%s,server.type=inet,server.host=%s,server.port=%s,export=vm2/%s",
			d, host, port, d), "-device", "virtio-blk-pci,drive="+d)
	}
	qemuOut := &testserver.LogBuffer{}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = qemuOut, qemuOut
	started := time.Now()
	vm, err := testguest.StartVM(cmd, filepath.Join(dir, "console"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Kill)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	select {
	case <-vm.Exited():
	case <-ctx.Done():
		vm.Kill()
	}
	text := vm.ConsoleText()
	if !strings.Contains(text, "instant: done") || strings.Contains(text, "instant: mount failed") ||
		strings.Contains(text, "instant: write error") || strings.Contains(text, "instant: umount failed") {
		t.Fatalf("the guest did not finish cleanly (%v)\n--- console ---\n%s\n--- QEMU ---\n%s",
			vm.Err(), testserver.Tail(text, 40), qemuOut.String())
	}
	if !strings.Contains(text, "instant: hello "+token) || !strings.Contains(text, "instant: blob "+hex.EncodeToString(sum[:])) {
		t.Fatalf("the guest did not read the backup's files:\n%s", testserver.Tail(text, 40))
	}
	p := restoring()
	if p == nil {
		t.Fatal("the copy ended before the guest did: nothing shows the guest ran before the restore")
	}
	t.Logf("the guest booted and ran in %s; the copy then stood at %d of %d bytes",
		time.Since(started).Round(time.Second), p.CopiedBytes, p.TotalBytes)

	// The store at full speed again: the copy ends.
	env.s3.Delay(0)
	deadline := time.Now().Add(2 * time.Minute)
	for restoring() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the copy did not end: %+v", restoring())
		}
		time.Sleep(200 * time.Millisecond)
	}
	cli2("snapshot", "create", "vm2", "whole")
	// The guest's writes are in the new volume...
	gotData := filepath.Join(dir, "vm2-data.img")
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", srv.URI("vm2/data"), gotData)
	copy(data[5<<20:], bytes.Repeat([]byte{0x77}, 64<<10))
	if b, err := os.ReadFile(gotData); err != nil || !bytes.Equal(b, data) {
		first := -1
		for i := range min(len(b), len(data)) {
			if b[i] != data[i] {
				first = i
				break
			}
		}
		t.Fatalf("the restored data disk is not the backup's with the guest's 64 KiB at 5 MiB (%v): %d bytes, first difference at %d",
			err, len(b), first)
	}
	got := filepath.Join(dir, "vm2-root.img")
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", srv.URI("vm2/root"), got)
	files := readXFS(t, got, "hello.txt", "after.txt")
	if files["hello.txt"] != token+"\n" || files["after.txt"] != "the restored VM was here\n" {
		t.Fatalf("the restored volume's root filesystem holds %q", files)
	}
	// ...and not in the backup, which still equals the original volume.
	for _, d := range []string{"root", "data", "logs"} {
		run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", srv.URI("backup:"+b.ID+"/"+d), srv.URI("vm/"+d))
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// readXFS reads files from the XFS image img (mounted read-only).
func readXFS(t *testing.T, img string, names ...string) map[string]string {
	t.Helper()
	mnt := t.TempDir()
	run(t, "mount", "-o", "loop,ro", img, mnt)
	defer run(t, "umount", mnt)
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(mnt, n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = string(b)
	}
	return out
}
