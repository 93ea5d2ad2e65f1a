package pool

import (
	"context"
	"errors"
	"testing"
)

// embedsDisk wraps a handle by embedding the interface, as a wrapper that
// overrides some methods would: it inherits the inner Capabilities method.
type embedsDisk struct{ Disk }

// embedsLive wraps the live handle by embedding its type: it inherits the
// inner Capabilities method and every Try method as well.
type embedsLive struct{ *liveDisk }

// declaresOwn wraps a handle and offers Nonblocking through its own
// methods, which it declares.
type declaresOwn struct {
	Disk
	tried int
}

func (d *declaresOwn) TryReadAt(p []byte, off int64) error {
	d.tried++
	return d.Disk.Capabilities().Nonblocking.TryReadAt(p, off)
}

func (d *declaresOwn) TryWriteAt(p []byte, off int64) error {
	d.tried++
	return d.Disk.Capabilities().Nonblocking.TryWriteAt(p, off)
}

func (d *declaresOwn) Capabilities() Capabilities { return Capabilities{Nonblocking: d} }

// uncomparable declares itself, a value of a type that cannot be compared.
type uncomparable struct {
	Disk
	_ []byte
}

func (uncomparable) TryReadAt([]byte, int64) error  { return ErrWouldBlock }
func (uncomparable) TryWriteAt([]byte, int64) error { return ErrWouldBlock }

func (d uncomparable) Capabilities() Capabilities { return Capabilities{Nonblocking: d} }

// TestCapabilitiesOf: a live disk's handle offers trying without waiting,
// batches and sendfile, a snapshot's none; a wrapper offers only the
// capabilities it declares as its own: one that embeds the handle it wraps
// (the interface or the handle's type) offers none of the inner handle's,
// whose requests would skip the wrapper.
func TestCapabilitiesOf(t *testing.T) {
	_, v, live := tryDisk(t, t.TempDir())
	if _, _, err := v.CreateSnapshot(context.Background(), "s", nil); err != nil {
		t.Fatal(err)
	}
	snap, err := v.OpenSnapshotDisk("s", "root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = snap.Close() })
	own := &declaresOwn{Disk: live}

	type offer struct{ nonblocking, batcher, sender, dataReader bool }
	for _, tc := range []struct {
		name string
		d    Disk
		want offer
	}{
		{"live", live, offer{nonblocking: true, batcher: true, sender: true}},
		{"snapshot", snap, offer{}},
		{"embeds the interface", embedsDisk{live}, offer{}},
		{"embeds the handle's type", embedsLive{live}, offer{}},
		{"declares its own", own, offer{nonblocking: true}},
		{"uncomparable", uncomparable{Disk: live}, offer{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := CapabilitiesOf(tc.d)
			got := offer{c.Nonblocking != nil, c.Batcher != nil, c.Sender != nil, c.DataReader != nil}
			if got != tc.want {
				t.Fatalf("offers %+v, want %+v", got, tc.want)
			}
			for _, x := range []any{c.Nonblocking, c.Batcher, c.Sender, c.DataReader} {
				if x != nil && x != any(tc.d) {
					t.Fatalf("offers %T, not the handle %T itself", x, tc.d)
				}
			}
		})
	}
	// What is offered is the wrapper's own: a read tried through it goes
	// through its method.
	if err := CapabilitiesOf(own).Nonblocking.TryReadAt(make([]byte, 4096), 0); err != nil && !errors.Is(err, ErrWouldBlock) {
		t.Fatal(err)
	}
	if own.tried != 1 {
		t.Fatalf("the wrapper's TryReadAt ran %d times, want 1", own.tried)
	}
}
