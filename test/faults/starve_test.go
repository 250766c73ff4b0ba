//go:build faults && linux

package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuRoot is cgroup v1's cpu hierarchy.
const cpuRoot = "/sys/fs/cgroup/cpu"

// squeeze puts the processes of hosts into one new cgroup v1 cpu cgroup
// allowed quota of one CPU (cpu.cfs_quota_us over a 100 ms period), and
// returns a function that moves them back to the root cgroup and removes
// it (also run at cleanup). It skips the test where there is no such
// hierarchy.
func squeeze(t *testing.T, quota float64, hosts ...*Host) (release func()) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu.cfs_quota_us")); err != nil {
		t.Skipf("no cgroup v1 cpu controller here: %v", err)
	}
	dir := filepath.Join(cpuRoot, fmt.Sprintf("sluice-faults-starve-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		t.Fatalf("cpu cgroup: %v", err)
	}
	write := func(file, v string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			t.Fatalf("%s/%s = %s: %v", dir, file, v, err)
		}
	}
	write("cpu.cfs_period_us", "100000")
	write("cpu.cfs_quota_us", strconv.Itoa(int(quota*100000)))
	for _, h := range hosts {
		write("cgroup.procs", strconv.Itoa(h.PID()))
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(cpuRoot, "cgroup.procs"), []byte(pid), 0o644)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	}
	t.Cleanup(release)
	return release
}

// TestStarvedClusterStaysUp: five hosts under load (300 checks a second),
// all five squeezed into one cgroup allowed a tenth of one CPU for 20 s —
// less than they need for the load: the nodes notice pauses and forwards
// time out — then released.
// The cluster may answer slower, but it must not turn the overload into a
// failure of its own: no member is declared dead (a flapping member is
// more work for every node, the start of a metastable collapse), every
// check gets a decision within its deadline, and no key admits more than
// its limit plus the admissions of stand-ins (a forward that timed out on
// a starved owner goes to the key's replica, whose decisions the owner's
// count does not merge: the bound of docs/guarantees.md for a paused
// owner). The pauses the nodes notice are explained as starved (most of
// them: see the end).
// The nodes run the default failure detection (lan), not the harness's
// fast one: with fast, CI saw members declared dead 14 times in the 20 s
// (2026-11-27), the overload turned into a membership failure, which is
// why lan is the default.
func TestStarvedClusterStaysUp(t *testing.T) {
	const (
		keys    = 100
		limit   = 40
		quota   = 0.1 // of one CPU, for all five nodes together
		squeezd = 20 * time.Second
		workers = linkWorkers
		perW    = linkPerWorker // checks per second per worker: 300 in all
	)
	c := New(t, 5)
	c.Extra = []string{"--failure-detection", "lan"}
	c.StartAll()
	l := NewLoad(c, keys, limit)
	owner := owners(t, l, c.Hosts[0])
	ld := startLoad(t, l, workers, perW, linkMaxCalls)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d warm-up calls", 2*keys), func() bool { return l.Calls() >= 2*keys })

	before := c.counters()
	pausesBefore := c.clusterSum("sluice_pauses_total")
	const failed = `sluice_membership_changes_total{event="fail"}`
	failsBefore := c.clusterSum(failed)
	from := l.Since()
	release := squeeze(t, quota, c.Hosts...)
	hold(t, l, ld, from, squeezd)
	release()
	to := l.Since()
	during := c.counters().since(before)
	moreCalls(t, l, 5*workers*perW) // 5 s of load after it
	ld.Stop(t)

	pauses := c.clusterSum("sluice_pauses_total") - pausesBefore
	starved := c.clusterSum(`sluice_pause_causes_total{cause="starved"}`)
	stopped := c.clusterSum(`sluice_pause_causes_total{cause="stopped"}`)
	h := l.History()
	pre, in, post := phases(h, from, to)
	t.Logf("before: %v", statsOf(pre))
	t.Logf("squeezed to %.0f%% of a CPU for %v: %v; %v", 100*quota, squeezd, statsOf(in), during)
	t.Logf("after: %v", statsOf(post))
	t.Logf("pauses noticed: %v (in all: %v starved, %v stopped)", pauses, starved, stopped)

	if fails := c.clusterSum(failed) - failsBefore; fails > 0 {
		t.Errorf("members declared dead %v times while the cluster was starved: the overload became a membership failure", fails)
	}
	noHangs(t, h)
	standIn := make([]int, keys)
	sum := 0
	for _, a := range h {
		if a.Admitted && a.Decider != "" && a.Decider != owner[a.Key] {
			standIn[a.Key]++
			sum++
		}
	}
	most, over := judge(t, h, keys, func(k int) int { return limit + standIn[k] })
	t.Logf("bound per key = limit %d + its stand-in admissions (%d over all keys); admitted %d in all, most on one key %d, keys past their bound %d",
		limit, sum, statsOf(h).Admitted, most, over)
	// The explanation is evidence, not proof: the first pause after a
	// node moved into the squeezed cgroup has no throttled time of it to
	// compare, and may read as stopped. Starvation must be recognised.
	if pauses > 0 && starved == 0 {
		t.Errorf("%v pauses, none explained as starved (%v as stopped): the nodes were starved, not stopped", pauses, stopped)
	}
}
