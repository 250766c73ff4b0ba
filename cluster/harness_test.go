package cluster

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// NodeConfig returns a node config for tests: gossip on 127.0.0.1 with a
// free port and fast timers, a fresh data dir, quiet logs.
func NodeConfig(t testing.TB, name, grpcAddr string) Config {
	t.Helper()
	cfg := DefaultConfig()
	ml := memberlist.DefaultLocalConfig()
	ml.Name = name
	ml.BindAddr = "127.0.0.1"
	ml.BindPort = 0
	ml.LogOutput = io.Discard
	cfg.Config = ml
	// One cluster name per test: tests run in parallel on one loopback
	// address, and a node that reconnects to a dead member's address must
	// not pull another test's node, which the kernel may have given that
	// port, into its cluster.
	cfg.ClusterName = testClusterName(t)
	cfg.GRPCAddr = grpcAddr
	cfg.DataDir = t.TempDir()
	cfg.JoinRetry = 100 * time.Millisecond
	cfg.Log = slog.New(slog.DiscardHandler)
	cfg.Cache.FlushInterval = 50 * time.Millisecond
	return cfg
}

// testClusterName is t's name, hashed when too long for a memberlist label.
func testClusterName(t testing.TB) string {
	if n := t.Name(); len(n) <= memberlist.LabelMaxSize {
		return n
	}
	return fmt.Sprintf("%x", sha256.Sum256([]byte(t.Name())))
}

// StartNodes builds nodes from cfgs, starts the first, joins the others to
// it, waits until every node's ring holds all of them, and shuts them all
// down when the test ends.
func StartNodes(t testing.TB, cfgs []Config, peers func(i int) Peers) []*Node {
	t.Helper()
	nodes := make([]*Node, len(cfgs))
	for i, cfg := range cfgs {
		if i > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		n, err := New(cfg, peers(i))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.Shutdown(ctx); err != nil {
				t.Errorf("shutdown %s: %v", n.Name(), err)
			}
		})
		nodes[i] = n
	}
	WaitFor(t, 20*time.Second, "every ring holds every node", func() bool {
		for _, n := range nodes {
			if n.Ring().Table().Len() != len(nodes) {
				return false
			}
		}
		return true
	})
	return nodes
}

// WaitFor polls cond until it holds, failing the test at the deadline.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		<-tick.C
	}
}

// FixedClock returns a clock stuck at t0 (decisions in tests must not cross
// a window edge by chance).
func FixedClock(t0 time.Time) func() time.Time { return func() time.Time { return t0 } }

func memAddr(i int) string { return fmt.Sprintf("mem-%d", i) }

// StartNode builds and starts one node joining seed (none when empty) and
// shuts it down when the test ends (a no-op if the test did already).
func StartNode(t testing.TB, cfg Config, peers Peers, seed string) *Node {
	t.Helper()
	if seed != "" {
		cfg.Join = []string{seed}
	}
	n, err := New(cfg, peers)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	})
	return n
}

// WaitRings waits until every node's ring holds exactly the given nodes.
func WaitRings(t testing.TB, nodes []*Node) {
	t.Helper()
	WaitFor(t, 20*time.Second, "every ring holds exactly the live nodes", func() bool {
		for _, n := range nodes {
			ms := n.Ring().Table().Members()
			if len(ms) != len(nodes) {
				return false
			}
		}
		return true
	})
}

// UnspentLeases returns the hits the nodes hold in leases and have not
// spent: admitted by their owners, not (yet) by anyone.
func UnspentLeases(nodes []*Node) int64 {
	var n int64
	for _, nd := range nodes {
		st := nd.Status()
		n += int64(st.LeaseTokens - st.LeaseSpent)
	}
	return n
}
