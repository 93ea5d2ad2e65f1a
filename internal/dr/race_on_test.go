//go:build race

package dr

// raceOn: the tests run with the race detector, which makes the crash
// twin's runs several times slower.
const raceOn = true
