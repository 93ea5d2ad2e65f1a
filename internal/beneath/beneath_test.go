package beneath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// layout makes a root with a file, a directory, and links of every kind
// pointing outside it, and an outside directory holding a victim file.
func layout(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "dir"), filepath.Join(root, "dir", "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "dir", "file"), "inside")
	write(filepath.Join(outside, "victim"), "victim")
	for link, target := range map[string]string{
		"dir/linkdir":  outside,
		"dir/linkfile": filepath.Join(outside, "victim"),
		"dir/rellink":  "../../outside/victim",
		"dir/inlink":   "file", // even a link that stays inside is refused
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(outside, "victim"), filepath.Join(root, "dir", "hard")); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func bothResolvers(t *testing.T, f func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			old := noOpenat2
			noOpenat2 = walk
			t.Cleanup(func() { noOpenat2 = old })
			f(t)
		})
	}
}

func TestOpenRefusesEscapes(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, _ := layout(t)
		r, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, tc := range []struct {
			rel  string
			want error // nil: opens
		}{
			{"dir/file", nil},
			{"dir/linkfile", ErrEscape},
			{"dir/rellink", ErrEscape},
			{"dir/inlink", ErrEscape},
			{"dir/linkdir/victim", ErrEscape},
			{"../outside/victim", ErrEscape},
			{"dir/../../outside/victim", ErrEscape},
			{"/etc/passwd", ErrEscape},
			{"dir/missing", fs.ErrNotExist},
			{"dir/hard", nil}, // OpenFile allows it; OpenRegular does not
		} {
			f, err := r.OpenFile(tc.rel, os.O_RDONLY, 0)
			if tc.want == nil {
				if err != nil {
					t.Errorf("OpenFile(%q): %v", tc.rel, err)
					continue
				}
				f.Close()
				continue
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("OpenFile(%q) = %v, want %v", tc.rel, err, tc.want)
			}
			if f != nil {
				f.Close()
			}
		}
	})
}

func TestOpenRegular(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, _ := layout(t)
		r, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for rel, want := range map[string]error{
			"dir/file": nil, "dir/hard": ErrHardLink, "dir": ErrNotRegular, "dir/linkfile": ErrEscape,
		} {
			f, err := r.OpenRegular(rel, os.O_RDONLY)
			if !errors.Is(err, want) || (want == nil && err != nil) {
				t.Errorf("OpenRegular(%q) = %v, want %v", rel, err, want)
			}
			if f != nil {
				f.Close()
			}
		}
	})
}

func TestCreateThroughLinkRefused(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, outside := layout(t)
		r, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if f, err := r.OpenFile("dir/linkdir/new", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, ErrEscape) {
			if f != nil {
				f.Close()
			}
			t.Fatalf("create through a link to a directory: %v, want ErrEscape", err)
		}
		if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a file appeared outside the root: %v", err)
		}
	})
}

func TestRemoveAllNeverFollowsLinks(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, outside := layout(t)
		r, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.RemoveAll("dir"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(root, "dir")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("dir still there: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "victim")); err != nil || string(b) != "victim" {
			t.Fatalf("victim changed: %q, %v", b, err)
		}
		if err := r.RemoveAll("dir"); err != nil {
			t.Fatalf("RemoveAll of an absent path: %v", err)
		}
	})
}

func TestRemoveAllThroughLinkedParentRefused(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, outside := layout(t)
		r, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, rel := range []string{"dir/linkdir/victim", "../outside/victim"} {
			if err := r.RemoveAll(rel); !errors.Is(err, ErrEscape) {
				t.Errorf("RemoveAll(%q) = %v, want ErrEscape", rel, err)
			}
			if err := r.Remove(rel); !errors.Is(err, ErrEscape) {
				t.Errorf("Remove(%q) = %v, want ErrEscape", rel, err)
			}
		}
		if _, err := os.Stat(filepath.Join(outside, "victim")); err != nil {
			t.Fatalf("victim gone: %v", err)
		}
	})
}

func TestLstatAndReadDir(t *testing.T) {
	root, _ := layout(t)
	r, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fi, err := r.Lstat("dir/linkdir")
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("Lstat(link) = %v, %v; want a symbolic link", fi, err)
	}
	fi, err = r.Lstat("dir/hard")
	if err != nil || !fi.Mode().IsRegular() || Links(fi) != 2 {
		t.Fatalf("Lstat(hard) = %v, %v", fi, err)
	}
	if _, err := r.ReadDir("dir/linkdir"); !errors.Is(err, ErrEscape) {
		t.Fatalf("ReadDir through a link: %v, want ErrEscape", err)
	}
	es, err := r.ReadDir("dir")
	if err != nil || len(es) != 7 || es[0].Name() != "file" {
		t.Fatalf("ReadDir(dir) = %v, %v", es, err)
	}
}

// TestOpenRegularRefusesFIFOWithoutBlocking: a FIFO where a file should be
// would block a read-only open forever.
func TestOpenRegularRefusesFIFOWithoutBlocking(t *testing.T) {
	root := t.TempDir()
	if err := syscallMkfifo(filepath.Join(root, "fifo")); err != nil {
		t.Fatal(err)
	}
	r, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, flag := range []int{os.O_RDONLY, os.O_RDWR} {
		if f, err := r.OpenRegular("fifo", flag); !errors.Is(err, ErrNotRegular) {
			if f != nil {
				f.Close()
			}
			t.Fatalf("OpenRegular(fifo, %#x) = %v, want ErrNotRegular", flag, err)
		}
	}
}
