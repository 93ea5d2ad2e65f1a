package pool

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestOnDelete: the functions registered with OnDelete are told each
// delete that completed, once, after the name is gone from the pool, and
// no delete that was refused.
func TestOnDelete(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	var told []string
	p.OnDelete(func(volume string) {
		if _, err := p.Volume(volume); !errors.Is(err, ErrVolumeNotFound) {
			t.Errorf("told of the delete of %s while the pool still holds it (%v)", volume, err)
		}
		told = append(told, volume)
	})
	mustCreate(t, p, vm3("a"))
	mustCreate(t, p, vm3("b"))
	v, err := p.Volume("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteWith(ctx, "a", DeleteOptions{}); !errors.Is(err, ErrHasSnapshots) {
		t.Fatalf("delete of a volume with snapshots, not recursive: %v, want ErrHasSnapshots", err)
	}
	if len(told) != 0 {
		t.Fatalf("told %q of a refused delete", told)
	}
	for _, name := range []string{"b", "a"} {
		if err := p.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(ctx, "a"); !errors.Is(err, ErrVolumeNotFound) {
		t.Fatalf("second delete: %v, want ErrVolumeNotFound", err)
	}
	if want := []string{"b", "a"}; !slices.Equal(told, want) {
		t.Errorf("told %q, want %q", told, want)
	}
}
