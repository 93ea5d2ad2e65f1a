package metrics

import (
	"context"
	"testing"
)

// TestVolumeIO reads a volume's counters as the Prometheus series count
// them: two disks, each written and read once, are two of each for the
// volume; a volume that did no I/O reads zero and gets no series by being
// asked; a deleted volume reads zero.
func TestVolumeIO(t *testing.T) {
	m, disks, p := activePool(t, 2, Options{})
	want := VolumeIO{ReadOps: 2, ReadBytes: 8192, WriteOps: 2, WriteBytes: 8192}
	if got := m.VolumeIO("vm-0001"); got != want {
		t.Fatalf("vm-0001: %+v, want %+v", got, want)
	}
	if err := disks[0].WriteAt(make([]byte, 65536), 0, false); err != nil {
		t.Fatal(err)
	}
	want.WriteOps, want.WriteBytes = 3, 8192+65536
	if got := m.VolumeIO("vm-0001"); got != want {
		t.Fatalf("vm-0001 after one more write: %+v, want %+v", got, want)
	}
	if got := m.VolumeIO("idle"); got != (VolumeIO{}) {
		t.Fatalf("a volume without I/O: %+v", got)
	}
	if n := seriesOf(t, m, "idle"); len(n) != 0 {
		t.Fatalf("asking for an idle volume's I/O made series %v", n)
	}
	for _, d := range disks {
		_ = d.Close()
	}
	if err := p.Delete(context.Background(), "vm-0001"); err != nil {
		t.Fatal(err)
	}
	if got := m.VolumeIO("vm-0001"); got != (VolumeIO{}) {
		t.Fatalf("a deleted volume: %+v", got)
	}
}
