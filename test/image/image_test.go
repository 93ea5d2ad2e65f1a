package image

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// podman runs podman as root on this machine: runc with the cgroupfs
// manager, storage of its own in dir (nothing left in the host's), no
// network; explicit limits, since the machine lacks CAP_SYS_RESOURCE.
type podman struct {
	t   *testing.T
	dir string
}

func (p podman) cmd(args ...string) *exec.Cmd {
	global := []string{"--root", filepath.Join(p.dir, "storage"), "--runroot", filepath.Join(p.dir, "run"),
		"--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"}
	return exec.Command("podman", append(global, args...)...)
}

// run runs podman and returns its standard output; a failure ends the test.
func (p podman) run(args ...string) string {
	p.t.Helper()
	out, err := p.cmd(args...).Output()
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, out, stderrOf(err))
	}
	return string(out)
}

// container runs image with entrypoint and args in a new container.
func (p podman) container(image, entrypoint string, args ...string) string {
	p.t.Helper()
	return p.run(append([]string{"run", "--rm", "--network", "none",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
		"--entrypoint", entrypoint, image}, args...)...)
}

// TestImage builds the quiver image with `make image`, loads it into podman
// and runs it: `quiver version` prints the version of the tag, which is the
// image's version label too; nbdfuse runs; the other programs the CSI node
// plugin, device agent and endpoint exec are there. The assembling program
// then makes a one-layer image of the static quiver alone, which runs too.
func TestImage(t *testing.T) {
	testfs.RequireRoot(t)
	for _, tool := range []string{"make", "mmdebstrap", "podman", "runc"} {
		testfs.RequireTool(t, tool)
	}
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	tarball := filepath.Join(tmp, "quiver.tar")
	mk := exec.Command("make", "-C", repoRoot(t), "image", "IMAGE_TAR="+tarball, "IMAGE_WORK="+work)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}

	a := readArchive(t, tarball)
	if len(a.tags) != 1 || !strings.HasPrefix(a.tags[0], "quiver:") {
		t.Fatalf("tags %q: want one, quiver:VERSION", a.tags)
	}
	tag := a.tags[0]
	version := strings.TrimPrefix(tag, "quiver:")

	p := podman{t: t, dir: filepath.Join(tmp, "podman")}
	t.Cleanup(func() {
		// Removes the images and unmounts what the storage still holds,
		// so that the temporary directory can go.
		if out, err := p.cmd("system", "reset", "--force").CombinedOutput(); err != nil {
			t.Logf("podman system reset: %v\n%s", err, out)
		}
	})
	p.run("load", "-i", tarball)
	label := p.run("image", "inspect", "--format", `{{index .Labels "org.opencontainers.image.version"}}`, tag)
	if strings.TrimSpace(label) != version {
		t.Errorf("label org.opencontainers.image.version %q, tag %s", strings.TrimSpace(label), tag)
	}
	if out := p.container(tag, "/usr/bin/quiver", "version"); !strings.Contains(out, "Client version:  "+version+"\n") {
		t.Errorf("quiver version in %s:\n%s\nwant Client version: %s", tag, out, version)
	}
	if out := p.container(tag, "nbdfuse", "--version"); !strings.HasPrefix(out, "nbdfuse ") {
		t.Errorf("nbdfuse --version in %s: %q", tag, out)
	}
	// What Block mode and the mounts exec besides nbdfuse
	// (build/image/rootfs.sh), and the system roots.
	check := `for p in fusermount3 losetup mount umount; do command -v $p >/dev/null || echo "missing $p"; done
test -s /etc/ssl/certs/ca-certificates.crt || echo "missing the system roots"`
	if out := p.container(tag, "/bin/sh", "-c", check); out != "" {
		t.Errorf("in %s: %s", tag, out)
	}

	// A one-layer image of one static binary, as the assembling program
	// makes for sidecars: no root filesystem at all.
	static := filepath.Join(tmp, "static.tar")
	staticTag := "quiver-static:" + version
	cmd := exec.Command(filepath.Join(work, "assemble"), "-add", filepath.Join(work, "quiver")+":/quiver",
		"-entrypoint", "/quiver", "-tag", staticTag, "-o", static)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("assemble %s: %v\n%s", staticTag, err, out)
	}
	p.run("load", "-i", static)
	if out := p.container(staticTag, "/quiver", "version"); !strings.Contains(out, "Client version:  "+version+"\n") {
		t.Errorf("quiver version in %s:\n%s", staticTag, out)
	}
	if _, err := os.Stat(filepath.Join(work, "rootfs.tar")); err != nil {
		t.Errorf("make image left no root filesystem in IMAGE_WORK: %v", err)
	}
}
