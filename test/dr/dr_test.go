package drtest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

var bin string

func TestMain(m *testing.M) { os.Exit(testserver.MainWithBinary(m, &bin)) }

const tokenB = "site-b-admin-token-0123456789abcdef"

// TestShipPromote: site A ships a 3-disk VM to site B through the CLI,
// in full and then as a delta; B's points equal A's byte for byte; B
// promotes the last one into an ordinary volume, after which A's next sync
// finds no target. Bad input is refused with clear errors.
func TestShipPromote(t *testing.T) {
	for _, tool := range []string{"qemu-io", "qemu-img"} {
		testfs.RequireTool(t, tool)
	}
	dir := t.TempDir()
	b := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "b"), NBDTCP: true, Token: tokenB})
	tokFile := filepath.Join(dir, "b.token")
	badTok := filepath.Join(dir, "wrong.token")
	cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "http://" + b.APIAddr, "tokenFile": tokFile},
		{"name": "b-wrong", "url": "http://" + b.APIAddr, "tokenFile": badTok}}})
	cfgFile := filepath.Join(dir, "dr.json")
	for f, data := range map[string][]byte{tokFile: []byte(tokenB + "\n"), cfgFile: cfg, badTok: []byte("not-site-b-s-token-0123456789\n")} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "a"), NBDTCP: true, Args: []string{"--dr-config", cfgFile}})

	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	onA := func(args ...string) string {
		t.Helper()
		out, err := run(append([]string{"--server", "http://" + a.APIAddr}, args...)...)
		if err != nil {
			t.Fatalf("site A: quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	bArgs := []string{"--server", "http://" + b.APIAddr, "--token-file", tokFile}
	onB := func(args ...string) string {
		t.Helper()
		out, err := run(append(bArgs, args...)...)
		if err != nil {
			t.Fatalf("site B: quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	qemu := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	onA("volume", "create", "vm", "--capacity", "64Mi", "--disk", "root=32Mi", "--disk", "data=16Mi", "--disk", "logs=8Mi")
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 20M", a.URI("vm/root"))
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x22 1M 8M", a.URI("vm/data"))
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x33 0 8M", a.URI("vm/logs"))

	// No target yet on B: refused, nothing shipped.
	if out, err := run("--server", "http://"+a.APIAddr, "dr", "sync", "vm", "--site", "b", "--relationship", "db"); err == nil ||
		!strings.Contains(out, "dr target accept") {
		t.Fatalf("a sync to a site with no target: %v\n%s", err, out)
	}
	if out, err := run("--server", "http://"+a.APIAddr, "dr", "sync", "vm", "--site", "nowhere", "--relationship", "db"); err == nil ||
		!strings.Contains(out, "no such DR site") {
		t.Fatalf("a sync to an unknown site: %v\n%s", err, out)
	}
	onB("dr", "target", "accept", "db", "vm-dr")
	if out, err := run(append(bArgs, "dr", "target", "accept", "db2", "vm-dr")...); err == nil || !strings.Contains(out, "exists") {
		t.Fatalf("accepting into an existing volume: %v\n%s", err, out)
	}

	sync := func() api.DRCycle {
		t.Helper()
		var st api.DRCycle
		if err := json.Unmarshal([]byte(onA("-o", "json", "dr", "sync", "vm", "--site", "b", "--relationship", "db")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// A VM cannot write to a target: its source would overwrite it.
	if out, err := run(append(bArgs, "attach", "create", "vm-dr", "vm-node")...); err == nil || !strings.Contains(out, "promote it first") {
		t.Fatalf("a read-write attachment of a DR target: %v\n%s", err, out)
	}
	// B's NBD needs an attachment's token: a read-only one, to compare.
	var att api.Attachment
	if err := json.Unmarshal([]byte(onB("-o", "json", "attach", "create", "vm-dr", "checker", "--mode", "ro")), &att); err != nil {
		t.Fatal(err)
	}
	same := func(st api.DRCycle) {
		t.Helper()
		for _, d := range []string{"root", "data", "logs"} {
			qemu("qemu-img", "compare", "-f", "raw", "-F", "raw", a.URI("vm@"+st.Point.Snapshot+"/"+d),
				b.URI("vm-dr@"+st.Point.Snapshot+"/"+d+"/"+att.Token))
		}
	}
	first := sync()
	if first.Base != "" || first.Changed != 56<<20 || first.Sent != 36<<20 {
		t.Fatalf("first sync: %+v, want every byte (36 MiB of data, the rest zeroes)", first)
	}
	same(first)
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x44 5M 64k", a.URI("vm/root"))
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x55 2M 4k", a.URI("vm/logs"))
	second := sync()
	if second.Base != first.Point.Snapshot || second.Changed != 128<<10 {
		t.Fatalf("second sync after two writes: %+v, want a delta of two 64 KiB granules from %s", second, first.Point.Snapshot)
	}
	same(second)
	list := onB("dr", "target", "list")
	if !strings.Contains(list, "vm-dr") || !strings.Contains(list, second.Point.Snapshot) {
		t.Fatalf("site B's targets:\n%s", list)
	}
	// Another VM of site A cannot overwrite vm's copy on B by naming its
	// relationship; a wrong credential is refused; nothing is written.
	onA("volume", "create", "other", "--capacity", "8Mi", "--disk", "root=4Mi")
	if out, err := run("--server", "http://"+a.APIAddr, "dr", "sync", "other", "--site", "b", "--relationship", "db"); err == nil ||
		!strings.Contains(out, "--replace") {
		t.Fatalf("another VM's sync into vm's target: %v\n%s", err, out)
	}
	if out, err := run("--server", "http://"+a.APIAddr, "dr", "sync", "vm", "--site", "b-wrong", "--relationship", "db"); err == nil ||
		!strings.Contains(strings.ToLower(out), "token") {
		t.Fatalf("a sync with a wrong credential: %v\n%s", err, out)
	}
	if list := onB("dr", "target", "list"); !strings.Contains(list, second.Point.Snapshot) {
		t.Fatalf("site B's target after refused syncs:\n%s", list)
	}
	same(second)

	// B takes over at the last point; A's next sync finds no target.
	onB("dr", "target", "promote", "db")
	for _, d := range []string{"root", "data", "logs"} {
		qemu("qemu-img", "compare", "-f", "raw", "-F", "raw", a.URI("vm@"+second.Point.Snapshot+"/"+d), b.URI("vm-dr/"+d+"/"+att.Token))
	}
	if out, err := run("--server", "http://"+a.APIAddr, "dr", "sync", "vm", "--site", "b", "--relationship", "db"); err == nil {
		t.Fatalf("a sync after the target was promoted succeeded:\n%s", out)
	}
	// A token of site B is needed for B's DR routes.
	if out, err := run("--server", "http://"+b.APIAddr, "dr", "target", "list"); err == nil {
		t.Fatalf("site B's targets without its token:\n%s", out)
	}
}
