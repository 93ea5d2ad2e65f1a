package qosbench

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// opOf maps qemu's name of an NBD request to the op label quiver counts it
// under; "" for requests that are not counted (disconnect; block status and
// cache, which this workload does not send).
func opOf(typ string) string {
	switch typ {
	case "read", "write", "trim", "flush":
		return typ
	case "write zeroes":
		return "zero"
	}
	return ""
}

// counts are operations and bytes by op label.
type counts struct {
	ops, bytes map[string]float64
}

func newCounts() counts { return counts{ops: map[string]float64{}, bytes: map[string]float64{}} }

// add counts one request as quiver's metrics should: bytes for reads and
// writes only (trim and zero move no data).
func (c counts) add(op string, length int64) {
	c.ops[op]++
	if op == "read" || op == "write" {
		c.bytes[op] += float64(length)
	}
}

// fromTrace counts what qemu sent.
func fromTrace(reqs []wireRequest) counts {
	c := newCounts()
	for _, r := range reqs {
		if op := opOf(r.typ); op != "" {
			c.add(op, r.length)
		}
	}
	return c
}

var ops = []string{"read", "write", "flush", "trim", "zero"}

func (c counts) String() string {
	s := ""
	for _, op := range ops {
		s += fmt.Sprintf(" %s=%v/%vB", op, c.ops[op], c.bytes[op])
	}
	return s
}

func (c counts) equal(o counts) bool {
	for _, op := range ops {
		if c.ops[op] != o.ops[op] || c.bytes[op] != o.bytes[op] {
			return false
		}
	}
	return true
}

// scraped is what /metrics counted for one disk.
func scraped(m client.Metrics, volume, disk string) counts {
	c := newCounts()
	for _, op := range ops {
		match := map[string]string{"volume": volume, "disk": disk, "op": op}
		c.ops[op] = m.Sum("quiver_disk_requests_total", match)
		c.bytes[op] = m.Sum("quiver_disk_bytes_total", match)
	}
	return c
}

