package cluster_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/clustertest"
)

// TestPausedOwnerPullsBeforeDeciding models a short pause of a key's owner
// (shorter than failure detection: its membership never changes): its
// peers get no answer from it (a stopped process accepts connections but
// answers nothing), so the key's replica stands in; then the owner runs
// again, its clock showing the time it did not run. It must take the
// stand-in's count before it decides: with an exact algorithm, never more
// than the limit in all (everything it admitted was replicated).
func TestPausedOwnerPullsBeforeDeciding(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var ahead atomic.Int64 // how far n0's clock is ahead of the bubble's (ns)
		c := clustertest.Formed(t, clustertest.Options{Configure: func(cfg *cluster.Config) {
			if cfg.Name == "n0" {
				cfg.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
			}
		}}, "n0", "n1", "n2")
		nodes := nodesOf(c, "n0", "n1", "n2")
		x := nodes[0]
		const limit, before, during = 10, 4, 6
		k := &limitedKey{t: t, key: clustertest.OwnedBy(c, "n0", "n0", "paused", 1)[0], limit: limit}
		cutOffOwner(t, c, k, before, during) // a pause, as its peers see it
		// The resume: n0 runs again, its clock past its last heartbeat by
		// more than the forward timeout.
		ahead.Store(int64(3 * cluster.DefaultConfig().ForwardTimeout))
		c.Peers.Heal()
		for i := range limit {
			if o := k.check(nodes[i%3]); o.Owner != x.Name() {
				t.Fatalf("after the resume %s decided, want the owner %s", o.Owner, x.Name())
			}
		}
		t.Logf("limit %d: %d admitted before the pause, %d during (stand-in), %d in all after %d more checks; pauses noticed by %s: %d",
			limit, before, during, k.admitted, limit, x.Name(), x.Status().Pauses)
		if k.admitted > limit {
			t.Fatalf("%d admitted for a limit of %d: the owner decided from its count of before the pause", k.admitted, limit)
		}
		if x.Status().Pauses != 1 {
			t.Fatalf("%s noticed %d pauses, want 1", x.Name(), x.Status().Pauses)
		}
	})
}

// TestIdleOwnerPullsBeforeDeciding: an owner that decided nothing for
// HeartbeatIdle stops its heartbeat; its next decision handles the gap as
// a pause and pulls the key first. Here the owner was also cut off while
// idle, so the key's replica stood in for it: the owner must take the
// stand-in's count, never more than the limit in all. Before the idle
// heartbeat stopped, it went on beating, saw no gap, and decided from its
// own stale count.
func TestIdleOwnerPullsBeforeDeciding(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{}, "n0", "n1", "n2")
		nodes := nodesOf(c, "n0", "n1", "n2")
		x := nodes[0]
		const limit, before, during = 10, 4, 6
		k := &limitedKey{t: t, key: clustertest.OwnedBy(c, "n0", "n0", "idle", 1)[0], limit: limit}
		cutOffOwner(t, c, k, before, during)
		// Nothing reaches the owner: its heartbeat stops once it has
		// beaten for HeartbeatIdle without a check.
		cfg := cluster.DefaultConfig()
		time.Sleep(cfg.HeartbeatIdle + cfg.ForwardTimeout/4)
		synctest.Wait()
		if !x.Status().HeartbeatIdle {
			t.Fatalf("the owner's heartbeat still beats %v after its last check", cfg.HeartbeatIdle)
		}
		c.Peers.Heal()
		pulls := x.Status().Pulls
		for i := range limit {
			if o := k.check(nodes[i%3]); o.Owner != x.Name() {
				t.Fatalf("after the heal %s decided, want the owner %s", o.Owner, x.Name())
			}
		}
		st := x.Status()
		t.Logf("limit %d: %d admitted before, %d by the stand-in, %d in all; owner: %d idle resumes, %d pauses, %d pulls",
			limit, before, during, k.admitted, st.IdleResumes, st.Pauses, st.Pulls-pulls)
		if k.admitted > limit {
			t.Fatalf("%d admitted for a limit of %d: the idle owner decided from its stale count", k.admitted, limit)
		}
		// One idle resume: the checks after the heal take no time of the
		// bubble's clock, so no second gap opens between them.
		if st.IdleResumes != 1 || st.Pauses != 0 || st.Pulls == pulls {
			t.Fatalf("owner: %d idle resumes (want 1), %d pauses (want 0), %d pulls (want some)", st.IdleResumes, st.Pauses, st.Pulls-pulls)
		}
		synctest.Wait()
		if x.Status().HeartbeatIdle {
			t.Fatal("the owner's heartbeat did not beat again after its decisions")
		}
	})
}
