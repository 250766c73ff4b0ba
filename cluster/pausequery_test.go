package cluster

import (
	"sync/atomic"
	"testing"
	"time"
)

// pausedOwner sets up three in-process nodes whose key owner n0 is cut
// off while its replica stands in for key stood (checked before times
// before and during times while cut off) but not for key quiet (checked
// before times before only), then resumes n0 with its clock 3 × the
// forward timeout past its last heartbeat. The other two nodes' clocks
// stand 10 s after their start, so that their ledgers reach back over
// the gap. beforeResume, when not nil, runs after the links heal and
// before n0's clock moves on. With warm, a third key of n0's is checked
// at n0 right after the resume: pulled, it shows n0 busy enough for a
// round of questions to pay off (worthAsking).
func pausedOwner(t *testing.T, before, during int, warm bool, beforeResume func([]*Node, *MemNetwork)) (nodes []*Node, net *MemNetwork, stood, quiet *limitedKey) {
	t.Helper()
	return pausedOwnerClocked(t, before, during, warm, false, beforeResume)
}

// pausedOwnerClocked is pausedOwner; with advancing, the other nodes'
// clocks also run on with real time.
func pausedOwnerClocked(t *testing.T, before, during int, warm, advancing bool, beforeResume func([]*Node, *MemNetwork)) (nodes []*Node, net *MemNetwork, stood, quiet *limitedKey) {
	t.Helper()
	base := time.Now()
	const forwardTimeout = 200 * time.Millisecond
	var ahead, others atomic.Int64 // n0's and the others' clocks past t0 (ns)
	nodes, net = memCluster(t, 3, func(c *Config) {
		c.ForwardTimeout = forwardTimeout
		if c.Name == "n0" {
			c.Now = func() time.Time { return t0.Add(time.Duration(ahead.Load())) }
		} else {
			c.Now = func() time.Time {
				if advancing {
					return t0.Add(time.Duration(others.Load()) + time.Since(base))
				}
				return t0.Add(time.Duration(others.Load()))
			}
		}
	})
	others.Store(int64(10 * time.Second))
	x := nodes[0]
	keys := keysOwnedBy(x, "n0", 3)
	stood = &limitedKey{t: t, key: keys[0], limit: 10}
	quiet = &limitedKey{t: t, key: keys[1], limit: 10}
	for i := range before {
		quiet.check(nodes[1+i%2])
	}
	cutOffOwner(t, nodes, net, stood, before, during)
	net.Heal()
	if beforeResume != nil {
		beforeResume(nodes, net)
	}
	ahead.Store(int64(3 * forwardTimeout))
	if warm {
		pulls := net.Pulls(memAddr(0))
		(&limitedKey{t: t, key: keys[2], limit: 10}).check(x)
		if net.Pulls(memAddr(0)) == pulls {
			t.Fatal("the first check after the pause pulled nothing")
		}
	}
	return nodes, net, stood, quiet
}

// After a pause, the owner asks its peers which of its keys they decided
// meanwhile and pulls only those: the key a replica stood in for is
// pulled (and nothing past its limit is admitted), the key nobody else
// decided is decided without a pull.
func TestPauseQueryNarrowsThePulls(t *testing.T) {
	t.Parallel()
	const before, during = 4, 3
	nodes, net, stood, quiet := pausedOwner(t, before, during, true, nil)
	x := nodes[0]
	WaitFor(t, 10*time.Second, "the owner's pause query narrowed its pulls", func() bool {
		return x.Status().PauseQueriesNarrowed == 1
	})
	if st := x.Status(); st.Pauses != 1 || st.PauseQueriesKept != 0 {
		t.Fatalf("%s: %d pauses, %d queries kept; want 1, 0", x.Name(), st.Pauses, st.PauseQueriesKept)
	}
	pulls := net.Pulls(memAddr(0))
	if o := quiet.check(x); o.Owner != x.Name() {
		t.Fatalf("the quiet key was decided by %s, want the owner", o.Owner)
	}
	if p := net.Pulls(memAddr(0)); p != pulls {
		t.Errorf("the owner pulled %d times for a key nobody else decided during the pause, want 0", p-pulls)
	}
	for range int(stood.limit) {
		if o := stood.check(x); o.Owner != x.Name() {
			t.Fatalf("the stood-in key was decided by %s, want the owner", o.Owner)
		}
	}
	if net.Pulls(memAddr(0)) == pulls {
		t.Error("the owner did not pull the key its replica stood in for")
	}
	t.Logf("stood-in key: %d admitted (limit %d; %d before, %d by the stand-in); pulls for it %d",
		stood.admitted, stood.limit, before, during, net.Pulls(memAddr(0))-pulls)
	if stood.admitted != int(stood.limit) {
		t.Fatalf("%d admitted for a limit of %d: the owner decided from its count of before the pause", stood.admitted, stood.limit)
	}
}

