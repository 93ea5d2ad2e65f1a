package main

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// decodeCaps reads a security.capability value of revision 2, the way the
// kernel does (get_vfs_caps_from_disk).
func decodeCaps(b []byte) (fileCaps, error) {
	if len(b) != 20 {
		return fileCaps{}, fmt.Errorf("security.capability of %d bytes, want 20 (revision 2)", len(b))
	}
	magic := binary.LittleEndian.Uint32(b[0:])
	if magic&^vfsCapEffective != vfsCapRevision2 {
		return fileCaps{}, fmt.Errorf("security.capability magic %#x, want revision 2 (%#x)", magic, vfsCapRevision2)
	}
	word := func(off int) uint64 { return uint64(binary.LittleEndian.Uint32(b[off:])) }
	return fileCaps{effective: magic&vfsCapEffective != 0,
		permitted:   word(4) | word(12)<<32,
		inheritable: word(8) | word(16)<<32}, nil
}

func TestParseCaps(t *testing.T) {
	const (
		bind     = 1 << 10
		netAdmin = 1 << 12
		sysAdmin = 1 << 21
		nice     = 1 << 23
		resource = 1 << 24
		bpf      = 1 << 39
	)
	for _, tc := range []struct {
		in   string
		want fileCaps
	}{
		{"cap_net_bind_service+ep", fileCaps{permitted: bind, effective: true}},
		{"cap_net_bind_service=ep", fileCaps{permitted: bind, effective: true}},
		{"cap_sys_admin,cap_net_admin+p", fileCaps{permitted: sysAdmin | netAdmin}},
		{"cap_sys_nice,cap_sys_resource+eip", fileCaps{permitted: nice | resource, inheritable: nice | resource, effective: true}},
		{"CAP_SYS_NICE+i", fileCaps{inheritable: nice}},
		{"cap_bpf+ep", fileCaps{permitted: bpf, effective: true}},
		{"10,21+p", fileCaps{permitted: bind | sysAdmin}},
		{"63+p", fileCaps{permitted: 1 << 63}},
	} {
		got, err := parseCaps(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseCaps(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := decodeCaps(got.xattr()); err != nil || back != got {
			t.Errorf("%q: the xattr decodes to %+v, %v; want %+v", tc.in, back, err, got)
		}
	}
	for _, bad := range []string{"", "cap_net_bind_service", "cap_net_bind_service+", "cap_nope+ep", "64+p",
		"cap_sys_admin+x", "+ep", "cap_sys_admin,+p", "cap_sys_admin+e"} {
		if got, err := parseCaps(bad); err == nil {
			t.Errorf("parseCaps(%q) = %+v, want an error", bad, got)
		}
	}
}

// TestCapXattrBytes: the value is struct vfs_cap_data of revision 2, as
// setcap writes it: cap_net_bind_service+ep is magic 0x02000001, bit 10
// of the low permitted word, nothing else.
func TestCapXattrBytes(t *testing.T) {
	c, err := parseCaps("cap_net_bind_service+ep")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x01, 0, 0, 0x02, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if got := c.xattr(); string(got) != string(want) {
		t.Errorf("xattr % x, want % x", got, want)
	}
}

// buildImage runs the command's parse and build on args (with -o and -tag
// added) and returns the image's last layer as a tar reader.
func buildImage(t *testing.T, args ...string) *tar.Reader {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	o, err := parse(append(args, "-tag", "test/caps:v1", "-o", out))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := build(o); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return tar.NewReader(rc)
}

// writeFiles makes files of the given names in a new directory, each
// holding its name.
func writeFiles(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestCapInLayer: the file -cap names carries its capabilities in the
// layer's tar as the PAX record SCHILY.xattr.security.capability, which
// decodes to the sets asked for; the other files carry none.
func TestCapInLayer(t *testing.T) {
	src := writeFiles(t, "monitor", "launcher", "admin")
	tr := buildImage(t,
		"-add", src+"/monitor:/usr/bin/virt-launcher-monitor",
		"-add", src+"/launcher:/usr/bin/virt-launcher",
		"-add", src+"/admin:/usr/sbin/admin",
		"-cap", "/usr/bin/virt-launcher-monitor=cap_net_bind_service+ep",
		"-cap", "/usr/sbin/admin=cap_sys_admin,cap_net_admin,cap_bpf=p")
	want := map[string]fileCaps{
		"usr/bin/virt-launcher-monitor": {permitted: 1 << 10, effective: true},
		"usr/sbin/admin":                {permitted: 1<<21 | 1<<12 | 1<<39},
	}
	seen := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		v, has := h.PAXRecords[paxCapability]
		w, wants := want[h.Name]
		switch {
		case wants && !has:
			t.Errorf("%s: no %s record; records %q", h.Name, paxCapability, h.PAXRecords)
		case !wants && has:
			t.Errorf("%s: has capabilities % x, want none", h.Name, v)
		case wants:
			seen++
			got, err := decodeCaps([]byte(v))
			if err != nil || got != w {
				t.Errorf("%s: capabilities %+v (%v), want %+v", h.Name, got, err, w)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("%d files with capabilities in the layer, want %d", seen, len(want))
	}
}

func TestCapFlagErrors(t *testing.T) {
	src := writeFiles(t, "f")
	for _, tc := range []struct{ name, cap, want string }{
		{"no such -add", "/usr/bin/g=cap_sys_admin+ep", "no -add puts a file"},
		{"bad capability", "/usr/bin/f=cap_nope+ep", "neither a capability's name"},
		{"no =", "/usr/bin/f", "must be DEST=CAPS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse([]string{"-add", src + "/f:/usr/bin/f", "-cap", tc.cap, "-tag", "t:v", "-o", "x.tar"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("-cap %s: %v, want an error saying %q", tc.cap, err, tc.want)
			}
		})
	}
	_, err := parse([]string{"-add", src + "/f:/usr/bin/f", "-cap", "/usr/bin/f=cap_sys_admin+ep",
		"-cap", "/usr/bin/f=cap_net_admin+ep", "-tag", "t:v", "-o", "x.tar"})
	if err == nil || !strings.Contains(err.Error(), "has capabilities already") {
		t.Errorf("two -cap of one file: %v, want an error", err)
	}
}

// needCapTools skips unless the test runs as root with setcap, getcap and
// GNU tar: .ci/run does not run this module's tests, so nothing forces
// them there.
func needCapTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"setcap", "getcap", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (libcap2-bin, tar): %v", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root may set security.capability")
	}
}

