package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

// opStats are the resolved collectors of one operation of one volume, or
// of one disk (Options.PerDisk). bytes is nil for the operations that move
// no data (flush, trim, zero).
type opStats struct {
	count   prometheus.Counter
	bytes   prometheus.Counter
	seconds prometheus.Counter  // volume only: the sum of the latencies
	latency prometheus.Observer // disk only: the histogram
}

// Disk wraps a disk handle: each request first waits for QoS tokens (without
// holding the volume's I/O gate, which the inner handle takes), then runs,
// and is counted and timed under its volume (and its disk with
// Options.PerDisk). It offers each capability of the inner handle
// (pool.Capabilities) through its own, which counts requests; on a volume
// with QoS limits they refuse every request (pool.ErrWouldBlock), which then
// waits for its tokens the ordinary way.
//
// Its series are resolved on its first request, once: an export opened
// only to be described (NBD_OPT_INFO, as nbdinfo --list does for every
// export) makes none.
type Disk struct {
	inner    pool.Disk
	caps     pool.Capabilities // the inner handle's
	m        *Metrics
	lim      *qos.Limiter
	volume   string
	disk     string
	snapshot bool // a snapshot's export: counted under quiver_snapshot_*

	once sync.Once
	s    *series // set by once
}

// series are the resolved collectors of one handle. The fields a handle
// does not count into are nil: the in-flight gauges, throttle and fence
// counters of a snapshot's export, the per-disk ones without
// Options.PerDisk.
type series struct {
	vol       [len(ops)]opStats // indexed like ops: no map lookup per request
	inflight  prometheus.Gauge
	throttled prometheus.Counter
	fenced    prometheus.Counter
	disk      [len(ops)]opStats // with Options.PerDisk
	diskIn    prometheus.Gauge  // with Options.PerDisk
}

var (
	_ pool.Disk       = (*Disk)(nil)
	_ pool.DataReader = (*Disk)(nil)
)

// movesData reports whether op reads or writes data (bytes are counted).
func movesData(op opIndex) bool { return op == iRead || op == iWrite }

// Wrap returns d counted under volume (and disk, with Options.PerDisk) and
// limited by lim (nil: no limit).
func (m *Metrics) Wrap(d pool.Disk, volume, disk string, lim *qos.Limiter) *Disk {
	return &Disk{inner: d, caps: d.Capabilities(), m: m, lim: lim, volume: volume, disk: disk}
}

// WrapSnapshot returns d, a disk of a snapshot of volume, counted under
// volume in the quiver_snapshot_* series: all the volume's snapshots and
// disks together, so that a volume's snapshots add a few series, however
// many come and go. It is not limited: the volume's QoS budget is its VM's.
func (m *Metrics) WrapSnapshot(d pool.Disk, volume string) *Disk {
	return &Disk{inner: d, caps: d.Capabilities(), m: m, volume: volume, snapshot: true}
}

// series returns the handle's series, resolving them on the first call.
func (d *Disk) series() *series {
	d.once.Do(func() { d.s = d.m.resolve(d.volume, d.disk, d.snapshot) })
	return d.s
}

// resolve makes (or finds) the series of one handle. When the volume is
// gone from the pool by then, they are deleted again: whichever of the
// delete's ForgetVolume and this check comes second sees the other's work,
// so a handle whose first request comes after its volume's delete leaves
// no series behind.
func (m *Metrics) resolve(volume, disk string, snapshot bool) *series {
	s := &series{}
	if snapshot {
		// Read-only: reads and flushes are all it completes.
		for _, i := range []opIndex{iRead, iFlush} {
			s.vol[i] = opStats{count: m.snapOps.WithLabelValues(volume, ops[i]),
				seconds: m.snapSeconds.WithLabelValues(volume, ops[i])}
		}
		s.vol[iRead].bytes = m.snapBytes.WithLabelValues(volume, OpRead)
	} else {
		for i, op := range ops {
			s.vol[i] = opStats{count: m.volOps.WithLabelValues(volume, op), seconds: m.volSeconds.WithLabelValues(volume, op)}
			if movesData(opIndex(i)) {
				s.vol[i].bytes = m.volBytes.WithLabelValues(volume, op)
			}
			if m.diskOps != nil {
				s.disk[i] = opStats{count: m.diskOps.WithLabelValues(volume, disk, op),
					latency: m.diskLatency.WithLabelValues(volume, disk, op)}
				if movesData(opIndex(i)) {
					s.disk[i].bytes = m.diskBytes.WithLabelValues(volume, disk, op)
				}
			}
		}
		s.inflight = m.volInflight.WithLabelValues(volume)
		s.throttled = m.throttled.WithLabelValues(volume)
		s.fenced = m.fenced.WithLabelValues(volume)
		m.io.Store(volume, &ioSeries{readOps: s.vol[iRead].count, readBytes: s.vol[iRead].bytes,
			writeOps: s.vol[iWrite].count, writeBytes: s.vol[iWrite].bytes})
		if m.diskOps != nil {
			s.diskIn = m.diskInflight.WithLabelValues(volume, disk)
		}
	}
	if m.pool != nil {
		if _, err := m.pool.Volume(volume); errors.Is(err, pool.ErrVolumeNotFound) {
			m.ForgetVolume(volume)
		}
	}
	return s
}

