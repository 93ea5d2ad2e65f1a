//go:build race

package qosbench

// raceEnabled builds the server with the race detector as well.
const raceEnabled = true
