package server

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// diskMethod is one method of pool.Disk called on a handle. A request
// answers a client, so the lease fences it; the others are the handle's
// own business.
type diskMethod struct {
	name    string
	request bool
	call    func(d pool.Disk) error
}

// diskMethods calls every method of pool.Disk;
// TestDiskMethodsCoverPoolDisk keeps it complete.
var diskMethods = []diskMethod{
	{"ReadAt", true, func(d pool.Disk) error { return d.ReadAt(make([]byte, 4096), 0) }},
	{"WriteAt", true, func(d pool.Disk) error { return d.WriteAt(make([]byte, 4096), 0, false) }},
	{"Flush", true, func(d pool.Disk) error { return d.Flush() }},
	{"Trim", true, func(d pool.Disk) error { return d.Trim(0, 4096, false) }},
	{"Zero", true, func(d pool.Disk) error { return d.Zero(0, 4096, 0) }},
	{"Cache", true, func(d pool.Disk) error { return d.Cache(0, 4096) }},
	{"Extents", true, func(d pool.Disk) error {
		ext, err := d.Extents(0, 4096, 0)
		if err != nil && ext != nil {
			return errors.New("extents returned with an error")
		}
		return err
	}},
	{"Size", false, func(d pool.Disk) error {
		if d.Size() != 1<<20 {
			return errors.New("size differs from the disk's")
		}
		return nil
	}},
	{"ReadOnly", false, func(d pool.Disk) error {
		if d.ReadOnly() {
			return errors.New("read-only")
		}
		return nil
	}},
	{"Capabilities", false, func(d pool.Disk) error {
		if c := d.Capabilities(); c.Nonblocking != nil || c.Batcher != nil || c.Sender != nil || c.DataReader != nil {
			return errors.New("offers a capability")
		}
		return nil
	}},
	{"Close", false, func(d pool.Disk) error { return d.Close() }},
}

// TestDiskMethodsCoverPoolDisk: diskMethods names every method of
// pool.Disk, so a method added to it is classified (fenced or not) before
// the fencing test passes again.
func TestDiskMethodsCoverPoolDisk(t *testing.T) {
	var want, got []string
	it := reflect.TypeFor[pool.Disk]()
	for i := range it.NumMethod() {
		want = append(want, it.Method(i).Name)
	}
	for _, m := range diskMethods {
		got = append(got, m.name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("diskMethods covers %v, pool.Disk has %v", got, want)
	}
}

// TestPrimaryDiskFencesEveryMethod: a primary whose lease is not surely
// held, or that handed the volume over, abandons every request
// (nbd.ErrAbandon) after the lease's TTL, reads of the allocation map
// (Extents: BLOCK_STATUS, READ over holes) and CACHE included, and offers
// no capability by which a request would skip the check; with the lease
// held each request is answered as the disk answers it. The handle's size
// and mode stay readable, and Close closes it, lease or not.
func TestPrimaryDiskFencesEveryMethod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		held    bool
		retired bool
		abandon bool
	}{
		{"lease held", true, false, false},
		{"lease not held", false, false, true},
		{"handed over", true, true, true},
	} {
		for _, m := range diskMethods {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				inner := newMemDisk(1 << 20)
				lease := &fakeLease{}
				lease.held.Store(tc.held)
				d := &primaryDisk{disk: inner, lease: lease, prim: cluster.Primacy{Term: 3},
					retired: func() bool { return tc.retired }}
				err := m.call(d)
				switch {
				case m.request && tc.abandon:
					if !errors.Is(err, nbd.ErrAbandon) {
						t.Fatalf("%s: %v, want it abandoned (nbd.ErrAbandon)", m.name, err)
					}
				case err != nil:
					t.Fatalf("%s: %v", m.name, err)
				}
				if m.name == "Close" && !inner.closed {
					t.Fatal("Close left the disk open")
				}
			})
		}
	}
}
