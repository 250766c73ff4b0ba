// Package keymove holds the words of a key moving between nodes, which the
// ownership protocol (cluster, cluster/ownership) and the peer protocol
// (transport/peer) both speak, and which cluster and transport/peer, which
// may not import each other, share from here: the nodes that may hold a
// newer state of a key (Holder), what a pull's answer says about a key
// besides its record (PullAnswer), and a member's answer to a node back
// from a pause (DecidedAnswer). Addresses are gRPC host:port strings; a
// forward's moved-to and a stand-in's pull-from addresses travel as plain
// strings beside the requests (cluster.Peers, peer.ForwardHandler). This
// package imports nothing of Sluice's.
package keymove

// Holder is a node that may hold a newer state of a key: its gRPC
// address, and whether to pull the key from it with release (it then stops
// deciding the key and points it at the puller).
type Holder struct {
	Addr    string
	Release bool
}

// MaxHolders is the most holders a pull's answer names for one key.
const MaxHolders = 32

// PullAnswer is what a pull's answer says about one key besides its
// record.
type PullAnswer struct {
	// MovedTo is the gRPC address of the node the answering node had
	// already released the key to ("" when none): it holds a newer state.
	MovedTo string
	// Holders are the nodes the answering node would pull the key from
	// before deciding it (it has not settled it since a membership change
	// gave it the key): they may hold a newer state. At most MaxHolders.
	Holders []Holder
}

// DecidedAnswer is a member's answer to a node that noticed a pause and
// asked which of its keys the member decided meanwhile (Peer/Decided).
type DecidedAnswer struct {
	// Hashes are the ring hashes of the keys of the partitions asked that
	// the member decided in the span: as a stand-in, under the
	// owner-unavailable policy, or as their new owner after a ring change.
	Hashes []uint64
	// Complete: the member's record covers the whole span, and its ring
	// has the asker's partition count. Without it nothing can be left out.
	Complete bool
	// Removed: the member took the asker out of its ring in the span.
	Removed bool
}
