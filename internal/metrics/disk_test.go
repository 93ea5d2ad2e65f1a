package metrics

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

// capDisk is an in-memory disk handle that offers every capability when
// offers is set, and records which way each request reached it.
type capDisk struct {
	data   []byte
	offers bool
	calls  []string
}

var _ pool.Disk = (*capDisk)(nil)

func (d *capDisk) Size() int64    { return int64(len(d.data)) }
func (d *capDisk) ReadOnly() bool { return false }
func (d *capDisk) ReadAt(p []byte, off int64) error {
	d.calls = append(d.calls, "read")
	copy(p, d.data[off:])
	return nil
}
func (d *capDisk) WriteAt(p []byte, off int64, fua bool) error {
	d.calls = append(d.calls, "write")
	copy(d.data[off:], p)
	return nil
}
func (d *capDisk) Flush() error                                   { return nil }
func (d *capDisk) Trim(off, length int64, fua bool) error         { return nil }
func (d *capDisk) Zero(off, length int64, _ pool.ZeroFlags) error { return nil }
func (d *capDisk) Cache(off, length int64) error                  { return nil }
func (d *capDisk) Close() error                                   { return nil }
func (d *capDisk) Extents(off, length int64, _ int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}

func (d *capDisk) TryReadAt(p []byte, off int64) error {
	d.calls = append(d.calls, "try read")
	copy(p, d.data[off:])
	return nil
}
func (d *capDisk) TryWriteAt(p []byte, off int64) error {
	d.calls = append(d.calls, "try write")
	copy(d.data[off:], p)
	return nil
}
func (d *capDisk) TryBatch(ios []pool.IO) {
	d.calls = append(d.calls, "batch")
	for i := range ios {
		ios[i].N = len(ios[i].P)
	}
}
func (d *capDisk) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	d.calls = append(d.calls, "send")
	return len(head) + n, nil
}
func (d *capDisk) ReadData(p []byte, off int64, ext []pool.Extent) error {
	d.calls = append(d.calls, "read data")
	return nil
}

func (d *capDisk) Checkpoints() []string {
	d.calls = append(d.calls, "checkpoints")
	return nil
}
func (d *capDisk) ChangesSince(ctx context.Context, base string) ([]pool.ChangedRange, error) {
	d.calls = append(d.calls, "changes since")
	return nil, nil
}

func (d *capDisk) Capabilities() pool.Capabilities {
	if !d.offers {
		return pool.Capabilities{}
	}
	return pool.Capabilities{Nonblocking: d, Batcher: d, Sender: d, DataReader: d, Changes: d}
}

// TestDiskCapabilities: a counted handle offers, through its own methods,
// the capabilities of the handle it wraps (its change report too) and no
// other (ReadData it always offers: it reads the data extents as one
// counted request); each reaches
// the inner handle's by its declared capability, and a volume with QoS
// limits refuses them all, so that every request waits for its tokens.
func TestDiskCapabilities(t *testing.T) {
	m := New(nil)
	type offer struct{ nonblocking, batcher, sender, dataReader, changes bool }
	for _, tc := range []struct {
		name   string
		offers bool
		want   offer
		calls  []string // what the five requests below reach in the inner handle
	}{
		{"inner offers all", true, offer{true, true, true, true, true},
			[]string{"try read", "try write", "batch", "send", "read data", "checkpoints", "changes since"}},
		{"inner offers none", false, offer{dataReader: true}, []string{"read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := &capDisk{data: make([]byte, 1<<20), offers: tc.offers}
			d := m.Wrap(inner, "vm", tc.name, nil)
			c := pool.CapabilitiesOf(d)
			got := offer{c.Nonblocking != nil, c.Batcher != nil, c.Sender != nil, c.DataReader != nil, c.Changes != nil}
			if got != tc.want {
				t.Fatalf("offers %+v, want %+v", got, tc.want)
			}
			p := make([]byte, 4096)
			if c.Nonblocking != nil {
				_ = c.Nonblocking.TryReadAt(p, 0)
				_ = c.Nonblocking.TryWriteAt(p, 0)
			}
			if c.Batcher != nil {
				c.Batcher.TryBatch([]pool.IO{{P: p}})
			}
			if c.Sender != nil {
				_, _ = c.Sender.TrySendTo(-1, nil, 0, len(p))
			}
			_ = c.DataReader.ReadData(p, 0, []pool.Extent{{Offset: 0, Length: 4096}})
			if c.Changes != nil {
				_ = c.Changes.Checkpoints()
				_, _ = c.Changes.ChangesSince(context.Background(), "base")
			}
			if !slices.Equal(inner.calls, tc.calls) {
				t.Fatalf("the inner handle saw %q, want %q", inner.calls, tc.calls)
			}
		})
	}

	inner := &capDisk{data: make([]byte, 1<<20), offers: true}
	d := m.Wrap(inner, "vm", "limited", qos.New(qos.Limits{ReadIOPS: 1000, WriteIOPS: 1000}))
	c := pool.CapabilitiesOf(d)
	p := make([]byte, 4096)
	ios := []pool.IO{{P: p}}
	c.Batcher.TryBatch(ios)
	_, sendErr := c.Sender.TrySendTo(-1, nil, 0, len(p))
	for name, err := range map[string]error{"try read": c.Nonblocking.TryReadAt(p, 0),
		"try write": c.Nonblocking.TryWriteAt(p, 0), "batch": ios[0].Err, "send": sendErr} {
		if !errors.Is(err, pool.ErrWouldBlock) {
			t.Errorf("%s with QoS limits: %v, want ErrWouldBlock", name, err)
		}
	}
	if len(inner.calls) != 0 {
		t.Errorf("with QoS limits the inner handle saw %q, want nothing", inner.calls)
	}
}
