package fscap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestCowExtentSize: XFS takes a copy-on-write extent size on a file with
// blocks (unlike the extent size hint), and CowExtentSize reports the size
// XFS uses, the larger of the two hints; other filesystems say they have
// none.
func TestCowExtentSize(t *testing.T) {
	const block = testfs.BlockSize
	tests := []struct {
		name    string
		fs      testfs.FS
		hint    uint32 // extent size hint, set while the file is empty
		cow     uint32
		want    uint32
		wantErr error
	}{
		{name: "xfs", fs: testfs.OnXFS, cow: block, want: block},
		{name: "xfs default", fs: testfs.OnXFS, want: 0},
		{name: "xfs under a larger extent size hint", fs: testfs.OnXFS, hint: 1 << 20, cow: block, want: 1 << 20},
		{name: "ext4", fs: testfs.OnExt4, cow: block, wantErr: ErrNotSupported},
		{name: "btrfs", fs: testfs.OnBtrfs, cow: block, wantErr: ErrNotSupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(tc.fs.Dir(t), "disk"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if tc.hint != 0 {
				if err := SetExtentSizeHint(f, tc.hint); err != nil {
					t.Fatal(err)
				}
			}
			// Blocks first: the copy-on-write size is set on a file with data.
			if _, err := f.WriteAt(testfs.Content(0, 4*block), 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if tc.cow != 0 || tc.wantErr != nil {
				err = SetCowExtentSize(f, tc.cow)
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("SetCowExtentSize: err = %v, want %v", err, tc.wantErr)
				}
				if err != nil {
					if _, err := CowExtentSize(f); !errors.Is(err, ErrNotSupported) {
						t.Fatalf("CowExtentSize: err = %v, want ErrNotSupported", err)
					}
					return
				}
			}
			got, err := CowExtentSize(f)
			if err != nil || got != tc.want {
				t.Fatalf("CowExtentSize = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
