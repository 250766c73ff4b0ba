package cluster

import (
	"bytes"
	"io"
	"os"
	"strings"
	"time"
)

// A gap in the pause heartbeat has three common causes, which call for
// different action by an operator but the same by the node (pause.go):
//
//   - starved: the process was ready to run but got no CPU — the machine
//     was overloaded or its cgroup's CPU quota was spent: its threads
//     waited on the kernel's run queues (the run delay of
//     /proc/self/task/*/schedstat) for most of the gap, or its cgroup was
//     throttled (cpu.stat) for most of it;
//   - busy: the process ran, but not its heartbeat — a long garbage
//     collection or a goroutine that held the CPU (its own CPU time grew
//     by most of the gap);
//   - stopped: neither — SIGSTOP, a frozen VM or container, or a step of
//     the wall clock.
//
// The node reacts to all three the same way, because its peers cannot
// tell them apart either: it did not answer them for longer than their
// forward timeout. The cause goes into the log line and the status
// (PausesStarved, PausesBusy) so that an overloaded machine is not
// mistaken for a failing node. Where the evidence is missing (no
// schedstat, no cgroup) a gap with no CPU used counts as stopped.

// Pause causes, as Status and the metrics name them.
const (
	PauseStarved = "starved"
	PauseBusy    = "busy"
	PauseStopped = "stopped"
)

// cpuSample is what the heartbeat records at each beat for a later gap to
// be explained by.
type cpuSample struct {
	cpu       time.Duration // this process's user + system CPU time
	waited    time.Duration // its threads' time on run queues, summed; 0 when unknown
	throttled time.Duration // its cgroup's throttled time; 0 when unknown
	cgroup    string        // the cgroup throttled is of: two samples of different cgroups do not compare
}

// cpuEvidence reads the counters cpuSample holds. The cgroup's file and
// each thread's schedstat file are opened once and read again at each
// sample; which cgroup the process is in, and which threads it has, are
// looked up again every relistEvery samples. Not safe for concurrent use:
// the node samples under pause.mu.
//
// A sample costs a read of each file it keeps open: a heartbeat samples
// four times a second, and opening every thread's file anew each time
// (three system calls a thread, and a directory listing) was a fifth of
// the CPU of a node with a trickle of checks, 100 such nodes sharing two
// cores (docs/scaling.md).
type cpuEvidence struct {
	cgroup *os.File // nil where there is none
	v2     bool     // cgroup holds cgroup v2's cpu.stat (throttled_usec)
	// self is /proc/self/cgroup as last read, and path the cgroup it
	// names: a process can be moved to another cgroup while it runs.
	self, path string
	buf        [512]byte
	// tasks maps each thread id to its schedstat file and the run-queue
	// wait last read from it; waited is the wait summed over every
	// thread seen, each counted in full when first seen and by its growth
	// after (a thread that ends keeps what it added).
	tasks   map[string]*taskStat
	waited  time.Duration
	samples int // samples taken; every relistEvery-th looks up the cgroup and threads again
}

// taskStat is a thread's open schedstat file and its last reading.
type taskStat struct {
	f    *os.File
	last time.Duration
}

// relistEvery is how many samples pass between two lookups of the
// process's cgroup and threads: 2 s at the heartbeat's four samples a
// second (a thread started meanwhile is counted from the next lookup).
const relistEvery = 8

// openCPUEvidence opens what the system offers; a missing file just
// leaves that counter at 0.
func openCPUEvidence() *cpuEvidence {
	e := &cpuEvidence{tasks: map[string]*taskStat{}}
	e.follow()
	e.relist()
	return e
}

// follow reads which cgroup the process is in, and opens that cgroup's
// cpu.stat when it changed.
func (e *cpuEvidence) follow() {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil || string(b) == e.self {
		return
	}
	e.self = string(b)
	if e.cgroup != nil {
		e.cgroup.Close()
	}
	e.cgroup, e.v2, e.path = openCgroupCPUStat(b)
}

// openCgroupCPUStat opens the cpu.stat of the CPU cgroup that b, the
// process's /proc/self/cgroup, names: v1 (the cpu controller's hierarchy)
// or v2 (the unified one).
func openCgroupCPUStat(b []byte) (*os.File, bool, string) {
	return cgroupCPUFile(b, "cpu.stat")
}

// cgroupCPUFile opens the file name of the CPU cgroup that b, the
// process's /proc/self/cgroup, names, and says whether it is cgroup v2's
// and which directory it is in; nil where there is none.
func cgroupCPUFile(b []byte, name string) (*os.File, bool, string) {
	var v2path string
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2path = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpu" {
				for _, dir := range []string{"/sys/fs/cgroup/" + parts[1], "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"} {
					if f, err := os.Open(dir + parts[2] + "/" + name); err == nil {
						return f, false, dir + parts[2]
					}
				}
			}
		}
	}
	if v2path != "" {
		if f, err := os.Open("/sys/fs/cgroup" + v2path + "/" + name); err == nil {
			return f, true, "/sys/fs/cgroup" + v2path
		}
	}
	return nil, false, ""
}

// CPULimit returns the CPU this process's cgroup allows it, in cores, and
// whether it has a limit: cgroup v2's cpu.max, or v1's cpu.cfs_quota_us
// over cpu.cfs_period_us. Only the process's own cgroup is read, not its
// ancestors (a container's runtime hides them), as Go's runtime does for
// its default GOMAXPROCS.
func CPULimit() (cores float64, ok bool) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	if f, v2, _ := cgroupCPUFile(self, "cpu.max"); f != nil {
		if b, err := readAndClose(f); v2 && err == nil {
			return cpuLimitV2(b)
		}
	}
	f, _, dir := cgroupCPUFile(self, "cpu.cfs_quota_us")
	if f == nil {
		return 0, false
	}
	quota, err1 := readAndClose(f)
	period, err2 := os.ReadFile(dir + "/cpu.cfs_period_us")
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return cpuLimitV1(quota, period)
}

