package security

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const testToken = "security-test-token-0123456789abcdef"

// nobody runs a command as uid and gid 65534 with no supplementary groups.
func nobody(name string, args ...string) *exec.Cmd {
	return exec.Command("setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups", name}, args...)...)
}

// publicDir returns a fresh directory that every user may enter (t.TempDir
// is 0700), so that only the modes quiver sets decide what uid 65534 may do.
func publicDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qvsec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// poolDigest hashes every file of the pool (name, mode, content), so that
// any change a refused request made would show. The audit log is left out:
// recording every refusal there is its job (docs/security.md, "Audit
// log"; internal/apiserver's TestAuditLog checks what it records).
func poolDigest(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "audit" && filepath.Dir(path) == filepath.Clean(dir) {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := path + " " + info.Mode().String()
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			line += " " + hex.EncodeToString(h.Sum(nil))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestLocalUsers: with --token-file, uid 65534 on the same machine can do
// nothing: not over the loopback API, not over loopback NBD, not over the
// API or NBD unix sockets (mode 0600). Root with the token, the positive
// control, can. Every image and manifest is 0600, so the files themselves
// are closed to it too.
func TestLocalUsers(t *testing.T) {
	testfs.RequireRoot(t)
	for _, tool := range []string{"setpriv", "qemu-io", "nbdinfo"} {
		testfs.RequireTool(t, tool)
	}
	pub := publicDir(t)
	bin := filepath.Join(pub, "quiver")
	copyFile(t, quiverBin, bin, 0o755)
	pool := filepath.Join(pub, "pool")
	apiSock, nbdSock := filepath.Join(pub, "api.sock"), filepath.Join(pub, "nbd.sock")
	srv := testserver.StartT(t, bin, testserver.Options{Pool: pool, NBDTCP: true, NBDSocket: nbdSock,
		Token: testToken, Args: []string{"--api-socket", apiSock}})
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm1", Capacity: 64 << 20,
		Disks: []api.DiskSpec{{Name: "root", Size: 16 << 20}}}); err != nil {
		t.Fatal(err)
	}
	att, err := srv.API.Attach(ctx, "vm1", api.AttachmentSpec{Node: "worker-1", Mode: "rw"})
	if err != nil {
		t.Fatal(err)
	}
	// The real writer writes, so the volume has a writer to fence.
	rootURI := srv.URI("vm1/root/" + att.Token)
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 64k", rootURI).CombinedOutput(); err != nil {
		t.Fatalf("the attachment's own write: %v\n%s", err, out)
	}
	for _, m := range []string{"*.img", "*.json"} {
		files, _ := filepath.Glob(filepath.Join(pool, "volumes", "vm1", m))
		disks, _ := filepath.Glob(filepath.Join(pool, "volumes", "vm1", "disks", m))
		for _, f := range append(files, disks...) {
			if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v (%v), want 0600", f, st.Mode().Perm(), err)
			}
		}
	}
	before := poolDigest(t, pool)
	vol, _ := srv.API.GetVolume(ctx, "vm1")
	tcp := "http://" + srv.APIAddr
	sock := "unix://" + apiSock
	cli := func(server string, args ...string) []string {
		return append([]string{bin, "--server", server, "-o", "json"}, args...)
	}
	var cmds [][]string
	for _, server := range []string{tcp, sock} {
		cmds = append(cmds,
			cli(server, "volume", "list"),
			cli(server, "volume", "get", "vm1"),
			cli(server, "attach", "list", "vm1"),
			cli(server, "attach", "create", "vm1", "intruder"),
			cli(server, "attach", "writer", "vm1", att.ID), // fence
			cli(server, "attach", "delete", "vm1", att.ID),
			cli(server, "volume", "delete", "vm1"),
			cli(server, "snapshot", "create", "vm1", "stolen"),
		)
	}
	nbdSockURI := func(export string) string { return "nbd+unix:///" + export + "?socket=" + nbdSock }
	for _, uri := range []string{srv.URI("vm1/root"), nbdSockURI("vm1/root"), srv.URI("vm1/root/" + strings.Repeat("0", 64))} {
		cmds = append(cmds,
			[]string{"qemu-io", "-f", "raw", "-c", "read -v 0 512", uri},
			[]string{"qemu-io", "-f", "raw", "-c", "write -P 0xee 0 4k", uri},
			[]string{"nbdinfo", uri},
		)
	}
	cmds = append(cmds, []string{"nbdinfo", "--list", "nbd://" + srv.NBDAddr}, []string{"nbdinfo", "--list", nbdSockURI("")})
	for _, f := range []string{filepath.Join(pool, "volumes", "vm1", "disks", "root.img"), filepath.Join(pool, "volumes", "vm1", "volume.json")} {
		cmds = append(cmds, []string{"cat", f}, []string{"dd", "if=/dev/zero", "of=" + f, "bs=512", "count=1", "conv=notrunc"})
	}
	for _, c := range cmds {
		out, err := nobody(c[0], c[1:]...).CombinedOutput()
		if err == nil {
			t.Errorf("as uid 65534: %s succeeded:\n%s", strings.Join(c, " "), out)
		} else {
			t.Logf("as uid 65534: %s: refused (%v): %s", strings.Join(c, " "), err, firstLine(out))
		}
		if strings.Contains(string(out), att.Token) {
			t.Errorf("as uid 65534: %s: output holds the attachment token", strings.Join(c, " "))
		}
	}
	time.Sleep(200 * time.Millisecond) // let the server finish any refused connection
	if after := poolDigest(t, pool); after != before {
		t.Errorf("the pool changed under refused requests:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if v, err := srv.API.GetVolume(ctx, "vm1"); err != nil || v.Writer != vol.Writer {
		t.Errorf("volume after the attempts: %+v, %v; writer was %+v", v.Writer, err, vol.Writer)
	}
	atts, err := srv.API.ListAttachments(ctx, "vm1")
	if err != nil || len(atts) != 1 || atts[0].ID != att.ID || atts[0].Fenced {
		t.Errorf("attachments after the attempts: %+v, %v; want only %s, not fenced", atts, err, att.ID)
	}

	// Positive controls: root, with the token where one is needed, can.
	tokenFile := filepath.Clean(pool) + ".token"
	for _, c := range [][]string{
		{bin, "--server", tcp, "--token-file", tokenFile, "volume", "list"},
		{bin, "--server", sock, "volume", "list"}, // the socket needs no token
		{"qemu-io", "-f", "raw", "-c", "read -P 0x5a 0 64k", rootURI},
		{"qemu-io", "-f", "raw", "-c", "read -P 0x5a 0 64k", nbdSockURI("vm1/root/" + att.Token)},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Errorf("as root: %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	c, err := client.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := c.ListVolumes(ctx, ""); err != nil || len(list) != 1 {
		t.Errorf("volume list over the socket as root: %v, %v", list, err)
	}
	for _, s := range []string{apiSock, nbdSock} {
		if st, err := os.Stat(s); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", s, st.Mode().Perm(), err)
		}
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}
