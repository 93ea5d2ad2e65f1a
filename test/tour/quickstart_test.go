package tour

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// quickStartScript returns the shell blocks of docs/cluster.md's quick
// start (every ```sh block between "## Quick start" and "### Three
// machines"), in order, as they would be pasted.
func quickStartScript(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n## Quick start\n")
	if !ok {
		t.Fatal("docs/cluster.md has no quick start")
	}
	section, _, ok := strings.Cut(rest, "\n### Three machines\n")
	if !ok {
		t.Fatal("docs/cluster.md's quick start has no three-machine variant after it")
	}
	var blocks []string
	for {
		var block string
		_, section, ok = strings.Cut(section, "```sh\n")
		if !ok {
			break
		}
		block, section, _ = strings.Cut(section, "```")
		blocks = append(blocks, block)
	}
	if len(blocks) < 3 {
		t.Fatalf("the quick start has %d shell blocks", len(blocks))
	}
	return strings.Join(blocks, "")
}

// writeCmd matches the quick start's qemu-io write: its pattern, range
// and export, which the test reads back through every node.
var writeCmd = regexp.MustCompile(`qemu-io -f raw -c 'write -P (0x[0-9a-f]+) (\S+) (\S+)' nbd://[0-9.]+:(\d+)/(\S+)`)

// TestClusterQuickStart runs docs/cluster.md's quick start as a new user
// pastes it: its shell blocks in one bash with set -e, in a fresh directory
// and network namespace (so the default ports are free), the quiver binary
// on PATH. A command that fails stops it and fails the test. Then the
// bytes the quick start wrote are read back through each of the three
// nodes, and the volume must show two copies. Every process it starts is
// killed: the bash's EXIT trap stops the background nodes, and the
// process group is killed at cleanup in case the bash itself was.
func TestClusterQuickStart(t *testing.T) {
	testfs.RequireRoot(t)
	for _, tool := range []string{"bash", "ip", "curl", "qemu-io", "base64"} {
		testfs.RequireTool(t, tool)
	}
	bin := testserver.Binary(t, false)
	dir := t.TempDir()
	quick := quickStartScript(t)
	w := writeCmd.FindStringSubmatch(quick)
	if w == nil {
		t.Fatalf("the quick start writes nothing with qemu-io (want %s):\n%s", writeCmd, quick)
	}
	pattern, offset, length, port, export := w[1], w[2], w[3], w[4], w[5]
	volume, _, _ := strings.Cut(export, "/")

	var script strings.Builder
	fmt.Fprintf(&script, "set -e\nip link set lo up\ncd %q\nexport PATH=%q:$PATH\n", dir, filepath.Dir(bin))
	script.WriteString("trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n")
	script.WriteString("set -x\n")
	script.WriteString(quick)
	script.WriteString("set +x\necho '--- read back through every node'\n")
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(&script, "qemu-io -r -f raw -c 'read -P %s %s %s' nbd://127.0.0.%d:%s/%s\n", pattern, offset, length, i, port, export)
	}
	fmt.Fprintf(&script, "echo '--- volume'\nquiver volume get %s -o json\n", volume)

	ns := fmt.Sprintf("qv-quick-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "bash", "-c", script.String())
	// Its own process group, which the nodes started with & stay in (a
	// shell without job control): killed whole at cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err == nil {
			t.Errorf("processes of the quick start outlived its shell (process group %d): killed", pgid)
		} else if !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kill process group %d: %v", pgid, err)
		}
	})
	err := cmd.Wait()
	t.Logf("the quick start's output:\n%s", out.String())
	if err != nil {
		for i := 1; i <= 3; i++ {
			if log, rerr := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d.log", i))); rerr == nil {
				t.Logf("n%d.log:\n%s", i, testserver.Tail(string(log), 30))
			}
		}
		t.Fatalf("the quick start stopped at a failing command (the last one traced above): %v", err)
	}
	_, got, _ := strings.Cut(out.String(), "--- volume\n")
	var vol struct {
		Replicas int
		Copies   []struct{ Node, State string }
	}
	if err := json.Unmarshal([]byte(got), &vol); err != nil {
		t.Fatalf("volume get -o json: %v\n%s", err, got)
	}
	if vol.Replicas != 2 || len(vol.Copies) != 2 {
		t.Errorf("the volume has replicas %d and copies %+v, want 2 of each", vol.Replicas, vol.Copies)
	}
	for _, c := range vol.Copies {
		if c.State != "in-sync" {
			t.Errorf("copy on %s is %q, want in-sync", c.Node, c.State)
		}
	}
}
