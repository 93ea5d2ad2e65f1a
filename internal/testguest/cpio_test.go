package testguest

import (
	"bytes"
	"os/exec"
	"regexp"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestCPIOWriterReadByGNUcpio checks the initramfs writer against an
// independent reader, GNU cpio: every entry listed with its type,
// permissions, size, symlink target or device numbers, and a file's
// contents extracted intact.
func TestCPIOWriterReadByGNUcpio(t *testing.T) {
	testfs.RequireTool(t, "cpio")
	var archive bytes.Buffer
	w := NewCPIOWriter(&archive)
	w.Dir("bin")
	w.File("bin/hello", 0o755, []byte("hello, initramfs\n")) // 17 bytes: exercises the padding
	w.Symlink("bin/sh", "busybox")
	w.Dir("dev")
	w.CharDevice("dev/console", 0o600, 5, 1)
	w.File("odd-name-length.txt", 0o644, []byte("x"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	list := exec.Command("cpio", "-itv", "--quiet")
	list.Stdin = bytes.NewReader(archive.Bytes())
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -itv: %v\n%s", err, out)
	}
	for _, want := range []string{
		`(?m)^drwxr-xr-x\s+2 root\s+root\s+0 .* bin$`,
		`(?m)^-rwxr-xr-x\s+1 root\s+root\s+17 .* bin/hello$`,
		`(?m)^lrwxrwxrwx\s+1 root\s+root\s+7 .* bin/sh -> busybox$`,
		`(?m)^drwxr-xr-x\s+2 root\s+root\s+0 .* dev$`,
		`(?m)^crw-------\s+1 root\s+root\s+5,\s+1 .* dev/console$`,
		`(?m)^-rw-r--r--\s+1 root\s+root\s+1 .* odd-name-length.txt$`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("cpio -itv shows no line matching %s:\n%s", want, out)
		}
	}
	if n := bytes.Count(out, []byte("\n")); n != 6 {
		t.Errorf("cpio -itv lists %d entries, want 6:\n%s", n, out)
	}

	extract := exec.Command("cpio", "-i", "--to-stdout", "--quiet", "bin/hello")
	extract.Stdin = bytes.NewReader(archive.Bytes())
	got, err := extract.Output()
	if err != nil {
		t.Fatalf("cpio -i --to-stdout bin/hello: %v", err)
	}
	if string(got) != "hello, initramfs\n" {
		t.Errorf("bin/hello extracted as %q", got)
	}
}
