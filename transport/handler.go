package transport

// The interfaces the Server calls: the checks (Handler), the peer RPCs
// (PeerHandler), rule limits, status, owners and other members' status.
// Their implementations live outside transport; cmd/sluice passes them in.

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Handler decides checks. cluster.Node implements it; cmd/sluice passes it in.
// Its methods are called concurrently from many goroutines. They return only
// when every element of out is filled (len(out) == len(reqs)); movedTo, as
// long as reqs, arrives with every entry "", and a method sets the entries
// of the items it leaves undecided. The transport reuses the slices after
// they return, so a Handler must not keep them.
type Handler interface {
	// Check decides reqs and fills out; it may forward to other nodes. It
	// validates each item itself and answers an invalid one with Outcome.Err.
	Check(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome)
	// CheckStandIn decides reqs that another node (named from) sent here
	// because their owner did not answer: this node decides them all from
	// what it holds (hop limit 1). pullFrom is nil or names, per request,
	// the node that handed the key here ("" for none), to pull it from
	// first (ForwardRequest.pull_from). movedTo is as for CheckForwarded.
	CheckStandIn(ctx context.Context, from string, reqs []bucket.Request, pullFrom []string, out []bucket.Outcome, movedTo []string)
	// CheckForwarded decides reqs another node (named from) forwarded to this
	// one; it never forwards again (hop limit 1). An item whose key this
	// node sees elsewhere is left undecided with movedTo[i] the address to
	// ask instead (ForwardResponse.moved_to).
	CheckForwarded(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome, movedTo []string)
}

// CheckValidator is a Handler that can tell whether a client's check is
// one it would decide, before deciding anything: valid, and with limits of
// its own or a rule's. POST /v1/check asks it about every item of a batch
// and decides none when one is invalid; without it the server asks
// bucket.Request.Validate alone. cluster.Node implements it. Called
// concurrently; it must not block, and changes nothing.
type CheckValidator interface {
	ValidateCheck(r *bucket.Request) error
}

// PeerHandler answers the node-to-node replication RPCs. cluster.Node
// implements it. Called concurrently. The slices belong to the transport: a
// PeerHandler must not keep them after returning (the Counter values it
// copies out are its own). Every Counter it is given has passed
// bucket.ValidateKey and carries a State that bucket.State.UnmarshalBinary
// accepted.
// LeasingHandler is a Handler that may grant quota leases for hot keys
// (docs/leases.md). The server calls CheckForwardedLeasing instead of
// CheckForwarded for a forward whose sender takes leases
// (ForwardRequest.takes_leases): it is CheckForwarded, and may also set
// out[i].Lease for an item decided here, which the server sends back in
// ForwardResponse.leases. A Handler without it grants none.
type LeasingHandler interface {
	CheckForwardedLeasing(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome, movedTo []string)
}

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

// RuleLimits gives the limits of the rule for a name (the rules file in
// force), so that HTTP answers decided by a rule can name its window in
// RateLimit-Policy (w=). The rules watcher of cluster/rules implements it;
// cmd/sluice passes it in. Called concurrently; must not block; the caller
// does not modify the slice.
type RuleLimits interface {
	Lookup(name string) ([]bucket.Limit, bool)
}

// StatusSource answers Admin.Status and the HTTP status page. Called
// concurrently.
type StatusSource interface {
	Status(ctx context.Context) (*sluicev1.StatusResponse, error)
}

// OwnerSource answers RateLimiter.Owners: the node's current owner table
// (OwnersResponse), for clients that send each check straight to its key's
// owner (client.WithOwnerRouting). cmd/sluice implements it over the
// node's ring.
// Called concurrently; it must not block. The server only reads the
// response, so an implementation may return the same one to every caller
// while its table does not change.
type OwnerSource interface {
	Owners(ctx context.Context) (*sluicev1.OwnersResponse, error)
}

// MemberStatus asks another member, at its gRPC address, for its own
// status, so that the status page can show every member's keys, rate,
// replication lag and rules hash, which only that member knows.
// PeerClient implements it. Called concurrently, with a short deadline.
type MemberStatus interface {
	Status(ctx context.Context, addr string) (*sluicev1.StatusResponse, error)
}

var _ MemberStatus = (*PeerClient)(nil)
