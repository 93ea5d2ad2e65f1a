//go:build race

package crypt

// raceEnabled: the race detector drops sync.Pool items on purpose, so the
// cipher's pool of tweak buffers allocates under it.
const raceEnabled = true
