package console

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "record the hash of web/console's sources (make console does)")

const (
	sourceDir  = "../../web/console"
	sourceHash = "source.sha256" // beside this file: the sources dist was built from
)

// TestDistIsCurrent fails when web/console's sources changed since dist was
// built: run `make console` and commit dist with them. make console records
// the sources' hash with -update after its build.
func TestDistIsCurrent(t *testing.T) {
	got := hashSources(t)
	if *update {
		if err := os.WriteFile(sourceHash, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(sourceHash)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(want)) != got {
		t.Fatalf("web/console changed since internal/console/dist was built (sources %s, built from %s): "+
			"run make console and commit dist", got, strings.TrimSpace(string(want)))
	}
}

// hashSources hashes every file of web/console that the build reads (all
// but node_modules), by path and content.
func hashSources(t *testing.T) string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(sourceDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(sourceDir, f)
		h.Write([]byte(filepath.ToSlash(rel) + "\x00"))
		h.Write(data)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
