//go:build race

package crash

// raceEnabled builds the server with the race detector too.
const raceEnabled = true
