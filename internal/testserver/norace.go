//go:build !race

package testserver

// RaceEnabled reports whether the tests run with the race detector.
const RaceEnabled = false
