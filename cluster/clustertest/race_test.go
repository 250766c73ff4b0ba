//go:build race

package clustertest

// raceEnabled: the race detector slows a run about tenfold, so TestModel
// runs fewer seeds by default.
const raceEnabled = true
