package cluster_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/clustertest"
)

// pauseForward is the nodes' forward timeout (the default).
var pauseForward = cluster.DefaultConfig().ForwardTimeout

// roundOver is how long after n0's resume its pause has been noticed (at
// its next beat, or at once by a check) and its round of questions, which
// starts twice the forward timeout after that, has ended, answered or not
// (PauseQueryTimeout).
var roundOver = pauseForward/4 + 2*pauseForward + cluster.PauseQueryTimeout

// pausedOwner forms n0, n1 and n2 and cuts off n0, the owner of keys
// stood and quiet, while its replica stands in for stood (checked before
// times before and during times while cut off) but not for quiet (checked
// before times before only); then heals the links and resumes n0 with its
// clock 3 × the forward timeout past its last heartbeat. beforeResume,
// when not nil, runs after the links heal and before n0's clock moves on.
// With warm, a third key of n0's is checked at n0 right after the resume:
// pulled, it shows n0 busy enough for a round of questions to pay off
// (worthAsking).
func pausedOwner(t *testing.T, before, during int, warm bool, beforeResume func(*clustertest.Cluster)) (c *clustertest.Cluster, stood, quiet *limitedKey) {
	t.Helper()
	var ahead atomic.Int64 // how far n0's clock is ahead of the bubble's (ns)
	c = clustertest.Formed(t, clustertest.Options{Configure: func(cfg *cluster.Config) {
		if cfg.Name == "n0" {
			cfg.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		}
	}}, "n0", "n1", "n2")
	// The others' ledgers start with them: a question reaches back over
	// the gap, a forward timeout and PauseQueryTimeout, and they must have
	// been running for as long to answer it.
	time.Sleep(10 * time.Second)
	x := c.Member("n0")
	keys := clustertest.OwnedBy(c, "n0", "n0", "paused", 3)
	stood = &limitedKey{t: t, key: keys[0], limit: 10}
	quiet = &limitedKey{t: t, key: keys[1], limit: 10}
	nodes := nodesOf(c, "n0", "n1", "n2")
	for i := range before {
		quiet.check(nodes[1+i%2])
	}
	cutOffOwner(t, c, stood, before, during)
	c.Peers.Heal()
	if beforeResume != nil {
		beforeResume(c)
	}
	ahead.Store(int64(3 * pauseForward))
	if warm {
		pulls := c.Peers.Pulls(x.PeerAddr)
		(&limitedKey{t: t, key: keys[2], limit: 10}).check(x.Node)
		if c.Peers.Pulls(x.PeerAddr) == pulls {
			t.Fatal("the first check after the pause pulled nothing")
		}
	}
	return c, stood, quiet
}

// TestPauseQueryNarrowsThePulls: after a pause, the owner asks its peers
// which of its keys they decided meanwhile and pulls only those: the key
// a replica stood in for is pulled (and nothing past its limit is
// admitted), the key nobody else decided is decided without a pull.
func TestPauseQueryNarrowsThePulls(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const before, during = 4, 3
		c, stood, quiet := pausedOwner(t, before, during, true, nil)
		x := c.Member("n0")
		time.Sleep(roundOver)
		synctest.Wait()
		if st := x.Node.Status(); st.Pauses != 1 || st.PauseQueriesNarrowed != 1 || st.PauseQueriesKept != 0 {
			t.Fatalf("%s: %d pauses, %d queries narrowed, %d kept; want 1, 1, 0", x.Name, st.Pauses, st.PauseQueriesNarrowed, st.PauseQueriesKept)
		}
		pulls := c.Peers.Pulls(x.PeerAddr)
		if o := quiet.check(x.Node); o.Owner != x.Name {
			t.Fatalf("the quiet key was decided by %s, want the owner", o.Owner)
		}
		if p := c.Peers.Pulls(x.PeerAddr); p != pulls {
			t.Errorf("the owner pulled %d times for a key nobody else decided during the pause, want 0", p-pulls)
		}
		for range int(stood.limit) {
			if o := stood.check(x.Node); o.Owner != x.Name {
				t.Fatalf("the stood-in key was decided by %s, want the owner", o.Owner)
			}
		}
		if c.Peers.Pulls(x.PeerAddr) == pulls {
			t.Error("the owner did not pull the key its replica stood in for")
		}
		t.Logf("stood-in key: %d admitted (limit %d; %d before, %d by the stand-in); pulls for it %d",
			stood.admitted, stood.limit, before, during, c.Peers.Pulls(x.PeerAddr)-pulls)
		if stood.admitted != int(stood.limit) {
			t.Fatalf("%d admitted for a limit of %d: the owner decided from its count of before the pause", stood.admitted, stood.limit)
		}
	})
}

