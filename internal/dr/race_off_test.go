//go:build !race

package dr

const raceOn = false
