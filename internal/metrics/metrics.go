package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Metrics holds quiver's collectors in their own registry.
//
// The data path is counted per volume (one VM) by default: a few series a
// volume, whatever its disks, plus one node-wide latency histogram by
// operation. Options.PerDisk adds the per-disk series, latency histograms
// included (about a hundred series a disk). Reads of a volume's snapshots
// are counted per volume too, apart (quiver_snapshot_*), never per
// snapshot.
//
// A volume's series appear with the first request through one of its
// exports (opening one to answer NBD_OPT_INFO makes none) and go when the
// volume is deleted (ForgetVolume, which NewWith has the pool call): a node
// whose volumes come and go exports only those it holds.
type Metrics struct {
	reg  *prometheus.Registry
	pool *pool.Pool // nil: no pool (ForgetVolume is then the caller's)

	// Per volume.
	volOps      *prometheus.CounterVec
	volBytes    *prometheus.CounterVec
	volSeconds  *prometheus.CounterVec
	volInflight *prometheus.GaugeVec
	throttled   *prometheus.CounterVec
	fenced      *prometheus.CounterVec
	// Node-wide, by operation, resolved once: no lookup per request.
	latency [len(ops)]prometheus.Observer

	// Per disk, only with Options.PerDisk (nil otherwise).
	diskOps      *prometheus.CounterVec
	diskBytes    *prometheus.CounterVec
	diskLatency  *prometheus.HistogramVec
	diskInflight *prometheus.GaugeVec

	// Per volume, of its snapshots' exports (read-only; backups and
	// clones, not the VM): apart from the volume's series, whose sums
	// are what its QoS limits count.
	snapOps     *prometheus.CounterVec
	snapBytes   *prometheus.CounterVec
	snapSeconds *prometheus.CounterVec

	errors *prometheus.CounterVec
	conns  prometheus.Gauge
	limits

	// io maps a volume to its read and write counters (*ioSeries), for
	// VolumeIO; set by resolve, cleared by ForgetVolume.
	io sync.Map
}

// Options choose what Metrics exports beyond its defaults.
type Options struct {
	// PerDisk also exports the data path's series per disk:
	// quiver_disk_requests_total, quiver_disk_bytes_total,
	// quiver_disk_request_duration_seconds (a histogram: 18 series per
	// operation) and quiver_disk_requests_in_flight. Off by default: on a
	// node of many VMs they are most of /metrics.
	PerDisk bool
}

// Operation label values.
const (
	OpRead  = "read"
	OpWrite = "write"
	OpFlush = "flush"
	OpTrim  = "trim"
	OpZero  = "zero"
)

// ops lists the operation labels; opIndex values index it.
var ops = [...]string{OpRead, OpWrite, OpFlush, OpTrim, OpZero}

type opIndex int

const (
	iRead opIndex = iota
	iWrite
	iFlush
	iTrim
	iZero
)

// Register adds collectors of other parts (the cluster's) to the registry.
func (m *Metrics) Register(cs ...prometheus.Collector) { m.reg.MustRegister(cs...) }

// latencyBuckets are the upper bounds of the latency histograms: 25 µs to
// 0.6 s.
var latencyBuckets = prometheus.ExponentialBuckets(25e-6, 2.5, 15)

// New registers every collector with the default Options.
func New(p *pool.Pool) *Metrics { return NewWith(p, Options{}) }