// TestPauseQueryKeepsEveryPull: when a peer cannot answer, or took the
// owner out of its ring in the gap, the owner narrows nothing: every key
// it owns is pulled.
func TestPauseQueryKeepsEveryPull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		do   func(*clustertest.Cluster)
	}{
		{"a peer does not answer", func(c *clustertest.Cluster) {
			c.Peers.Cut(c.Member("n0").PeerAddr, c.Member("n2").PeerAddr, cluster.Blackhole)
		}},
		{"a peer took it out of its ring", func(c *clustertest.Cluster) {
			c.Member("n1").Node.NoteRemoved("n0")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c, _, quiet := pausedOwner(t, 2, 2, true, tc.do)
				x := c.Member("n0")
				time.Sleep(roundOver)
				synctest.Wait()
				if st := x.Node.Status(); st.PauseQueriesKept != 1 || st.PauseQueriesNarrowed != 0 {
					t.Fatalf("%d queries kept every pull, %d narrowed; want 1, 0", st.PauseQueriesKept, st.PauseQueriesNarrowed)
				}
				c.Peers.Heal()
				pulls := c.Peers.Pulls(x.PeerAddr)
				quiet.check(x.Node)
				if c.Peers.Pulls(x.PeerAddr) == pulls {
					t.Fatal("the owner did not pull the quiet key")
				}
			})
		})
	}
}

// TestPauseQuerySkippedWhenPullsAreFew: a node that pulled nothing since
// its pause (idle, or a trickle of checks) does not ask: a round would
// cost more calls than its pulls. Every key it owns is pulled as before.
func TestPauseQuerySkippedWhenPullsAreFew(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, _, quiet := pausedOwner(t, 2, 2, false, nil)
		x := c.Member("n0")
		time.Sleep(roundOver)
		synctest.Wait()
		if st := x.Node.Status(); st.Pauses != 1 || st.PauseQueriesSkipped != 1 || st.PauseQueriesNarrowed+st.PauseQueriesKept != 0 {
			t.Fatalf("%d pauses, %d rounds skipped, %d asked; want 1, 1, 0", st.Pauses, st.PauseQueriesSkipped, st.PauseQueriesNarrowed+st.PauseQueriesKept)
		}
		pulls := c.Peers.Pulls(x.PeerAddr)
		quiet.check(x.Node)
		if c.Peers.Pulls(x.PeerAddr) == pulls {
			t.Fatal("without a round, the owner did not pull the quiet key")
		}
	})
}

// TestPauseQueryReachesBackOverASlowAnswer: a member that answers late
// still names what it decided in the gap: the span asked about reaches
// back from its now at the answer, up to the round's timeout after the
// question. (Asked for the gap alone, a member whose answer took 2 s
// looked at the last 0.8 s of its own clock and missed its stand-in
// decisions: the owner narrowed past the stood-in key and admitted over
// the limit.)
func TestPauseQueryReachesBackOverASlowAnswer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const before, during = 4, 3
		c, stood, _ := pausedOwner(t, before, during, true, func(c *clustertest.Cluster) {
			c.Delay(2 * time.Second)
		})
		x := c.Member("n0")
		time.Sleep(roundOver)
		synctest.Wait()
		if n := x.Node.Status().PauseQueriesNarrowed; n != 1 {
			t.Fatalf("%d queries narrowed the pulls, want 1", n)
		}
		c.Delay(0)
		for range int(stood.limit) {
			stood.check(x.Node)
		}
		t.Logf("stood-in key: %d admitted (limit %d; %d before, %d by the stand-in)", stood.admitted, stood.limit, before, during)
		if stood.admitted != int(stood.limit) {
			t.Fatalf("%d admitted for a limit of %d: the late answer missed the stand-in's decisions", stood.admitted, stood.limit)
		}
	})
}
