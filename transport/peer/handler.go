package peer

// The interfaces the Server calls: the checks other nodes forward
// (ForwardHandler, LeasingHandler) and the counters they replicate and pull
// (PeerHandler). DecidedLedger, LeaseReturner and RegionGranter are beside
// their calls. Their implementations live outside transport; cmd/sluice
// passes them in through transport.ServerConfig.

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
)

// ForwardHandler decides the checks other nodes forward to this one: the
// part of transport.Handler that the Peer service calls (cluster.Node
// implements both). Its methods are called concurrently from many
// goroutines. They return only when every element of out is filled
// (len(out) == len(reqs)); movedTo, as long as reqs, arrives with every
// entry "", and a method sets the entries of the items it leaves
// undecided. The Server reuses the slices after they return, so a
// ForwardHandler must not keep them.
type ForwardHandler interface {
	// CheckStandIn decides reqs that another node (named from) sent here
	// because their owner did not answer: this node decides them all from
	// what it holds (hop limit 1). pullFrom is nil or names, per request,
	// the node that handed the key here ("" for none), to pull it from
	// first (ForwardRequest.pull_from). movedTo is as for CheckForwarded.
	CheckStandIn(ctx context.Context, from string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string)
	// CheckForwarded decides reqs another node (named from) forwarded to this
	// one; it never forwards again (hop limit 1). An item whose key this
	// node sees elsewhere is left undecided with movedTo[i] the address to
	// ask instead (ForwardResponse.moved_to).
	CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string)
}

// LeasingHandler is a ForwardHandler that may grant quota leases for hot
// keys (docs/leases.md). The Server calls CheckForwardedLeasing instead of
// CheckForwarded for a forward whose sender takes leases
// (ForwardRequest.takes_leases): it is CheckForwarded, and may also set
// out[i].Lease for an item decided here, which the Server sends back in
// ForwardResponse.leases. A ForwardHandler without it grants none.
type LeasingHandler interface {
	CheckForwardedLeasing(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string)
}

// PeerHandler answers the node-to-node replication RPCs. cluster.Node
// implements it. Called concurrently. The slices belong to the Server: a
// PeerHandler must not keep them after returning (the Counter values it
// copies out are its own). Every Counter it is given has passed
// bucket.ValidateKey and carries a State that bucket.State.UnmarshalBinary
// accepted.
type PeerHandler interface {
	// Replicate installs counters whose Version is newer than what this node holds; handoff means this node now owns them.
	Replicate(ctx context.Context, from string, handoff bool, counters []bucket.Counter) (installed, stale int)
	// Pull fills State and Version of each element of keys (only Name and Key are set on input; Version 0 on output = none held),
	// and ans[i] (len(ans) == len(keys)) with where keys[i] had been released to and whom this node would pull it from
	// (PullResponse.moved_to and holders; at most keymove.MaxHolders are sent per key).
	// With release, this node stops deciding those keys for ttl (it points their checks at the puller).
	// from is the puller's name, fromAddr its gRPC address (PullRequest.from_addr; empty from older nodes).
	Pull(ctx context.Context, from, fromAddr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer)
}
