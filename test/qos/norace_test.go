//go:build !race

package qosbench

const raceEnabled = false