// When a peer cannot answer, or took the owner out of its ring in the
// gap, the owner narrows nothing: every key it owns is pulled.
func TestPauseQueryKeepsEveryPull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		do   func([]*Node, *MemNetwork)
	}{
		{"a peer does not answer", func(_ []*Node, net *MemNetwork) {
			net.Cut(memAddr(0), memAddr(2), Blackhole)
		}},
		{"a peer took it out of its ring", func(nodes []*Node, _ *MemNetwork) {
			nodes[1].ledger.Removed(nodes[0].Name(), nodes[1].now().UnixNano())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nodes, net, _, quiet := pausedOwner(t, 2, 2, true, tc.do)
			x := nodes[0]
			WaitFor(t, 10*time.Second, "the owner's pause query gave up", func() bool {
				return x.Status().PauseQueriesKept == 1
			})
			net.Heal()
			pulls := net.Pulls(memAddr(0))
			quiet.check(x)
			if n := x.Status().PauseQueriesNarrowed; n != 0 || net.Pulls(memAddr(0)) == pulls {
				t.Fatalf("the owner did not pull the quiet key (%d queries narrowed)", n)
			}
		})
	}
}

// A node that pulled nothing since its pause (idle, or a trickle of
// checks) does not ask: a round would cost more calls than its pulls.
// Every key it owns is pulled as before.
func TestPauseQuerySkippedWhenPullsAreFew(t *testing.T) {
	t.Parallel()
	nodes, net, _, quiet := pausedOwner(t, 2, 2, false, nil)
	x := nodes[0]
	WaitFor(t, 10*time.Second, "the owner's pause query was skipped", func() bool {
		return x.Status().PauseQueriesSkipped == 1
	})
	if st := x.Status(); st.PauseQueriesNarrowed+st.PauseQueriesKept != 0 {
		t.Fatalf("%d rounds asked, want none", st.PauseQueriesNarrowed+st.PauseQueriesKept)
	}
	pulls := net.Pulls(memAddr(0))
	quiet.check(x)
	if net.Pulls(memAddr(0)) == pulls {
		t.Fatal("without a round, the owner did not pull the quiet key")
	}
}

// A member that answers late still names what it decided in the gap: the
// span asked about reaches back from its now at the answer, up to the
// round's timeout after the question. (Asked for the gap alone, a member
// whose answer took 2 s looked at the last 0.8 s of its own clock and
// missed its stand-in decisions: the owner narrowed past the stood-in
// key and admitted over the limit.)
func TestPauseQueryReachesBackOverASlowAnswer(t *testing.T) {
	t.Parallel()
	const before, during = 4, 3
	nodes, net, stood, _ := pausedOwnerClocked(t, before, during, true, true, func(_ []*Node, net *MemNetwork) {
		net.SetDelay(2 * time.Second)
	})
	x := nodes[0]
	WaitFor(t, 15*time.Second, "the owner's pause query narrowed its pulls", func() bool {
		return x.Status().PauseQueriesNarrowed == 1
	})
	net.SetDelay(0)
	for range int(stood.limit) {
		stood.check(x)
	}
	t.Logf("stood-in key: %d admitted (limit %d; %d before, %d by the stand-in)", stood.admitted, stood.limit, before, during)
	if stood.admitted != int(stood.limit) {
		t.Fatalf("%d admitted for a limit of %d: the late answer missed the stand-in's decisions", stood.admitted, stood.limit)
	}
}
