package fscap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

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

// Flag is one feature flag of a Caps: its name in JSON and the flag itself.
type Flag struct {
	Name string
	On   *bool
}

// Flags returns the feature flags of c (every field but Filesystem) in a
// fixed order, each pointing into c.
func (c *Caps) Flags() []Flag {
	return []Flag{
		{"reflink", &c.Reflink},
		{"copyFileRange", &c.CopyFileRange},
		{"seekHole", &c.SeekHole},
		{"btrfsSubvolumes", &c.BtrfsSubvolumes},
		{"extentSizeHint", &c.ExtentSizeHint},
	}
}

// ProbeError is Probe's error when it could not tell whether the filesystem
// has some features: trying them failed for another reason than the
// filesystem answering that it does not offer them (an I/O error, no space,
// no memory, a read-only filesystem, a denied call). Such a feature is
// unknown, not missing: the Caps Probe returns with the error hold false for
// it, and true or false for the features it could tell.
type ProbeError struct {
	// Unknown has the flag of each feature Probe could not tell set; its
	// Filesystem is empty.
	Unknown Caps
	// Err is the first failure.
	Err error
}

func (e *ProbeError) Error() string {
	var names []string
	for _, f := range e.Unknown.Flags() {
		if *f.On {
			names = append(names, f.Name)
		}
	}
	return fmt.Sprintf("could not tell whether the filesystem has %s: %v", strings.Join(names, ", "), e.Err)
}

func (e *ProbeError) Unwrap() error { return e.Err }

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
// before returning. Probe needs write access to dir, a few free inodes and
// about 200 KiB of free space.
//
// A feature is reported missing only when the filesystem answers that it
// does not offer it (EOPNOTSUPP, ENOTTY, ENOSYS, EXDEV, EINVAL, or a result
// that is not what the feature promises). When a try fails otherwise (EIO,
// ENOSPC, ENOMEM, EROFS...), or the probe files cannot be made, written or
// inspected, the feature is unknown: Probe returns what it could tell,
// with an error wrapping a *ProbeError that lists the unknown features and
// the errno of the first failure. A caller must not take an unknown feature
// for a missing one. Probe fails with another error only when statfs of
// dir fails.
func Probe(dir string) (Caps, error) {
	name, err := statfsName(dir)
	if err != nil {
		return Caps{}, fmt.Errorf("probe %s: %w", dir, err)
	}
	p := newProber(dir)
	defer p.cleanup()
	caps, err := p.run(name)
	if err != nil {
		return caps, fmt.Errorf("probe %s: %w", dir, err)
	}
	return caps, nil
}

// prober tracks the probe files so they are removed whatever happens, and
// holds the calls that try the features, which the package's tests replace
// to make one fail.
type prober struct {
	dir   string
	files []*os.File

	clone     func(dst, src *os.File) error
	copyRange func(dst, src *os.File, off, n int64) (int64, error)
	seek      func(f *os.File, off int64) (data, hole int64, err error)
	setHint   func(f *os.File, bytes uint32) error
}

