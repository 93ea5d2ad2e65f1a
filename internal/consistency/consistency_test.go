package consistency

import (
	"strings"
	"testing"
)

// TestCheckDetectsNonCuts feeds the checker hand-made histories so that it is
// known to fail when it should.
func TestCheckDetectsNonCuts(t *testing.T) {
	l := NewLog()
	// 1 and 2 run one after the other; 3 and 4 overlap.
	s1 := l.Next()
	l.Ack(s1)
	s2 := l.Next()
	l.Ack(s2)
	s3 := l.Next()
	s4 := l.Next()
	l.Ack(s4)
	l.Ack(s3)
	tests := []struct {
		name    string
		present []int64
		wantErr string
	}{
		{"empty", nil, ""},
		{"prefix", []int64{s1}, ""},
		{"all", []int64{s1, s2, s3, s4}, ""},
		{"overlapping writes in either order", []int64{s1, s2, s4}, ""},
		{"overlapping writes other one", []int64{s1, s2, s3}, ""},
		{"hole before", []int64{s2}, "not a cut"},
		{"later without earlier", []int64{s1, s3}, "not a cut"},
		{"phantom", []int64{99}, "never issued"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := map[int64]bool{}
			for _, s := range tt.present {
				set[s] = true
			}
			_, err := l.Check(set)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("unexpected %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("got %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestStampScanRoundTrip(t *testing.T) {
	const disks = 3
	images := make([][]byte, disks)
	for i := range images {
		images[i] = make([]byte, 64*BlockSize)
	}
	for seq := int64(1); seq <= 100; seq++ {
		d, off := Place(seq, disks)
		Stamp(images[d][off:off+BlockSize], seq)
	}
	got := map[int64]bool{}
	for d, img := range images {
		if err := Scan(img, d, disks, got); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 100 {
		t.Fatalf("scanned %d seqs, want 100", len(got))
	}
	images[1][BlockSize+9] ^= 0xFF // tear a block
	if err := Scan(images[1], 1, disks, map[int64]bool{}); err == nil {
		t.Fatal("torn block not detected")
	}
}
