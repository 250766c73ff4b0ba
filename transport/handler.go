package transport

// The interfaces the Server calls: the checks (Handler, CheckValidator),
// rule limits, status, owners and other members' status; those of the Peer
// service (PeerHandler and the others) are package peer's. Their
// implementations live outside transport; cmd/sluice passes them in.

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// Handler decides checks. cluster.Node implements it; cmd/sluice passes it in.
// Its methods are called concurrently from many goroutines. They return only
// when every element of out is filled (len(out) == len(reqs)). The transport
// reuses the slices after they return, so a Handler must not keep them.
type Handler interface {
	// Check decides reqs and fills out; it may forward to other nodes. It
	// validates each item itself and answers an invalid one with Outcome.Err.
	Check(ctx context.Context, reqs []check.Request, out []check.Outcome)
	// ForwardHandler decides the checks other nodes send this one over the
	// Peer service (CheckStandIn, CheckForwarded), which NewServer registers
	// from package peer with this Handler; a Handler that is also a
	// peer.LeasingHandler, DecidedLedger, LeaseReturner or RegionGranter
	// serves those calls too.
	peer.ForwardHandler
}

// CheckValidator is a Handler that can tell whether a client's check is
// one it would decide, before deciding anything: valid, and with limits of
// its own or a rule's. POST /v1/check asks it about every item of a batch
// and decides none when one is invalid; without it the server asks
// check.Request.Validate alone. cluster.Node implements it. Called
// concurrently; it must not block, and changes nothing.
type CheckValidator interface {
	ValidateCheck(r *check.Request) error
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

// TopKeysSource answers Admin.TopKeys: the node's heaviest keys, by
// admitted or refused hits (limit 1..MaxTopKeys, already checked).
// cmd/sluice implements it over cluster.Node.TopKeys. Called concurrently.
type TopKeysSource interface {
	TopKeys(ctx context.Context, by sluicev1.TopBy, limit int) (*sluicev1.TopKeysResponse, error)
}

// KeysSource answers the Admin key calls (InspectKey, DrainKey, ResetKey) for a
// request already validated (its name, key and limits, as a check's).
// cmd/sluice implements it over cluster.Node. Called concurrently.
type KeysSource interface {
	InspectKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error)
	DrainKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error)
	ResetKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error)
}

// OverridesSource keeps the runtime overrides (Admin.SetOverride,
// DeleteOverride, ListOverrides). SetOverride gets o as the client sent
// it and the caller as the audit line names it, and answers the stored
// override, or an error that is ErrOverridesFull past the cap and a
// refusal of o otherwise. cmd/sluice implements it with cluster.Node.
// Called concurrently.
type OverridesSource interface {
	SetOverride(o *sluicev1.Override, setBy string) (*sluicev1.Override, error)
	DeleteOverride(name, key string, prefix bool, setBy string) (bool, error)
	Overrides(name string) (list []*sluicev1.Override, max int)
}

// ErrOverridesFull is wrapped by an OverridesSource's refusal of a new
// override past the cap.
var ErrOverridesFull = errors.New("overrides full")

// MaxTopKeys is the most keys a TopKeys call may ask for, and
// DefaultTopKeys what a limit of 0 asks for.
const (
	MaxTopKeys     = 1024
	DefaultTopKeys = 20
)

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
// peer.PeerClient implements it. Called concurrently, with a short deadline.
type MemberStatus interface {
	Status(ctx context.Context, addr string) (*sluicev1.StatusResponse, error)
}

var _ MemberStatus = (*peer.PeerClient)(nil)
