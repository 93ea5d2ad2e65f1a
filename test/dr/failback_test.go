package drtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const tokenA = "site-a-admin-token-0123456789abcdef"

// TestFailback, through the CLI between two servers that each name the
// other as a DR site: A ships to B; B is promoted (A lost) and both write;
// A, back, is demoted; B's sync to A ships only what B changed since the
// last common point, and the two are then equal byte for byte.
// pair is two sites, each a server with its own token that names the
// other as a DR site (through relays), driven through the CLI.
type pair struct {
	t        *testing.T
	dir      string
	a, b     *testserver.Process
	onA, onB func(args ...string) string
}

func newPair(t *testing.T) *pair {
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
	p := &pair{t: t, dir: dir}
	p.a = testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "a"), NBDTCP: true, Token: tokenA,
		Args: []string{"--dr-config", filepath.Join(dir, "a.json")}})
	p.b = testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "b"), NBDTCP: true, Token: tokenB,
		Args: []string{"--dr-config", filepath.Join(dir, "b.json")}})
	toA.to.Store(&p.a.APIAddr)
	toB.to.Store(&p.b.APIAddr)
	p.onA, p.onB = p.on(p.a, "a.token"), p.on(p.b, "b.token")
	return p
}

func (p *pair) on(s *testserver.Process, tokFile string) func(args ...string) string {
	return func(args ...string) string {
		p.t.Helper()
		out, err := exec.Command(bin, append([]string{"--server", "http://" + s.APIAddr, "--token-file", filepath.Join(p.dir, tokFile)}, args...)...).CombinedOutput()
		if err != nil {
			p.t.Fatalf("quiver %s on %s: %v\n%s", strings.Join(args, " "), s.APIAddr, err, out)
		}
		return string(out)
	}
}

func (p *pair) attach(onX func(...string) string, vol, node, mode string) api.Attachment {
	p.t.Helper()
	var att api.Attachment
	if err := json.Unmarshal([]byte(onX("-o", "json", "attach", "create", vol, node, "--mode", mode)), &att); err != nil {
		p.t.Fatal(err)
	}
	return att
}

func (p *pair) write(uri string, pattern byte, off, n string) {
	p.t.Helper()
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", fmt.Sprintf("write -P %d %s %s", pattern, off, n), uri).CombinedOutput(); err != nil {
		p.t.Fatalf("qemu-io %s: %v\n%s", uri, err, out)
	}
}

func (p *pair) sync(onX func(...string) string, vol, site string) api.DRCycle {
	p.t.Helper()
	var st api.DRCycle
	if err := json.Unmarshal([]byte(onX("-o", "json", "dr", "sync", vol, "--site", site, "--relationship", "db")), &st); err != nil {
		p.t.Fatal(err)
	}
	return st
}

func TestFailback(t *testing.T) {
	p := newPair(t)
	a, b, onA, onB := p.a, p.b, p.onA, p.onB
	attach, write, sync := p.attach, p.write, p.sync
	dir := p.dir

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

// TestPlannedMigration (issue 34, acceptance 4): a writer on site A
// writes records into three disks and flushes, keeping the log of what
// each flush made durable; the VM stops; A is demoted (no VM may write it
// from then on), ships its final point and B promotes it. Every flushed
// record is on B, and B's first cycle back ships nothing.
func TestPlannedMigration(t *testing.T) {
	p := newPair(t)
	a, b, onA, onB := p.a, p.b, p.onA, p.onB
	onA("volume", "create", "vm", "--capacity", "64Mi", "--disk", "d0=8Mi", "--disk", "d1=8Mi", "--disk", "d2=8Mi")
	onB("dr", "target", "accept", "db", "vm-dr")
	w := p.attach(onA, "vm", "vm-node", "rw")
	ctx := t.Context()
	var conns [3]*nbdclient.Conn
	for d := range conns {
		c, err := nbdclient.Dial(ctx, a.NBDAddr, fmt.Sprintf("vm/d%d/%s", d, w.Token), nbdclient.Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[d] = c
	}
	// record n: 4 KiB at block n/3 of disk n%3, stamped with n.
	record := func(n int) []byte {
		b := bytes.Repeat([]byte(fmt.Sprintf("record %08d ", n)), 4096/16)
		return b[:4096]
	}
	var flushed []int
	written := 0
	write := func(k int) {
		t.Helper()
		for range k {
			if err := conns[written%3].WriteAt(record(written), int64(written/3)*4096, false); err != nil {
				t.Fatal(err)
			}
			written++
		}
		for _, c := range conns {
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		for n := len(flushed); n < written; n++ {
			flushed = append(flushed, n)
		}
	}
	write(300)
	p.sync(onA, "vm", "b") // a point while the VM runs
	write(300)
	// The migration: the VM stops (its last writes flushed, then it lets
	// go), A is demoted, ships its final point, and B takes over.
	write(17)
	for _, c := range conns {
		c.Close()
	}
	onA("attach", "delete", "vm", w.ID)
	onA("dr", "demote", "vm", "--relationship", "db")
	if out, err := exec.Command(bin, "--server", "http://"+a.APIAddr, "--token-file", filepath.Join(p.dir, "a.token"),
		"attach", "create", "vm", "vm-node").CombinedOutput(); err == nil || !strings.Contains(string(out), "promote it first") {
		t.Fatalf("a read-write attachment of the demoted source: %v\n%s", err, out)
	}
	final := p.sync(onA, "vm", "b")
	onB("dr", "target", "promote", "db")

	ro := p.attach(onB, "vm-dr", "checker", "ro")
	got := [3][]byte{}
	for d := range got {
		c, err := nbdclient.Dial(ctx, b.NBDAddr, fmt.Sprintf("vm-dr/d%d/%s", d, ro.Token), nbdclient.Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got[d] = make([]byte, c.Size())
		err = c.ReadAt(got[d], 0)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range flushed {
		off := (n / 3) * 4096
		if !bytes.Equal(got[n%3][off:off+4096], record(n)) {
			t.Fatalf("record %d, flushed on A before the migration, is not on B", n)
		}
	}
	back := p.sync(onB, "vm-dr", "a")
	if back.Base != final.Point.Snapshot || back.Changed != 0 {
		t.Fatalf("B's first cycle back: %+v, want nothing changed since %s", back, final.Point.Snapshot)
	}
	t.Logf("%d flushed records, all on B after the migration", len(flushed))
}
