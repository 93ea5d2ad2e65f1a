package pool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVolumeTenant: a volume's tenant is stored in its manifest, read back
// at start-up, inherited by its clones (whose names must carry the
// tenant's prefix); a manifest whose tenant and name disagree quarantines
// the volume.
func TestVolumeTenant(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := func(name, tenant string) VolumeSpec {
		return VolumeSpec{Name: name, Tenant: tenant, Capacity: 1 << 20, Disks: []DiskSpec{{Name: "root", Size: 1 << 20}}}
	}
	for _, bad := range []VolumeSpec{spec("web", "acme"), spec("other--web", "acme"), spec("acme--", "acme"),
		spec("a--b--web", "a--b"), spec("acme--web", "Acme")} {
		if _, _, err := p.Create(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create(%q, tenant %q): %v, want ErrInvalid", bad.Name, bad.Tenant, err)
		}
	}
	if _, _, err := p.Create(ctx, spec("acme--web", "acme")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Create(ctx, spec("plain", "")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "acme--web"}, Names: []string{"stolen"}}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("clone out of the tenant: %v", err)
	}
	if _, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "acme--web"}, Names: []string{"acme--copy"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p, err = Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"acme--web": "acme", "acme--copy": "acme", "plain": ""} {
		v, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		if v.Tenant() != want || v.Info().Tenant != want {
			t.Errorf("%s: tenant %q, want %q", name, v.Tenant(), want)
		}
	}
	p.Close()

	// The tenant field is checked like every other field when read back.
	manifest := filepath.Join(dir, "volumes", "acme--web", "volume.json")
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, tamper := range []struct{ from, to string }{
		{`"tenant": "acme"`, `"tenant": "evil"`},
		{`"tenant": "acme"`, `"tenant": ""`},
		{`"tenant": "acme"`, `"tenant": "../x"`},
	} {
		if !strings.Contains(string(data), tamper.from) {
			t.Fatalf("volume.json has no %s:\n%s", tamper.from, data)
		}
		if err := os.WriteFile(manifest, []byte(strings.Replace(string(data), tamper.from, tamper.to, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := Open(ctx, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := p.Volume("acme--web")
		if tamper.to == `"tenant": ""` {
			// No tenant and a name with "--" is a valid untenanted
			// volume: only an admin sees it, never tenant acme.
			if err != nil || v.Tenant() != "" {
				t.Errorf("%s: %v, tenant %q", tamper.to, err, v.Tenant())
			}
		} else if err == nil && v.Info().Broken == "" {
			t.Errorf("%s: the volume is served, want it quarantined", tamper.to)
		}
		p.Close()
	}
}
