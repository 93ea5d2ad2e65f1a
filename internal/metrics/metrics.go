package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Metrics holds quiver's collectors in their own registry.
type Metrics struct {
	reg       *prometheus.Registry
	ops       *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	inflight  *prometheus.GaugeVec
	throttled *prometheus.CounterVec
	errors    *prometheus.CounterVec
	fenced    *prometheus.CounterVec
	conns     prometheus.Gauge
	limits
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

// New registers every collector, including one that reads the pool's state
// (capacities, allocation, snapshots, free space) at scrape time.
func New(p *pool.Pool) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_disk_requests_total",
			Help: "Requests completed by the data path, by volume, disk and operation."}, []string{"volume", "disk", "op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_disk_bytes_total",
			Help: "Bytes read or written by the data path."}, []string{"volume", "disk", "op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "quiver_disk_request_duration_seconds",
			Help:    "Time from admission (including QoS waits) to completion of a request.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2.5, 15)}, []string{"volume", "disk", "op"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quiver_disk_requests_in_flight",
			Help: "Requests being executed or waiting for QoS tokens."}, []string{"volume", "disk"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_qos_throttled_seconds_total",
			Help: "Time requests waited for QoS tokens."}, []string{"volume", "disk"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_errors_total",
			Help: "Failed data-path requests by kind."}, []string{"kind"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_fenced_writes_total",
			Help: "Writes, trims and zeroes refused because their attachment lost the writer role or was detached."}, []string{"volume", "disk"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quiver_nbd_connections",
			Help: "Open NBD connections."}),
		limits: newLimits(),
	}
	m.reg.MustRegister(m.ops, m.bytes, m.latency, m.inflight, m.throttled, m.errors, m.fenced, m.conns,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
		m.reg.MustRegister(&poolCollector{p: p})
	}
	return m
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
