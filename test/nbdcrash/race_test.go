//go:build race

package nbdcrash

// raceEnabled builds the server under test with the race detector too.
const raceEnabled = true
