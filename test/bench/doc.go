// Package bench holds quiver's performance benchmarks. They measure; they do
// not assert: each prints quiver side by side with its peers (cp, the raw
// filesystem) in one run, with the ratios, for docs/benchmarks.md. They run
// only when QUIVER_BENCH=1 (make bench), as root, on loop-mounted
// filesystems they make themselves.
package bench
