package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestHandlesReportChanges: a snapshot's handle and a live handle declare
// their change report (CapabilitiesOf keeps it: it is the handle), name
// the checkpoints a delta can start from (a snapshot's own excluded), and
// report the changes of their own disk only: a snapshot's up to its
// snapshot, a live handle's up to the call. A snapshot that is no
// checkpoint offers no base.
func TestHandlesReportChanges(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib,
		Disks: []DiskSpec{{Name: "root", Size: 8 * mib}, {Name: "data", Size: 8 * mib}}})
	v, _ := p.Volume("vm")
	if _, _, err := v.CreateSnapshot(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "root", 2*mib, bytes.Repeat([]byte{1}, 100<<10)) // two granules
	writeDisk(t, v, "data", 6*mib, []byte("data only"))
	if _, _, err := v.CreateSnapshot(ctx, "b", nil); err != nil {
		t.Fatal(err)
	}

	snap, err := v.OpenSnapshotDisk("b", "root")
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	live, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	for _, c := range []struct {
		name        string
		d           Disk
		checkpoints []string
	}{
		{"snapshot b", snap, []string{"a"}},
		{"live", live, []string{"a", "b"}},
	} {
		cr := CapabilitiesOf(c.d).Changes
		if cr == nil {
			t.Fatalf("%s: the handle offers no change report", c.name)
		}
		if got := cr.Checkpoints(); !slices.Equal(got, c.checkpoints) {
			t.Errorf("%s: checkpoints %q, want %q", c.name, got, c.checkpoints)
		}
		got, err := cr.ChangesSince(ctx, "a")
		if want := []ChangedRange{{2 * mib, 2 * changeGranule}}; err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: changes since a %v, %v; want %v", c.name, got, err, want)
		}
		if _, err := cr.ChangesSince(ctx, "nope"); !errors.Is(err, ErrSnapshotNotFound) {
			t.Errorf("%s: changes since an unknown snapshot: %v", c.name, err)
		}
	}
	// The live handle sees a write made after b, the snapshot's does not.
	writeDisk(t, v, "root", 7*mib, []byte("after b"))
	if got, _ := CapabilitiesOf(live).Changes.ChangesSince(ctx, "b"); fmt.Sprint(got) != fmt.Sprint([]ChangedRange{{7 * mib, changeGranule}}) {
		t.Errorf("live: changes since b %v, want the write after b", got)
	}
	if got, _ := CapabilitiesOf(snap).Changes.ChangesSince(ctx, "b"); len(got) != 0 {
		t.Errorf("snapshot b: changes since b %v, want none", got)
	}
	// A snapshot from before change tracking is no base, and no delta
	// ends at it.
	v.mu.Lock()
	v.snaps["a"].Checkpoint = 0
	v.mu.Unlock()
	if got := CapabilitiesOf(live).Changes.Checkpoints(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("live: checkpoints %q once a is none, want [b]", got)
	}
	old, err := v.OpenSnapshotDisk("a", "root")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if got := CapabilitiesOf(old).Changes.Checkpoints(); len(got) != 0 {
		t.Errorf("snapshot a, taken before change tracking: checkpoints %q, want none", got)
	}
	// A closed live handle reports nothing.
	l2, _ := v.OpenDisk("root")
	_ = l2.Close()
	if _, err := CapabilitiesOf(l2).Changes.ChangesSince(ctx, "a"); !errors.Is(err, ErrClosed) {
		t.Errorf("closed handle: %v, want ErrClosed", err)
	}
}
