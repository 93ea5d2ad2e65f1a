package replicated

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
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

// TestReplicatedChainOffersNoInnerCapability: the handle a replicated
// volume's primary serves (primaryHandle over the pool's disk counted by
// metrics, through the disk's Set when read-write) offers none of the
// capabilities of the disk under it, which the disk (as the pool's live
// disk does) offers: a request by one of them would skip the lease check
// and, for a write, the copies. Neither does any wrapper of the chain
// declare one it does not implement with its own checks, and every request
// reaches the disk the ordinary way.
func TestReplicatedChainOffersNoInnerCapability(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name       string
		replicated bool
	}{
		{"read-write, through the Set", true},
		{"without a Set (read-only)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := newMemDisk(size)
			counted := metrics.New(nil).Wrap(inner, "vm", "root", nil)
			if c := pool.CapabilitiesOf(counted); c.Nonblocking == nil || c.Sender == nil || c.Batcher == nil {
				t.Fatalf("the counted disk offers %+v: the fake should offer every capability", c)
			}
			var set *replica.Set
			released := 0
			if tc.replicated {
				var err error
				if set, err = replica.NewSet(context.Background(), size, nil, nil, replica.Options{}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(set.Close)
			}
			lease := &fakeLease{}
			lease.held.Store(true)
			h := primaryHandle(counted, set, func() { released++ }, lease, cluster.Primacy{Term: 1},
				func() bool { return false })

			// Every wrapper's own declaration, outermost first.
			layers := []pool.Disk{h}
			for d := h; ; {
				switch w := d.(type) {
				case *primaryDisk:
					d = w.disk
				case *setDisk:
					d = w.disk
				default:
					d = nil
				}
				if d == nil || d == pool.Disk(counted) {
					break
				}
				layers = append(layers, d)
			}
			if tc.replicated && len(layers) != 3 {
				t.Fatalf("chain %T: want primaryDisk, setDisk, replica.Disk", layers)
			}
			for _, l := range layers {
				if c := l.Capabilities(); c.Nonblocking != nil || c.Batcher != nil || c.Sender != nil || c.DataReader != nil {
					t.Errorf("%T declares %+v", l, c)
				}
			}
			if c := pool.CapabilitiesOf(h); c != (pool.Capabilities{}) {
				t.Errorf("the served handle offers %+v", c)
			}

			// Every request reaches the disk as itself.
			want := []string{"read", "cache", "extents"}
			if tc.replicated {
				want = []string{"read", "write", "flush", "trim", "zero", "cache", "extents"}
			}
			for _, m := range diskMethods {
				if m.request && (tc.replicated || m.name == "ReadAt" || m.name == "Cache" || m.name == "Extents") {
					if err := m.call(h); err != nil {
						t.Fatalf("%s: %v", m.name, err)
					}
				}
			}
			if got := inner.seen(); !slices.Equal(got, want) {
				t.Fatalf("the disk saw %q, want %q", got, want)
			}
			if err := h.Close(); err != nil || !inner.closed {
				t.Fatalf("close: %v, disk closed %v", err, inner.closed)
			}
			if tc.replicated && released != 1 {
				t.Fatalf("the Set released %d times on close, want once", released)
			}
		})
	}
}
