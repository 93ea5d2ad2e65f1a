package migration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	name    string
	cmd     *exec.Cmd
	stderr  *testserver.LogBuffer
	console string
	qmp     *testguest.QMP
	exited  chan struct{}
	werr    error // cmd.Wait's error, set before exited is closed
}

// startVM starts QEMU and connects to its QMP socket. t.Cleanup ends the
// process (quit, then SIGKILL) and, if the test failed, logs the tail of the
// guest console, QEMU's stderr and the QMP events.
func startVM(t *testing.T, ctx context.Context, cfg vmConfig) *vm {
	t.Helper()
	v := &vm{
		name:    cfg.name,
		stderr:  &testserver.LogBuffer{},
		console: filepath.Join(cfg.dir, cfg.name+".console"),
		exited:  make(chan struct{}),
	}
	qmpPath := filepath.Join(cfg.dir, cfg.name+".qmp")
	args := []string{
		"-name", cfg.name,
		// Single-threaded TCG: with QEMU 7.2's default multi-threaded TCG
		// the guest kernel on the destination crashed after about one
		// migration in four (stack corruption, oopses in random places:
		// guest memory the source had changed was not migrated); with
		// thread=single, none did in 16 runs.
		"-machine", envOr("QUIVER_MIGRATION_MACHINE", "pc"), "-accel", "tcg,thread=" + envOr("QUIVER_MIGRATION_TCG_THREAD", "single"),
		"-cpu", "qemu64", "-smp", "1", "-m", envOr("QUIVER_MIGRATION_MEM", fmt.Sprintf("%dK", guestRAM>>10)),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", cfg.guest.kernel.VmlinuzPath(), "-initrd", cfg.guest.initrd,
		"-append", "console=ttyS0 loglevel=4 panic=-1",
		"-serial", "file:" + v.console,
		"-qmp", "unix:" + qmpPath + ",server=on,wait=off",
	}
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
	v.cmd = exec.Command("qemu-system-x86_64", args...)
	v.cmd.Stdout = v.stderr
	v.cmd.Stderr = v.stderr
	// Should the test binary die, QEMU dies with it.
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start %s QEMU: %v", cfg.name, err)
	}
	go func() {
		v.werr = v.cmd.Wait()
		close(v.exited)
	}()
	t.Cleanup(func() {
		v.shutdown()
		if t.Failed() {
			t.Logf("%s: %s", v.name, v.diagnostics())
		}
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := testguest.DialQMP(dctx, qmpPath)
	if err != nil {
		t.Fatalf("%s: %v", cfg.name, err)
	}
	v.qmp = q
	return v
}

// shutdown asks QEMU to quit and kills it (by its PID) if it has not exited
// within 10 s.
func (v *vm) shutdown() {
	select {
	case <-v.exited:
		return
	default:
	}
	if v.qmp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = v.qmp.Execute(ctx, "quit", nil, nil)
		cancel()
	}
	select {
	case <-v.exited:
	case <-time.After(10 * time.Second):
		v.kill()
	}
	if v.qmp != nil {
		_ = v.qmp.Close()
	}
}

// kill ends QEMU with SIGKILL and reaps it.
func (v *vm) kill() {
	_ = v.cmd.Process.Kill()
	<-v.exited
}

