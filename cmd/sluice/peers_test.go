package main

import (
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/transport"
)

// TestObservedPeersWakeReturningMembers: the metrics wrapper around the
// peer client keeps its optional ResetBackoff, which the node calls when a
// member comes back after a crash. Before, the wrapper hid it, and every
// node kept its connection to a restarted peer in gRPC's reconnect backoff
// (forwards to it refused, stand-ins deciding its keys) after it was back
// (found by test/faults TestFullDiskOnRealHosts).
func TestObservedPeersWakeReturningMembers(t *testing.T) {
	t.Parallel()
	pc := transport.NewPeerClient(transport.PeerConfig{NodeName: "a"})
	defer pc.Close()
	var p cluster.Peers = observedPeers{next: pc, m: newPeerMetrics()}
	if _, ok := p.(cluster.PeerWaker); !ok {
		t.Fatal("observedPeers hides the peer client's ResetBackoff (cluster.PeerWaker)")
	}
	p.(cluster.PeerWaker).ResetBackoff("127.0.0.1:1") // unknown peer: nothing to do
}
