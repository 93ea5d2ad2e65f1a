package powercut

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// guestMemory is the guest's RAM (QEMU's -m, MiB): the kernel, the
// initramfs (quiver is most of it) unpacked in RAM, quiver's heap and XFS's
// caches.
const guestMemory = "256"

// machine is one boot of the guest: QEMU under TCG, its pool disk served
// by a cacheDisk through quiver's NBD server on a unix socket, the API
// and NBD of the quiver inside reachable on loopback ports of the host.
type machine struct {
	disk    *cacheDisk
	srv     *nbd.Server
	ln      net.Listener
	vm      *testguest.VM
	stderr  *testserver.LogBuffer
	apiAddr string // host side of the forwarded ports
	nbdAddr string
	api     *client.Client
}

// boot starts a backend on the medium and QEMU on it. It does not wait for
// the guest: see waitReady.
func boot(ctx context.Context, g *guest, m *medium, dir, token string, n int) (*machine, error) {
	mc := &machine{disk: newCacheDisk(m), stderr: &testserver.LogBuffer{}}
	console := filepath.Join(dir, fmt.Sprintf("console-%d", n))
	sock := filepath.Join(dir, "disk.sock")
	ln, err := nbd.ListenUnix(sock)
	if err != nil {
		return nil, err
	}
	mc.ln = ln
	mc.srv = nbd.NewServer(cacheExports{mc.disk}, nbd.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go mc.srv.Serve(ln)

	apiPort, nbdPort, err := freePorts()
	if err != nil {
		mc.stopBackend()
		return nil, err
	}
	mc.apiAddr = fmt.Sprintf("127.0.0.1:%d", apiPort)
	mc.nbdAddr = fmt.Sprintf("127.0.0.1:%d", nbdPort)
	node, err := json.Marshal(map[string]any{
		"driver": "nbd", "node-name": "pool",
		"server": map[string]string{"type": "unix", "path": sock},
		"export": cacheExport,
	})
	if err != nil {
		mc.stopBackend()
		return nil, err
	}
	// no_timer_check: on a loaded host the kernel's check of the IO-APIC
	// timer under TCG fails now and then and panics the boot.
	machine := testguest.Machine{CPU: "max", Memory: guestMemory, Cmdline: "quiet mitigations=off no_timer_check"}
	args := append(machine.Args(g.kernel, g.initrd, console),
		"-blockdev", string(node),
		// write-cache=on: the guest sees a volatile write cache and sends
		// FLUSH; 4 KiB blocks, the cache's granule.
		"-device", "virtio-blk-pci,drive=pool,write-cache=on,logical_block_size=4096,physical_block_size=4096",
		"-netdev", fmt.Sprintf("user,id=net0,hostfwd=tcp:%s-:%d,hostfwd=tcp:%s-:%d", mc.apiAddr, guestAPIPort, mc.nbdAddr, guestNBDPort),
		"-device", "virtio-net-pci,netdev=net0",
	)
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout = mc.stderr
	cmd.Stderr = mc.stderr
	if mc.vm, err = testguest.StartVM(cmd, console); err != nil {
		mc.stopBackend()
		return nil, err
	}
	mc.api, err = client.New("http://"+mc.apiAddr, client.WithToken(token))
	if err != nil {
		mc.cutPower(0, nil)
		return nil, err
	}
	return mc, nil
}

// freePorts returns two loopback ports that were free a moment ago.
func freePorts() (int, int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports[0], ports[1], nil
}

// waitReady waits until the quiver inside answers the API, or fails with
// the reason: QEMU exited, the pool did not mount, quiver exited (a pool
// that does not open), or ctx ended.
func (mc *machine) waitReady(ctx context.Context) error {
	for {
		text := mc.vm.ConsoleText()
		for _, bad := range []string{consoleMountFail, consoleQuiverEnd, "Kernel panic", "init: insmod"} {
			if strings.Contains(text, bad) {
				return fmt.Errorf("guest: %q on the console", bad)
			}
		}
		if strings.Contains(text, consoleMounted) {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := mc.api.Pool(actx)
			cancel()
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("guest not ready: %w", ctx.Err())
		case <-mc.vm.Exited():
			return fmt.Errorf("QEMU exited (%v) before quiver was ready", mc.vm.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cutPower is the power cut: the disk's volatile cache is lost except for
// a random subset, each block kept with probability keep, and the disk
// refuses every later request; then QEMU dies by SIGKILL (the guest's RAM
// and page cache with it) and is reaped. The cache goes first: QEMU's
// death closes its NBD connection, and the NBD server flushes an export
// whose client leaves with writes unflushed, which would save the cache.
// A guest request in the instant between fails, as it would on a disk
// without power.
func (mc *machine) cutPower(keep float64, rng *rand.Rand) (dirty, kept int, err error) {
	if rng == nil {
		rng = rand.New(rand.NewPCG(0, 0))
	}
	dirty, kept, err = mc.disk.cut(keep, rng)
	mc.vm.Kill()
	mc.stopBackend()
	return dirty, kept, err
}

func (mc *machine) stopBackend() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = mc.srv.Shutdown(ctx)
	mc.ln.Close()
}

// diagnostics is what a failure message needs: the console and QEMU's
// output.
func (mc *machine) diagnostics() string {
	return fmt.Sprintf("--- guest console (tail) ---\n%s\n--- QEMU output (tail) ---\n%s\n",
		testserver.Tail(mc.vm.ConsoleText(), 60), testserver.Tail(mc.stderr.String(), 20))
}
