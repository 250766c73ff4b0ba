package peer

// PeerState is peerState for the tests of package peer_test
// (tracing_test.go), which import transport and so cannot be in package
// peer.
var PeerState = peerState