// NewWith registers every collector, including one that reads the pool's
// state (capacities, allocation, snapshots, free space) at scrape time.
func NewWith(p *pool.Pool, opts Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		volOps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_volume_requests_total",
			Help: "Requests completed by the data path, by volume (all its disks) and operation."}, []string{"volume", "op"}),
		volBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_volume_bytes_total",
			Help: "Bytes read or written by the data path, by volume (all its disks)."}, []string{"volume", "op"}),
		volSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_volume_request_seconds_total",
			Help: "Sum of the requests' times from admission (including QoS waits) to completion, by volume and operation: " +
				"divided by quiver_volume_requests_total, the mean latency."}, []string{"volume", "op"}),
		volInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quiver_volume_requests_in_flight",
			Help: "Requests being executed or waiting for QoS tokens, by volume."}, []string{"volume"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_qos_throttled_seconds_total",
			Help: "Time requests waited for QoS tokens, by volume (one budget for all its disks)."}, []string{"volume"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_fenced_writes_total",
			Help: "Writes, trims and zeroes refused because their attachment lost the writer role or was detached."}, []string{"volume"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_errors_total",
			Help: "Failed data-path requests by kind."}, []string{"kind"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quiver_nbd_connections",
			Help: "Open NBD connections."}),
		limits: newLimits(),
	}
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "quiver_request_duration_seconds",
		Help:    "Time from admission (including QoS waits) to completion of a request, every volume of the node.",
		Buckets: latencyBuckets}, []string{"op"})
	for i, op := range ops {
		m.latency[i] = latency.WithLabelValues(op)
	}
	m.snapOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_snapshot_requests_total",
		Help: "Requests completed by the read-only exports of a volume's snapshots (all its snapshots and disks), by operation."}, []string{"volume", "op"})
	m.snapBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_snapshot_bytes_total",
		Help: "Bytes read through the exports of a volume's snapshots."}, []string{"volume", "op"})
	m.snapSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_snapshot_request_seconds_total",
		Help: "Sum of the times of the requests to the exports of a volume's snapshots, by operation."}, []string{"volume", "op"})
	m.reg.MustRegister(m.volOps, m.volBytes, m.volSeconds, m.volInflight, m.throttled, m.fenced, latency, m.errors, m.conns,
		m.snapOps, m.snapBytes, m.snapSeconds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opts.PerDisk {
		m.diskOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_disk_requests_total",
			Help: "Requests completed by the data path, by volume, disk and operation."}, []string{"volume", "disk", "op"})
		m.diskBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_disk_bytes_total",
			Help: "Bytes read or written by the data path."}, []string{"volume", "disk", "op"})
		m.diskLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "quiver_disk_request_duration_seconds",
			Help:    "Time from admission (including QoS waits) to completion of a request.",
			Buckets: latencyBuckets}, []string{"volume", "disk", "op"})
		m.diskInflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quiver_disk_requests_in_flight",
			Help: "Requests being executed or waiting for QoS tokens."}, []string{"volume", "disk"})
		m.reg.MustRegister(m.diskOps, m.diskBytes, m.diskLatency, m.diskInflight)
	}
	m.reg.MustRegister(m.limits.collectors()...)
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quiver_io_uring",
		Help: "1 when the NBD readers' batches of small reads and writes go through io_uring, 0 when they take one system call each (the start-up log says why)."},
		func() float64 {
			if pool.IOUring() != nil {
				return 0
			}
			return 1
		}))
	if p != nil {
		m.pool = p
		m.reg.MustRegister(&poolCollector{p: p})
		p.OnDelete(m.ForgetVolume)
	}
	return m
}

// ForgetVolume deletes every series labelled with volume: the pool calls
// it when the volume is deleted (NewWith). A handle of the volume still
// open keeps counting into series no longer exported; a handle whose
// first request comes after the delete makes none (Disk.series).
func (m *Metrics) ForgetVolume(volume string) {
	m.io.Delete(volume)
	l := prometheus.Labels{"volume": volume}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.volOps, m.volBytes, m.volSeconds, m.volInflight, m.throttled, m.fenced,
		m.snapOps, m.snapBytes, m.snapSeconds,
	} {
		v.DeletePartialMatch(l)
	}
	if m.diskOps != nil {
		m.diskOps.DeletePartialMatch(l)
		m.diskBytes.DeletePartialMatch(l)
		m.diskLatency.DeletePartialMatch(l)
		m.diskInflight.DeletePartialMatch(l)
	}
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry returns the registry, for tests and embedding.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ConnOpened and ConnClosed track NBD connections.
func (m *Metrics) ConnOpened() { m.conns.Inc() }

// ConnClosed is the counterpart of ConnOpened.
func (m *Metrics) ConnClosed() { m.conns.Dec() }
