package nbdcrash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const (
	crashBlocks  = 256 // blocks per disk: 1 MiB, small enough for many overwrites
	libnbdWindow = 8   // requests in flight per libnbd connection
	flushOneIn   = 12  // one request in flushOneIn is a FLUSH
)

// TestKillDuringWrites is the NBD crash acceptance test: SIGKILL the server
// during a write workload from real clients with periodic FLUSH and FUA
// writes; after the restart every write acknowledged before a completed
// FLUSH, and every acknowledged FUA write, must be on disk.
//
// Each cycle writes to two disks of one volume at once: "qemu" through
// qemu-io (QEMU's NBD client, one request at a time) and "libnbd" through
// two libnbd connections with several requests in flight each, where a FLUSH
// on either connection covers the writes acknowledged on both (the server
// advertises NBD_FLAG_CAN_MULTI_CONN). After a random delay the server is
// killed, started again on the same pool, and both disks are read back
// through NBD (libnbd, on a fresh connection) and checked against the model
// (model_test.go).
//
// A SIGKILL ends the process, not the machine: the kernel keeps the page
// cache, so a write that reached pwrite survives whether or not it was
// flushed. This test therefore proves the protocol-level ordering (no
// acknowledgement before the data is in the file, FLUSH and FUA answered
// only after the write they cover), not durability across power loss, which
// needs a crash-simulating filesystem.
func TestKillDuringWrites(t *testing.T) {
	cycles := envInt(t, "QUIVER_NBDCRASH_CYCLES", 50)
	if testing.Short() && os.Getenv("QUIVER_NBDCRASH_CYCLES") == "" {
		cycles = 10
	}
	runKillTest(t, t.TempDir(), cycles, false)
}

// TestKillDuringWritesXFS runs fewer cycles on an XFS pool, where disks are
// written in owned chunks (pool/chunks.go): the first write into a chunk
// rewrites it whole, and a kill during that rewrite must lose nothing
// either.
func TestKillDuringWritesXFS(t *testing.T) {
	cycles := envInt(t, "QUIVER_NBDCRASH_XFS_CYCLES", 15)
	if testing.Short() && os.Getenv("QUIVER_NBDCRASH_XFS_CYCLES") == "" {
		cycles = 5
	}
	runKillTest(t, testfs.MountXFS(t, 1<<30), cycles, true)
}

// runKillTest runs cycles on a pool in dir, taking a snapshot after each
// with snapshotEach.
func runKillTest(t *testing.T, dir string, cycles int, snapshotEach bool) {
	requireTools(t, "qemu-io")
	python := libnbdPython(t)
	// The server runs without the race detector here: it is restarted for
	// every cycle, and the detector would make each one several times
	// slower. TestSnapshotsUnderNBDLoad runs it with the detector under NBD
	// load.
	bin := testserver.Binary(t, false)
	seed := uint64(time.Now().UnixNano())
	if os.Getenv("QUIVER_NBDCRASH_SEED") != "" {
		seed = uint64(envInt(t, "QUIVER_NBDCRASH_SEED", 0))
	}
	t.Logf("%d cycles, seed %d (QUIVER_NBDCRASH_SEED)", cycles, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	ctx := t.Context()
	k := &killTest{snapshotEach: snapshotEach, bin: bin, dir: dir, poolDir: filepath.Join(dir, "pool"), python: python, seed: seed,
		qemu: newDiskModel("qemu", rng.Uint64(), crashBlocks), libnbd: newDiskModel("libnbd", rng.Uint64(), crashBlocks)}
	t.Cleanup(k.close)
	var err error
	if k.srv, err = startQuiver(ctx, bin, k.poolDir); err != nil {
		t.Fatal(err)
	}
	_, err = k.srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 2 * crashBlocks * blockSize, Disks: []api.DiskSpec{
		{Name: "qemu", Size: crashBlocks * blockSize},
		{Name: "libnbd", Size: crashBlocks * blockSize},
	}})
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	models := []*diskModel{k.qemu, k.libnbd}
	// On a loaded machine the clients start slowly and a short cycle can end
	// before either made a write durable (seen in CI at load average 18:
	// one acknowledged flush from qemu-io in 15 cycles). Cycles go on then,
	// up to as many again, until each disk has writes made durable both by
	// FUA and by a flush; the check below fails if they still have not.
	ran := 0
	for ; ran < cycles || (ran < 2*cycles && !provesDurability(models)); ran++ {
		if err := k.cycle(ctx, ran, time.Duration(20+rng.IntN(230))*time.Millisecond); err != nil {
			t.Fatalf("cycle %d (QUIVER_NBDCRASH_SEED=%d): %v", ran, seed, err)
		}
	}
	t.Logf("%d kill cycles in %v", ran, time.Since(start).Round(time.Millisecond))
	for _, m := range models {
		s := m.stats
		t.Logf("disk %s: %d writes issued, %d acknowledged, %d durable by FUA, %d by one of %d acknowledged flushes; %d blocks checked against a durable write",
			m.name, s.writes, s.acked, s.fua, s.flushed, s.flushes, s.durableBlocks)
		if !provesDurability([]*diskModel{m}) {
			t.Errorf("disk %s: the workload made too few writes durable to prove anything", m.name)
		}
	}
	if err := k.srv.Stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// provesDurability reports whether every model has writes made durable by
