//go:build faults && linux

package faults

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flushStats is a host's flush histogram (sluice_flush_duration_seconds).
type flushStats struct{ sum, count float64 }

func (h *Host) flushStats() flushStats {
	s, _ := h.Metric("sluice_flush_duration_seconds_sum")
	n, _ := h.Metric("sluice_flush_duration_seconds_count")
	return flushStats{s, n}
}

// mean is the mean flush time since b.
func (a flushStats) mean(b flushStats) time.Duration {
	if a.count == b.count {
		return 0
	}
	return time.Duration((a.sum - b.sum) / (a.count - b.count) * float64(time.Second))
}

// TestSlowStoreOnRealHosts: five hosts under load; n1's data dir is on a
// loop device whose I/O, for n1's process, is throttled to 1/slowIO I/Os
// a second each way (SlowStore) for 15 s. The store is write-back: a
// check never waits on a flush, so every check gets a decision within its
// deadline, and with no membership change every key admits at most its
// limit (plus a replica's admissions when a forward timed out, printed).
// It prints the latency of the checks n1 decided against the others', and
// n1's flush times during the fault against the others'.
// Long on purpose: one story (slow store under load), then its figures.
func TestSlowStoreOnRealHosts(t *testing.T) {
	const (
		slowIO = time.Second
		fault  = 15 * time.Second
	)
	c := New(t, 5)
	x := c.Hosts[1]
	x.LoopDisk(diskSize)
	c.StartAll()

	l := NewLoad(c, diskKeys, diskLimit)
	owner := owners(t, l, c.Hosts[0])
	ld := startLoad(t, l, linkWorkers, linkPerWorker, diskMaxCalls)
	waitFor(t, 30*time.Second, "warm-up calls", func() bool { return l.Calls() >= diskKeys })

	flushBefore := make([]flushStats, len(c.Hosts))
	for i, h := range c.Hosts {
		flushBefore[i] = h.flushStats()
	}
	slowAt := l.Since()
	cg := x.SlowStore(slowIO)
	hold(t, l, ld, slowAt, fault)
	io, _ := os.ReadFile(filepath.Join(cg, "blkio.throttle.io_serviced"))
	fastAt := l.Since()
	x.FastStore()
	var means []string
	var slowMean time.Duration
	for i, h := range c.Hosts {
		m := h.flushStats().mean(flushBefore[i])
		means = append(means, h.Name+" "+m.Round(100*time.Microsecond).String())
		if h == x {
			slowMean = m
		}
	}
	waitFor(t, 30*time.Second, x.Name+"'s store catches up", func() bool {
		s := x.storeState()
		return s.writable == 1 && s.failures == 0
	})
	moreCalls(t, l, 2*linkWorkers*linkPerWorker) // 2 s of load after the fault
	ld.Stop(t)
	if x.Exited() {
		t.Fatalf("%s exited", x.Name)
	}

	h := l.History()
	_, during, _ := phases(h, slowAt, fastAt)
	var byX, byOthers, viaX, viaOthers []Answer
	for _, a := range during {
		if a.Decider == x.Name {
			byX = append(byX, a)
		} else {
			byOthers = append(byOthers, a)
		}
		if a.Entry == x.Index {
			viaX = append(viaX, a)
		} else {
			viaOthers = append(viaOthers, a)
		}
	}
	t.Logf("%s's store throttled to %v per I/O for %v; I/Os it made in the cgroup: %s", x.Name, slowIO, fault, strings.Join(strings.Fields(string(io)), " "))
	t.Logf("mean flush time during the fault: %s", strings.Join(means, ", "))
	t.Logf("during the fault: %v", statsOf(during))
	t.Logf("  decided by %s: %v", x.Name, statsOf(byX))
	t.Logf("  decided by the others: %v", statsOf(byOthers))
	t.Logf("  sent to %s: %v", x.Name, statsOf(viaX))
	t.Logf("  sent to the others: %v", statsOf(viaOthers))
	if len(byX) == 0 {
		t.Errorf("%s decided nothing during the fault", x.Name)
	}
	// A guard, not a promise: the fault must have made the store slow, or
	// the scenario proves nothing. Each flush (one per 1 s flush interval,
	// slowIO apart) writes and fdatasyncs its WAL, and its I/Os queue at
	// the throttle's rate behind the previous flush's, so a flush that
	// waited less than half the delay means the throttle missed the store.
	if slowMean < slowIO/2 {
		t.Errorf("%s's mean flush time during the fault is %v: the store was not slowed (throttle %v per I/O)", x.Name, slowMean, slowIO)
	}
	noHangs(t, h)
	b := crashBound(h, owner, owner, x, l.Since(), l.Since(), diskLimit)
	most, over := judge(t, h, diskKeys, func(k int) int { return diskLimit + b.early[k] })
	t.Logf("admitted %d (limit %d on %d keys; %d admissions by a stand-in after a forward timed out); most on one key %d; keys over %d",
		statsOf(h).Admitted, diskLimit, diskKeys, b.sumEarly, most, over)
	agree(t, c, l)
}
