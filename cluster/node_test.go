package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/clustertest"
)

// TestEveryNodeStoppedAtOnceStopsCleanly: stopping every node at once (a
// whole cluster's SIGTERM) is a graceful stop for each of them: a node
// whose leave message nobody is left to hear has still handed off and
// flushed its counters, so it must not report a failure (sluice serve
// would exit 2).
func TestEveryNodeStoppedAtOnceStopsCleanly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{}, "n0", "n1", "n2")
		nodes := nodesOf(c, "n0", "n1", "n2")
		for i := range 30 {
			if o := check1(nodes[i%3], clustertest.Request(fmt.Sprint("k", i), 10, 1)); o.Err != "" {
				t.Fatal(o.Err)
			}
		}
		errs := make(chan error, len(nodes))
		for _, n := range nodes {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := n.Shutdown(ctx); err != nil {
					errs <- fmt.Errorf("%s: %w", n.Name(), err)
					return
				}
				errs <- nil
			}()
		}
		for range nodes {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
}

// mapRules is a fixed rules set.
type mapRules map[string][]bucket.Limit

func (m mapRules) Lookup(name string) ([]bucket.Limit, bool) { l, ok := m[name]; return l, ok }
func (m mapRules) Hash() string                              { return "test" }

// TestLimitZeroTakesTheRule: limit 0 means "take limit and window from the
// rules for the name" (docs/architecture.md) even when the request carries
// a window, and the owner of a forwarded check decides with the limits its
// sender resolved, rules or not (here only the entry node has rules).
func TestLimitZeroTakesTheRule(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{Configure: func(cfg *cluster.Config) {
			if cfg.Name == "n0" {
				cfg.Rules = mapRules{
					"login":   {{Algorithm: bucket.SlidingWindow, Limit: 5, WindowMS: 60_000}},
					"blocked": {{Algorithm: bucket.SlidingWindow, Limit: 0, WindowMS: 60_000}},
				}
			}
		}}, "n0", "n1", "n2")
		entry := c.Member("n0").Node
		owners := map[string]bool{}
		for k := range 12 {
			key := fmt.Sprint("user:", k)
			admitted := 0
			for range 8 {
				o := check1(entry, check.Request{Name: "login", Key: key, Hits: 1, Limit: bucket.Limit{WindowMS: 3_600_000}})
				if o.Err != "" {
					t.Fatalf("%s: %s", key, o.Err)
				}
				if o.Limit != 5 {
					t.Fatalf("%s: decided with limit %d, want the rule's 5", key, o.Limit)
				}
				if o.Allowed() {
					admitted++
				}
				owners[o.Owner] = true
			}
			if admitted != 5 {
				t.Fatalf("%s: limit 0 with a window admitted %d of 8, want the rule's 5", key, admitted)
			}
			if o := check1(entry, check.Request{Name: "blocked", Key: key, Hits: 1}); o.Err != "" || o.Allowed() {
				t.Fatalf("%s: a rule of limit 0 answered %+v, want over limit", key, o)
			}
		}
		if len(owners) != 3 {
			t.Fatalf("12 keys were decided by %v; want every node, so that forwarded checks are covered", owners)
		}
		o := check1(entry, check.Request{Name: "no-rule", Key: "k", Hits: 1, Limit: bucket.Limit{WindowMS: 60_000}})
		if !strings.Contains(o.Err, "no rule") {
			t.Fatalf("limit 0 with a window and no rule answered %+v, want the no-rule error", o)
		}
	})
}

// TestNodeRateMeterStopsWhenIdle: a started node's rate meter stops
// without checks, a check starts it again and is counted, and it stops
// again once checks stop (it samples every second, and stops at the
// first sample that sees no check).
func TestNodeRateMeterStopsWhenIdle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{}, "solo")
		n := c.Member("solo").Node
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !n.MeterIdle() {
			t.Fatal("the meter runs 2 s after the node started, without a check")
		}
		if o := check1(n, clustertest.Request("k", 10, 1)); o.Err != "" {
			t.Fatal(o.Err)
		}
		time.Sleep(time.Second + time.Second/2)
		synctest.Wait()
		if n.MeterIdle() || n.Status().ChecksPerSecond <= 0 {
			t.Fatalf("a second after a check: meter idle %v, %v checks a second; want running, above 0", n.MeterIdle(), n.Status().ChecksPerSecond)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !n.MeterIdle() || n.Status().ChecksPerSecond != 0 {
			t.Fatalf("two seconds after the check: meter idle %v, %v checks a second; want idle, 0", n.MeterIdle(), n.Status().ChecksPerSecond)
		}
	})
}
