package backup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// waitWhole waits until volume name is no longer filling.
func waitWhole(t *testing.T, p *pool.Pool, name string) *pool.Volume {
	t.Helper()
	v, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for v.Filling() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("volume %s still filling after a minute: %+v", name, v.Info().Fill)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return v
}

func TestInstantRestore(t *testing.T) {
	ctx := context.Background()
	s, p, _ := testService(t)
	defer s.Close()
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("vm")
	scribble(t, v, rand.New(rand.NewPCG(3, 4)), 300)
	m, err := s.Backup(ctx, "vm", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := contents(t, v)

	info, err := s.InstantRestore(ctx, "main", m.ID, "fast", nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.Fill == nil || info.Fill.Source != "backup:main:"+m.ID || info.Labels["app"] != "db" {
		t.Fatalf("instant restore returned %+v (fill %+v)", info, info.Fill)
	}
	// Served at once: the VM reads the backup's data and writes its own,
	// while the copy runs.
	rv, _ := p.Volume("fast")
	h, err := rv.OpenDisk("data")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8<<20)
	if err := h.ReadAt(got, 0); err != nil || !bytes.Equal(got, want["data"]) {
		t.Fatalf("read while filling: %v (equal %v)", err, bytes.Equal(got, want["data"]))
	}
	mine := bytes.Repeat([]byte("written after the restore "), 4096)[:64<<10]
	if err := h.WriteAt(mine, 5<<20, true); err != nil {
		t.Fatal(err)
	}
	h.Close()
	copy(want["data"][5<<20:], mine)

	rv = waitWhole(t, p, "fast")
	for d, w := range want {
		if !bytes.Equal(contents(t, rv)[d], w) {
			t.Fatalf("disk %s of the instantly restored volume differs from the backup plus the VM's write", d)
		}
	}
	// The VM's write went to the new volume only: the backup restores as
	// it was.
	if _, err := s.Restore(ctx, "main", m.ID, "again", nil, nil); err != nil {
		t.Fatal(err)
	}
	again, _ := p.Volume("again")
	if bytes.Equal(contents(t, again)["data"][5<<20:5<<20+len(mine)], mine) {
		t.Fatal("the VM's write reached the backup")
	}
	if _, _, err := rv.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatalf("snapshot of the volume once whole: %v", err)
	}
	if _, err := s.InstantRestore(ctx, "main", m.ID, "fast", nil); !errors.Is(err, pool.ErrExists) {
		t.Fatalf("instant restore into an existing volume: %v, want ErrExists", err)
	}
}

// TestInstantRestoreResumes: the store goes down mid-copy and the service
// stops; a new service (a restarted server) finishes the copy once the
// store is back.
func TestInstantRestoreResumes(t *testing.T) {
	ctx := context.Background()
	s, p, srv := testService(t)
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("vm")
	scribble(t, v, rand.New(rand.NewPCG(5, 6)), 300)
	m, err := s.Backup(ctx, "vm", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := contents(t, v)
	if _, err := s.InstantRestore(ctx, "main", m.ID, "fast", nil); err != nil {
		t.Fatal(err)
	}
	srv.Down(true)
	rv, _ := p.Volume("fast")
	if rv.Filling() == nil {
		t.Fatal("the copy was done before the store went down")
	}
	h, err := rv.OpenDisk("logs")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ReadAt(make([]byte, 4096), 4<<20-4096); !errors.Is(err, pool.ErrFillSource) {
		t.Fatalf("read of a block not copied with the store down: %v, want ErrFillSource", err)
	}
	h.Close()
	s.Close()

	srv.Down(false)
	var cfg Config
	for _, n := range s.order {
		cfg.Targets = append(cfg.Targets, s.targets[n].cfg)
	}
	s2, err := NewService(p, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s2.Run(runCtx, time.Hour) }()
	defer func() { stop(); <-done }()
	rv = waitWhole(t, p, "fast")
	got := contents(t, rv)
	for d, w := range want {
		if !bytes.Equal(got[d], w) {
			t.Fatalf("disk %s differs from the backup after the resumed copy", d)
		}
	}
}
