package nbdcrash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/consistency"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const (
	snapDisks    = 3
	snapDiskSize = 4 << 20 // bytes per disk: room for 3*8192 stamped blocks
	snapReserve  = 2000    // of those, kept for after the last snapshot
	snapCount    = 15
	snapEvery    = 100 * time.Millisecond
	snapWindow   = 24 // writes in flight over the three connections
)

// TestSnapshotsUnderNBDLoad is the NBD snapshot acceptance test: while real
// clients write to three disks of one VM through NBD, snapshots are taken
// through the API, and the core issue's checker (internal/consistency)
// proves each one is a consistent cut.
//
// The clients are libnbd (testdata/nbdpeer.py), one connection per disk as
// a VM has. They write consistency.Stamp blocks at consistency.Place
// offsets, which qemu-io cannot: its write -P fills with one byte, and
// write -s would need a file per write. The log records a write as issued
// just before the test hands it to its client, and as acknowledged when the
// test reads the client's report of the server's reply: both are on the safe
// side of the real moments, so the checker can only demand less than the
// truth, never more.
//
// Besides the cut property, each snapshot must hold every write
// acknowledged before it was requested, and none issued after it returned;
// and every snapshot must be non-trivial (some but not all writes).
func TestSnapshotsUnderNBDLoad(t *testing.T) {
	python := libnbdPython(t)
	bin := testserver.Binary(t, true)
	ctx := t.Context()
	srv, err := startQuiver(ctx, bin, filepath.Join(t.TempDir(), "pool"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(20 * time.Second) })
	spec := api.VolumeSpec{Name: "vm", Capacity: snapDisks * snapDiskSize}
	for d := range snapDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: fmt.Sprintf("d%d", d), Size: snapDiskSize})
	}
	if _, err := srv.API.CreateVolume(ctx, spec); err != nil {
		t.Fatal(err)
	}

	w := &stampWriter{log: consistency.NewLog(), outcomes: make(chan outcome, 4096),
		stop: make(chan struct{}), snapped: make(chan struct{}), ended: make(chan struct{})}
	var clients []*libnbdClient
	for d := range snapDisks {
		c, err := startLibnbdClient(python)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.close() })
		clients = append(clients, c)
		s, err := c.connect(srv.URI("vm/"+spec.Disks[d].Name), d, snapWindow, w.outcomes)
		if err != nil {
			w.abort()
			t.Fatal(err)
		}
		w.peers = append(w.peers, s)
	}
	go func() {
		w.err = w.run()
		close(w.ended)
	}()

	snaps, err := takeSnapshots(ctx, srv, w)
	close(w.stop)
	<-w.ended
	if err := errors.Join(err, w.err); err != nil {
		t.Fatalf("%v\nserver log with its goroutines:\n%s", err, srv.Dump())
	}

	nonTrivial := 0
	dir := t.TempDir()
	for _, s := range snaps {
		present, err := readSnapshot(srv, clients, s, dir)
		if err != nil {
			t.Fatalf("snapshot %s: %v", s.name, err)
		}
		n, err := w.log.Check(present)
		if err != nil {
			t.Fatalf("snapshot %s: %v", s.name, err)
		}
		for _, seq := range s.ackedBefore {
			if !present[seq] {
				t.Fatalf("snapshot %s lacks seq %d, acknowledged before the snapshot was requested", s.name, seq)
			}
		}
		for seq := range present {
			if seq > s.issuedBefore {
				t.Fatalf("snapshot %s holds seq %d, issued after the snapshot returned (last issued then: %d)", s.name, seq, s.issuedBefore)
			}
		}
		if n > 0 && n < w.log.Acked() {
			nonTrivial++
		}
		t.Logf("snapshot %s holds %d writes (%d acknowledged before it began, gate held %v)", s.name, n, len(s.ackedBefore), s.gateHeld)
	}
	t.Logf("%d writes acknowledged; %d of %d snapshots taken mid-workload", w.log.Acked(), nonTrivial, len(snaps))
	if nonTrivial != len(snaps) {
		t.Errorf("%d of %d snapshots hold no writes or all of them: they were not taken under load", len(snaps)-nonTrivial, len(snaps))
	}
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// readSnapshot reads the disks of a snapshot through NBD, in parallel, and
// returns the writes it holds. Only the start of each disk can hold a write
// issued before the snapshot returned (consistency.Place); the rest must
// read as zeros. That is checked here with bytes.Equal instead of by
// consistency.Scan, whose loop over every byte would take most of the run
// under the race detector.
func readSnapshot(srv *testserver.Process, clients []*libnbdClient, s snapshotTaken, dir string) (map[int64]bool, error) {
	_, last := consistency.Place(s.issuedBefore, snapDisks)
	end := last + consistency.BlockSize
	images := make([][]byte, snapDisks)
	errs := make([]error, snapDisks)
	var wg sync.WaitGroup
	for d := range snapDisks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			images[d], errs[d] = clients[d].readAll(srv.URI(fmt.Sprintf("vm@%s/d%d", s.name, d)), snapDiskSize, dir)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	present := map[int64]bool{}
	for d, img := range images {
		if !isZero(img[end:]) {
			return nil, fmt.Errorf("disk d%d holds data beyond offset %d, where no write issued before the snapshot returned belongs", d, end)
		}
		if err := consistency.Scan(img[:end], d, snapDisks, present); err != nil {
			return nil, err
		}
	}
	return present, nil
}

