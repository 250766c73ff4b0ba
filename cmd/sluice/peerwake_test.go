package main

import (
	"testing"

	"github.com/sluicehq/sluice/cluster"
)

// wakingPeers is a cluster.Peers that records the members it was told
// are back.
type wakingPeers struct {
	cluster.NoPeers
	woken []string
}

func (w *wakingPeers) ResetBackoff(addr string) { w.woken = append(w.woken, addr) }

// The node wakes the connection to a member that comes back through
// cluster.PeerWaker; the timing wrapper around the peer client must pass
// it on, or a restarted node's peers keep failing their calls to it with
// the old process's "connection refused" until their reconnect backoff
// ends, and its checks go to stand-ins (docs/guarantees.md, "Restart after
// a crash").
func TestObservedPeersPassOnResetBackoff(t *testing.T) {
	t.Parallel()
	next := &wakingPeers{}
	w, ok := cluster.Peers(observedPeers{next: next, m: newPeerMetrics()}).(cluster.PeerWaker)
	if !ok {
		t.Fatal("observedPeers does not implement cluster.PeerWaker: the node cannot wake the connection to a member that is back")
	}
	w.ResetBackoff("10.0.0.1:7000")
	if len(next.woken) != 1 || next.woken[0] != "10.0.0.1:7000" {
		t.Fatalf("the peer client was woken for %v, want [10.0.0.1:7000]", next.woken)
	}
	// A Peers that keeps no connections has nothing to wake.
	cluster.Peers(observedPeers{next: cluster.NoPeers{}, m: newPeerMetrics()}).(cluster.PeerWaker).ResetBackoff("10.0.0.1:7000")
}
