package migration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// guestRAM is the guest's RAM: enough for the kernel and the initramfs,
// small enough that TCG migrates it in about a second. It is 128 MiB and
// 8 KiB, not 128 MiB: QEMU 7.2 syncs the migration dirty bitmap of a RAM
// block whose size is a multiple of 256 KiB on a fast path that does not
// reset TCG's TLB (fixed in QEMU 9.0 by "physmem: Fix migration dirty
// bitmap coherency with TCG memory access"), so some guest stores made
// after a sync were never sent and the destination guest crashed or hung
// now and then; any other size takes the per-page path, which resets the TLB
// (docs/live-migration.md, "Guest crashes after migration").
// QUIVER_MIGRATION_MEM (QEMU's -m) overrides it to reproduce the crashes.
const guestRAM = 128<<20 + 8<<10

// vmConfig describes one QEMU process. The source and the destination of a
// migration must have the same machine, memory and devices; only name, dir,
// exports and incoming may differ.
type vmConfig struct {
	name      string // "src", "dst": names files and log lines
	dir       string // short directory (unix socket paths) for the QMP socket and the console
	guest     *guest
	nbdSocket string            // quiver's NBD unix socket
	exports   map[string]string // disk (guestDisks) -> NBD export name
	incoming  bool              // start with -incoming defer, waiting for migrate-incoming
	// paused keeps an incoming guest paused after the migration (-S),
	// until the test sends cont: compareRAM reads its RAM meanwhile.
	paused bool
	// sockets overrides nbdSocket per disk (servers with one export per
	// socket: nbdkit memory, qemu-nbd).
	sockets map[string]string
	// extra are more QEMU arguments (trace events, a log file).
	extra []string
}

// envOr is the environment variable name, or def when it is empty. The
// machine (QUIVER_MIGRATION_MACHINE, pc or q35), TCG's threading
// (QUIVER_MIGRATION_TCG_THREAD, single or multi) and the RAM size
// (QUIVER_MIGRATION_MEM, QEMU's -m) can be changed to reproduce other
// setups; the tests run with the defaults.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// socket is the NBD unix socket of disk.
func (cfg vmConfig) socket(disk string) string {
	if s, ok := cfg.sockets[disk]; ok {
		return s
	}
	return cfg.nbdSocket
}

// vm is a running QEMU: qemu-system-x86_64 under TCG booting the guest
// kernel and initramfs, each quiver disk a virtio-blk-pci device whose
// backend is QEMU's NBD client, QMP on a unix socket and the serial console
// in a file.
type vm struct {
	*testguest.VM
	name   string
	stderr *testserver.LogBuffer
}

// startVM starts QEMU and connects to its QMP socket. t.Cleanup ends the
// process (quit, then SIGKILL) and, if the test failed, logs the tail of the
// guest console, QEMU's stderr and the QMP events.
func startVM(t *testing.T, ctx context.Context, cfg vmConfig) *vm {
	t.Helper()
	console, qmp := filepath.Join(cfg.dir, cfg.name+".console"), filepath.Join(cfg.dir, cfg.name+".qmp")
	machine := testguest.Machine{
		// Single-threaded TCG: with QEMU 7.2's default multi-threaded TCG
		// the guest kernel on the destination crashed after about one
		// migration in four (stack corruption, oopses in random places:
		// guest memory the source had changed was not migrated); with
		// thread=single, none did in 16 runs.
		Type: envOr("QUIVER_MIGRATION_MACHINE", "pc"), Accel: "tcg,thread=" + envOr("QUIVER_MIGRATION_TCG_THREAD", "single"),
		Memory: envOr("QUIVER_MIGRATION_MEM", fmt.Sprintf("%dK", guestRAM>>10)),
		QMP:    qmp,
	}
	args := append([]string{"-name", cfg.name}, machine.Args(cfg.guest.kernel, cfg.guest.initrd, console)...)
	for _, disk := range guestDisks {
		node, err := json.Marshal(map[string]any{
			"driver":    "nbd",
			"node-name": "disk-" + disk,
			"server":    map[string]string{"type": "unix", "path": cfg.socket(disk)},
			"export":    cfg.exports[disk],
		})
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-blockdev", string(node), "-device", "virtio-blk-pci,drive=disk-"+disk+",id="+disk)
	}
	if cfg.incoming {
		args = append(args, "-incoming", "defer")
	}
	if cfg.paused {
		args = append(args, "-S")
	}
	args = append(args, cfg.extra...)
	cmd := exec.Command("qemu-system-x86_64", args...)
	v := &vm{name: cfg.name, stderr: &testserver.LogBuffer{}}
	cmd.Stdout, cmd.Stderr = v.stderr, v.stderr
	var err error
	if v.VM, err = testguest.StartVM(cmd, console); err != nil {
		t.Fatalf("%s: %v", cfg.name, err)
	}
	t.Cleanup(func() {
		v.Shutdown()
		if t.Failed() {
			t.Logf("%s: %s", v.name, v.diagnostics())
		}
	})
	if err := v.DialQMP(ctx, qmp); err != nil {
		t.Fatalf("%s: %v", cfg.name, err)
	}
	return v
}

// quit ends QEMU through QMP and fails the test unless it exits by itself,
// with status 0, within 20 s.
func (v *vm) quit(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := v.Quit(ctx); err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
}

