package metrics

import "github.com/prometheus/client_golang/prometheus"

// limits holds the collectors of the server's resource limits
// (docs/security.md): refused connections, waits for memory, data-path
// errors.
type limits struct {
	rejected   *prometheus.CounterVec
	memWaits   *prometheus.CounterVec
	dataErrors *prometheus.CounterVec
}

func newLimits() limits {
	return limits{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_connections_rejected_total",
			Help: "Connections closed at accept, or accepts that failed, by server (api, nbd) and reason " +
				"(total, peer, handshakes, fds)."}, []string{"server", "reason"}),
		memWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_nbd_memory_waits_total",
			Help: "Times an NBD connection stopped reading requests because its in-flight bytes (scope conn), " +
				"its peer's (scope peer) or the server's (scope server) were at their cap."}, []string{"scope"}),
		dataErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_nbd_data_errors_total",
			Help: "NBD requests that failed on the disk (EIO, ENOSPC), by NBD error."}, []string{"errno"}),
	}
}

func (l limits) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.rejected, l.memWaits, l.dataErrors}
}

// Server label values of quiver_connections_rejected_total.
const (
	ServerAPI = "api"
	ServerNBD = "nbd"
)

// ConnRejected counts a refused NBD connection (nbd.Observer).
func (m *Metrics) ConnRejected(reason string) { m.rejected.WithLabelValues(ServerNBD, reason).Inc() }

// APIConnRejected counts a refused API connection.
func (m *Metrics) APIConnRejected(reason string) { m.rejected.WithLabelValues(ServerAPI, reason).Inc() }

// MemoryWait counts an NBD reader that waits for in-flight bytes to drain
// (nbd.Observer); scope is "conn", "peer" or "server".
func (m *Metrics) MemoryWait(scope string) { m.memWaits.WithLabelValues(scope).Inc() }

// DataError counts a data-path request that failed on the disk
// (nbd.Observer); errno is the NBD error's name (EIO, ENOSPC).
func (m *Metrics) DataError(errno string) { m.dataErrors.WithLabelValues(errno).Inc() }