// FUA and by a flush, and blocks checked against them.
func provesDurability(models []*diskModel) bool {
	for _, m := range models {
		if s := m.stats; s.fua == 0 || s.flushed == 0 || s.durableBlocks == 0 {
			return false
		}
	}
	return true
}

// killTest is the state that lives through the cycles: the server of the
// current cycle, the disks' models and the libnbd client processes.
type killTest struct {
	bin, dir, poolDir, python string
	seed                      uint64
	snapshotEach              bool
	srv                       *testserver.Process // nil after a failed cycle, which killed it
	qemu, libnbd              *diskModel
	clients                   [2]*libnbdClient
}

func (k *killTest) close() {
	if k.srv != nil {
		_ = k.srv.Stop(20 * time.Second) // a failed test: its cause is reported already
	}
	for _, c := range k.clients {
		if c != nil {
			_ = c.close()
		}
	}
}

// cycle writes to both disks, kills the server after delay, restarts it and
// checks both disks through the restarted server.
func (k *killTest) cycle(ctx context.Context, n int, delay time.Duration) error {
	loads, err := k.startLoads()
	if err != nil {
		return errors.Join(err, k.kill())
	}
	var killed atomic.Bool
	stop := make(chan struct{})
	errs := make([]error, len(loads))
	var wg sync.WaitGroup
	for i, l := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(k.seed, uint64(n*len(loads)+i+1)))
			errs[i] = l.drive(rng, stop, &killed)
		}()
	}
	time.Sleep(delay)
	killed.Store(true)
	killErr := killServer(k.srv)
	close(stop)
	wg.Wait()
	if err := errors.Join(append(errs, killErr, k.srv.CheckLog())...); err != nil {
		k.srv = nil
		return err
	}
	if k.srv, err = startQuiver(ctx, k.bin, k.poolDir); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	for i, l := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := k.clients[i].readAll(k.srv.URI("vm/"+l.model.name), crashBlocks*blockSize, k.dir)
			if err == nil {
				err = l.model.check(img)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return errors.Join(err, k.kill())
	}
	if k.snapshotEach {
		// The next cycle's writes then land in extents shared with the
		// snapshot: with owned chunks, each first write rewrites its chunk.
		if _, err := k.srv.API.CreateSnapshot(ctx, "vm", fmt.Sprintf("cycle-%d", n)); err != nil {
			return errors.Join(fmt.Errorf("snapshot: %w", err), k.kill())
		}
	}
	return nil
}

func (k *killTest) kill() error {
	err := killServer(k.srv)
	k.srv = nil
	return err
}

