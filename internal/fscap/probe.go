package fscap

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Caps is what a filesystem was found to support. Each flag is set only when
// the feature worked on real files, not because the filesystem type usually
// has it.
type Caps struct {
	Filesystem      string `json:"filesystem"`      // "xfs", "btrfs", "ext4", "tmpfs", "nfs", or "unknown(0x...)" from the statfs magic
	Reflink         bool   `json:"reflink"`         // FICLONE works
	CopyFileRange   bool   `json:"copyFileRange"`   // copy_file_range works
	SeekHole        bool   `json:"seekHole"`        // SEEK_DATA/SEEK_HOLE report holes (not just one data extent)
	BtrfsSubvolumes bool   `json:"btrfsSubvolumes"` // filesystem is btrfs
	ExtentSizeHint  bool   `json:"extentSizeHint"`  // XFS FS_IOC_FSSETXATTR with FS_XFLAG_EXTSIZE works
}

// Probe geometry: one data run in the middle of a file, with holes on both
// sides, each larger than any common filesystem block.
const (
	probeDataOff  = 1 << 20
	probeDataLen  = 64 << 10
	probeFileSize = 2 << 20
	probeHint     = 1 << 20
)

// Probe finds out what the filesystem holding dir supports by trying each
// feature on temporary files in dir, named ".probe-*", which it removes
// before returning. A feature that fails for any reason is reported as
// missing; Probe itself fails only when it cannot create, write or inspect
// its probe files. Probe needs write access to dir, a few free inodes and
// about 200 KiB of free space. When it fails, the Caps it returns name the
// filesystem (statfs of dir, which needs neither) and nothing more.
func Probe(dir string) (Caps, error) {
	name, err := statfsName(dir)
	if err != nil {
		return Caps{}, fmt.Errorf("probe %s: %w", dir, err)
	}
	p := prober{dir: dir}
	defer p.cleanup()
	caps, err := p.run()
	if err != nil {
		return Caps{Filesystem: name}, fmt.Errorf("probe %s: %w", dir, err)
	}
	return caps, nil
}

// prober tracks the probe files so they are removed whatever happens.
type prober struct {
	dir   string
	files []*os.File
}

func (p *prober) create(kind string) (*os.File, error) {
	f, err := os.CreateTemp(p.dir, ".probe-"+kind+"-*")
	if err != nil {
		return nil, err
	}
	p.files = append(p.files, f)
	return f, nil
}

func (p *prober) cleanup() {
	for _, f := range p.files {
		f.Close()
		os.Remove(f.Name())
	}
}

func (p *prober) run() (Caps, error) {
	var caps Caps
	src, err := p.create("src")
	if err != nil {
		return caps, err
	}
	if caps.Filesystem, err = fstatfsName(src); err != nil {
		return caps, err
	}
	caps.BtrfsSubvolumes = caps.Filesystem == "btrfs"

	want := bytes.Repeat([]byte("quiver probe\n"), probeDataLen/13+1)[:probeDataLen]
	if err := src.Truncate(probeFileSize); err != nil {
		return caps, err
	}
	if _, err := src.WriteAt(want, probeDataOff); err != nil {
		return caps, err
	}
	if err := src.Sync(); err != nil { // some filesystems only map holes of flushed data
		return caps, err
	}

	caps.SeekHole = probeSeekHole(src)

	if caps.Reflink, err = p.probeCopy(src, want, Reflink); err != nil {
		return caps, err
	}
	cfr := func(dst, src *os.File) error {
		if err := dst.Truncate(probeFileSize); err != nil {
			return err
		}
		done, err := copyFileRange(dst, src, probeDataOff, probeDataLen)
		if err == nil && done != probeDataLen {
			err = fmt.Errorf("copy_file_range copied %d of %d bytes", done, probeDataLen)
		}
		return err
	}
	if caps.CopyFileRange, err = p.probeCopy(src, want, cfr); err != nil {
		return caps, err
	}

	hinted, err := p.create("hint")
	if err != nil {
		return caps, err
	}
	if caps.ExtentSizeHint, err = probeExtentSizeHint(hinted); err != nil {
		return caps, err
	}
	return caps, nil
}

// probeSeekHole reports whether SEEK_DATA and SEEK_HOLE find the data run of
// src rather than calling the whole file data.
func probeSeekHole(src *os.File) bool {
	data, hole, err := seekDataHole(src, 0)
	return err == nil && data > 0 && data <= probeDataOff &&
		hole >= probeDataOff+probeDataLen && hole < probeFileSize
}

// probeCopy copies src into a new probe file with copyFn and reports whether
// that worked and produced the expected bytes. Failing to create or read
// the probe file is an error, and so is a copy that fails for lack of
// space: a full filesystem says nothing about the feature, and reporting it
// missing would run a reflink pool without what reflink needs (the unshare
// guard of internal/pool among them).
func (p *prober) probeCopy(src *os.File, want []byte, copyFn func(dst, src *os.File) error) (bool, error) {
	dst, err := p.create("dst")
	if err != nil {
		return false, err
	}
	if err := copyFn(dst, src); err != nil {
		if noSpace(err) {
			return false, err
		}
		return false, nil
	}
	r, err := os.Open(dst.Name())
	if err != nil {
		return false, err
	}
	defer r.Close()
	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, probeDataOff); err != nil {
		return false, nil
	}
	fi, err := r.Stat()
	if err != nil {
		return false, err
	}
	return fi.Size() == probeFileSize && bytes.Equal(got, want), nil
}

// probeExtentSizeHint sets a hint on the empty file f; SetExtentSizeHint
// reads it back, so success means the filesystem kept it. A failure for
// lack of space is an error, as in probeCopy.
func probeExtentSizeHint(f *os.File) (bool, error) {
	err := SetExtentSizeHint(f, probeHint)
	if noSpace(err) {
		return false, err
	}
	return err == nil, nil
}

// noSpace reports whether err says the filesystem or a quota is full.
func noSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
