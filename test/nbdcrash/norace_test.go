//go:build !race

package nbdcrash

const raceEnabled = false
