//go:build !race

package wire

// raceEnabled: the race detector changes what allocates.
const raceEnabled = false