func (d *Disk) Size() int64    { return d.inner.Size() }
func (d *Disk) ReadOnly() bool { return d.inner.ReadOnly() }
func (d *Disk) Close() error   { return d.inner.Close() }

// Cache is neither limited nor counted: it only reads ahead.
func (d *Disk) Cache(off, length int64) error { return d.inner.Cache(off, length) }

// Extents is neither limited nor counted: it reads the disk's map, not its
// data.
func (d *Disk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return d.inner.Extents(off, length, limit)
}

// Capabilities offers, of the inner handle's capabilities, those this
// wrapper counts: each through the wrapper's own method. ReadData is always
// offered.
func (d *Disk) Capabilities() pool.Capabilities {
	c := pool.Capabilities{DataReader: d}
	if d.caps.Nonblocking != nil {
		c.Nonblocking = d
	}
	if d.caps.Batcher != nil {
		c.Batcher = d
	}
	if d.caps.Sender != nil {
		c.Sender = d
	}
	if d.caps.Changes != nil {
		c.Changes = d
	}
	return c
}

// Checkpoints is neither limited nor counted: it reads the volume's
// snapshots, not the disk. Offered only when the inner handle offers it.
func (d *Disk) Checkpoints() []string { return d.caps.Changes.Checkpoints() }

// ChangesSince is neither limited nor counted: it reads the change
// tracking's maps, not the disk's data.
func (d *Disk) ChangesSince(ctx context.Context, base string) ([]pool.ChangedRange, error) {
	return d.caps.Changes.ChangesSince(ctx, base)
}

// admit waits for QoS tokens and starts accounting a request.
func (d *Disk) admit(kind qos.Op, bytes int64) (time.Time, error) {
	start := time.Now()
	d.enter()
	if d.lim != nil {
		waited, err := d.lim.Wait(context.Background(), kind, bytes)
		if s := d.series(); waited > 0 && s.throttled != nil {
			s.throttled.Add(waited.Seconds())
		}
		if err != nil {
			return start, err // done decrements in-flight
		}
	}
	return start, nil
}

// enter and leave count a request in flight.
func (d *Disk) enter() {
	s := d.series()
	if s.inflight != nil {
		s.inflight.Inc()
	}
	if s.diskIn != nil {
		s.diskIn.Inc()
	}
}

func (d *Disk) leave() {
	s := d.series()
	if s.inflight != nil {
		s.inflight.Dec()
	}
	if s.diskIn != nil {
		s.diskIn.Dec()
	}
}

// done finishes accounting a request.
func (d *Disk) done(op opIndex, start time.Time, bytes int64, err error) error {
	d.leave()
	if err != nil {
		kind := errorKind(err)
		d.m.errors.WithLabelValues(kind).Inc()
		if s := d.series(); kind == "fenced" && s.fenced != nil {
			s.fenced.Inc()
		}
		return err
	}
	return d.count(op, start, bytes)
}

// count counts a request that succeeded.
func (d *Disk) count(op opIndex, start time.Time, bytes int64) error {
	took := time.Since(start).Seconds()
	s := d.series()
	if v := &s.vol[op]; v.count != nil {
		v.count.Inc()
		if bytes > 0 && v.bytes != nil {
			v.bytes.Add(float64(bytes))
		}
		v.seconds.Add(took)
	}
	if !d.snapshot {
		d.m.latency[op].Observe(took)
	}
	if ds := &s.disk[op]; ds.count != nil {
		ds.count.Inc()
		if bytes > 0 && ds.bytes != nil {
			ds.bytes.Add(float64(bytes))
		}
		ds.latency.Observe(took)
	}
	return nil
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, pool.ErrOutOfRange), errors.Is(err, pool.ErrInvalid):
		return "invalid"
	case errors.Is(err, pool.ErrReadOnly):
		return "read_only"
	case errors.Is(err, pool.ErrSyncFailed):
		return "sync"
	case errors.Is(err, pool.ErrNoSpace): // the storage layer's class of ENOSPC, EDQUOT, EFBIG
		return "no_space"
	case errors.Is(err, pool.ErrFenced):
		return "fenced"
	case errors.Is(err, pool.ErrDiskNotFound), errors.Is(err, pool.ErrVolumeNotFound), errors.Is(err, pool.ErrClosed),
		errors.Is(err, pool.ErrDiskRemoved):
		return "gone"
	default:
		return "io"
	}
}