// TestCapExtractedByTar: GNU tar, extracting the layer as root with
// --xattrs, gives the file the capabilities -cap asked for, as getcap
// reads them from the file.
func TestCapExtractedByTar(t *testing.T) {
	needCapTools(t)
	src := writeFiles(t, "monitor")
	tr := buildImage(t, "-add", src+"/monitor:/usr/bin/virt-launcher-monitor",
		"-cap", "/usr/bin/virt-launcher-monitor=cap_net_bind_service+ep")
	// Copy the layer into a file for tar to read.
	layer := filepath.Join(t.TempDir(), "layer.tar")
	f, err := os.Create(layer)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if out, err := exec.Command("tar", "--xattrs", "--xattrs-include=security.*", "-xf", layer, "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	bin := filepath.Join(root, "usr/bin/virt-launcher-monitor")
	out, err := exec.Command("getcap", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("getcap: %v\n%s", err, out)
	}
	if want := bin + " cap_net_bind_service=ep"; strings.TrimSpace(string(out)) != want {
		t.Errorf("getcap says %q, want %q", strings.TrimSpace(string(out)), want)
	}
}

// TestCapNamesAsSetcap: for every name capNumbers knows, the value -cap
// writes is byte for byte what setcap writes for it, read back from the
// file; setcap is the oracle of the names' numbers and of the format.
func TestCapNamesAsSetcap(t *testing.T) {
	needCapTools(t)
	file := filepath.Join(writeFiles(t, "f"), "f")
	for name := range capNumbers {
		for _, text := range []string{name + "+ep", name + "+i"} {
			if out, err := exec.Command("setcap", text, file).CombinedOutput(); err != nil {
				t.Errorf("setcap %s: %v: %s", text, err, out)
				continue
			}
			buf := make([]byte, 64)
			n, err := syscall.Getxattr(file, "security.capability", buf)
			if err != nil {
				t.Fatalf("getxattr after setcap %s: %v", text, err)
			}
			c, err := parseCaps(text)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.xattr(); string(got) != string(buf[:n]) {
				t.Errorf("%s: -cap writes % x, setcap % x", text, got, buf[:n])
			}
		}
	}
}
