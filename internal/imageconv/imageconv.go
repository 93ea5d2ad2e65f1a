// Package imageconv runs qemu-img to inspect and convert disk images for
// whole-VM import and export: from a file, or a byte range of one (a disk
// inside an OVA), to an NBD URI or a file, sparse, with progress.
//
// Imports from quiver: nothing.
package imageconv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Tool is the qemu-img binary; tests may point it elsewhere.
var Tool = "qemu-img"

// ErrBadImage marks an image qemu-img cannot read, or one that is not what
// it claims (truncated, damaged, another format).
var ErrBadImage = errors.New("unreadable disk image")

// Source is an image to read: the whole file at Path, or Size bytes of it
// from Offset when Size is not 0.
type Source struct {
	Path   string
	Offset int64
	Size   int64
	// Format is the image format (raw, vmdk, qcow2, vhdx, ...); empty means
	// probe it (only for Inspect).
	Format string
}

// spec returns the qemu-img filename of s: its path, or a json: blockdev
// spec with a raw layer that cuts out the byte range.
func (s Source) spec(format string) string {
	if s.Size == 0 {
		return s.Path
	}
	file := map[string]any{"driver": "raw", "offset": s.Offset, "size": s.Size,
		"file": map[string]any{"driver": "file", "filename": s.Path}}
	top := map[string]any{"file": file}
	if format != "" {
		top["driver"] = format
	}
	b, _ := json.Marshal(top)
	return "json:" + string(b)
}

// Info is what Inspect learns of an image.
type Info struct {
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual-size"`
}

// Inspect runs qemu-img info on s and checks the image reads: `qemu-img
// check` for the formats that support it, so a truncated or damaged image
// is refused before anything is written.
func Inspect(ctx context.Context, s Source) (Info, error) {
	args := []string{"info", "--output=json"}
	if s.Format != "" && s.Size == 0 {
		args = append(args, "-f", s.Format)
	}
	out, err := run(ctx, append(args, s.spec(s.Format))...)
	if err != nil {
		return Info{}, fmt.Errorf("%s: %w: %v", s.Path, ErrBadImage, err)
	}
	var info Info
	if err := json.Unmarshal(out, &info); err != nil || info.Format == "" || info.VirtualSize <= 0 {
		return Info{}, fmt.Errorf("%s: qemu-img info says no format or size: %w", s.Path, ErrBadImage)
	}
	if s.Format != "" && info.Format != s.Format && s.Size != 0 {
		// Through a json: spec the format is whatever the top driver is.
		info.Format = s.Format
	}
	switch info.Format {
	case "qcow2", "vmdk", "vhdx", "vdi", "qed", "parallels":
		if _, err := run(ctx, "check", "-q", "-f", info.Format, s.spec(info.Format)); err != nil {
			return Info{}, fmt.Errorf("%s: qemu-img check: %w: %v", s.Path, ErrBadImage, err)
		}
	}
	return info, nil
}

// Convert copies src (of format) to dst, a file or an NBD URI, in dstFormat.
// A destination that exists (an NBD disk) must hold zeroes: only data is
// written, so the copy stays sparse. progress, when not nil, gets the
// fraction done (0..1) as qemu-img reports it. opts are extra -o options
// (e.g. subformat=streamOptimized).
func Convert(ctx context.Context, src Source, format, dst, dstFormat string, existing bool, opts string, progress func(float64)) error {
	args := []string{"convert", "-p", "-f", format, "-O", dstFormat}
	if existing {
		args = append(args, "-n", "--target-is-zero")
	}
	if opts != "" {
		args = append(args, "-o", opts)
	}
	args = append(args, src.spec(format), dst)
	cmd := exec.CommandContext(ctx, Tool, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w (install qemu-utils)", Tool, err)
	}
	sc := bufio.NewScanner(stdout)
	sc.Split(splitCR)
	for sc.Scan() {
		if m := percent.FindStringSubmatch(sc.Text()); m != nil && progress != nil {
			if f, err := strconv.ParseFloat(m[1], 64); err == nil {
				progress(f / 100)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("qemu-img convert %s: %w: %s", src.Path, ErrBadImage, firstLine(stderr.String(), err))
	}
	return nil
}

// percent matches qemu-img's progress, "    (12.34/100%)".
var percent = regexp.MustCompile(`\(([0-9.]+)/100%\)`)

// splitCR splits qemu-img's progress output, which ends lines with \r.
func splitCR(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, Tool, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return nil, fmt.Errorf("%s: %w (install qemu-utils)", Tool, err)
		}
		return nil, errors.New(firstLine(stderr.String(), err))
	}
	return out, nil
}

// firstLine is qemu-img's first line of complaint, without its name.
func firstLine(stderr string, err error) string {
	line, _, _ := strings.Cut(strings.TrimSpace(stderr), "\n")
	line = strings.TrimPrefix(line, "qemu-img: ")
	if line == "" {
		return err.Error()
	}
	return line
}
