package ova

import (
	"archive/tar"
	"bufio"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Member is where a file of a package lies: a byte range of a file on
// disk (the whole file beside an .ovf, a tar member of an .ova).
type Member struct {
	Path   string
	Offset int64
	Size   int64
}

// Package is an opened OVF package: its descriptor and where each of its
// disk files is.
type Package struct {
	Descriptor *Descriptor
	// Files maps the descriptor's file names to where they lie.
	Files map[string]Member
	// manifest maps file names to their digest, when the package has one.
	manifest map[string]digest
}

type digest struct {
	algo string // SHA1, SHA256 or SHA512
	sum  string // lower-case hex
}

// Open reads the package at path: an .ova archive, or an .ovf descriptor
// with its files in the same directory. names renames the disks in order
// (see Parse). Every disk file must be there; a manifest (.mf), when
// present, must list every one of them (Verify checks the digests).
func Open(path string, names []string) (*Package, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".ova":
		return openOVA(path, names)
	case ".ovf":
		return openOVF(path, names)
	}
	return nil, fmt.Errorf("%s: want an .ova archive or an .ovf descriptor: %w", path, ErrInvalid)
}

func openOVF(path string, names []string) (*Package, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	desc, err := Parse(f, names)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &Package{Descriptor: desc, Files: map[string]Member{}}
	dir := filepath.Dir(path)
	for _, d := range desc.Disks {
		file := filepath.Join(dir, d.File)
		st, err := os.Stat(file)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %v: %w", d.Name, err, ErrInvalid)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("disk %s: %s is not a regular file: %w", d.Name, file, ErrInvalid)
		}
		p.Files[d.File] = Member{Path: file, Size: st.Size()}
	}
	mf := strings.TrimSuffix(path, filepath.Ext(path)) + ".mf"
	if data, err := os.ReadFile(mf); err == nil {
		if p.manifest, err = parseManifest(data); err != nil {
			return nil, fmt.Errorf("%s: %w", mf, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return p, p.checkManifest()
}

// countingReader counts what the tar reader consumed, so that a member's
// data offset is the count when Next returns (the reader reads headers
// only until then).
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func openOVA(path string, names []string) (*Package, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cr := &countingReader{r: f} // unbuffered: the count must be exact
	tr := tar.NewReader(cr)
	members := map[string]Member{}
	var descriptor, manifest []byte
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: not a readable tar archive: truncated or damaged (%v): %w", path, err, ErrInvalid)
		}
		if i >= 4*MaxDisks {
			return nil, fmt.Errorf("%s: more than %d members: %w", path, 4*MaxDisks, ErrInvalid)
		}
		if err := plainName(h.Name); err != nil {
			return nil, fmt.Errorf("%s: member %q: %v: %w", path, h.Name, err, ErrInvalid)
		}
		if h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s: member %q is not a regular file: %w", path, h.Name, ErrInvalid)
		}
		if _, dup := members[h.Name]; dup {
			return nil, fmt.Errorf("%s: member %q appears twice: %w", path, h.Name, ErrInvalid)
		}
		members[h.Name] = Member{Path: path, Offset: cr.n, Size: h.Size}
		switch ext := strings.ToLower(filepath.Ext(h.Name)); {
		case i == 0 && ext == ".ovf":
			if h.Size > MaxDescriptor {
				return nil, fmt.Errorf("%s: descriptor larger than %d MiB: %w", path, MaxDescriptor>>20, ErrInvalid)
			}
			if descriptor, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("%s: read descriptor: %v: %w", path, err, ErrInvalid)
			}
		case i == 0:
			return nil, fmt.Errorf("%s: the first member is %q; an OVA starts with its .ovf descriptor: %w", path, h.Name, ErrInvalid)
		case ext == ".mf":
			if manifest, err = io.ReadAll(io.LimitReader(tr, MaxDescriptor)); err != nil {
				return nil, fmt.Errorf("%s: read manifest: %v: %w", path, err, ErrInvalid)
			}
		}
	}
	if descriptor == nil {
		return nil, fmt.Errorf("%s: empty archive, no .ovf descriptor: %w", path, ErrInvalid)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	desc, err := Parse(strings.NewReader(string(descriptor)), names)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &Package{Descriptor: desc, Files: map[string]Member{}}
	for _, d := range desc.Disks {
		m, ok := members[d.File]
		if !ok {
			return nil, fmt.Errorf("%s: disk %s: the archive has no file %q: %w", path, d.Name, d.File, ErrInvalid)
		}
		if m.Offset+m.Size > st.Size() {
			return nil, fmt.Errorf("%s: disk %s: %q is cut short (the archive is truncated): %w", path, d.Name, d.File, ErrInvalid)
		}
		p.Files[d.File] = m
	}
	if manifest != nil {
		if p.manifest, err = parseManifest(manifest); err != nil {
			return nil, fmt.Errorf("%s: manifest: %w", path, err)
		}
	}
	return p, p.checkManifest()
}

// manifestLine is "SHA256(disk1.vmdk)= 0123...".
var manifestLine = regexp.MustCompile(`^(SHA1|SHA256|SHA512)\(([^)]+)\)\s*=\s*([0-9a-fA-F]+)$`)

func parseManifest(data []byte) (map[string]digest, error) {
	out := map[string]digest{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		m := manifestLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %q: want ALGO(file)= hex: %w", line, ErrInvalid)
		}
		out[m[2]] = digest{algo: m[1], sum: strings.ToLower(m[3])}
	}
	return out, sc.Err()
}

// checkManifest requires a manifest, when there is one, to list every disk
// file.
func (p *Package) checkManifest() error {
	if p.manifest == nil {
		return nil
	}
	for name := range p.Files {
		if _, ok := p.manifest[name]; !ok {
			return fmt.Errorf("the manifest does not list %q: %w", name, ErrInvalid)
		}
	}
	return nil
}

// HasManifest says the package has digests for its files.
func (p *Package) HasManifest() bool { return p.manifest != nil }

// Verify checks every disk file against the manifest's digest, calling
// progress with the bytes read as it goes. Without a manifest it does
// nothing.
func (p *Package) Verify(progress func(n int64)) error {
	if p.manifest == nil {
		return nil
	}
	for name, m := range p.Files {
		want := p.manifest[name]
		var h hash.Hash
		switch want.algo {
		case "SHA1":
			h = sha1.New()
		case "SHA256":
			h = sha256.New()
		default:
			h = sha512.New()
		}
		f, err := os.Open(m.Path)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.MultiWriter(h, progressWriter(progress)), io.NewSectionReader(f, m.Offset, m.Size))
		f.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want.sum {
			return fmt.Errorf("%s: %s digest %s, the manifest says %s (the file is damaged): %w", name, want.algo, got, want.sum, ErrInvalid)
		}
	}
	return nil
}

type progressWriter func(n int64)

func (w progressWriter) Write(p []byte) (int, error) {
	if w != nil {
		w(int64(len(p)))
	}
	return len(p), nil
}
