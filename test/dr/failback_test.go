package drtest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const tokenA = "site-a-admin-token-0123456789abcdef"

// TestFailback, through the CLI between two servers that each name the
// other as a DR site: A ships to B; B is promoted (A lost) and both write;
// A, back, is demoted; B's sync to A ships only what B changed since the
// last common point, and the two are then equal byte for byte.
func TestFailback(t *testing.T) {
	for _, tool := range []string{"qemu-io", "qemu-img"} {
		testfs.RequireTool(t, tool)
	}
	dir := t.TempDir()
	toA, toB := newLink(t, ""), newLink(t, "")
	for name, cfg := range map[string]map[string]any{
		"a.json": {"sites": []map[string]any{{"name": "b", "url": "http://" + toB.ln.Addr().String(), "tokenFile": filepath.Join(dir, "b.token")}}},
		"b.json": {"sites": []map[string]any{{"name": "a", "url": "http://" + toA.ln.Addr().String(), "tokenFile": filepath.Join(dir, "a.token")}}},
	} {
		data, _ := json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for f, tok := range map[string]string{"a.token": tokenA, "b.token": tokenB} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "a"), NBDTCP: true, Token: tokenA,
		Args: []string{"--dr-config", filepath.Join(dir, "a.json")}})
	b := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "b"), NBDTCP: true, Token: tokenB,
		Args: []string{"--dr-config", filepath.Join(dir, "b.json")}})
	toA.to.Store(&a.APIAddr)
	toB.to.Store(&b.APIAddr)

	on := func(p *testserver.Process, tokFile string) func(args ...string) string {
		return func(args ...string) string {
			t.Helper()
			out, err := exec.Command(bin, append([]string{"--server", "http://" + p.APIAddr, "--token-file", filepath.Join(dir, tokFile)}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("quiver %s on %s: %v\n%s", strings.Join(args, " "), p.APIAddr, err, out)
			}
			return string(out)
		}
	}
	onA, onB := on(a, "a.token"), on(b, "b.token")
	attach := func(onX func(...string) string, vol, node, mode string) api.Attachment {
		t.Helper()
		var att api.Attachment
		if err := json.Unmarshal([]byte(onX("-o", "json", "attach", "create", vol, node, "--mode", mode)), &att); err != nil {
			t.Fatal(err)
		}
		return att
	}
	write := func(uri string, pattern byte, off, n string) {
		t.Helper()
		if out, err := exec.Command("qemu-io", "-f", "raw", "-c", fmt.Sprintf("write -P %d %s %s", pattern, off, n), uri).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io %s: %v\n%s", uri, err, out)
		}
	}
	sync := func(onX func(...string) string, vol, site string) api.DRCycle {
		t.Helper()
		var st api.DRCycle
		if err := json.Unmarshal([]byte(onX("-o", "json", "dr", "sync", vol, "--site", site, "--relationship", "db")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	onA("volume", "create", "vm", "--capacity", "64Mi", "--disk", "root=16Mi", "--disk", "data=8Mi", "--disk", "logs=4Mi")
	w := attach(onA, "vm", "vm-node", "rw")
	write(a.URI("vm/root/"+w.Token), 0x11, "0", "6M")
	write(a.URI("vm/data/"+w.Token), 0x22, "1M", "2M")
	onB("dr", "target", "accept", "db", "vm-dr")
	sync(onA, "vm", "b")
	write(a.URI("vm/logs/"+w.Token), 0x33, "0", "1M")
	common := sync(onA, "vm", "b")

	// A is lost after more writes; B takes over and writes.
	write(a.URI("vm/root/"+w.Token), 0x44, "2M", "128k")
	onB("dr", "target", "promote", "db")
	wb := attach(onB, "vm-dr", "vm-node-b", "rw")
	write(b.URI("vm-dr/data/"+wb.Token), 0x55, "4M", "192k")
	changedEither := int64(128+192) << 10

	// A is back: demoted while its VM still holds it, refused.
	if out, err := exec.Command(bin, "--server", "http://"+a.APIAddr, "--token-file", filepath.Join(dir, "a.token"),
		"dr", "demote", "vm", "--relationship", "db").CombinedOutput(); err == nil || !strings.Contains(string(out), "detach it first") {
		t.Fatalf("demote with a VM attached: %v\n%s", err, out)
	}
	onA("attach", "delete", "vm", w.ID)
	onA("dr", "demote", "vm", "--relationship", "db")
	back := sync(onB, "vm-dr", "a")
	if back.Base != common.Point.Snapshot || back.Sent+back.Zeroed == 0 || back.Sent+back.Zeroed > changedEither*12/10 {
		t.Fatalf("the sync back: %+v, want a delta from %s of at most 1.2 x %d bytes", back, common.Point.Snapshot, changedEither)
	}
	ra, rb := attach(onA, "vm", "checker", "ro"), attach(onB, "vm-dr", "checker", "ro")
	for _, d := range []string{"root", "data", "logs"} {
		if out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", a.URI("vm@"+back.Point.Snapshot+"/"+d+"/"+ra.Token),
			b.URI("vm-dr@"+back.Point.Snapshot+"/"+d+"/"+rb.Token)).CombinedOutput(); err != nil {
			t.Fatalf("disk %s after the failback: %v\n%s", d, err, out)
		}
	}
}
