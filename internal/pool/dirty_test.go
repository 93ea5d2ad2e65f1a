package pool

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

const kib = int64(1) << 10

func TestDirtySet(t *testing.T) {
	const g = dirtyGranule
	tests := []struct {
		name string
		adds []span // {off, length}
		size int64
		want []span
	}{
		{name: "nothing written", size: 1 * mib, want: []span{}},
		{name: "zero length", adds: []span{{4 * kib, 0}}, size: 1 * mib, want: []span{}},
		{name: "rounded out to the granule", adds: []span{{g + 512, 512}}, size: 1 * mib,
			want: []span{{g, 2 * g}}},
		{name: "a write across a granule boundary", adds: []span{{g - 512, 1024}}, size: 1 * mib,
			want: []span{{0, 2 * g}}},
		{name: "same granule twice", adds: []span{{0, 4 * kib}, {8 * kib, 4 * kib}}, size: 1 * mib,
			want: []span{{0, g}}},
		{name: "adjacent granules merge", adds: []span{{2 * g, 4 * kib}, {g, 4 * kib}, {3 * g, g}}, size: 1 * mib,
			want: []span{{g, 4 * g}}},
		{name: "overlapping ranges merge", adds: []span{{0, 3 * g}, {g, 4 * g}}, size: 1 * mib,
			want: []span{{0, 5 * g}}},
		{name: "separate ranges stay apart, sorted", adds: []span{{5 * g, 1}, {0, 1}, {3 * g, g}}, size: 1 * mib,
			want: []span{{0, g}, {3 * g, 4 * g}, {5 * g, 6 * g}}},
		{name: "clipped to an unaligned end", adds: []span{{1*mib - 512, 512}}, size: 1*mib + 512 - g,
			want: []span{{1*mib - g, 1*mib + 512 - g}}},
		{name: "last granule clipped", adds: []span{{g, 512}}, size: g + 512,
			want: []span{{g, g + 512}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s dirtySet
			for _, a := range tc.adds {
				s.add(a.off, a.end)
			}
			got, ok := s.ranges(tc.size)
			if !ok {
				t.Fatal("set overflowed")
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ranges = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDirtySetBatches adds far more ranges than one batch, in a scrambled
// order: first every even granule, then every odd one, so each batch merges
// with what earlier ones left.
func TestDirtySetBatches(t *testing.T) {
	var s dirtySet
	const n = 10 * compactBatch // granules of each parity
	rng := rand.New(rand.NewPCG(5, 6))
	for _, parity := range []int64{0, 1} {
		for _, i := range rng.Perm(n) {
			s.add((2*int64(i)+parity)*dirtyGranule, 512)
		}
		if parity == 0 {
			if got, ok := s.ranges(1 << 50); !ok || len(got) != n {
				t.Fatalf("after the even granules: %d ranges, ok %v; want %d", len(got), ok, n)
			}
		}
	}
	got, ok := s.ranges(1 << 50)
	if want := []span{{0, 2 * n * dirtyGranule}}; !ok || !slices.Equal(got, want) {
		t.Fatalf("after all granules: %d ranges (first %v), ok %v; want %v", len(got), got[:min(len(got), 3)], ok, want)
	}
}

func TestDirtySetOverflow(t *testing.T) {
	var s dirtySet
	for i := range int64(maxDirtyRanges) {
		s.add(i*2*dirtyGranule, 1)
	}
	if got, ok := s.ranges(1 << 50); !ok || len(got) != maxDirtyRanges {
		t.Fatalf("with %d ranges: %d ranges, ok %v; want all of them", maxDirtyRanges, len(got), ok)
	}
	s.add(maxDirtyRanges*2*dirtyGranule, 1)
	if got, ok := s.ranges(1 << 50); ok {
		t.Fatalf("with one range more: %d ranges, ok; want an overflow", len(got))
	}
	if s.spans != nil {
		t.Errorf("an overflowed set keeps %d spans, want none", len(s.spans))
	}
	s.add(0, 1)
	if _, ok := s.ranges(1 << 50); ok {
		t.Error("an overflowed set recovered after another add")
	}

	// Memory stays bounded while ranges arrive between compactions.
	var b dirtySet
	for i := range int64(3 * maxDirtyRanges) {
		b.add(i*2*dirtyGranule, 1)
		if cap(b.spans) > 4*maxDirtyRanges+2*compactBatch {
			t.Fatalf("after %d adds the set holds room for %d spans", i+1, cap(b.spans))
		}
	}
	if _, ok := b.ranges(1 << 50); ok {
		t.Error("no overflow after 3 times maxDirtyRanges separate ranges")
	}
}

// TestDirtySetConcurrent adds from many goroutines (run with -race); the
// result is the union of everything added.
func TestDirtySetConcurrent(t *testing.T) {
	var s dirtySet
	const writers, perWriter = 8, 5000
	var wg sync.WaitGroup
	for w := range int64(writers) {
		wg.Go(func() {
			for i := range int64(perWriter) {
				s.add((i*writers+w)*dirtyGranule, 512) // writer w owns every writers-th granule
			}
		})
	}
	wg.Wait()
	got, ok := s.ranges(1 << 50)
	if want := []span{{0, writers * perWriter * dirtyGranule}}; !ok || !slices.Equal(got, want) {
		t.Errorf("ranges = %v, ok %v; want %v", got, ok, want)
	}
}

// TestMarkDirty checks that writes are recorded only while a tracker is set,
// per disk, and that disks unknown to the tracker are ignored.
func TestMarkDirty(t *testing.T) {
	v := &Volume{}
	v.markDirty("root", 0, 4096) // no tracker: nothing happens
	tr := newDirtyTracker([]DiskSpec{{Name: "root", Size: 1 * mib}, {Name: "data", Size: 1 * mib}})
	v.dirty.Store(tr)
	v.markDirty("root", 3*dirtyGranule, 4096)
	v.markDirty("new", 0, 4096)
	v.dirty.Store(nil)
	v.markDirty("root", 0, 4096)
	if got, _ := tr.disks["root"].ranges(1 * mib); !slices.Equal(got, []span{{3 * dirtyGranule, 4 * dirtyGranule}}) {
		t.Errorf("root ranges = %v, want only the write made while tracking", got)
	}
	if got, _ := tr.disks["data"].ranges(1 * mib); len(got) != 0 {
		t.Errorf("data ranges = %v, want none", got)
	}
}