// startLoads connects the clients of both disks, in parallel: qemu-io to
// "qemu", two libnbd connections to "libnbd".
func (k *killTest) startLoads() ([]*diskLoad, error) {
	q := &diskLoad{model: k.qemu, fill: true, peers: make([]peer, 1), outcomes: make(chan outcome, 4096)}
	l := &diskLoad{model: k.libnbd, peers: make([]peer, 2), outcomes: make(chan outcome, 4096)}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(3)
	go func() {
		defer wg.Done()
		p, err := startQemuIO(k.srv.URI("vm/qemu"), 0, q.outcomes)
		if err == nil {
			q.peers[0] = p
		}
		errs[0] = err
	}()
	for i := range k.clients {
		go func() {
			defer wg.Done()
			c := k.clients[i]
			if c == nil || c.exited {
				var err error
				if c, err = startLibnbdClient(k.python); err != nil {
					errs[1+i] = err
					return
				}
				k.clients[i] = c
			}
			s, err := c.connect(k.srv.URI("vm/libnbd"), i, libnbdWindow, l.outcomes)
			if err == nil {
				l.peers[i] = s
			}
			errs[1+i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, d := range []*diskLoad{q, l} {
			for _, p := range d.peers {
				if p != nil {
					p.closeInput()
					_ = p.wait(5 * time.Second)
				}
			}
		}
		return nil, err
	}
	return []*diskLoad{q, l}, nil
}

// diskLoad drives the clients of one disk and keeps its model up to date.
type diskLoad struct {
	model    *diskModel
	peers    []peer
	fill     bool // the clients write one repeated byte (qemu-io)
	outcomes chan outcome
}

// pendingReq is a request in flight: a write, or a flush (w == nil).
type pendingReq struct {
	peer int
	w    *write
}

// drive issues requests until stop, then lets the clients finish and
// records every outcome they report. A request that fails before the
// server was killed is an error.
func (d *diskLoad) drive(rng *rand.Rand, stop <-chan struct{}, killed *atomic.Bool) error {
	m := d.model
	busy := make([]bool, m.blocks)
	inflight := make([]int, len(d.peers))
	pending := map[int64]pendingReq{}
	var errs []error
	fail := func(err error) {
		if !killed.Load() && len(errs) < 10 {
			errs = append(errs, err)
		}
	}
	stopping := false
	var timeout <-chan time.Time
	for closed := 0; closed < len(d.peers); {
		for i, p := range d.peers {
			for !stopping && !killed.Load() && inflight[i] < p.window() {
				req, ok := d.next(rng, busy, pending, i)
				if !ok {
					break
				}
				inflight[i]++
				if err := p.send(req); err != nil {
					fail(fmt.Errorf("send request #%d: %w", req.id, err))
					break
				}
			}
		}
		select {
		case <-stop:
			stopping, stop = true, nil
			for _, p := range d.peers {
				p.closeInput()
			}
			timeout = time.After(30 * time.Second)
		case <-timeout:
			return fmt.Errorf("disk %s: clients still running 30 s after the kill", m.name)
		case o := <-d.outcomes:
			if o.closed {
				closed++
				continue
			}
			pr, ok := pending[o.id]
			if !ok {
				errs = append(errs, fmt.Errorf("disk %s: outcome for unknown request #%d: %s", m.name, o.id, o.err))
				continue
			}
			delete(pending, o.id)
			inflight[pr.peer]--
			d.settle(pr, o, busy, fail)
		}
	}
	for _, p := range d.peers {
		if err := p.wait(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// next makes the next request for peer i and records it as issued.
func (d *diskLoad) next(rng *rand.Rand, busy []bool, pending map[int64]pendingReq, i int) (request, bool) {
	m := d.model
	if rng.IntN(flushOneIn) == 0 {
		id := m.newID()
		m.issueFlush(id)
		pending[id] = pendingReq{peer: i}
		return request{id: id, flush: true}, true
	}
	w := m.newWrite(rng, busy, d.fill)
	if w == nil {
		return request{}, false
	}
	for b := w.first; b < w.first+w.n; b++ {
		busy[b] = true
	}
	m.issued(w)
	pending[w.id] = pendingReq{peer: i, w: w}
	return request{id: w.id, off: int64(w.first) * blockSize, data: m.payload(w), fua: w.fua}, true
}

func (d *diskLoad) settle(pr pendingReq, o outcome, busy []bool, fail func(error)) {
	m := d.model
	if pr.w == nil {
		if o.err == "" {
			m.ackFlush(o.id)
			return
		}
		m.failFlush(o.id)
		fail(fmt.Errorf("disk %s: flush #%d failed while the server ran: %s", m.name, o.id, o.err))
		return
	}
	for b := pr.w.first; b < pr.w.first+pr.w.n; b++ {
		busy[b] = false
	}
	if o.err == "" {
		m.ackWrite(pr.w)
		return
	}
	fail(fmt.Errorf("disk %s: write #%d failed while the server ran: %s", m.name, o.id, o.err))
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, s)
	}
	return n
}
