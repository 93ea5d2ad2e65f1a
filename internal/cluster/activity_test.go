package cluster

import "testing"

// TestTargetActivityFor: a resync trusts an old primary's activity logs
// only for a whole copy recorded as the primary at the term just before
// the resyncing primary's (whose bitmaps track it from its first write),
// with logs of that term; anything else is copied whole.
func TestTargetActivityFor(t *testing.T) {
	logs := &CopyActivity{Term: 4, Extent: 4 << 20, Disks: map[string][]int64{"root": {1, 7}}}
	for _, tc := range []struct {
		name   string
		target Target
		term   uint64
		trust  bool
	}{
		{"old primary under its successor", Target{Whole: true, WasPrimary: 4, Activity: logs}, 5, true},
		{"a later primary than its successor", Target{Whole: true, WasPrimary: 4, Activity: logs}, 6, false},
		{"no logs published", Target{Whole: true, WasPrimary: 4}, 5, false},
		{"logs of another term", Target{Whole: true, WasPrimary: 3, Activity: logs}, 4, false},
		{"diverged (not an old primary's)", Target{Whole: true, Activity: logs}, 5, false},
		{"only behind: its bitmap is exact", Target{WasPrimary: 4, Activity: logs}, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.target.ActivityFor(tc.term) != nil; got != tc.trust {
				t.Fatalf("ActivityFor(%d) of %+v: trusted %v, want %v", tc.term, tc.target, got, tc.trust)
			}
		})
	}
}
