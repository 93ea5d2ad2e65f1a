package interop

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestTLSGuest: a QEMU guest (TCG) whose disk is a quiver export over NBD
// with TLS required, QEMU's own tls-creds-x509 and tls-hostname, boots,
// writes 64 KiB of 0xab at 1 MiB with O_DIRECT, reads it back and powers
// off; qemu-io over TLS then finds the data on the disk.
func TestTLSGuest(t *testing.T) {
	requireTools(t, "qemu-system-x86_64", "qemu-io")
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioBlk, initrd, `echo "guest: disk of $(cat /sys/block/vda/size) sectors"
head -c 65536 /dev/zero | tr '\000' '\253' | dd of=/dev/vda bs=64k seek=16 count=1 iflag=fullblock oflag=direct 2>/dev/null || echo "guest: write error"
echo "guest: read back $(dd if=/dev/vda bs=64k skip=16 count=1 iflag=direct 2>/dev/null | od -An -v -tx1 | tr -s ' ' '\n' | sort -u | tr -d '\n')"
sync
echo "guest: done"
poweroff -f
`)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}

	ca := certtest.NewCA(t, "quiver CA")
	s := startTLSServer(t, ca, nil, "require")
	creds := certtest.ClientDir(t, ca, nil)
	obj, img := s.qemuOpts(t, "vm/root", creds, "localhost")
	host, port, err := net.SplitHostPort(s.NBDAddr)
	if err != nil {
		t.Fatal(err)
	}
	blockdev := "driver=nbd,node-name=disk0,server.type=inet,server.host=" + host + ",server.port=" + port +
		",export=vm/root,tls-creds=tls0,tls-hostname=localhost"

	console := filepath.Join(dir, "console")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	qemuOut := &testserver.LogBuffer{}
	cmd := exec.Command("qemu-system-x86_64", append(testguest.QEMUArgs(k, initrd, console),
		"-object", obj,
		"-blockdev", blockdev,
		"-device", "virtio-blk-pci,drive=disk0",
	)...)
	cmd.Stdout, cmd.Stderr = qemuOut, qemuOut
	vm, err := testguest.StartVM(cmd, console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Kill)
	select {
	case <-vm.Exited(): // the guest powered off
	case <-ctx.Done():
		vm.Kill()
	}
	runErr := vm.Err()
	text := vm.ConsoleText()
	if runErr != nil || !strings.Contains(text, "guest: done") {
		t.Fatalf("the guest did not finish (%v)\n--- console ---\n%s\n--- QEMU ---\n%s",
			runErr, testserver.Tail(text, 40), qemuOut.String())
	}
	if !strings.Contains(text, "guest: disk of 8192 sectors") {
		t.Errorf("the guest did not see the 4 MiB disk:\n%s", testserver.Tail(text, 40))
	}
	if strings.Contains(text, "guest: write error") || !hasLine(text, "guest: read back ab") {
		t.Errorf("the guest's write and read back over TLS failed:\n%s", testserver.Tail(text, 40))
	}
	out := run(t, "qemu-io", "--object", obj, "--image-opts", img, "-c", "read -P 0xab 1M 64k")
	if bad := qemuIOFailure(out); bad != "" {
		t.Fatalf("qemu-io over TLS does not find the guest's data: %s\n%s", bad, out)
	}
}

// hasLine reports whether text (a serial console: lines end in \r\n) has
// the line want.
func hasLine(text, want string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == want {
			return true
		}
	}
	return false
}
