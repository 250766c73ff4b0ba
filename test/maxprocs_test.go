package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procsRecheck is how often a node reads its CPU limit again
// (cmd/sluice/maxprocs.go).
const procsRecheck = 10 * time.Second

// TestSubCoreNodeRunsOnOneThread: a node whose cgroup allows it less than
// one core runs its Go code on one thread (go_sched_gomaxprocs_threads 1),
// and goes back to the runtime's default once the limit is gone. On two
// threads, a node held to 0.2 core had garbage collections stretched
// across throttled periods stop it for longer than the forward timeout:
// pauses, and their pulls (docs/scaling.md, "Capacity"). The node is
// moved into a cgroup v1 cpu group after it started, as a squeeze would
// find it; it reads its limit every procsRecheck, so each wait is that
// and 5 s more. Skipped without a writable cgroup v1 cpu hierarchy, or
// when GOMAXPROCS is set in the environment (the node then leaves it).
func TestSubCoreNodeRunsOnOneThread(t *testing.T) {
	t.Parallel()
	const root = "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		t.Skipf("no cgroup v1 cpu controller here: %v", err)
	}
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		t.Skipf("GOMAXPROCS=%s is set: the node leaves it as it is", v)
	}
	p := startClusterAt(t, "127.0.0.1", 1)[0]
	const procs = "go_sched_gomaxprocs_threads"
	before := metric(t, p, procs)
	dir := filepath.Join(root, fmt.Sprintf("sluice-test-subcore-%d-%d", os.Getpid(), p.cmd.Process.Pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cpu cgroup: %v", err)
	}
	t.Cleanup(func() {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(pid), 0o644)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	write := func(file, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			t.Fatalf("%s/%s = %s: %v", dir, file, v, err)
		}
	}
	write("cpu.cfs_period_us", "100000")
	write("cpu.cfs_quota_us", "20000")
	write("cgroup.procs", strconv.Itoa(p.cmd.Process.Pid))
	wait := procsRecheck + 5*time.Second
	waitFor(t, wait, "the node at 0.2 core runs on one thread", func() bool { return metric(t, p, procs) == 1 })
	write("cpu.cfs_quota_us", "-1")
	waitFor(t, wait, fmt.Sprintf("the node without a limit runs on the default %v threads again", before),
		func() bool { return metric(t, p, procs) == before })
	if !strings.Contains(p.log.String(), "CPU limit below one core") {
		t.Errorf("the node did not log why it runs on one thread")
	}
}