// waitIdle waits until the server has no NBD connection: a connection's
// last accounting (the flush the server does for a client that left with
// unflushed writes) is done before it is closed.
func waitIdle(t *testing.T, s *server) client.Metrics {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := s.scrape(t)
		if m.Sum("quiver_nbd_connections", nil) == 0 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v NBD connections still open", m.Sum("quiver_nbd_connections", nil))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitBusy waits until the server has counted requests to every one of
// disks of volume.
func waitBusy(t *testing.T, s *server, volume string, disks ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := s.scrape(t)
		busy := 0
		for _, d := range disks {
			if m.Sum("quiver_disk_requests_total", map[string]string{"volume": volume, "disk": d}) > 0 {
				busy++
			}
		}
		if busy == len(disks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no requests to %d of the disks %v of %s after 30 s", len(disks)-busy, disks, volume)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsCountTheWorkload is acceptance criterion 3: a workload whose
// every request is known, then /metrics must hold exactly that. The oracle
// is twofold: the commands given (each is one NBD request of known size) and
// qemu's own trace of what it put on the wire; they must agree, then the
// counters must equal them.
//
// qemu-io runs with its default cache mode, writethrough: every write goes
// with FUA, and on close qemu sends one more FLUSH because there were writes
// since the last one (bdrv_close flushes). That flush is a client request
// like any other, so it is expected, not tolerated.
func TestMetricsCountTheWorkload(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	s := startServer(t, "--metrics-per-disk")
	v := s.createVolume(t, "vm", &api.QoS{RWIOPS: 100_000, RWMBytes: 10_000},
		disk("root", 64*miB), disk("data", 32*miB))
	workload := []struct {
		command string
		op      string
		length  int64
	}{
		{"write -P 0x11 0 4k", "write", 4 * kiB},
		{"write -P 0x22 64k 64k", "write", 64 * kiB},
		{"write -P 0x33 1M 1M", "write", miB},
		{"write -P 0x44 3M 512", "write", 512},
		{"flush", "flush", 0},
		{"read -P 0x11 0 4k", "read", 4 * kiB},
		{"read -P 0x22 64k 64k", "read", 64 * kiB},
		// 1 MiB is above the size from which holes are looked up, but
		// the range is all data: one read.
		{"read -P 0x33 1M 1M", "read", miB},
		{"read -P 0x44 3M 512", "read", 512},
		{"write -z 8M 64k", "zero", 0},
		{"discard 16M 64k", "trim", 0},
		{"flush", "flush", 0},
		{"write -P 0x55 32M 8k", "write", 8 * kiB},
	}
	want := newCounts()
	var commands []string
	for _, w := range workload {
		commands = append(commands, w.command)
		want.add(w.op, w.length)
	}
	want.add("flush", 0) // qemu's flush on close, after the last write

	out, reqs := qemuIO(t, s.uri("vm", "root"), "writethrough", commands...)
	if sent := fromTrace(reqs); !sent.equal(want) {
		t.Fatalf("qemu sent%s\nwant%s\n(the workload's expectation is wrong for this qemu)\n%s", sent, want, out)
	}
	m := waitIdle(t, s)
	if got := scraped(m, "vm", "root"); !got.equal(want) {
		t.Errorf("metrics of vm/root:%s\nwant (what qemu sent):%s", got, want)
	}
	for _, op := range ops {
		match := map[string]string{"volume": "vm", "disk": "root", "op": op}
		if n := m.Sum("quiver_disk_request_duration_seconds_count", match); n != want.ops[op] {
			t.Errorf("latency histogram of %s holds %v requests, want %v", op, n, want.ops[op])
		}
	}
	// The volume's series count the same requests: its other disk is idle.
	vol := newCounts()
	for _, op := range ops {
		match := map[string]string{"volume": "vm", "op": op}
		vol.ops[op] = m.Sum("quiver_volume_requests_total", match)
		vol.bytes[op] = m.Sum("quiver_volume_bytes_total", match)
		if n := m.Sum("quiver_request_duration_seconds_count", map[string]string{"op": op}); n != want.ops[op] {
			t.Errorf("the node's latency histogram of %s holds %v requests, want %v", op, n, want.ops[op])
		}
	}
	if !vol.equal(want) {
		t.Errorf("metrics of the volume vm:%s\nwant (what qemu sent):%s", vol, want)
	}
	if got := scraped(m, "vm", "data"); !got.equal(newCounts()) {
		t.Errorf("metrics of the idle disk vm/data:%s, want none", got)
	}
	gauges := []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"quiver_disk_virtual_bytes", map[string]string{"volume": "vm", "disk": "root"}, float64(64 * miB)},
		{"quiver_disk_virtual_bytes", map[string]string{"volume": "vm", "disk": "data"}, float64(32 * miB)},
		{"quiver_volume_capacity_bytes", map[string]string{"volume": "vm"}, float64(v.Capacity)},
		{"quiver_volume_snapshots", map[string]string{"volume": "vm"}, 0},
		{"quiver_disk_requests_in_flight", map[string]string{"volume": "vm"}, 0},
		{"quiver_volume_requests_in_flight", map[string]string{"volume": "vm"}, 0},
		{"quiver_nbd_connections", nil, 0},
		{"quiver_pool_volumes", nil, 1},
		{"quiver_errors_total", nil, 0},
	}
	for _, g := range gauges {
		if got := m.Sum(g.name, g.match); got != g.want {
			t.Errorf("%s%v = %v, want %v", g.name, g.match, got, g.want)
		}
	}
	alloc := m.Sum("quiver_disk_allocated_bytes", map[string]string{"volume": "vm", "disk": "root"})
	if alloc < float64(miB) || alloc > float64(64*miB) {
		t.Errorf("vm/root allocates %v bytes, want between the 1 MiB written and its 64 MiB", alloc)
	}
	free, size := m.Sum("quiver_pool_free_bytes", nil), m.Sum("quiver_pool_size_bytes", nil)
	if free <= 0 || free > size {
		t.Errorf("pool free %v of %v bytes", free, size)
	}
	if _, err := s.api.CreateSnapshot(t.Context(), "vm", "s1"); err != nil {
		t.Fatal(err)
	}
	if n := s.scrape(t).Sum("quiver_volume_snapshots", map[string]string{"volume": "vm"}); n != 1 {
		t.Errorf("quiver_volume_snapshots = %v after a snapshot, want 1", n)
	}
}

// TestMetricsServerFlushOfAbandonedConnection pins down the one request the
// metrics count that no client sent: a client that goes away with writes it
// never flushed (here qemu-io, SIGKILLed, in writeback mode so its write has
// no FUA) leaves the server to flush them, and that flush goes through the
// same counted path as a client's.
func TestMetricsServerFlushOfAbandonedConnection(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	s := startServer(t, "--metrics-per-disk")
	s.createVolume(t, "vm", nil, disk("root", 16*miB))
	q := startSession(t, s.uri("vm", "root"), "writeback")
	q.do(t, "write -P 0x66 0 4k", "wrote 4096/4096")
	m := s.scrape(t)
	if n := m.Sum("quiver_nbd_connections", nil); n != 1 {
		t.Errorf("quiver_nbd_connections = %v with qemu-io connected, want 1", n)
	}
	sent := fromTrace(q.kill(t))
	want := newCounts()
	want.add("write", 4*kiB)
	if !sent.equal(want) {
		t.Fatalf("qemu sent%s, want%s", sent, want)
	}
	want.add("flush", 0) // the server's, for the unflushed write
	if got := scraped(waitIdle(t, s), "vm", "root"); !got.equal(want) {
		t.Errorf("metrics:%s\nwant:%s", got, want)
	}
}

// TestMetricsErrorsByKind fails requests on purpose: the disk is removed
// under a connected client, so every later request fails as "gone", and is
// counted as an error instead of as a completed request. (Deleting the whole
// volume would close the connection instead.)
func TestMetricsErrorsByKind(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	s := startServer(t, "--metrics-per-disk")
	s.createVolume(t, "vm", nil, disk("root", 16*miB))
	q := startSession(t, s.uri("vm", "root"), "writethrough")
	q.do(t, "write -P 0x66 0 4k", "wrote 4096/4096")
	if _, err := s.api.RemoveDisk(t.Context(), "vm", "root", client.Force()); err != nil { // a writer is connected on purpose
		t.Fatal(err)
	}
	q.do(t, "write -P 0x67 0 4k", "write failed")
	q.do(t, "read 0 4k", "read failed")
	reqs := q.quit(t)
	// The first write succeeded; everything after it failed.
	failed := len(slices.DeleteFunc(reqs[1:], func(r wireRequest) bool { return opOf(r.typ) == "" }))
	if failed < 2 {
		t.Fatalf("qemu sent %v after the removal, want at least the write and the read", reqs[1:])
	}
	m := waitIdle(t, s)
	errs := map[string]float64{}
	for _, smp := range m.Samples("quiver_errors_total", nil) {
		errs[smp.Labels["kind"]] += smp.Value
	}
	if want := map[string]float64{"gone": float64(failed)}; !maps.Equal(errs, want) {
		t.Errorf("quiver_errors_total by kind = %v, want %v (requests sent after the removal: %v)", errs, want, reqs[1:])
	}
	if got := scraped(m, "vm", "root"); got.ops["write"] != 1 || got.ops["read"] != 0 {
		t.Errorf("completed requests:%s, want only the first write", got)
	}
}

// TestMetricsCountSparseReads: a READ of at least 256 KiB over a range with
// holes is answered with structured reply chunks, one per extent. It is
// still one client request of its full length, to be counted and charged
// to QoS once.
func TestMetricsCountSparseReads(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	s := startServer(t, "--metrics-per-disk")
	s.createVolume(t, "vm", nil, disk("root", 16*miB))
	_, reqs := qemuIO(t, s.uri("vm", "root"), "writethrough",
		"write -P 0x11 0 4k",
		"read 0 1M",  // 4 KiB of data, then a hole
		"read 8M 1M", // all hole
	)
	want := fromTrace(reqs)
	if want.ops["read"] != 2 || want.bytes["read"] != float64(2*miB) {
		t.Fatalf("qemu sent%s, want two 1 MiB reads", want)
	}
	if got := scraped(waitIdle(t, s), "vm", "root"); !got.equal(want) {
		t.Errorf("metrics:%s\nwant (what qemu sent):%s", got, want)
	}
}
