package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the directory of quiver's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the quiver module")
	}
	return filepath.Dir(gomod)
}

// buildAssemble compiles build/image, a module of its own, into dir.
func buildAssemble(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "assemble")
	cmd := exec.Command("go", "build", "-C", filepath.Join(repoRoot(t), "build", "image"), "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build build/image: %v\n%s", err, out)
	}
	return bin
}

// archive is a docker-archive tarball as `docker save` writes it, read
// with the standard library only.
type archive struct {
	tags   []string
	config imageConfig
	layers [][]entry // each layer's entries, in order
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// entry is one file of a layer, with its content when it is small.
type entry struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	mtime    int64
	data     string
}

func readArchive(t *testing.T, file string) archive {
	t.Helper()
	members := map[string][]byte{}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		members[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("%s: manifest.json: %v (%d images)", file, err, len(manifest))
	}
	var a archive
	a.tags = manifest[0].RepoTags
	if err := json.Unmarshal(members[manifest[0].Config], &a.config); err != nil {
		t.Fatalf("%s: config %s: %v", file, manifest[0].Config, err)
	}
	for _, l := range manifest[0].Layers {
		entries, err := readLayer(members[l])
		if err != nil {
			t.Fatalf("%s: layer %s: %v", file, l, err)
		}
		a.layers = append(a.layers, entries)
	}
	return a
}

func readLayer(gz []byte) ([]entry, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		e := entry{name: h.Name, typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, mtime: h.ModTime.Unix()}
		if h.Size <= 4096 {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			e.data = string(b)
		}
		out = append(out, e)
	}
}

func (e entry) String() string {
	return fmt.Sprintf("%s type %c mode %o owner %d:%d mtime %d", e.name, e.typ, e.mode, e.uid, e.gid, e.mtime)
}
