package testfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TreeSum is a digest of every name (relative to dir), type, mode, size
// and content under dir, links not followed: equal sums, the same tree.
func TreeSum(t testing.TB, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v %d", rel, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			line += " " + hex.EncodeToString(h[:])
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(h[:])
}

// ReadOnlyTree takes write permission from every directory and file under
// dir (mode bits only: root writes all the same); t.Cleanup gives it
// back, so that t.TempDir can remove them.
func ReadOnlyTree(t testing.TB, dir string) {
	t.Helper()
	chmodTree(t, dir, func(m fs.FileMode) fs.FileMode { return m &^ 0o222 })
	t.Cleanup(func() { chmodTree(t, dir, func(m fs.FileMode) fs.FileMode { return m | 0o200 }) })
}

func chmodTree(t testing.TB, dir string, mode func(fs.FileMode) fs.FileMode) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chmod(p, mode(fi.Mode().Perm()))
	})
	if err != nil {
		t.Fatal(err)
	}
}
