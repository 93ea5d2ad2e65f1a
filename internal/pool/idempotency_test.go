package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestCreateOfATakenName: every create path (volume, snapshot, clone, disk,
// attachment) refuses a name that is taken with ErrExists, even when the
// spec is the same, so a job that reuses a name learns it instead of
// getting the old object. It returns the existing object only to a retry
// with the key it was made with, or with SameSpec, and only when the spec
// is the same. The answer survives a restart (the key is in the manifest).
func TestCreateOfATakenName(t *testing.T) {
	ctx := context.Background()
	keyA, keyB := Idempotency{Key: "req-a"}, Idempotency{Key: "req-b"}
	sameSpec := Idempotency{SameSpec: true}
	type create func(p *Pool, idem Idempotency, other bool) (id string, err error)
	paths := []struct {
		name string
		make create
	}{
		{"volume", func(p *Pool, idem Idempotency, other bool) (string, error) {
			spec := vm3("web02")
			if other {
				spec.Capacity *= 2
			}
			spec.Idempotency = idem
			v, _, err := p.Create(ctx, spec)
			return v.UID, err
		}},
		{"snapshot", func(p *Pool, idem Idempotency, other bool) (string, error) {
			v, err := p.Volume("web01")
			if err != nil {
				return "", err
			}
			s, _, err := v.CreateSnapshotWith(ctx, "nightly", idem, nil)
			return s.UID, err
		}},
		{"clone", func(p *Pool, idem Idempotency, other bool) (string, error) {
			src := Source{Volume: "web01", Snapshot: "base"}
			if other {
				src.Snapshot = ""
			}
			out, err := p.Clone(ctx, CloneRequest{Source: src, Names: []string{"vdi-1"}, Idempotency: idem}, nil)
			if err != nil {
				return "", err
			}
			return out[0].UID, nil
		}},
		{"disk", func(p *Pool, idem Idempotency, other bool) (string, error) {
			v, err := p.Volume("web01")
			if err != nil {
				return "", err
			}
			d := DiskSpec{Name: "extra", Size: mib}
			if other {
				d.Size *= 2
			}
			info, err := v.AddDiskWith(ctx, d, idem)
			for _, di := range info.Disks {
				if di.Name == "extra" {
					return fmt.Sprint(di.Size), err
				}
			}
			return "", err
		}},
		{"attachment", func(p *Pool, idem Idempotency, other bool) (string, error) {
			v, err := p.Volume("web01")
			if err != nil {
				return "", err
			}
			mode := ModeReadWrite
			if other {
				mode = ModeReadOnly
			}
			a, _, err := v.AttachWith("node-a", mode, idem)
			return a.ID + a.Token, err
		}},
	}
	setup := func(t *testing.T, dir string) *Pool {
		p := openTestPool(t, dir)
		mustCreate(t, p, vm3("web01"))
		v, _ := p.Volume("web01")
		if _, _, err := v.CreateSnapshot(ctx, "base", nil); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			dir := t.TempDir()
			p := setup(t, dir)
			first, err := path.make(p, keyA, false)
			if err != nil || first == "" {
				t.Fatalf("first create: %q, %v", first, err)
			}
			refused := []struct {
				what  string
				idem  Idempotency
				other bool
			}{
				{"no key, same spec", Idempotency{}, false},
				{"another key, same spec", keyB, false},
				{"same key, another spec", keyA, true},
				{"SameSpec, another spec", sameSpec, true},
			}
			for _, r := range refused {
				if path.name == "snapshot" && r.other {
					continue // a snapshot has no spec but its volume
				}
				if _, err := path.make(p, r.idem, r.other); !errors.Is(err, ErrExists) {
					t.Errorf("%s: %v, want ErrExists", r.what, err)
				}
			}
			if _, err := path.make(p, Idempotency{}, false); err == nil ||
				!strings.Contains(err.Error(), "already") || !strings.Contains(err.Error(), "first") {
				t.Errorf("no key: error %q does not say what to do", err)
			}
			p.Close()
			p = openTestPool(t, dir) // the key is durable with the object
			for _, idem := range []Idempotency{keyA, sameSpec} {
				again, err := path.make(p, idem, false)
				if err != nil || again != first {
					t.Errorf("retry with %+v after a restart: %q, %v; want the existing %q", idem, again, err, first)
				}
			}
		})
	}
}
