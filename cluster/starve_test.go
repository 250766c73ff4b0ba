package cluster

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestPauseCause(t *testing.T) {
	t.Parallel()
	const gap = time.Second
	base := cpuSample{cpu: 5 * time.Second, waited: 7 * time.Second, throttled: 9 * time.Second}
	for _, c := range []struct {
		name  string
		after cpuSample
		want  string
	}{
		{"nothing ran, nothing waited: stopped", base, PauseStopped},
		{"threads waited most of the gap on run queues", cpuSample{cpu: base.cpu, waited: base.waited + 600*time.Millisecond, throttled: base.throttled}, PauseStarved},
		{"the cgroup was throttled most of the gap", cpuSample{cpu: base.cpu, waited: base.waited, throttled: base.throttled + 700*time.Millisecond}, PauseStarved},
		{"the process used the CPU (a collection)", cpuSample{cpu: base.cpu + 900*time.Millisecond, waited: base.waited, throttled: base.throttled}, PauseBusy},
		{"a little of each is not enough", cpuSample{cpu: base.cpu + 400*time.Millisecond, waited: base.waited + 400*time.Millisecond, throttled: base.throttled + 400*time.Millisecond}, PauseStopped},
		{"starved and busy: starved", cpuSample{cpu: base.cpu + 600*time.Millisecond, waited: base.waited + 600*time.Millisecond, throttled: base.throttled}, PauseStarved},
		{"moved to another cgroup: its throttled time does not compare", cpuSample{cpu: base.cpu, waited: base.waited, throttled: base.throttled + time.Hour, cgroup: "/other"}, PauseStopped},
	} {
		if got := pauseCause(base, c.after, gap); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestCPUEvidenceParsers(t *testing.T) {
	t.Parallel()
	if got := schedstatWaited([]byte("696287 52469 2\n")); got != 52469 {
		t.Errorf("schedstat: %v", got)
	}
	for _, bad := range []string{"", "1", "1 x 2", "1 -5 2", "1 +5 2", "1 1234567890123456789 2", "  \n"} {
		if got := schedstatWaited([]byte(bad)); got != 0 {
			t.Errorf("schedstat %q: %v, want 0", bad, got)
		}
	}
	v1 := "nr_periods 120\nnr_throttled 30\nthrottled_time 2500000000\n"
	if got := cgroupThrottled([]byte(v1), false); got != 2500*time.Millisecond {
		t.Errorf("cgroup v1: %v", got)
	}
	v2 := "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 3\nnr_throttled 1\nthrottled_usec 1500\n"
	if got := cgroupThrottled([]byte(v2), true); got != 1500*time.Microsecond {
		t.Errorf("cgroup v2: %v", got)
	}
	if got := cgroupThrottled([]byte(v2), false); got != 0 {
		t.Errorf("v2's file read as v1: %v", got)
	}
	if got := cgroupThrottled([]byte("throttled_time x\n"), false); got != 0 {
		t.Errorf("malformed value: %v", got)
	}
}

// The heartbeat parses every thread's schedstat file four times a second
// while checks come: the parsers allocate nothing. (Not parallel:
// AllocsPerRun counts the whole process's allocations.)
func TestCPUEvidenceParsersDoNotAllocate(t *testing.T) {
	line := []byte("696287 52469 2\n")
	stat := []byte("nr_periods 120\nnr_throttled 30\nthrottled_time 2500000000\n")
	if a := testing.AllocsPerRun(100, func() { schedstatWaited(line); cgroupThrottled(stat, false) }); a != 0 {
		t.Errorf("the parsers allocate %v times a call, want 0", a)
	}
}

// On Linux the run-queue wait of the process's threads is readable, and
// it grows while two goroutines per CPU compete for the CPUs.
func TestRunDelayGrowsUnderContention(t *testing.T) {
	e := openCPUEvidence()
	defer e.close()
	before := e.sample()
	if before.waited == 0 {
		if _, err := os.Stat("/proc/self/task"); err == nil {
			t.Fatal("/proc/self/task is there, but the threads' run-queue wait read as 0")
		}
		t.Skip("no /proc/self/task here")
	}
	if before.cpu <= 0 {
		t.Fatalf("process CPU time %v", before.cpu)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	for range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for !stop.Load() {
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	var after cpuSample
	for {
		after = e.sample()
		if after.waited > before.waited && after.cpu > before.cpu {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	stop.Store(true)
	for range 8 {
		<-done
	}
	if after.waited <= before.waited || after.cpu <= before.cpu {
		t.Fatalf("under contention: waited %v → %v, cpu %v → %v; want both to grow", before.waited, after.waited, before.cpu, after.cpu)
	}
}

// BenchmarkCPUEvidenceSample is the cost of one heartbeat sample of the
// pause evidence (the heartbeat takes four a second while checks come).
func BenchmarkCPUEvidenceSample(b *testing.B) {
	e := openCPUEvidence()
	defer e.close()
	for b.Loop() {
		e.sample()
	}
}

// TestCPULimitParsers: cgroup v2's cpu.max and v1's quota and period give
// the cores a process may use; "max", -1 and anything malformed mean no
// limit.
func TestCPULimitParsers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"20000 100000\n", 0.2, true},
		{"150000 100000\n", 1.5, true},
		{"max 100000\n", 0, false},
		{"20000\n", 0, false},
		{"", 0, false},
		{"0 100000\n", 0, false},
		{"20000 0\n", 0, false},
		{"-5 100000\n", 0, false},
	} {
		if got, ok := cpuLimitV2([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("cpu.max %q: %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		quota, period string
		want          float64
		ok            bool
	}{
		{"20000\n", "100000\n", 0.2, true},
		{"250000\n", "100000\n", 2.5, true},
		{"-1\n", "100000\n", 0, false},
		{"20000\n", "x\n", 0, false},
		{"", "100000\n", 0, false},
	} {
		if got, ok := cpuLimitV1([]byte(c.quota), []byte(c.period)); got != c.want || ok != c.ok {
			t.Errorf("cfs quota %q over period %q: %v, %v; want %v, %v", c.quota, c.period, got, ok, c.want, c.ok)
		}
	}
}
