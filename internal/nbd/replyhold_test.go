package nbd

import (
	"context"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// holdExports wraps exports so that a WRITE at offset holdOff waits in the
// disk until release is closed, and every other request runs at once. Its
// handles are pool.Nonblocking and never run a request without waiting, so
// the reader hands small WRITEs to the write executor: a local file on a
// filesystem without RWF_NOWAIT writes (ext4), or a volume with QoS limits.
type holdExports struct {
	Exports
	holdOff int64
	entered chan struct{}
	release chan struct{}
}

type holdDisk struct {
	pool.Disk
	x *holdExports
}

func (h *holdExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := h.Exports.Open(ctx, name, peer)
	if err != nil {
		return Export{}, err
	}
	x.Disk = holdDisk{Disk: x.Disk, x: h}
	return x, nil
}

func (d holdDisk) WriteAt(p []byte, off int64, fua bool) error {
	if off == d.x.holdOff {
		d.x.entered <- struct{}{}
		<-d.x.release
	}
	return d.Disk.WriteAt(p, off, fua)
}

func (holdDisk) TryReadAt([]byte, int64) error  { return pool.ErrWouldBlock }
func (holdDisk) TryWriteAt([]byte, int64) error { return pool.ErrWouldBlock }

func (d holdDisk) Capabilities() pool.Capabilities { return pool.Capabilities{Nonblocking: d} }

var _ pool.Nonblocking = holdDisk{}

// TestWriteReplyNotHeldBehindWaitingWrite: two WRITEs arrive together and
// both go to the write executor; the second waits in the disk (for QoS
// tokens, the I/O gate, writeback). The first one's reply must reach the
// client while the second still waits, not when the executor's queue runs
// empty: it once waited behind the second (8 s seen under a snapshot).
func TestWriteReplyNotHeldBehindWaitingWrite(t *testing.T) {
	h := &holdExports{Exports: newMemExports(), holdOff: 64 << 10,
		entered: make(chan struct{}, 1), release: make(chan struct{})}
	addr := serveExports(t, "tcp", h, Config{Workers: 16})
	c := dial(t, addr)
	c.handshake(hsOpts{export: exportRoot})
	first := withPayload(testReq{typ: cmdWrite, cookie: 1, off: 0, length: 4096}, 3)
	held := withPayload(testReq{typ: cmdWrite, cookie: 2, off: uint64(h.holdOff), length: 4096}, 4)
	c.expect(first)
	c.expect(held)
	c.mustWrite(append(reqBytes(first), reqBytes(held)...))
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the second write never reached the disk")
	}
	defer close(h.release)
	c.timeout = 3 * time.Second
	start := time.Now()
	rep, err := c.readReply()
	if err != nil {
		t.Fatalf("no reply to the first write within %v while the second waits in the disk: %v", c.timeout, err)
	}
	if rep.cookie != 1 || rep.errno != 0 {
		t.Fatalf("reply to cookie %d errno %d, want the first write's success", rep.cookie, rep.errno)
	}
	t.Logf("first write answered %v after the second began to wait", time.Since(start).Round(time.Microsecond))
}

// netDisk is a disk that cannot try requests without waiting (not
// pool.Nonblocking), as a replicated or forwarded disk: its writes wait for
// a peer. Every WRITE announces itself on entered and waits for release.
type netExports struct {
	Exports
	entered chan int64
	release chan struct{}
}

type netDisk struct {
	pool.Disk
	x *netExports
}

func (n *netExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := n.Exports.Open(ctx, name, peer)
	if err != nil {
		return Export{}, err
	}
	x.Disk = netDisk{Disk: x.Disk, x: n}
	return x, nil
}

// Capabilities: none, as a replicated or forwarded disk.
func (netDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

func (d netDisk) WriteAt(p []byte, off int64, fua bool) error {
	d.x.entered <- off
	<-d.x.release
	return d.Disk.WriteAt(p, off, fua)
}

// TestNetworkDiskWritesRunSideBySide: the small WRITEs of a disk that
// waits on the network run on the workers at once, not one after another in
// the write executor (a replicated volume at queue depth 32 would otherwise
// write its copies at queue depth 1).
func TestNetworkDiskWritesRunSideBySide(t *testing.T) {
	n := &netExports{Exports: newMemExports(), entered: make(chan int64, 4), release: make(chan struct{})}
	addr := serveExports(t, "tcp", n, Config{Workers: 16})
	c := dial(t, addr)
	c.handshake(hsOpts{export: exportRoot})
	var stream []byte
	for i := range 4 {
		r := withPayload(testReq{typ: cmdWrite, cookie: uint64(i + 1), off: uint64(i) * 8192, length: 4096}, byte(i+1))
		c.expect(r)
		stream = append(stream, reqBytes(r)...)
	}
	c.mustWrite(stream)
	for i := range 4 {
		select {
		case <-n.entered:
		case <-time.After(5 * time.Second):
			close(n.release)
			t.Fatalf("%d of 4 writes in the disk at once, want all 4: they run one after another", i)
		}
	}
	close(n.release)
	for range 4 {
		if rep := mustReply(t, c); rep.errno != 0 {
			t.Fatalf("cookie %d: errno %d", rep.cookie, rep.errno)
		}
	}
}
