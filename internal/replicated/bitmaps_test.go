package replicated

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

// TestBitmapSharedAcrossSets: two Sets of one disk (two terms) that track
// one copy share one Bitmap, so neither writes the words of its own memory
// over a bit the other set: after both marked and one closed, the file holds
// both marks.
func TestBitmapSharedAcrossSets(t *testing.T) {
	p, err := pool.Init(context.Background(), filepath.Join(t.TempDir(), "pool"), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r := newReplicaSets(nil, p, quietLogger(), newReplMetrics(), cluster.Config{}, nil)
	const size, granule = 8 << 20, replica.DefaultGranule
	rel := replica.BitmapPath("uid1", "root", "n2")
	old, _, err := r.openBitmap(rel, size)
	if err != nil {
		t.Fatal(err)
	}
	cur, created, err := r.openBitmap(rel, size)
	if err != nil || created {
		t.Fatalf("second open: created %v, %v", created, err)
	}
	if err := cur.Mark(0, 4096); err != nil { // the new term's Set
		t.Fatal(err)
	}
	if err := old.Mark(granule, 4096); err != nil { // the old term's Set, same word
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cur.Mark(2*granule, 4096); err != nil {
		t.Fatalf("a mark after the other holder closed: %v", err)
	}
	_ = cur.Close()
	b, _, err := replica.OpenBitmap(p.FS(), rel, size, granule)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Ranges(); len(got) != 3 {
		t.Fatalf("on disk %v, want the three granules both Sets marked", got)
	}
}
