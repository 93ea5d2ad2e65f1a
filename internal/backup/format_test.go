package backup

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

func testManifest() *Manifest {
	id := func(b byte) BlockID { var x BlockID; x[0], x[31] = b, 1; return x }
	return &Manifest{ID: "20261206T000000Z-abcdef", Volume: "vm", Snapshot: "s", BlockSize: BlockSize,
		CreatedAt: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC),
		Disks: []DiskManifest{
			{Name: "root", Size: 5*BlockSize + 100, Blocks: []BlockID{{}, id(1), id(2), {}, {}, id(1)}},
			{Name: "empty", Size: 0, Blocks: []BlockID{}},
			{Name: "zeros", Size: 3 * BlockSize, Blocks: []BlockID{{}, {}, {}}},
			{Name: "full", Size: 2 * BlockSize, Blocks: []BlockID{id(3), id(4)}},
		}}
}

// A manifest reads back as it was written: block ids in place, runs of
// zero blocks included.
func TestManifestRoundTrip(t *testing.T) {
	m := testManifest()
	p, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeManifest(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range m.Disks {
		g := got.Disks[i]
		if g.Name != d.Name || g.Size != d.Size || len(g.Blocks) != len(d.Blocks) {
			t.Fatalf("disk %d: %+v, want %+v", i, g, d)
		}
		for j := range d.Blocks {
			if g.Blocks[j] != d.Blocks[j] {
				t.Fatalf("disk %s block %d: %s, want %s", d.Name, j, g.Blocks[j], d.Blocks[j])
			}
		}
	}
	// Cut short or padded: refused.
	for _, bad := range [][]byte{p[:len(p)-1], append(bytes.Clone(p), 0)} {
		if _, err := decodeManifest(bad); err == nil {
			t.Errorf("a manifest of %d bytes (of %d) decodes", len(bad), len(p))
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	p, _ := encodeManifest(testManifest())
	f.Add(p)
	f.Add([]byte(manifestMagic + "\x02\x00\x00\x00{}"))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeManifest(p)
		if err != nil {
			return
		}
		for _, d := range m.Disks {
			if int64(len(d.Blocks)) != (d.Size+BlockSize-1)/BlockSize {
				t.Fatalf("disk %s: %d blocks for %d bytes", d.Name, len(d.Blocks), d.Size)
			}
		}
	})
}

func FuzzDecodeIndex(f *testing.F) {
	f.Add(encodeIndex([]indexEntry{{ID: BlockID{1}, Offset: 0, Length: 100}, {ID: BlockID{2}, Offset: 100, Length: 7}}))
	f.Add([]byte(indexMagic + "\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, p []byte) {
		entries, err := decodeIndex(p)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeIndex(entries), p) {
			t.Fatal("an index decodes to entries that encode differently")
		}
	})
}

type hugeSource struct{}

func (hugeSource) Disks() []Disk {
	return []Disk{{"root", maxBackupSize/2 + BlockSize}, {"data", maxBackupSize / 2}}
}
func (hugeSource) ReadAt(string, []byte, int64) error {
	return errors.New("a backup too large to read back must not start")
}

// A backup whose manifest could not be read back is refused before it
// starts.
func TestBackupTooLargeIsRefused(t *testing.T) {
	_, _, r, _ := testRepo(t)
	if _, err := r.Backup(context.Background(), hugeSource{}, Options{Volume: "vm", Snapshot: "s"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("backup of %d bytes of disks: %v", int64(maxBackupSize+BlockSize), err)
	}
}
