// Package qosbench holds the acceptance tests of per-VM QoS and of the
// Prometheus metrics, and the benchmark of what the QoS path costs:
//
//   - limits_test.go: rw_iops and rw_mbytes over two disks of one volume,
//     measured by two concurrent fio processes (nbd engine), and a live
//     change of the limit seen in fio's per-second IOPS log;
//   - metrics_test.go: a workload whose every NBD request is known (qemu-io,
//     with its own trace of what it sent as the oracle), then /metrics must
//     count exactly that;
//   - dashboard_test.go: every metric the Grafana dashboard
//     (deploy/grafana) queries is one a live server exposes;
//   - overhead_test.go: an in-process NBD server with and without metrics
//     and QoS, side by side (QUIVER_BENCH=1, make bench-qos).
//
// The tests start the real `quiver server` binary, built once by TestMain
// (with -race when the tests run with it), and talk to it through
// internal/client, the CLI and the NBD wire. Only the benchmark imports the
// server side (pool, nbd, metrics), to compare two exports in one process.
//
// Short runs by default (6 s per rate check, looser bounds for CI);
// QUIVER_QOS_FULL=1 runs the 30 s checks with the bounds of the issue. A
// test whose peer (fio, qemu-io) is missing skips locally and fails when CI
// is set.
package qosbench