func newProber(dir string) *prober {
	return &prober{dir: dir, clone: Reflink, copyRange: copyFileRange, seek: seekDataHole, setHint: SetExtentSizeHint}
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

// run tries each feature in turn. name is the filesystem statfs found for
// the probe directory; the probe's own file names it when it can.
func (p *prober) run(name string) (Caps, error) {
	caps := Caps{Filesystem: name, BtrfsSubvolumes: name == "btrfs"}
	want := bytes.Repeat([]byte("quiver probe\n"), probeDataLen/13+1)[:probeDataLen]
	src, err := p.source(&caps, want)
	if err != nil {
		// Nothing could be tried: every feature but the one statfs tells
		// is unknown.
		return caps, &ProbeError{Unknown: Caps{Reflink: true, CopyFileRange: true, SeekHole: true, ExtentSizeHint: true}, Err: err}
	}

	var pe ProbeError
	tell := func(flag, unknown *bool, ok bool, err error) {
		if err != nil {
			*unknown = true
			if pe.Err == nil {
				pe.Err = err
			}
			return
		}
		*flag = ok
	}
	ok, err := p.probeSeekHole(src)
	tell(&caps.SeekHole, &pe.Unknown.SeekHole, ok, err)
	ok, err = p.probeCopy(src, want, p.clone)
	tell(&caps.Reflink, &pe.Unknown.Reflink, ok, err)
	ok, err = p.probeCopy(src, want, p.copyFileRange)
	tell(&caps.CopyFileRange, &pe.Unknown.CopyFileRange, ok, err)
	ok, err = p.probeExtentSizeHint()
	tell(&caps.ExtentSizeHint, &pe.Unknown.ExtentSizeHint, ok, err)
	if pe.Err != nil {
		return caps, &pe
	}
	return caps, nil
}

// source makes the file the features are tried on: one data run of want
// between holes, flushed. It names caps' filesystem after the file.
func (p *prober) source(caps *Caps, want []byte) (*os.File, error) {
	src, err := p.create("src")
	if err != nil {
		return nil, err
	}
	name, err := fstatfsName(src)
	if err != nil {
		return nil, err
	}
	caps.Filesystem = name
	caps.BtrfsSubvolumes = caps.Filesystem == "btrfs"
	if err := src.Truncate(probeFileSize); err != nil {
		return nil, err
	}
	if _, err := src.WriteAt(want, probeDataOff); err != nil {
		return nil, err
	}
	if err := src.Sync(); err != nil { // some filesystems only map holes of flushed data
		return nil, err
	}
	return src, nil
}

// saysUnsupported reports whether err, from a feature's call on the probe
// files, is the filesystem's answer that it does not offer the feature:
// ErrNotSupported, or for the probe's calls EOPNOTSUPP, ENOTTY, ENOSYS,
// EXDEV (copy_file_range between filesystems on old kernels) and EINVAL
// (FICLONE where the files cannot share extents, an extent size hint XFS
// refuses). Any other error (EIO, ENOSPC, EDQUOT, ENOMEM, EAGAIN, EROFS,
// EPERM...) says nothing about the feature.
func saysUnsupported(err error) bool {
	return errors.Is(err, ErrNotSupported) ||
		isErrno(err, unix.EOPNOTSUPP, unix.ENOTTY, unix.ENOSYS, unix.EXDEV, unix.EINVAL)
}

// probeSeekHole reports whether SEEK_DATA and SEEK_HOLE find the data run of
// src rather than calling the whole file data. ENXIO (no data found where
// the data run is) is a wrong answer, so the feature is missing; an error
// that says nothing about it is returned.
func (p *prober) probeSeekHole(src *os.File) (bool, error) {
	data, hole, err := p.seek(src, 0)
	if err != nil {
		if saysUnsupported(err) || isErrno(err, unix.ENXIO) {
			return false, nil
		}
		return false, fmt.Errorf("seek data and hole in %s: %w", src.Name(), err)
	}
	return data > 0 && data <= probeDataOff &&
		hole >= probeDataOff+probeDataLen && hole < probeFileSize, nil
}

// copyFileRange is the copy probeCopy tries for CopyFileRange: the data run
// of src into dst in one copy_file_range call. A short copy counts as the
// feature missing.
func (p *prober) copyFileRange(dst, src *os.File) error {
	if err := dst.Truncate(probeFileSize); err != nil {
		return err
	}
	done, err := p.copyRange(dst, src, probeDataOff, probeDataLen)
	if err == nil && done != probeDataLen {
		err = notSupported(fmt.Errorf("copy_file_range copied %d of %d bytes", done, probeDataLen))
	}
	return err
}

// probeCopy copies src into a new probe file with copyFn and reports whether
// that worked and produced the expected bytes. A copy the filesystem
// refuses (saysUnsupported) or that gives other bytes or another size means
// the feature is missing. Any other failure (the copy failing for lack of
// space or with an I/O error, or the probe file not being made or read
// back) is returned: it says nothing about the feature, and reporting it
// missing would run a reflink pool without what reflink needs (the unshare
// guard of internal/pool among them).
func (p *prober) probeCopy(src *os.File, want []byte, copyFn func(dst, src *os.File) error) (bool, error) {
	dst, err := p.create("dst")
	if err != nil {
		return false, err
	}
	if err := copyFn(dst, src); err != nil {
		if saysUnsupported(err) {
			return false, nil
		}
		return false, err
	}
	r, err := os.Open(dst.Name())
	if err != nil {
		return false, err
	}
	defer r.Close()
	fi, err := r.Stat()
	if err != nil {
		return false, err
	}
	if fi.Size() != probeFileSize {
		return false, nil
	}
	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, probeDataOff); err != nil {
		return false, fmt.Errorf("read back %s: %w", dst.Name(), err)
	}
	return bytes.Equal(got, want), nil
}

// probeExtentSizeHint sets a hint on a new, empty probe file;
// SetExtentSizeHint reads it back, so success means the filesystem kept
// it. A refusal (saysUnsupported) means the feature is missing; any other
// failure is returned, as in probeCopy.
func (p *prober) probeExtentSizeHint() (bool, error) {
	f, err := p.create("hint")
	if err != nil {
		return false, err
	}
	err = p.setHint(f, probeHint)
	if err != nil && !saysUnsupported(err) {
		return false, err
	}
	return err == nil, nil
}
