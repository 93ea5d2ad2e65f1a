package tour

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/ova"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// tourLines returns the commands of the README's tour: the "$ " lines of
// the first code block after its heading.
func tourLines(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "## A five-minute tour")
	if !ok {
		t.Fatal("README has no tour")
	}
	_, block, _ := strings.Cut(rest, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if cmd, ok := strings.CutPrefix(l, "$ "); ok {
			lines = append(lines, cmd)
		}
	}
	if len(lines) < 10 {
		t.Fatalf("the tour has %d commands", len(lines))
	}
	return lines
}

// fixtures makes what the tour assumes the user has: a disk image to copy
// in, and an OVA out of vSphere.
func fixtures(t *testing.T, dir string) {
	t.Helper()
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	img := filepath.Join(dir, "debian.img")
	run("qemu-img", "create", "-f", "raw", img, "64M")
	run("qemu-io", "-f", "raw", "-c", "write -P 0x42 0 1M", img)
	raw := filepath.Join(t.TempDir(), "legacy.raw")
	run("qemu-img", "create", "-f", "raw", raw, "32M")
	run("qemu-io", "-f", "raw", "-c", "write -P 0x17 1M 1M", raw)
	vmdk := filepath.Join(t.TempDir(), "legacy01-disk1.vmdk")
	run("qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", raw, vmdk)
	disks := []ova.ExportDisk{{Name: "Hard disk 1", File: "legacy01-disk1.vmdk", Capacity: 32 << 20}}
	if err := ova.WriteOVA(filepath.Join(dir, "legacy01.ova"), "legacy01", disks, map[string]string{"legacy01-disk1.vmdk": vmdk}); err != nil {
		t.Fatal(err)
	}
}

// TestREADMETour runs the tour's commands in order in one bash, in a fresh
// directory and network namespace, failing at the first command that
// fails. A line that starts a background job (the server) is followed by
// a wait until the API answers, as a person pasting lines waits.
func TestREADMETour(t *testing.T) {
	testfs.RequireRoot(t)
	for _, tool := range []string{"bash", "ip", "qemu-img", "qemu-io", "nbdinfo", "curl"} {
		testfs.RequireTool(t, tool)
	}
	bin := testserver.Binary(t, false)
	dir := t.TempDir()
	fixtures(t, dir)

	var script strings.Builder
	fmt.Fprintf(&script, "set -e\nip link set lo up\ncd %q\nexport PATH=%q:$PATH\n", dir, filepath.Dir(bin))
	script.WriteString("trap 'kill %1 2>/dev/null; wait' EXIT\n")
	for _, line := range tourLines(t) {
		fmt.Fprintf(&script, "echo %q\n%s\n", "$ "+line, line)
		if strings.HasSuffix(strings.TrimSpace(strings.SplitN(line, "#", 2)[0]), "&") {
			script.WriteString("for i in $(seq 100); do quiver pool info >/dev/null 2>&1 && break; sleep 0.1; done\n")
		}
	}

	ns := fmt.Sprintf("qv-tour-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "bash", "-c", script.String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("the tour's output:\n%s", out.String())
	if err != nil {
		t.Fatalf("the tour stopped at a failing command (the last one printed above): %v", err)
	}
	for _, want := range []string{"web01", "legacy01", "quiver_volume_requests_total"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the tour's output lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "web01.ova")); err != nil {
		t.Errorf("the tour's export made no OVA: %v", err)
	}
}
