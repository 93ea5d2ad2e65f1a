package replicated

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

const (
	alDisk    = 16 << 20
	alExtent  = 256 << 10
	alSlots   = 4
	alGranule = replica.DefaultGranule
)

// alNode is one node of the test: its pool, its volume "vm" of one disk
// "root", and its NBD server (its copy, for the other node's Set).
type alNode struct {
	pool *pool.Pool
	uid  string
	addr string
	disk pool.Disk
}

// holdingExports serve a pool's disks, holding a write at offset at (the
// copy never answers it: the primary dies with it in flight).
type holdingExports struct {
	nbd.Exports
	at      int64
	entered chan struct{}
	release chan struct{}
}

func (e holdingExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	ex, err := e.Exports.Open(ctx, name, peer)
	if err == nil {
		ex.Disk = &holdingDisk{Disk: ex.Disk, e: e}
	}
	return ex, err
}

type holdingDisk struct {
	pool.Disk
	e holdingExports
}

func (d *holdingDisk) WriteAt(p []byte, off int64, fua bool) error {
	if off == d.e.at {
		close(d.e.entered)
		<-d.e.release // never applied
		return errors.New("test: the copy's node went down with its primary")
	}
	return d.Disk.WriteAt(p, off, fua)
}

// Capabilities: none, so that every write reaches WriteAt.
func (d *holdingDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

func startALNode(t *testing.T, name string, wrap func(nbd.Exports) nbd.Exports) *alNode {
	t.Helper()
	ctx := context.Background()
	p, err := pool.Init(ctx, filepath.Join(t.TempDir(), name), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	info, _, err := p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: alDisk, Replicas: 2,
		Disks: []pool.DiskSpec{{Name: "root", Size: alDisk}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var ex nbd.Exports = nbd.PoolExports{Pool: p}
	if wrap != nil {
		ex = wrap(ex)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := nbd.NewServer(ex, nbd.Config{Logger: quietLogger()})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return &alNode{pool: p, uid: info.UID, addr: l.Addr().String(), disk: d}
}

func randomBlock(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func diskBytes(t *testing.T, d pool.Disk) []byte {
	t.Helper()
	b := make([]byte, alDisk)
	if err := d.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOldPrimaryResyncCopiesOnlyWhatChanged (issue 32): the primary a
// dies under writes with one in flight (applied on its disk, never on its
// copy b); b is promoted and written meanwhile; when a comes back, its
// resync copies b's dirty bitmap (every change since b took over) and a's
// activity log (published as the cluster's copy record says, read by
// poolStore.ActivityOf, trusted by Target.ActivityFor, marked by
// markBeyondBitmap): at most the bytes written in the outage plus the
// activity window, rounded to the granule, not the disk; and a ends byte
// for byte b's, the write in flight undone.
func TestOldPrimaryResyncCopiesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(32, 32))
	const inflightAt = 3*alExtent + 8192
	entered, release := make(chan struct{}), make(chan struct{})
	b := startALNode(t, "b", func(ex nbd.Exports) nbd.Exports {
		return holdingExports{Exports: ex, at: inflightAt, entered: entered, release: release}
	})
	t.Cleanup(func() { close(release) })
	a := startALNode(t, "a", nil)

	// Term 1: a is the primary, b its in-sync copy.
	al, err := replica.OpenActivityLog(a.pool.FS(), replica.ActivityPath(a.uid, "root"), 1, alExtent, alSlots)
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan struct{})
	defer close(dead)
	s1, err := replica.NewSet(ctx, alDisk, []replica.Copy{{Node: "b", Addr: b.addr, Export: "vm/root"}}, nil,
		replica.Options{Timeout: time.Minute, Activity: al, OutOfSync: func(string, error) error {
			<-dead // the primary is dead: it records nothing more
			return context.Canceled
		}})
	if err != nil {
		t.Fatal(err)
	}
	d1 := s1.Disk(a.disk)
	for i := range 200 {
		off := r.Int64N(alDisk/4096) * 4096
		if off/alExtent == inflightAt/alExtent {
			continue
		}
		if err := d1.WriteAt(randomBlock(r, 4096), off, false); err != nil {
			t.Fatal(err)
		}
		if i%10 == 9 {
			if err := d1.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The last write: applied on a, in flight to b when a dies.
	go func() { _ = d1.WriteAt(bytes.Repeat([]byte{0xee}, 4096), inflightAt, false) }()
	<-entered
	waitUntil(t, "the write in flight applied on a", func() bool {
		p := make([]byte, 4096)
		return a.disk.ReadAt(p, inflightAt) == nil && p[0] == 0xee
	})

	// Term 2: b is promoted; a is behind, tracked from b's first write.
	s2, err := replica.NewSet(ctx, alDisk, nil, []string{"a"}, replica.Options{Timeout: 5 * time.Second,
		OutOfSync: func(string, error) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	d2 := s2.Disk(b.disk)
	var rounded int64
	for range 20 {
		off := r.Int64N(alDisk/4096) * 4096
		if off/alExtent == inflightAt/alExtent {
			continue
		}
		if err := d2.WriteAt(randomBlock(r, 4096), off, false); err != nil {
			t.Fatal(err)
		}
		rounded += (off+4096+alGranule-1)/alGranule*alGranule - off/alGranule*alGranule
	}

	// a comes back: it publishes its activity log of term 1 as it follows
	// term 2, and b resyncs it.
	act := poolStore{a.pool}.ActivityOf("vm", a.uid, 1)
	target := cluster.Target{Node: "a", Whole: true, WasPrimary: 1, Activity: act}
	activity := target.ActivityFor(2)
	if activity == nil {
		t.Fatalf("activity log of a: %+v, not trusted for its resync", act)
	}
	window := int64(len(activity.Disks["root"])) * alExtent
	if err := markBeyondBitmap(s2, "a", "root", alDisk, true, activity); err != nil {
		t.Fatal(err)
	}
	x, err := s2.BeginResync(ctx, replica.Copy{Node: "a", Addr: a.addr, Export: "vm/root"})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Run(ctx, b.disk, nil); err != nil {
		t.Fatal(err)
	}
	if err := replica.Rejoin([]*replica.Resync{x}, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	t.Logf("resync copied %d bytes: outage writes %d (to the granule), activity window %d, disk %d",
		x.Total(), rounded, window, int64(alDisk))
	if x.Total() > rounded+window || window > alSlots*alExtent {
		t.Errorf("resync copied %d bytes, more than the outage's writes (%d, to the granule) and the activity window (%d)",
			x.Total(), rounded, window)
	}
	if !bytes.Equal(diskBytes(t, a.disk), diskBytes(t, b.disk)) {
		t.Errorf("after the resync the old primary's copy differs from the new primary's")
	}
}
