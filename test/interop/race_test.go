//go:build race

package interop

// raceEnabled builds the server with the race detector as well.
const raceEnabled = true
