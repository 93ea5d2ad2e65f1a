package fscap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestProbe(t *testing.T) {
	tests := []struct {
		fs   testfs.FS
		want Caps
	}{
		{testfs.OnExt4, Caps{Filesystem: "ext4", CopyFileRange: true, SeekHole: true}},
		{testfs.OnXFS, Caps{Filesystem: "xfs", Reflink: true, CopyFileRange: true, SeekHole: true, ExtentSizeHint: true}},
		{testfs.OnBtrfs, Caps{Filesystem: "btrfs", Reflink: true, CopyFileRange: true, SeekHole: true, BtrfsSubvolumes: true}},
		{testfs.OnTmpfs, Caps{Filesystem: "tmpfs", CopyFileRange: true, SeekHole: true}},
	}
	for _, tc := range tests {
		t.Run(tc.fs.Name, func(t *testing.T) {
			dir := tc.fs.Dir(t)
			got, err := Probe(dir)
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			if got != tc.want {
				t.Errorf("Probe = %+v\nwant    %+v", got, tc.want)
			}
			assertNoProbeFiles(t, dir)
		})
	}
}

// TestProbeTempDir probes whatever holds the test's temporary directory, so
// it only checks what must hold everywhere.
func TestProbeTempDir(t *testing.T) {
	dir := t.TempDir()
	caps, err := Probe(dir)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	t.Logf("%s: %+v", dir, caps)
	if caps.Filesystem == "" {
		t.Error("Filesystem is empty")
	}
	if caps.BtrfsSubvolumes != (caps.Filesystem == "btrfs") {
		t.Errorf("BtrfsSubvolumes = %v on %s", caps.BtrfsSubvolumes, caps.Filesystem)
	}
	assertNoProbeFiles(t, dir)
}

func TestProbeErrors(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(tmp, "missing"), file} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			if caps, err := Probe(dir); err == nil {
				t.Errorf("Probe(%s) = %+v, want an error", dir, caps)
			}
		})
	}
	assertNoProbeFiles(t, tmp)
}

func TestFilesystemName(t *testing.T) {
	tests := []struct {
		magic int64
		want  string
	}{
		{0x58465342, "xfs"},
		{0x9123683e, "btrfs"},
		{-0x6edc97c2, "btrfs"}, // the same magic where statfs's f_type is a signed 32-bit field
		{0xef53, "ext4"},
		{0x01021994, "tmpfs"},
		{0x6969, "nfs"},
		{0x2fc12fc1, "unknown(0x2fc12fc1)"},
	}
	for _, tc := range tests {
		if got := filesystemName(tc.magic); got != tc.want {
			t.Errorf("filesystemName(%#x) = %q, want %q", tc.magic, got, tc.want)
		}
	}
}

func assertNoProbeFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".probe-") {
			t.Errorf("probe file %s left in %s", e.Name(), dir)
		}
	}
}

