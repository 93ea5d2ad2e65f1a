package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// addition is one -add: the file src at dest in the image, with caps (a
// security.capability value, caps.go) when -cap gives it some.
type addition struct {
	src, dest string
	caps      []byte
}

// baseLayer is the tarball at file as a layer, without its device nodes and
// FIFOs: the runtime mounts its own /dev, and a rootless or restricted
// runtime cannot create them. Everything else passes unchanged.
func baseLayer(file string) (v1.Layer, error) {
	if _, err := os.Stat(file); err != nil {
		return nil, fmt.Errorf("-base: %w", err)
	}
	open := func() (io.ReadCloser, error) {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() {
			err := filterTar(f, pw)
			f.Close()
			pw.CloseWithError(err)
		}()
		return pr, nil
	}
	// Caching keeps the compressed layer in memory: it is compressed once
	// for its digest, not again for the archive.
	return tarball.LayerFromOpener(open, tarball.WithCompressedCaching)
}

// filterTar copies the tar stream r to w without character and block
// devices and FIFOs.
func filterTar(r io.Reader, w io.Writer) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return fmt.Errorf("-base: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// fileLayer is a layer with the files of adds, in the order of their
// destinations, and the directories above them. Every entry is owned by
// root and dated mtime; a file keeps only its permission bits, and the
// capabilities -cap gives it.
func fileLayer(adds []addition, mtime time.Time) (v1.Layer, error) {
	sorted := append([]addition(nil), adds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].dest < sorted[j].dest })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for i, a := range sorted {
		if i > 0 && sorted[i-1].dest == a.dest {
			return nil, fmt.Errorf("-add: %s given twice", a.dest)
		}
		name := strings.TrimPrefix(path.Clean(a.dest), "/")
		for _, d := range parents(name) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			h := &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
		}
		if err := addFile(tw, a, name, mtime); err != nil {
			return nil, fmt.Errorf("-add %s: %w", a.src, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// parents returns the directories above name, outermost first:
// "usr/bin/quiver" gives "usr", "usr/bin".
func parents(name string) []string {
	var out []string
	for i, c := range name {
		if c == '/' {
			out = append(out, name[:i])
		}
	}
	return out
}

// addFile writes a's file as name, with its capabilities as a PAX record.
func addFile(tw *tar.Writer, a addition, name string, mtime time.Time) error {
	f, err := os.Open(a.src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	h := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Size:     st.Size(),
		Mode:     int64(st.Mode().Perm()),
		ModTime:  mtime,
	}
	if a.caps != nil {
		h.PAXRecords = map[string]string{paxCapability: string(a.caps)}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != st.Size() {
		err = fmt.Errorf("changed while read: %d bytes, not %d", n, st.Size())
	}
	return err
}
