package endpoint

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

// memDisk is a disk in memory for concatDisk's tests.
type memDisk struct {
	b       []byte
	flushes int
}

func (m *memDisk) Size() int64    { return int64(len(m.b)) }
func (m *memDisk) ReadOnly() bool { return false }
func (m *memDisk) ReadAt(p []byte, off int64) error {
	if off+int64(len(p)) > m.Size() {
		return pool.ErrInvalid
	}
	copy(p, m.b[off:])
	return nil
}
func (m *memDisk) WriteAt(p []byte, off int64, fua bool) error {
	if off+int64(len(p)) > m.Size() {
		return pool.ErrInvalid
	}
	copy(m.b[off:], p)
	return nil
}
func (m *memDisk) Flush() error                         { m.flushes++; return nil }
func (m *memDisk) Trim(off, length int64, f bool) error { clear(m.b[off : off+length]); return nil }
func (m *memDisk) Zero(off, length int64, _ pool.ZeroFlags) error {
	clear(m.b[off : off+length])
	return nil
}
func (m *memDisk) Cache(off, length int64) error { return nil }
func (m *memDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}
func (m *memDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }
func (m *memDisk) Close() error                    { return nil }

// TestConcatDisk: disk i is at i*SlotSize whatever the sizes; the bytes of
// a slot past its disk read as zeros and refuse writes; a request across
// two slots is split; Flush reaches every disk.
func TestConcatDisk(t *testing.T) {
	a, b := &memDisk{b: make([]byte, 8192)}, &memDisk{b: make([]byte, 4096)}
	c := newConcatDisk([]pool.Disk{a, b})
	if c.Size() != 2*SlotSize {
		t.Fatalf("size %d", c.Size())
	}
	if err := c.WriteAt([]byte("second"), SlotSize+100, false); err != nil {
		t.Fatal(err)
	}
	if string(b.b[100:106]) != "second" || bytes.Contains(a.b, []byte("second")) {
		t.Fatal("a write at SlotSize+100 is not at 100 of the second disk")
	}
	if err := c.WriteAt([]byte("x"), 8192, false); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a write past the first disk's end: %v, want ErrInvalid", err)
	}
	// A read across the end of slot 0 into slot 1: the rest of slot 0 is
	// zeros, then disk b's first bytes.
	b.b[0] = 'B'
	a.b[8191] = 'A'
	p := bytes.Repeat([]byte{0xff}, 16)
	if err := c.ReadAt(p, SlotSize-8); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p[:8], make([]byte, 8)) || p[8] != 'B' {
		t.Fatalf("read across slots: %q", p)
	}
	if err := c.ReadAt(p[:4], 8188); err != nil || p[3] != 'A' {
		t.Fatalf("read at the first disk's end: %v %q", err, p[:4])
	}
	if err := c.ReadAt(p, 2*SlotSize-8); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a read past the device: %v", err)
	}
	if err := c.Flush(); err != nil || a.flushes != 1 || b.flushes != 1 {
		t.Fatalf("flush: %v, %d %d", err, a.flushes, b.flushes)
	}
	if err := c.Zero(SlotSize, 8192, 0); err != nil || b.b[100] != 0 {
		t.Fatalf("zero of slot 1 past its disk: %v", err)
	}
}

// TestDisksExport writes through the volume's one-device export at slot 1
// and finds the bytes on the storage node's second disk.
func TestDisksExport(t *testing.T) {
	sn := startStorageNode(t)
	f := startFakeAPI(t, sn.addr)
	e := openEndpoint(t, t.TempDir(), locator(t, f.url))
	pub, err := e.Publish(context.Background(), vmVolume(sn.token))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialSocket(t, pub.Socket, DisksExport)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Size() != 2*SlotSize {
		t.Fatalf("the device is %d bytes, want %d", c.Size(), 2*SlotSize)
	}
	if err := c.WriteAt([]byte("in slot one"), SlotSize+8192, true); err != nil {
		t.Fatal(err)
	}
	direct, err := dialSocket(t, pub.Socket, "data")
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	got := make([]byte, 11)
	if err := direct.ReadAt(got, 8192); err != nil || string(got) != "in slot one" {
		t.Fatalf("disk data at 8192: %q %v", got, err)
	}
	if err := c.WriteAt([]byte("x"), SlotSize-1, false); !errors.Is(err, nbdclient.Errno(22)) {
		t.Fatalf("a write past disk 0's end: %v, want EINVAL", err)
	}
}
