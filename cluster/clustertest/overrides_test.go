package clustertest

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/overrides"
)

// overrideReach is how long an override set on one node may take to be in
// force on every node: the promise of docs/operations.md, "Overrides".
const overrideReach = time.Second

// waitOverride waits, in the bubble's time, until every member up holds
// limits for (LimitName, key) (nil: no override), and returns how long that
// took; past overrideReach it fails t.
func waitOverride(t *testing.T, c *Cluster, key string, want []bucket.Limit) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		all := true
		for _, name := range c.Up() {
			got, ok := c.Member(name).Node.OverrideLimitsOf(LimitName, key)
			if ok != (want != nil) || !slices.Equal(got, want) {
				all = false
			}
		}
		if all {
			return time.Since(start)
		}
		if time.Since(start) > overrideReach {
			t.Fatalf("override of %s not in force on every node within %v", key, overrideReach)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An override set on one node is in force on every node within a second
// (simulated time), ahead of the limit the checks carry inline, through
// whichever node they arrive at; a node that joins later gets it, and so
// does a node that was down when it was set (from a peer's state) or
// restarts (from its file); a deletion ends it everywhere, and a node that
// missed it does not bring it back.
func TestOverridesReachEveryNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		lim := []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 3, WindowMS: Window.Milliseconds()}}
		if err := c.Crash("n3"); err != nil {
			t.Fatal(err)
		}
		// One key's override, set on n1, wins over the prefix's, set on n2.
		vip := []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 2, WindowMS: Window.Milliseconds()}}
		if _, err := c.Member("n1").Node.SetOverride(overrides.Override{Target: overrides.Target{Name: LimitName, Key: "tenant:vip"}, Limits: vip}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Member("n2").Node.SetOverride(overrides.Override{Target: overrides.Target{Name: LimitName, Key: "tenant:", Prefix: true}, Limits: lim}); err != nil {
			t.Fatal(err)
		}
		took := waitOverride(t, c, "tenant:9", lim)
		waitOverride(t, c, "tenant:vip", vip)
		t.Logf("overrides in force on the members up after %v (bound %v)", took, overrideReach)
		if got := admitted(t, c, "n2", "tenant:vip", 100, 5); got != 2 {
			t.Fatalf("tenant:vip: %d of 5 admitted, want its own override's 2", got)
		}
		// Checks carry a limit of 100 inline; the override's 3 wins, on
		// every node.
		for _, via := range []string{"n1", "n2"} {
			if got := admitted(t, c, via, "tenant:"+via, 100, 5); got != 3 {
				t.Fatalf("via %s: %d of 5 admitted, want the override's 3", via, got)
			}
		}
		// n3 was down: it gets both from a peer's state, and n4 on its join.
		if err := c.Restart("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Add("n4"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		took = waitOverride(t, c, "tenant:9", lim)
		waitOverride(t, c, "tenant:vip", vip)
		t.Logf("on a restarted and a new member after %v", took)

		// Deleted while n4 is down: not brought back by it.
		if err := c.Crash("n4"); err != nil {
			t.Fatal(err)
		}
		if ok, err := c.Member("n3").Node.DeleteOverride(overrides.Target{Name: LimitName, Key: "tenant:", Prefix: true}, "test"); !ok || err != nil {
			t.Fatalf("delete: %v, %v", ok, err)
		}
		waitOverride(t, c, "tenant:9", nil)
		if err := c.Restart("n4"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		// n4's file still holds the override; its peers' deletion wins.
		time.Sleep(2 * overrideReach)
		waitOverride(t, c, "tenant:9", nil)
		waitOverride(t, c, "tenant:vip", vip) // the key's own override stays
		if got := admitted(t, c, "n4", "tenant:x", 100, 5); got != 5 {
			t.Fatalf("after the deletion: %d of 5 admitted, want all", got)
		}
	})
}

// staticRules is a rules file of one rule.
type staticRules map[string][]bucket.Limit

func (r staticRules) Lookup(name string) ([]bucket.Limit, bool) { ls, ok := r[name]; return ls, ok }
func (r staticRules) Hash() string                              { return "static" }

// The precedence of docs/operations.md: a key's override, then its
// longest prefix's, then the check's own limit, then the rule; deleting
// the override gives the key back to the rule.
func TestOverridePrecedence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule := []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 4, WindowMS: Window.Milliseconds()}}
		c := Formed(t, Options{Configure: func(cfg *cluster.Config) { cfg.Rules = staticRules{LimitName: rule} }}, "n1", "n2", "n3")
		byRule := func(key string) check.Request { return check.Request{Name: LimitName, Key: key, Hits: 1} }
		count := func(r check.Request, n int) int {
			got := 0
			for range n {
				o := checkVia(t, c, "n2", r)
				if o.Err != "" {
					t.Fatalf("%+v: %s", r, o.Err)
				}
				if o.Allowed() {
					got++
				}
			}
			return got
		}
		if got := count(byRule("a"), 6); got != 4 {
			t.Fatalf("by the rule: %d of 6, want 4", got)
		}
		lim := func(n int64) []bucket.Limit {
			return []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: n, WindowMS: Window.Milliseconds()}}
		}
		set := func(key string, prefix bool, n int64) {
			if _, err := c.Member("n1").Node.SetOverride(overrides.Override{Target: overrides.Target{Name: LimitName, Key: key, Prefix: prefix}, Limits: lim(n)}); err != nil {
				t.Fatal(err)
			}
		}
		set("p:", true, 2)
		set("p:k", false, 3)
		waitOverride(t, c, "p:x", lim(2))
		waitOverride(t, c, "p:k", lim(3))
		for _, tc := range []struct {
			r    check.Request
			want int
		}{
			{byRule("p:x"), 2},        // the prefix's override over the rule
			{Request("p:y", 5, 1), 2}, // and over the check's own limit
			{byRule("p:k"), 3},        // the key's own over the prefix's
			{Request("q", 5, 1), 5},   // no override: the check's own limit over the rule
			{byRule("r"), 4},          // nothing else: the rule
		} {
			if got := count(tc.r, 7); got != tc.want {
				t.Fatalf("%s (limit %d): %d of 7 admitted, want %d", tc.r.Key, tc.r.Limit.Limit, got, tc.want)
			}
		}
		if ok, err := c.Member("n3").Node.DeleteOverride(overrides.Target{Name: LimitName, Key: "p:", Prefix: true}, "test"); !ok || err != nil {
			t.Fatalf("delete: %v %v", ok, err)
		}
		waitOverride(t, c, "p:z", nil)
		if got := count(byRule("p:z"), 6); got != 4 {
			t.Fatalf("after the deletion: %d of 6, want the rule's 4", got)
		}
	})
}
