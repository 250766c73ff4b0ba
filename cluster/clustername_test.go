package cluster

import (
	"testing"
	"time"
)

// A node of another cluster cannot join, even through a member's address:
// the gossip label (the cluster name) differs, so memberlist drops its
// messages, and neither side's membership or ring changes. A node of the
// same cluster joins through the same seed.
func TestNodeOfAnotherClusterCannotJoin(t *testing.T) {
	t.Parallel()
	start := func(name, cluster, seed string) *Node {
		cfg := NodeConfig(t, name, name+":8081")
		cfg.ClusterName = cluster
		return StartNode(t, cfg, NoPeers{}, seed)
	}
	seed := start("a0", "blue", "")
	// Start makes one join attempt before it returns; it fails.
	stranger := start("x0", "green", seed.GossipAddr())
	if stranger.Ready() {
		t.Fatal("a node of cluster green joined cluster blue")
	}
	member := start("a1", "blue", seed.GossipAddr())
	WaitFor(t, 10*time.Second, "a1 joins blue", func() bool {
		return member.Ready() && seed.Ring().Table().Len() == 2 && member.Ring().Table().Len() == 2
	})
	for _, n := range []*Node{seed, member} {
		for _, m := range n.Status().Members {
			if m.Name == "x0" {
				t.Fatalf("%s knows the other cluster's node: %+v", n.Name(), n.Status().Members)
			}
		}
	}
	if st := stranger.Status(); len(st.Members) != 1 || stranger.Ring().Table().Len() != 1 {
		t.Fatalf("the other cluster's node sees %+v", st.Members)
	}
}