var zeros = make([]byte, 64<<10)

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// snapshotTaken is a snapshot with what the test knew when it was taken.
type snapshotTaken struct {
	name         string
	ackedBefore  []int64 // acknowledged before the request was sent
	issuedBefore int64   // highest seq handed to a client before it returned
	gateHeld     time.Duration
}

// takeSnapshots takes snapCount snapshots every snapEvery once writes are
// acknowledged, then waits until a write issued after the last one is
// acknowledged, so that no snapshot can hold every write.
func takeSnapshots(ctx context.Context, srv *testserver.Process, w *stampWriter) ([]snapshotTaken, error) {
	waitFor := func(what string, cond func() bool) error {
		deadline := time.After(30 * time.Second)
		for !cond() {
			select {
			case <-w.ended:
				return fmt.Errorf("writers stopped while waiting for %s", what)
			case <-deadline:
				return fmt.Errorf("timed out waiting for %s", what)
			case <-time.After(5 * time.Millisecond):
			}
		}
		return nil
	}
	if err := waitFor("the first acknowledged writes", func() bool { return w.log.Acked() >= 50 }); err != nil {
		return nil, err
	}
	var snaps []snapshotTaken
	for i := range snapCount {
		s := snapshotTaken{name: fmt.Sprintf("s%02d", i), ackedBefore: w.ackedSoFar()}
		snap, err := srv.API.CreateSnapshot(ctx, "vm", s.name)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", s.name, err)
		}
		s.issuedBefore, s.gateHeld = w.issued.Load(), snap.GateHeld
		snaps = append(snaps, s)
		time.Sleep(snapEvery)
	}
	close(w.snapped)
	last := snaps[len(snaps)-1].issuedBefore
	err := waitFor("a write issued after the last snapshot", func() bool { return w.maxAcked.Load() > last })
	return snaps, err
}

// stampWriter writes stamped blocks through one client per disk, keeping
// snapWindow writes in flight, and feeds the consistency log. Should the
// disks fill up before the snapshots are done, it pauses, keeping
// snapReserve blocks for the writes after the last snapshot.
type stampWriter struct {
	log      *consistency.Log
	peers    []peer
	outcomes chan outcome
	stop     chan struct{}
	snapped  chan struct{} // closed after the last snapshot
	ended    chan struct{} // closed when run returned, with err set
	err      error
	issued   atomic.Int64 // highest seq handed to a client

	maxAcked atomic.Int64
	mu       sync.Mutex
	acked    []int64 // in the order the acknowledgements were read
}

func (w *stampWriter) ackedSoFar() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int64(nil), w.acked...)
}

// run writes until stop (or until the disks are full), then lets the
// clients finish and records their last acknowledgements.
func (w *stampWriter) run() error {
	const maxSeq = snapDisks*snapDiskSize/consistency.BlockSize - 1
	block := make([]byte, consistency.BlockSize)
	inflight, closed := 0, 0
	stopping := false
	stop := w.stop
	var errs []error
	var timeout <-chan time.Time
	finish := func() {
		stopping, stop = true, nil
		for _, p := range w.peers {
			p.closeInput()
		}
		timeout = time.After(30 * time.Second)
	}
	limit, snapped := int64(maxSeq-snapReserve), w.snapped
	for closed < len(w.peers) {
		for !stopping && inflight < snapWindow && w.issued.Load() < limit {
			seq := w.log.Next() // issued: recorded before the client sees it
			if seq > maxSeq {
				errs = append(errs, errors.New("the disks are full: the workload outran the snapshots"))
				finish()
				break
			}
			d, off := consistency.Place(seq, snapDisks)
			consistency.Stamp(block, seq)
			w.issued.Store(seq)
			inflight++
			if err := w.peers[d].send(request{id: seq, off: off, data: block}); err != nil {
				errs = append(errs, fmt.Errorf("send seq %d: %w", seq, err))
				finish()
			}
		}
		select {
		case <-stop:
			finish()
		case <-snapped:
			limit, snapped = maxSeq, nil
		case <-timeout:
			errs = append(errs, fmt.Errorf("clients still running 30 s after the end: %d writes in flight, %d of %d connections over", inflight, closed, len(w.peers)))
			for _, p := range w.peers {
				errs = append(errs, p.wait(0))
			}
			return errors.Join(errs...)
		case o := <-w.outcomes:
			switch {
			case o.closed:
				closed++
			case o.err != "":
				inflight--
				errs = append(errs, fmt.Errorf("write of seq %d failed: %s", o.id, o.err))
			default:
				inflight--
				w.log.Ack(o.id) // acknowledged: recorded after the client saw it
				w.mu.Lock()
				w.acked = append(w.acked, o.id)
				w.mu.Unlock()
				if o.id > w.maxAcked.Load() {
					w.maxAcked.Store(o.id)
				}
			}
		}
	}
	for _, p := range w.peers {
		if err := p.wait(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// abort ends the clients started so far.
func (w *stampWriter) abort() {
	for _, p := range w.peers {
		p.closeInput()
		_ = p.wait(5 * time.Second)
	}
}
