//go:build !unix

package transport

import "testing"

// cpuMeter reports nothing where getrusage is not available.
func cpuMeter(*testing.B) func() { return func() {} }
