package fscap

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// maxChunk bounds one copy step: progress is reported and cancellation is
// checked at least this often.
const maxChunk = 8 << 20

// zeroBlockSize is the granularity at which the read/write fallback leaves
// runs of zeros as holes instead of writing them.
const zeroBlockSize = 4096

// CopySparse makes dst a copy of src that keeps src's holes.
//
// dst is truncated to zero and then sized to src's size, so its previous
// content is gone. CopySparse walks src's data runs with SEEK_DATA/SEEK_HOLE
// and copies each in chunks of at most 8 MiB, with copy_file_range when the
// kernel allows it (which shares extents on XFS and btrfs) and with
// pread/pwrite otherwise; the pread/pwrite path also leaves 4 KiB blocks of
// zeros unwritten. After each chunk it calls progress (when not nil) with the
// number of bytes that chunk covered, so the calls add up to DataBytes(src).
// It checks ctx before every chunk and returns an error wrapping ctx.Err()
// once ctx is done, leaving dst partly written.
//
// src must not change during the copy. CopySparse moves src's file offset
// (lseek is how holes are found) but not dst's.
//
// Durability: none. CopySparse does not fsync; the caller syncs dst.
func CopySparse(ctx context.Context, dst, src *os.File, progress func(n int64)) error {
	return copySparse(ctx, dst, src, progress, true)
}

// copySparse is CopySparse with copy_file_range switchable, so tests can
// exercise the pread/pwrite path on filesystems where copy_file_range works.
func copySparse(ctx context.Context, dst, src *os.File, progress func(n int64), useCFR bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	size := fi.Size()
	if err := dst.Truncate(0); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	if err := dst.Truncate(size); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	c := copier{ctx: ctx, dst: dst, src: src, progress: progress, useCFR: useCFR}
	if err := dataRuns(src, size, c.copyRun); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	return nil
}

// copier holds the state of one CopySparse call.
type copier struct {
	ctx      context.Context
	dst, src *os.File
	progress func(n int64)
	useCFR   bool   // cleared for good once copy_file_range refuses
	buf      []byte // pread/pwrite buffer, allocated on first use
}

// copyRun copies the data run [start, end) chunk by chunk.
func (c *copier) copyRun(start, end int64) error {
	for off := start; off < end; {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		n := min(end-off, maxChunk)
		if err := c.copyChunk(off, n); err != nil {
			return err
		}
		if c.progress != nil {
			c.progress(n)
		}
		off += n
	}
	return nil
}

// copyChunk copies n bytes at off, falling back from copy_file_range to
// pread/pwrite for the rest of the chunk (and of the copy) when the kernel
// refuses copy_file_range for these files.
func (c *copier) copyChunk(off, n int64) error {
	for n > 0 && c.useCFR {
		done, err := copyFileRange(c.dst, c.src, off, n)
		off, n = off+done, n-done
		switch {
		case err == nil && done == 0:
			return fmt.Errorf("at offset %d: %w", off, io.ErrUnexpectedEOF)
		case isErrno(err, unix.ENOSYS, unix.EXDEV, unix.EOPNOTSUPP, unix.EINVAL, unix.EBADF):
			c.useCFR = false
		case err != nil:
			return fmt.Errorf("copy_file_range at offset %d: %w", off, err)
		}
	}
	if n > 0 {
		return c.readWrite(off, n)
	}
	return nil
}

// copyFileRange copies up to n bytes at off from src to dst with one
// copy_file_range call, leaving both file offsets alone.
func copyFileRange(dst, src *os.File, off, n int64) (int64, error) {
	var done int
	err := withFDs(dst, src, func(dfd, sfd int) error {
		return retryEINTR(func() error {
			roff, woff := off, off
			var err error
			done, err = unix.CopyFileRange(sfd, &roff, dfd, &woff, int(n), 0)
			return err
		})
	})
	return int64(done), err
}

// readWrite copies n bytes at off through a buffer, skipping blocks of zeros
// so they stay holes in dst (which was truncated to size, so holes read as
// zeros).
func (c *copier) readWrite(off, n int64) error {
	if c.buf == nil {
		c.buf = make([]byte, maxChunk)
	}
	buf := c.buf[:n]
	if _, err := c.src.ReadAt(buf, off); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read at offset %d: %w", off, err)
	}
	for i := 0; i < len(buf); {
		// Skip zero blocks, then write the run of non-zero blocks after them.
		for i < len(buf) && isZero(buf[i:min(i+zeroBlockSize, len(buf))]) {
			i += zeroBlockSize
		}
		j := i
		for j < len(buf) && !isZero(buf[j:min(j+zeroBlockSize, len(buf))]) {
			j += zeroBlockSize
		}
		j = min(j, len(buf))
		if i >= j {
			break
		}
		if _, err := c.dst.WriteAt(buf[i:j], off+int64(i)); err != nil {
			return fmt.Errorf("write at offset %d: %w", off+int64(i), err)
		}
		i = j
	}
	return nil
}

var zeroBlock = make([]byte, zeroBlockSize)

func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// dataRuns calls fn for each data run [start, end) of f below size, in
// order. A filesystem that cannot report holes yields one run covering the
// whole file.
func dataRuns(f *os.File, size int64, fn func(start, end int64) error) error {
	for off := int64(0); off < size; {
		start, err := seek(f, off, unix.SEEK_DATA)
		if isErrno(err, unix.ENXIO) {
			return nil // no data after off
		}
		if isErrno(err, unix.EINVAL, unix.EOPNOTSUPP) && off == 0 {
			return fn(0, size) // no SEEK_DATA: all data
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		if start >= size {
			return nil
		}
		end, err := seek(f, start, unix.SEEK_HOLE)
		if isErrno(err, unix.ENXIO) {
			end = size // truncated under us; copy what the size promised
		} else if err != nil {
			return fmt.Errorf("SEEK_HOLE at %d: %w", start, err)
		}
		end = min(end, size)
		if err := fn(start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

func seek(f *os.File, off int64, whence int) (int64, error) {
	var pos int64
	err := withFD(f, func(fd int) error {
		return retryEINTR(func() error {
			var err error
			pos, err = unix.Seek(fd, off, whence)
			return err
		})
	})
	return pos, err
}

// DataBytes returns how many bytes of f lie in data runs as SEEK_DATA and
// SEEK_HOLE report them: the total that CopySparse reports progress against.
// On a filesystem without hole reporting it is the file size. It moves f's
// file offset.
func DataBytes(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("data bytes of %s: %w", f.Name(), err)
	}
	var total int64
	err = dataRuns(f, fi.Size(), func(start, end int64) error {
		total += end - start
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("data bytes of %s: %w", f.Name(), err)
	}
	return total, nil
}
