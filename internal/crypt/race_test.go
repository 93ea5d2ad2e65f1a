//go:build race

package crypt

// raceEnabled: the race detector drops sync.Pool items on purpose, so
// x/crypto/xts's tweak pool allocates under it.
const raceEnabled = true
