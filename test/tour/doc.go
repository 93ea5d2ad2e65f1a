// Package tour replays the README's five-minute tour, line by line, the
// way a new user pastes it into a shell: the quiver binary on PATH, the
// default ports (in a network namespace of its own, so they are free), and
// the two files the tour assumes the user has (debian.img, legacy01.ova).
// It replays docs/cluster.md's quick start the same way: three nodes on
// one machine, a replicated volume written and read back.
//
// Imports from quiver: internal/ova, internal/testfs, internal/testserver.
package tour
