package migration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// compareRAM saves the guest RAM of a migration's source, stopped for good
// (postmigrate), and of its destination, paused by -S before it ran a single
// instruction (vmConfig.paused), with QMP pmemsave, and compares them page
// by page. Nothing writes the guest's RAM between the two, so any
// difference is a page the migration did not carry over as it was: a fault
// of QEMU's migration, whatever the disks did. It returns "" when they
// match, else the number of pages that differ, the first few (guest
// physical address, first differing byte, bytes that differ) and both
// sides' virtqueue state; with keep set both images are saved there.
func compareRAM(t *testing.T, ctx context.Context, src, dst *vm, keep string) string {
	t.Helper()
	var size struct {
		Base int64 `json:"base-memory"`
	}
	if err := src.QMP.Execute(ctx, "query-memory-size-summary", nil, &size); err != nil {
		t.Fatalf("%s: %v", src.name, err)
	}
	dir, err := os.MkdirTemp("/dev/shm", "qvmem")
	if err != nil {
		dir = t.TempDir()
	}
	defer os.RemoveAll(dir)
	var img [2][]byte
	for i, v := range []*vm{src, dst} {
		f := filepath.Join(dir, v.name)
		args := map[string]any{"val": 0, "size": size.Base, "filename": f}
		if err := v.QMP.Execute(ctx, "pmemsave", args, nil); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if img[i], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	const page = 4096
	var pages []string
	n := 0
	for off := 0; off+page <= len(img[0]) && off+page <= len(img[1]); off += page {
		a, b := img[0][off:off+page], img[1][off:off+page]
		if string(a) == string(b) {
			continue
		}
		n++
		if len(pages) < 8 {
			bytes, first := 0, -1
			for i := range a {
				if a[i] != b[i] {
					bytes++
					if first < 0 {
						first = i
					}
				}
			}
			pages = append(pages, fmt.Sprintf("%#x(+%#x,%dB)", off, first, bytes))
		}
	}
	if n == 0 && len(img[0]) == len(img[1]) {
		return ""
	}
	if keep != "" {
		for i, v := range []*vm{src, dst} {
			_ = os.WriteFile(filepath.Join(keep, v.name+".ram"), img[i], 0o644)
		}
	}
	return fmt.Sprintf("RAM differs in %d pages of %d: %s; source %s; destination %s",
		n, len(img[0])/page, strings.Join(pages, " "), src.queueStatus(ctx), dst.queueStatus(ctx))
}