// A feature whose try fails because the filesystem says it does not offer
// it is missing; one whose try fails for any other reason is unknown, and
// Probe says so with a *ProbeError instead of reporting it missing. Before,
// a FICLONE failing with EIO (anything but ENOSPC) read as "no reflink", and
// a pool on XFS opened without its unshare guard.
func TestProbeTellsUnknownFromMissing(t *testing.T) {
	dir := t.TempDir()
	base, err := newProber(dir).runAndClean("tmp")
	if err != nil {
		t.Fatalf("probe without a failure: %v", err)
	}
	features := []struct {
		name   string
		inject func(p *prober, err error)
		flag   func(c *Caps) *bool
	}{
		{"reflink", func(p *prober, err error) { p.clone = func(*os.File, *os.File) error { return err } },
			func(c *Caps) *bool { return &c.Reflink }},
		{"copyFileRange", func(p *prober, err error) {
			p.copyRange = func(*os.File, *os.File, int64, int64) (int64, error) { return 0, err }
		}, func(c *Caps) *bool { return &c.CopyFileRange }},
		{"seekHole", func(p *prober, err error) {
			p.seek = func(*os.File, int64) (int64, int64, error) { return 0, 0, err }
		}, func(c *Caps) *bool { return &c.SeekHole }},
		{"extentSizeHint", func(p *prober, err error) { p.setHint = func(*os.File, uint32) error { return err } },
			func(c *Caps) *bool { return &c.ExtentSizeHint }},
	}
	unknown := []unix.Errno{unix.EIO, unix.ENOSPC, unix.EDQUOT, unix.ENOMEM, unix.EAGAIN, unix.EROFS, unix.EPERM}
	missing := []unix.Errno{unix.EOPNOTSUPP, unix.ENOTTY, unix.ENOSYS, unix.EXDEV, unix.EINVAL}
	for _, f := range features {
		for _, errno := range append(unknown, missing...) {
			isUnknown := slices.Contains(unknown, errno)
			t.Run(fmt.Sprintf("%s %v", f.name, errno), func(t *testing.T) {
				p := newProber(dir)
				f.inject(p, &os.PathError{Op: f.name, Path: "probe", Err: errno})
				got, err := p.runAndClean("tmp")
				want := base
				*f.flag(&want) = false
				if got != want {
					t.Errorf("caps %+v, want %+v", got, want)
				}
				var pe *ProbeError
				if !isUnknown {
					if err != nil {
						t.Fatalf("the filesystem said %v (not supported): Probe failed with %v, want %s missing", errno, err, f.name)
					}
					return
				}
				if !errors.As(err, &pe) {
					t.Fatalf("%s failing with %v: Probe error %v, want a *ProbeError (%s unknown, not missing)", f.name, errno, err, f.name)
				}
				var wantUnknown Caps
				*f.flag(&wantUnknown) = true
				if pe.Unknown != wantUnknown || !errors.Is(err, errno) || !strings.Contains(err.Error(), f.name) {
					t.Errorf("Probe error %v (unknown %+v), want %s unknown with %v", err, pe.Unknown, f.name, errno)
				}
			})
		}
	}
	t.Run("no probe file", func(t *testing.T) {
		p := newProber(filepath.Join(dir, "missing"))
		got, err := p.runAndClean("btrfs")
		var pe *ProbeError
		if !errors.As(err, &pe) || !errors.Is(err, unix.ENOENT) {
			t.Fatalf("Probe error %v, want a *ProbeError wrapping ENOENT", err)
		}
		want := Caps{Reflink: true, CopyFileRange: true, SeekHole: true, ExtentSizeHint: true}
		if pe.Unknown != want || got != (Caps{Filesystem: "btrfs", BtrfsSubvolumes: true}) {
			t.Errorf("caps %+v, unknown %+v; want only what statfs tells, and every tried feature unknown", got, pe.Unknown)
		}
	})
	assertNoProbeFiles(t, dir)
}

// runAndClean runs the probe and removes its files.
func (p *prober) runAndClean(name string) (Caps, error) {
	defer p.cleanup()
	return p.run(name)
}

// Flags covers every feature of Caps, by its JSON name: the pool keeps
// recorded capabilities flag by flag through it.
func TestCapsFlags(t *testing.T) {
	var c Caps
	flags := c.Flags()
	ct := reflect.TypeOf(c)
	n := 0
	for i := range ct.NumField() {
		field := ct.Field(i)
		if field.Type.Kind() != reflect.Bool {
			continue
		}
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		if n >= len(flags) || flags[n].Name != name {
			t.Fatalf("Flags()[%d] = %+v, want %s", n, flags, name)
		}
		*flags[n].On = true
		if !reflect.ValueOf(c).Field(i).Bool() {
			t.Errorf("flag %s does not point at field %s", name, field.Name)
		}
		n++
	}
	if n != len(flags) {
		t.Errorf("Flags has %d flags, Caps %d", len(flags), n)
	}
}