// ReadAt counts a read.
func (d *Disk) ReadAt(p []byte, off int64) error {
	start, err := d.admit(qos.Read, int64(len(p)))
	if err == nil {
		err = d.inner.ReadAt(p, off)
	}
	return d.done(iRead, start, int64(len(p)), err)
}

// ReadData reads the data extents of [off, off+len(p)) into p (holes are
// left as they are in p, which the caller has zeroed or will not send), as
// one read request for QoS and metrics: a sparse read costs what its length
// costs, like any read.
func (d *Disk) ReadData(p []byte, off int64, ext []pool.Extent) error {
	start, err := d.admit(qos.Read, int64(len(p)))
	if err == nil {
		err = d.readData(p, off, ext)
	}
	return d.done(iRead, start, int64(len(p)), err)
}

func (d *Disk) readData(p []byte, off int64, ext []pool.Extent) error {
	if dr := d.caps.DataReader; dr != nil {
		return dr.ReadData(p, off, ext)
	}
	return pool.ReadExtents(d.inner, p, off, ext)
}

// WriteAt counts a write.
func (d *Disk) WriteAt(p []byte, off int64, fua bool) error {
	start, err := d.admit(qos.Write, int64(len(p)))
	if err == nil {
		err = d.inner.WriteAt(p, off, fua)
	}
	return d.done(iWrite, start, int64(len(p)), err)
}

// Flush counts a flush; flushes are not limited.
func (d *Disk) Flush() error {
	start := time.Now()
	d.enter()
	return d.done(iFlush, start, 0, d.inner.Flush())
}

// Trim counts a trim as a write operation of no bandwidth.
func (d *Disk) Trim(off, length int64, fua bool) error {
	start, err := d.admit(qos.Write, 0)
	if err == nil {
		err = d.inner.Trim(off, length, fua)
	}
	return d.done(iTrim, start, 0, err)
}

// Zero counts a zero as a write operation of no bandwidth.
func (d *Disk) Zero(off, length int64, flags pool.ZeroFlags) error {
	start, err := d.admit(qos.Write, 0)
	if err == nil {
		err = d.inner.Zero(off, length, flags)
	}
	return d.done(iZero, start, 0, err)
}

var _ pool.Nonblocking = (*Disk)(nil)

// TryReadAt tries a read without waiting (pool.Nonblocking). Only a read
// that was done is counted: any error, ErrWouldBlock or not, means the
// caller runs the request again the ordinary way, which counts it. A
// volume with QoS limits never takes this path, so every request waits for
// its tokens.
func (d *Disk) TryReadAt(p []byte, off int64) error { return d.try(iRead, p, off) }

// TryWriteAt tries a write without waiting, like TryReadAt.
func (d *Disk) TryWriteAt(p []byte, off int64) error { return d.try(iWrite, p, off) }

func (d *Disk) try(op opIndex, p []byte, off int64) error {
	nb := d.caps.Nonblocking
	if nb == nil || !d.lim.Unlimited() {
		return pool.ErrWouldBlock
	}
	start := time.Now()
	var err error
	if op == iWrite {
		err = nb.TryWriteAt(p, off)
	} else {
		err = nb.TryReadAt(p, off)
	}
	if err != nil {
		return err
	}
	return d.count(op, start, int64(len(p)))
}

var _ pool.Batcher = (*Disk)(nil)

// TryBatch tries reads and writes without waiting, many at once
// (pool.Batcher); like TryReadAt, only those done are counted, each as one
// request whose latency is the batch's.
func (d *Disk) TryBatch(ios []pool.IO) {
	b := d.caps.Batcher
	if b == nil || !d.lim.Unlimited() {
		for i := range ios {
			if ios[i].Err == nil {
				ios[i].Err = pool.ErrWouldBlock
			}
		}
		return
	}
	start := time.Now()
	b.TryBatch(ios)
	for i := range ios {
		if io := &ios[i]; io.Err == nil {
			op := iRead
			if io.Write {
				op = iWrite
			}
			io.Err = d.count(op, start, int64(len(io.P)))
		}
	}
}

var _ pool.Sender = (*Disk)(nil)

// TrySendTo sends a read's data from the page cache straight to a socket
// (pool.Sender). Like TryReadAt, only a volume without QoS limits takes
// this path, and a refusal, with nothing sent, is not counted: the caller
// then reads the ordinary way, which counts it. A failure after part was
// sent counts as a failed read.
func (d *Disk) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	s := d.caps.Sender
	if s == nil || !d.lim.Unlimited() {
		return 0, pool.ErrWouldBlock
	}
	start := time.Now()
	sent, err := s.TrySendTo(sock, head, off, n)
	switch {
	case err == nil:
		return sent, d.count(iRead, start, int64(n))
	case sent == 0:
		return 0, err
	default:
		d.m.errors.WithLabelValues(errorKind(err)).Inc()
		return sent, err
	}
}