// quit ends QEMU through QMP and fails the test unless it exits by itself,
// with status 0, within 20 s.
func (v *vm) quit(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := v.qmp.Execute(ctx, "quit", nil, nil); err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	select {
	case <-v.exited:
		if v.werr != nil {
			t.Fatalf("%s QEMU exited with %v after quit", v.name, v.werr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s QEMU still running 20 s after quit", v.name)
	}
}

func (v *vm) running() bool {
	select {
	case <-v.exited:
		return false
	default:
		return true
	}
}

// consoleText is everything the guest printed on its serial console.
func (v *vm) consoleText() string {
	b, _ := os.ReadFile(v.console)
	return string(b)
}

// diagnostics is what a failure message needs: the tail of the console,
// QEMU's output and the QMP events.
func (v *vm) diagnostics() string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s guest console (tail) ---\n%s\n", v.name, testserver.Tail(v.consoleText(), 100))
	fmt.Fprintf(&b, "--- %s QEMU stderr (tail) ---\n%s\n", v.name, testserver.Tail(v.stderr.String(), 20))
	if v.qmp != nil {
		fmt.Fprintf(&b, "--- %s QMP events ---\n%s\n", v.name, testserver.Tail(strings.Join(v.qmp.Events(), "\n"), 20))
	}
	if !v.running() {
		fmt.Fprintf(&b, "--- %s QEMU exited: %v ---\n", v.name, v.werr)
	}
	return redact(b.String())
}

// waitConsole waits until the guest console contains want, or fails the
// test when ctx ends or QEMU exits first.
func (v *vm) waitConsole(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for !strings.Contains(v.consoleText(), want) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the guest console never showed %q: %v", v.name, want, ctx.Err())
		case <-v.exited:
			t.Fatalf("%s: QEMU exited before the guest console showed %q", v.name, want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// status is QMP query-status's run state: "running", "paused",
// "postmigrate", "inmigrate", "io-error", ...
func (v *vm) status(t *testing.T, ctx context.Context) string {
	t.Helper()
	var st struct {
		Status string `json:"status"`
	}
	if err := v.qmp.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	return st.Status
}

// blockStats are the counters of query-blockstats that the test reads: one
// operation per completed guest request.
type blockStats struct {
	WrOperations          int64 `json:"wr_operations"`
	FailedWrOperations    int64 `json:"failed_wr_operations"`
	FlushOperations       int64 `json:"flush_operations"`
	FailedFlushOperations int64 `json:"failed_flush_operations"`
	RdOperations          int64 `json:"rd_operations"`
	FailedRdOperations    int64 `json:"failed_rd_operations"`
}

func (s blockStats) failed() int64 {
	return s.FailedWrOperations + s.FailedFlushOperations + s.FailedRdOperations
}

// blockStats returns query-blockstats per disk (guestDisks).
func (v *vm) blockStats(t *testing.T, ctx context.Context) map[string]blockStats {
	t.Helper()
	out, err := v.tryBlockStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryBlockStats is blockStats for callers that expect QEMU may be gone (a
// guest that panicked ends its QEMU: -no-reboot).
func (v *vm) tryBlockStats(ctx context.Context) (map[string]blockStats, error) {
	var list []struct {
		NodeName string     `json:"node-name"`
		Stats    blockStats `json:"stats"`
	}
	if err := v.qmp.Execute(ctx, "query-blockstats", nil, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", v.name, err)
	}
	out := map[string]blockStats{}
	for _, e := range list {
		if disk, ok := strings.CutPrefix(e.NodeName, "disk-"); ok {
			out[disk] = e.Stats
		}
	}
	if len(out) != len(guestDisks) {
		return nil, fmt.Errorf("%s: query-blockstats names %d of the %d disks: %+v", v.name, len(out), len(guestDisks), list)
	}
	return out, nil
}

// ioStatus returns query-block's io-status per disk ("ok", "failed",
// "nospace"; QEMU leaves it out for devices that do not track it).
func (v *vm) ioStatus(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	var list []struct {
		QDev     string `json:"qdev"`
		IOStatus string `json:"io-status"`
		Inserted struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := v.qmp.Execute(ctx, "query-block", nil, &list); err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	out := map[string]string{}
	for _, e := range list {
		if disk, ok := strings.CutPrefix(e.Inserted.NodeName, "disk-"); ok {
			out[disk] = e.IOStatus
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
		if s.failed() != 0 {
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
	for line := range strings.Lines(v.consoleText()) {
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

// tail returns the last n lines of s.
