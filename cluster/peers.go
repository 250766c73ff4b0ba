package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
)

// Peers sends checks and counters to other nodes. peer.PeerClient
// implements it over gRPC; MemNetwork implements it in memory with failure
// controls. Every method is called concurrently by many goroutines and must
// return before ctx's deadline, with an error when the peer could not answer.
// The slices are the caller's; out, movedTo and ans are as long as reqs (or
// keys), and on success every element of them is written.
//
// Forward asks the node whose gRPC address is addr to decide reqs and fills
// out with its answers; an item the peer no longer holds comes back
// undecided, with movedTo[i] the address to ask instead ("" for the decided
// items).
//
// ForwardStandIn is Forward for requests whose owner did not answer, or that
// were pointed on twice: the receiver decides them all from what it holds.
// pullFrom is nil or names, per request, the node that handed the key to the
// receiver ("" for none), which pulls the key from it first. movedTo is as
// for Forward.
//
// Replicate sends counters to addr, which installs those newer than its own
// copies; with handoff the receiver owns them from now on.
//
// Pull fills State and Version of each element of keys (Name and Key set)
// from addr's copies (Version 0: none), and ans[i] with what addr says about
// keys[i] besides (where it released the key to, whom it would pull it
// from); with release, addr stops deciding those keys for ttl.
type Peers interface {
	Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error
	ForwardStandIn(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error
	Replicate(ctx context.Context, addr string, handoff bool, counters []bucket.Counter) (installed, stale int, err error)
	Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) error
}

// ErrNoPeers is returned by NoPeers.
var ErrNoPeers = errors.New("no peer transport")

// NoPeers is a Peers that reaches nobody: a single node, or tests of the
// fallback paths.
type NoPeers struct{}

var _ Peers = NoPeers{}

// Forward fails at once.
func (NoPeers) Forward(context.Context, string, []check.Request, []check.Outcome, []string) error {
	return ErrNoPeers
}

// ForwardStandIn fails at once.
func (NoPeers) ForwardStandIn(context.Context, string, []check.Request, []string, []check.Outcome, []string) error {
	return ErrNoPeers
}

// Replicate fails at once.
func (NoPeers) Replicate(context.Context, string, bool, []bucket.Counter) (int, int, error) {
	return 0, 0, ErrNoPeers
}

// Pull fails at once.
func (NoPeers) Pull(context.Context, string, []bucket.Counter, bool, time.Duration, []keymove.PullAnswer) error {
	return ErrNoPeers
}
