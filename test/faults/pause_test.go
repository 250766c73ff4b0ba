//go:build faults && linux

package faults

import (
	"fmt"
	"testing"
	"time"
)

// TestPausedOwnerOnRealHosts is the gray failure on real hosts: five hosts
// under load with the default policy, one of them (the owner of about a
// fifth of the keys) frozen with SIGSTOP for 10 s and then continued. While
// it is frozen the clients call the other four (as a load balancer whose
// health check fails would); checks forwarded to it wait out the forward
// timeout and go to the key's replica, then, once the others declare it
// dead, to the key's next owner.
//
// The bound on each key (docs/guarantees.md, "Paused owner"): the limit
// plus the hits the paused owner admitted on that key since its last
// replication, measured from the first answer on the key decided without
// it (a fixed window's remaining is limit − count), plus the hits admitted
// by stand-ins other than the key's next owner (its replica before the
// others declare the owner dead, and the next owner's replica when the
// next owner does not answer within the forward timeout while it settles):
// a stand-in's decisions are not merged back into the owner's count, so
// each can be one admission too many. Every check gets a decision within
// its deadline, and after the resume every host answers every key alike,
// with a count no lower than what was admitted minus those unreplicated
// and stand-in hits (the resumed node did not overwrite newer counts with
// its stale ones).
func TestPausedOwnerOnRealHosts(t *testing.T) {
	const (
		keys  = 100
		limit = 40 // 3 checks per key per second: 6 before, 30 during the pause, used up after it
		pause = 10 * time.Second
	)
	c := New(t, 5)
	c.StartAll()
	x, rest := c.Hosts[3], []*Host{c.Hosts[0], c.Hosts[1], c.Hosts[2], c.Hosts[4]}

	l := NewLoad(c, keys, limit)
	owner := owners(t, l, c.Hosts[0])
	ld := startLoad(t, l, linkWorkers, linkPerWorker, linkMaxCalls)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d warm-up calls", 2*keys), func() bool { return l.Calls() >= 2*keys })

	// Clients leave x, and its last calls finish, before it freezes: a
	// call to a frozen process can only end at its deadline.
	l.SetEntries(rest...)
	waitFor(t, 10*time.Second, "no call in flight to "+x.Name, func() bool { return l.InFlight(x) == 0 })
	before := c.counters()
	pausedAt := l.Since()
	x.Pause()
	detect := c.WaitViews(30*time.Second, rest)
	next := owners(t, l, rest[0]) // each key's owner while x is declared dead
	t.Logf("SIGSTOP of %s at %v: the other four see it dead after %v", x.Name, pausedAt.Round(time.Millisecond), detect.Round(time.Millisecond))
	hold(t, l, ld, pausedAt, pause)
	x.Resume()
	resumedAt := l.Since()
	l.SetEntries()
	during := c.counters().since(before)
	converge := c.WaitViews(60*time.Second, c.Hosts)
	moreCalls(t, l, 5*linkWorkers*linkPerWorker) // 5 s of load after the resume
	ld.Stop(t)
	pauses := x.metricSum("sluice_pauses_total")

	h := l.History()
	pre, in, post := phases(h, pausedAt, resumedAt)
	// Per key: the hits x admitted since its last replication (measured
	// from the first answer decided without it) and the admissions of
	// stand-ins, those of calls that began before the pause included
	// (early: a forward to x that timed out once x stopped; crashBound; no
	// return to judge strays after: x decides again after the resume, as
	// the key's owner).
	b := crashBound(h, owner, next, x, pausedAt, time.Duration(1<<62), limit)
	for _, k := range b.noAnswer {
		t.Errorf("key %d (owned by %s): no answer decided without it during the pause", k, x.Name)
	}
	unreplicated := b.unreplicated
	standIn := make([]int, keys) // after the pause and before it (early)
	for k := range standIn {
		standIn[k] = b.standIn[k] + b.early[k]
	}
	sumUnrep, sumStandIn, owned := b.sumUnrep, b.sumStandIn+b.sumEarly, b.owned
	t.Logf("paused %s for %v (limit %d, %d keys of %d owned by it); bound per key = limit + hits it admitted since its last replication + stand-in admissions: %d unreplicated hits over its keys, %d stand-in admissions over all keys",
		x.Name, (resumedAt - pausedAt).Round(time.Millisecond), limit, owned, keys, sumUnrep, sumStandIn)
	t.Logf("before: %v", statsOf(pre))
	t.Logf("during: %v; %v", statsOf(in), during)
	t.Logf("after the resume: %v; all five alive %v after it; %s counted %v pauses", statsOf(post), converge.Round(time.Millisecond), x.Name, pauses)
	most, over := judge(t, h, keys, func(k int) int { return limit + unreplicated[k] + standIn[k] })
	t.Logf("admitted %d in all (at most %d + %d + %d); most on one key %d; keys past their bound %d",
		statsOf(h).Admitted, keys*limit, sumUnrep, sumStandIn, most, over)
	noHangs(t, h)
	if pauses < 1 {
		t.Errorf("%s reports %v pauses, want at least 1", x.Name, pauses)
	}
	rem := agree(t, c, l)
	for k, n := range admittedPerKey(h, keys) {
		if count := int(limit - rem[k]); count < min(limit, n-unreplicated[k]-standIn[k]) {
			t.Errorf("key %d: count %d after the resume, but %d admitted (%d of them unreplicated by %s, %d by stand-ins): a stale count overwrote a newer one; its admissions: %s",
				k, count, n, unreplicated[k], x.Name, standIn[k], trace(h, k))
		}
	}
}