// readAndClose reads a small cgroup file (at most 256 bytes) and closes it.
func readAndClose(f *os.File) ([]byte, error) {
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 256))
}

// cpuLimitV2 reads cgroup v2's cpu.max ("QUOTA PERIOD" in µs, or "max
// PERIOD" for none).
func cpuLimitV2(b []byte) (float64, bool) {
	q, rest, ok := cutField(b)
	if !ok {
		return 0, false
	}
	p, _, ok := cutField(rest)
	if !ok {
		return 0, false
	}
	return quotaOver(q, p)
}

// cpuLimitV1 reads cgroup v1's cpu.cfs_quota_us (-1 for none) and
// cpu.cfs_period_us.
func cpuLimitV1(quota, period []byte) (float64, bool) {
	return quotaOver(bytes.TrimSpace(quota), bytes.TrimSpace(period))
}

// quotaOver is quota/period for two decimal counts of µs; a quota that is
// not a positive count ("max", "-1") is no limit.
func quotaOver(quota, period []byte) (float64, bool) {
	q, ok1 := parseDecimal(quota)
	p, ok2 := parseDecimal(period)
	if !ok1 || !ok2 || q <= 0 || p <= 0 {
		return 0, false
	}
	return float64(q) / float64(p), true
}

func (e *cpuEvidence) close() {
	if e.cgroup != nil {
		e.cgroup.Close()
	}
	for id, ts := range e.tasks {
		ts.f.Close()
		delete(e.tasks, id)
	}
}

// sample reads the counters now.
func (e *cpuEvidence) sample() cpuSample {
	if e.samples++; e.samples%relistEvery == 0 {
		e.follow()
		e.relist()
	}
	s := cpuSample{cpu: cpuTime(), waited: e.runDelay(), cgroup: e.path}
	if e.cgroup != nil {
		if n, err := e.cgroup.ReadAt(e.buf[:], 0); n > 0 && (err == nil || n < len(e.buf)) {
			s.throttled = cgroupThrottled(e.buf[:n], e.v2)
		}
	}
	return s
}

// runDelay returns the time this process's threads have spent waiting on
// a run queue (the second field of each /proc/self/task/TID/schedstat),
// summed (see waited); 0 where the system does not say.
func (e *cpuEvidence) runDelay() time.Duration {
	for id, ts := range e.tasks {
		cur, ok := e.readWaited(ts.f)
		if !ok { // the thread ended
			ts.f.Close()
			delete(e.tasks, id)
			continue
		}
		e.waited += cur - ts.last
		ts.last = cur
	}
	return e.waited
}

// relist opens the schedstat file of each thread not known yet, and adds
// its wait so far.
func (e *cpuEvidence) relist() {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return
	}
	for _, t := range ents {
		if _, ok := e.tasks[t.Name()]; ok {
			continue
		}
		f, err := os.Open("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		cur, ok := e.readWaited(f)
		if !ok {
			f.Close()
			continue
		}
		e.tasks[t.Name()] = &taskStat{f: f, last: cur}
		e.waited += cur
	}
}

// readWaited reads a schedstat file from its start.
func (e *cpuEvidence) readWaited(f *os.File) (time.Duration, bool) {
	n, err := f.ReadAt(e.buf[:], 0)
	if n == 0 || (err != nil && err != io.EOF) {
		return 0, false
	}
	return schedstatWaited(e.buf[:n]), true
}

// schedstatWaited returns the run-queue wait of a schedstat line ("ns on
// a CPU, ns waiting on a run queue, timeslices"), or 0. It allocates
// nothing: the heartbeat calls it for every thread, four times a second.
func schedstatWaited(b []byte) time.Duration {
	_, rest, ok := cutField(b)
	if !ok {
		return 0
	}
	f, _, ok := cutField(rest)
	if !ok {
		return 0
	}
	v, ok := parseDecimal(f)
	if !ok {
		return 0
	}
	return time.Duration(v)
}

// cutField returns b's first whitespace-separated field and what follows
// it; ok is false when b holds no field.
func cutField(b []byte) (field, rest []byte, ok bool) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	return b[i:j], b[j:], j > i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseDecimal parses a non-negative decimal integer of at most 18
// digits (no sign, no overflow possible).
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// cgroupThrottled returns a cpu.stat's throttled time: throttled_time
// (ns) in cgroup v1, throttled_usec in v2; 0 when absent. It allocates
// nothing.
func cgroupThrottled(b []byte, v2 bool) time.Duration {
	key, unit := "throttled_time", time.Nanosecond
	if v2 {
		key, unit = "throttled_usec", time.Microsecond
	}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte{' '})
		if !ok || string(k) != key {
			continue
		}
		n, ok := parseDecimal(bytes.TrimSpace(v))
		if !ok {
			return 0
		}
		return time.Duration(n) * unit
	}
	return 0
}

// pauseCause explains a gap of length gap between the samples before
// and after it (the earlier may be older than the gap: the heartbeat
// samples every ForwardTimeout): starved when the process's threads
// waited on run queues, or its cgroup was throttled, for at least half of
// it; busy when the process used at least half of it in CPU time;
// stopped otherwise.
func pauseCause(before, after cpuSample, gap time.Duration) string {
	if gap <= 0 {
		return PauseStopped
	}
	half := gap / 2
	switch {
	case after.waited-before.waited >= half || (after.cgroup == before.cgroup && after.throttled-before.throttled >= half):
		return PauseStarved
	case after.cpu-before.cpu >= half:
		return PauseBusy
	}
	return PauseStopped
}
