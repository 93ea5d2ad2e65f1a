package fscap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestReflink(t *testing.T) {
	for _, tc := range reflinkCases {
		t.Run(tc.name, func(t *testing.T) {
			srcDir, dstDir := tc.dirs(t)
			srcPath := testfs.MakeSparse(t, srcDir, "src")
			dstPath := filepath.Join(dstDir, "dst")
			src, err := os.Open(srcPath)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			dst, err := os.Create(dstPath)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()

			err = Reflink(dst, src)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reflink: err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if fi, err := dst.Stat(); err != nil || fi.Size() != 0 {
					t.Errorf("dst after a failed reflink: %v, %v; want it empty", fi, err)
				}
				return
			}
			testfs.AssertSameFile(t, dstPath, srcPath)
		})
	}
}