// diagnostics is what a failure message needs: the tail of the console,
// QEMU's output and the QMP events.
func (v *vm) diagnostics() string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s guest console (tail) ---\n%s\n", v.name, testserver.Tail(v.ConsoleText(), 100))
	fmt.Fprintf(&b, "--- %s QEMU stderr (tail) ---\n%s\n", v.name, testserver.Tail(v.stderr.String(), 20))
	if v.QMP != nil {
		fmt.Fprintf(&b, "--- %s QMP events ---\n%s\n", v.name, testserver.Tail(strings.Join(v.QMP.Events(), "\n"), 20))
	}
	if !v.Running() {
		fmt.Fprintf(&b, "--- %s QEMU exited: %v ---\n", v.name, v.Err())
	}
	return redact(b.String())
}

// waitConsole waits until the guest console contains want, or fails the
// test when ctx ends or QEMU exits first.
func (v *vm) waitConsole(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	if err := v.WaitConsole(ctx, want); err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
}

// status is QMP query-status's run state: "running", "paused",
// "postmigrate", "inmigrate", "io-error", ...
func (v *vm) status(t *testing.T, ctx context.Context) string {
	t.Helper()
	st, err := v.QMP.Status(ctx)
	if err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	return st
}

// blockStats returns query-blockstats per disk (guestDisks).
func (v *vm) blockStats(t *testing.T, ctx context.Context) map[string]testguest.BlockStats {
	t.Helper()
	out, err := v.tryBlockStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryBlockStats is blockStats for callers that expect QEMU may be gone (a
// guest that panicked ends its QEMU: -no-reboot).
func (v *vm) tryBlockStats(ctx context.Context) (map[string]testguest.BlockStats, error) {
	all, err := v.QMP.BlockStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", v.name, err)
	}
	out := byDisk(all)
	if len(out) != len(guestDisks) {
		return nil, fmt.Errorf("%s: query-blockstats names %d of the %d disks: %+v", v.name, len(out), len(guestDisks), all)
	}
	return out, nil
}

// ioStatus returns query-block's io-status per disk ("ok", "failed",
// "nospace"; QEMU leaves it out for devices that do not track it).
func (v *vm) ioStatus(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	all, err := v.QMP.IOStatus(ctx)
	if err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	return byDisk(all)
}

// byDisk keys QMP's answers per block node by disk: node disk-vda is vda.
// Nodes not named so are left out.
func byDisk[T any](byNode map[string]T) map[string]T {
	out := map[string]T{}
	for node, x := range byNode {
		if disk, ok := strings.CutPrefix(node, "disk-"); ok {
			out[disk] = x
		}
	}
	return out
}

// waitStatus waits for the VM's run state.
func (v *vm) waitStatus(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for {
		st := v.status(t, ctx)
		if st == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: VM status %q, want %q: %v", v.name, st, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitWrites waits until the VM has completed at least want[disk] writes
// to each disk. When it gives up, onTimeout (if not nil) runs first, to
// record what the other side was doing.
func (v *vm) waitWrites(t *testing.T, ctx context.Context, want map[string]int64, onTimeout func()) {
	t.Helper()
	for {
		stats := v.blockStats(t, ctx)
		done := true
		for d, n := range want {
			if stats[d].WrOperations < n {
				done = false
			}
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			if onTimeout != nil {
				onTimeout()
			}
			t.Fatalf("%s: waiting for %v writes, have %+v: %v", v.name, want, stats, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkGuestHealthy fails the test if the VM is not running, a disk
// reports an I/O error status or failed requests, or the guest console
// shows an I/O error, a panic or the guest writer's exit.
func (v *vm) checkGuestHealthy(t *testing.T, ctx context.Context) {
	t.Helper()
	if st := v.status(t, ctx); st != "running" {
		t.Errorf("%s: VM status %q, want running", v.name, st)
	}
	for disk, st := range v.ioStatus(t, ctx) {
		if st != "" && st != "ok" {
			t.Errorf("%s: disk %s io-status %q, want ok", v.name, disk, st)
		}
	}
	for disk, s := range v.blockStats(t, ctx) {
		if s.Failed() != 0 {
			t.Errorf("%s: disk %s has failed requests: %+v", v.name, disk, s)
		}
	}
	checkConsoleClean(t, v)
}

// consoleTrouble are console lines no guest of a passing test prints: the
// kernel's block layer errors and panics, the guest writer's errors and a
// full disk, and /init's complaints (a module that failed to load, the
// guest writer's exit).
var consoleTrouble = []string{"I/O error", "Kernel panic", "BUG:", "kernel BUG at", "Oops", "list_add corruption",
	"list_del corruption", "general protection fault", "segfault", "WARNING:", "guestwriter: I/O", "disks full", "init: "}

func checkConsoleClean(t *testing.T, v *vm) {
	t.Helper()
	for line := range strings.Lines(v.ConsoleText()) {
		for _, bad := range consoleTrouble {
			if strings.Contains(line, bad) {
				t.Errorf("%s: guest console: %s", v.name, strings.TrimSpace(line))
			}
		}
	}
}

// checkStderrClean fails the test if QEMU reported a block or I/O problem
// on stderr, such as a flush that failed when it quit.
func checkStderrClean(t *testing.T, v *vm) {
	t.Helper()
	for line := range strings.Lines(v.stderr.String()) {
		l := strings.ToLower(line)
		for _, bad := range []string{"error", "fail", "nbd", "flush", "i/o"} {
			if strings.Contains(l, bad) {
				t.Errorf("%s QEMU: %s", v.name, redact(strings.TrimSpace(line)))
				break
			}
		}
	}
}
