//go:build unix

package transport

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter starts measuring; the function it returns makes b report
// "cpu-ns/op", the process's CPU time per operation since the start. Call it
// when the timed loop is over. On a shared machine CPU time per operation
// moves less with other load than ns/op does.
func cpuMeter(b *testing.B) func() {
	start := processCPU()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}
