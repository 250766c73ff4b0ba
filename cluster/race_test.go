//go:build race

package cluster

// raceEnabled: the race detector slows the node several times over, so
// tests that measure speed skip.
const raceEnabled = true
