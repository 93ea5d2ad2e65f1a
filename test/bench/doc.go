// Package bench holds quiver's performance benchmarks. They measure; they do
// not assert: each prints quiver side by side with its peers (cp, the raw
// filesystem) in one run, with the ratios, for docs/benchmarks.md. They run
// only when QUIVER_BENCH=1 (make bench); those of the storage core as root,
// on loop-mounted filesystems they make themselves. Those of scale
// (scale_test.go: 1,000 exports listed, /metrics of 500 volumes) run a
// quiver server on a temporary pool and need neither.
package bench
