package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
)

// DataRuns calls fn for each data run [start, end) of f within [off, end),
// in order, as SEEK_DATA and SEEK_HOLE report them. A filesystem that
// cannot report holes yields one run covering the range. It is the one walk
// over a file's data: copies, progress totals, NBD block status and the
// first pass of a live snapshot all use it.
func DataRuns(f File, off, end int64, fn func(start, end int64) error) error {
	for off < end {
		start, err := f.SeekData(off)
		if errors.Is(err, ErrNoData) {
			return nil
		}
		if errors.Is(err, ErrNotSupported) {
			return fn(off, end) // no hole reporting: all data
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		if start >= end {
			return nil
		}
		stop, err := f.SeekHole(start)
		if errors.Is(err, ErrNoData) || err == nil && stop <= start {
			stop = end // truncated under us: the rest is what the size promised
		} else if err != nil {
			return fmt.Errorf("SEEK_HOLE at %d: %w", start, err)
		}
		stop = min(stop, end)
		if err := fn(start, stop); err != nil {
			return err
		}
		off = stop
	}
	return nil
}

// DataBytes returns how many bytes of f lie in data runs: the total that
// CopySparse reports progress against.
func DataBytes(f File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("data bytes of %s: %w", f.Name(), err)
	}
	var total int64
	err = DataRuns(f, 0, fi.Size(), func(start, end int64) error {
		total += end - start
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("data bytes of %s: %w", f.Name(), err)
	}
	return total, nil
}

// maxChunk bounds one copy step: progress is reported and cancellation is
// checked at least this often.
const maxChunk = 8 << 20

// zeroBlockSize is the granularity at which the read/write copy leaves runs
// of zeros as holes.
const zeroBlockSize = 4096

// CopySparse makes dst a copy of src that keeps src's holes: dst is
// truncated to zero and sized to src's size, then each data run of src is
// copied in chunks of at most 8 MiB, with CopyRange where the kernel allows
// it and read/write otherwise (leaving 4 KiB blocks of zeros unwritten).
// progress, when not nil, gets each chunk's length (they add up to
// DataBytes(src)). It checks ctx before every chunk.
//
// Durability: none; the caller syncs dst.
func CopySparse(ctx context.Context, dst, src File, progress func(n int64)) error {
	if err := copySparse(ctx, dst, src, progress, true); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
	}
	return nil
}

func copySparse(ctx context.Context, dst, src File, progress func(n int64), useCFR bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := dst.Truncate(0); err != nil {
		return err
	}
	if err := dst.Truncate(size); err != nil {
		return err
	}
	c := copier{ctx: ctx, dst: dst, src: src, progress: progress, useCFR: useCFR}
	return DataRuns(src, 0, size, c.copyRun)
}

type copier struct {
	ctx      context.Context
	dst, src File
	progress func(n int64)
	useCFR   bool
	buf      []byte
}

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

func (c *copier) copyChunk(off, n int64) error {
	for n > 0 && c.useCFR {
		done, err := c.dst.CopyRange(c.src, off, n)
		off, n = off+done, n-done
		switch {
		case err == nil && done == 0:
			return fmt.Errorf("at offset %d: %w", off, io.ErrUnexpectedEOF)
		case errors.Is(err, ErrNotSupported):
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

// Methods CloneOrCopy reports.
const (
	MethodReflink = "reflink"
	MethodCopy    = "copy"
)

// CloneOrCopy makes dst, whatever it holds, a copy of src: a whole-file
// reflink when reflink is set and the filesystem shares extents, otherwise
// a sparse copy (CopySparse, reporting progress). It returns the method
// used. A reflink reports no progress. It is the one reflink-or-copy
// fallback.
//
// Durability: none; the caller syncs dst.
func CloneOrCopy(ctx context.Context, dst, src File, reflink bool, progress func(n int64)) (string, error) {
	if reflink {
		err := dst.Clone(src)
		if err == nil {
			return MethodReflink, nil
		}
		if !errors.Is(err, ErrNotSupported) {
			return "", err
		}
	}
	if err := CopySparse(ctx, dst, src, progress); err != nil {
		return "", err
	}
	return MethodCopy, nil
}
