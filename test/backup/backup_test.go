package backup

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/tests3"
	"github.com/quiverstorage/quiver/internal/testserver"
)

var bin string

func TestMain(m *testing.M) { os.Exit(testserver.MainWithBinary(m, &bin)) }

func TestBackupRestoreVerifyThroughTheCLI(t *testing.T) {
	for _, tool := range []string{"qemu-io", "qemu-img"} {
		testfs.RequireTool(t, tool)
	}
	ctx := context.Background()
	env := startWithBackups(t)
	s3, srv, cli2 := env.s3, env.srv, env.cli2
	if out, err := exec.Command(bin, "backup", "key", "generate", env.keyFile).CombinedOutput(); err == nil || !strings.Contains(string(out), "never overwritten") {
		t.Fatalf("a second key over the first: %v %s", err, out)
	}
	cli2("volume", "create", "vm", "--capacity", "128Mi", "--disk", "root=64Mi", "--disk", "data=32Mi", "--disk", "logs=16Mi")
	qio := func(export, cmd string) {
		t.Helper()
		if out, err := exec.Command("qemu-io", "-f", "raw", "-c", cmd, srv.URI(export)).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io %s %q: %v\n%s", export, cmd, err, out)
		}
	}
	qio("vm/root", "write -P 0x11 0 40M")
	qio("vm/data", "write -P 0x22 1M 20M")
	qio("vm/logs", "write -P 0x33 0 16M")

	var first, second api.Backup
	if err := json.Unmarshal([]byte(cli2("-o", "json", "backup", "create", "vm")), &first); err != nil {
		t.Fatal(err)
	}
	// About 1% of the VM changes.
	qio("vm/root", "write -P 0x44 10M 512k")
	qio("vm/logs", "write -P 0x55 3M 256k")
	if err := json.Unmarshal([]byte(cli2("-o", "json", "backup", "create", "vm")), &second); err != nil {
		t.Fatal(err)
	}
	if second.Parent != first.ID || second.Stats.BytesRead > 2<<20 || first.Stats.BytesRead != 112<<20 {
		t.Fatalf("first read %d bytes; second (parent %q, want %s) read %d", first.Stats.BytesRead, second.Parent, first.ID,
			second.Stats.BytesRead)
	}
	list := cli2("backup", "list", "vm")
	if !strings.Contains(list, first.ID) || !strings.Contains(list, second.ID) || !strings.Contains(list, "incremental") {
		t.Fatalf("backup list:\n%s", list)
	}
	cli2("backup", "verify", second.ID)
	cli2("backup", "restore", second.ID, "vm-restored")
	for _, d := range []string{"root", "data", "logs"} {
		if out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", srv.URI("vm/"+d),
			srv.URI("vm-restored/"+d)).CombinedOutput(); err != nil {
			t.Fatalf("restored disk %s differs from the volume: %v\n%s", d, err, out)
		}
	}
	// The backup served straight from the store over NBD, read-only: the
	// same bytes as the restored volume, zero blocks as holes.
	for _, d := range []string{"root", "data", "logs"} {
		if out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", srv.URI("backup:"+second.ID+"/"+d),
			srv.URI("vm-restored/"+d)).CombinedOutput(); err != nil {
			t.Fatalf("backup export of disk %s differs from its restore: %v\n%s", d, err, out)
		}
	}
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x66 0 4k", srv.URI("backup:"+second.ID+"/root")).CombinedOutput(); err == nil {
		t.Fatalf("a write to a backup export succeeded:\n%s", out)
	}
	if out, err := exec.Command("qemu-io", "-r", "-f", "raw", "-c", "read -P 0 30M 1M", srv.URI("backup:offsite:"+first.ID+"/data")).CombinedOutput(); err != nil ||
		strings.Contains(string(out), "Pattern verification failed") {
		t.Fatalf("a hole of the first backup's data disk: %v\n%s", err, out)
	}

	// One disk, from the first backup: it holds the first point.
	cli2("backup", "restore", first.ID, "root-only", "--disk", "root")
	if out, err := exec.Command("qemu-io", "-r", "-f", "raw", "-c", "read -P 0x11 10M 512k", srv.URI("root-only/root")).CombinedOutput(); err != nil {
		t.Fatalf("first backup's root: %v\n%s", err, out)
	}

	// A schedule: shown on the volume, in backup status and in the metrics.
	cli2("volume", "policy", "vm", "--backup-every", "1h", "--keep-last", "24", "--keep-daily", "7")
	var vol api.Volume
	if err := json.Unmarshal([]byte(cli2("-o", "json", "volume", "get", "vm")), &vol); err != nil {
		t.Fatal(err)
	}
	if vol.BackupPolicy == nil || vol.BackupPolicy.Every != "1h0m0s" || vol.BackupPolicy.KeepDaily != 7 {
		t.Fatalf("volume's policy: %+v", vol.BackupPolicy)
	}
	status := cli2("backup", "status")
	if !strings.Contains(status, second.ID) || !strings.Contains(status, "1h0m0s") || !strings.Contains(status, " ok ") {
		t.Fatalf("backup status:\n%s", status)
	}
	if out, err := exec.Command(bin, "--server", "http://"+srv.APIAddr, "volume", "policy", "vm", "--backup-every", "10s").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "between 1m") {
		t.Fatalf("a schedule under a minute: %v %s", err, out)
	}
	metrics := curl(t, "http://"+srv.APIAddr+"/metrics")
	if !strings.Contains(metrics, `quiver_backup_policy_interval_seconds{target="offsite",volume="vm"} 3600`) ||
		!strings.Contains(metrics, `quiver_backup_overdue{target="offsite",volume="vm"} 0`) {
		t.Fatalf("backup metrics missing:\n%s", grepLines(metrics, "quiver_backup"))
	}

	// A damaged pack: verify names it and fails.
	var victim string
	err := s3Objects(t, s3, "quiver/packs/", func(k string) { victim = k })
	if err != nil || victim == "" {
		t.Fatalf("no pack in the store: %v", err)
	}
	s3.Corrupt(t, victim)
	id := victim[strings.LastIndexByte(victim, '/')+1:]
	bad := 0
	for _, b := range []api.Backup{first, second} {
		out, err := exec.Command(bin, "--server", "http://"+srv.APIAddr, "backup", "verify", b.ID).CombinedOutput()
		if err != nil {
			bad++
			if !strings.Contains(string(out), id) {
				t.Errorf("verify of a damaged backup does not name pack %s:\n%s", id, out)
			}
		}
	}
	if bad == 0 {
		t.Fatalf("verify passes with pack %s damaged", id)
	}
	_ = ctx
}

// s3Objects calls fn with every key under prefix in the S3 server's bucket.
func s3Objects(t *testing.T, s3 *tests3.Server, prefix string, fn func(string)) error {
	t.Helper()
	return s3.List(prefix, fn)
}

func curl(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
