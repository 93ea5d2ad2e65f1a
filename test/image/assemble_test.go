package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// inputs writes the inputs of one assembly into dir: a base tarball with a
// directory, a file, a character device and a FIFO, and a program file of
// the given content. Each call dates them at mtime, so two calls differ in
// everything the build machine has but the content.
func inputs(t *testing.T, dir string, program string, mtime time.Time) (base, prog string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "./etc/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: "./etc/os-release", Mode: 0o644, Size: 5},
		{Typeflag: tar.TypeDir, Name: "./dev/", Mode: 0o755},
		{Typeflag: tar.TypeChar, Name: "./dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Typeflag: tar.TypeFifo, Name: "./dev/initctl", Mode: 0o600},
	} {
		h.ModTime = time.Unix(1_000_000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("test\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	base, prog = filepath.Join(dir, "rootfs.tar"), filepath.Join(dir, "program")
	if err := os.WriteFile(base, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, []byte(program), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{base, prog} {
		if err := os.Chtimes(f, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	return base, prog
}

// assemble runs the assembling program and returns what it prints (tag,
// image ID, manifest digest) and the digest of the archive it wrote.
func assemble(t *testing.T, bin string, args ...string) (printed string, fileDigest [32]byte) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=") // -created decides
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderrOf(err))
	}
	o := args[slices.Index(args, "-o")+1]
	data, err := os.ReadFile(o)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), sha256.Sum256(data)
}

func stderrOf(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}

// TestAssembleReproducible: the same inputs, at other paths and with other
// file times, give the same image ID, manifest digest and archive bytes;
// one byte changed in a file gives another image. The image holds the base
// without its device nodes and FIFOs, then the added file owned by root
// with its permission bits and the -created time, and the config given.
func TestAssembleReproducible(t *testing.T) {
	tmp := t.TempDir()
	bin := buildAssemble(t, tmp)
	build := func(name, program string, mtime time.Time) (string, [32]byte) {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		base, prog := inputs(t, dir, program, mtime)
		return assemble(t, bin, "-base", base, "-add", prog+":/usr/bin/program",
			"-entrypoint", "/usr/bin/program", "-entrypoint", "serve",
			"-label", "org.opencontainers.image.version=v1.2.3", "-env", "MODE=test",
			"-created", "1700000000", "-tag", "program:v1.2.3", "-o", filepath.Join(dir, "image.tar"))
	}
	first, firstFile := build("first", "#!/bin/sh\necho one\n", time.Now())
	second, secondFile := build("second", "#!/bin/sh\necho one\n", time.Now().Add(-48*time.Hour))
	if first != second {
		t.Errorf("same inputs, other paths and times: printed\n%s\n%s", first, second)
	}
	if firstFile != secondFile {
		t.Errorf("same inputs, other paths and times: the archives differ")
	}
	changed, _ := build("changed", "#!/bin/sh\necho two\n", time.Now())
	if fields(t, changed)[1] == fields(t, first)[1] {
		t.Errorf("a changed file kept the image ID: %s", changed)
	}

	a := readArchive(t, filepath.Join(tmp, "first", "image.tar"))
	if f := fields(t, first); f[0] != "program:v1.2.3" || !slices.Equal(a.tags, []string{"program:v1.2.3"}) {
		t.Errorf("tag: printed %q, archive %v; want program:v1.2.3", f[0], a.tags)
	}
	c := a.config
	if c.Created != "2023-11-14T22:13:20Z" || c.OS != "linux" || c.Architecture == "" {
		t.Errorf("config: created %q, os %q, architecture %q", c.Created, c.OS, c.Architecture)
	}
	if !slices.Equal(c.Config.Entrypoint, []string{"/usr/bin/program", "serve"}) {
		t.Errorf("entrypoint %q", c.Config.Entrypoint)
	}
	if c.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("labels %v", c.Config.Labels)
	}
	if !slices.Contains(c.Config.Env, "MODE=test") || !slices.ContainsFunc(c.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=/") }) {
		t.Errorf("env %q: want MODE=test and a default PATH", c.Config.Env)
	}
	if len(a.layers) != 2 || len(c.RootFS.DiffIDs) != 2 {
		t.Fatalf("%d layers, %d diff IDs; want 2", len(a.layers), len(c.RootFS.DiffIDs))
	}
	var baseNames []string
	for _, e := range a.layers[0] {
		baseNames = append(baseNames, e.name)
	}
	if want := []string{"./etc/", "./etc/os-release", "./dev/"}; !slices.Equal(baseNames, want) {
		t.Errorf("base layer %q, want %q (no device node, no FIFO)", baseNames, want)
	}
	var added []string
	for _, e := range a.layers[1] {
		added = append(added, e.String())
	}
	want := []string{
		"usr/ type 5 mode 755 owner 0:0 mtime 1700000000",
		"usr/bin/ type 5 mode 755 owner 0:0 mtime 1700000000",
		"usr/bin/program type 0 mode 750 owner 0:0 mtime 1700000000",
	}
	if !slices.Equal(added, want) {
		t.Errorf("added layer:\n%s\nwant\n%s", strings.Join(added, "\n"), strings.Join(want, "\n"))
	}
	if got := a.layers[1][2].data; got != "#!/bin/sh\necho one\n" {
		t.Errorf("added file holds %q", got)
	}
}

// fields splits what the assembling program prints: tag, image ID,
// manifest digest.
func fields(t *testing.T, printed string) []string {
	t.Helper()
	f := strings.Fields(printed)
	if len(f) != 3 || !strings.HasPrefix(f[1], "sha256:") || !strings.HasPrefix(f[2], "sha256:") {
		t.Fatalf("printed %q: want tag, image ID and manifest digest", printed)
	}
	return f
}
