package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// Peers sends checks and counters to other nodes. transport.PeerClient
// implements it over gRPC; MemNetwork implements it in memory with failure
// controls. Every method is called concurrently by many goroutines and must
// return before ctx's deadline, with an error when the peer could not answer.
//
// Forward asks the node whose gRPC address is addr to decide reqs and fills
// out (len(out) == len(reqs)) with its answers; an item the peer no longer
// holds comes back with MovedTo set instead of a decision.
//
// ForwardStandIn is Forward for requests whose owner did not answer: the
// receiver, a replica, decides them all from what it holds.
//
// Replicate sends counters to addr, which installs those newer than its own
// copies; with handoff the receiver owns them from now on.
//
// Pull fills State and Version of each element of keys (Name and Key set)
// from addr's copies (Version 0: none); with release, addr stops deciding
// those keys for ttl.
type Peers interface {
	Forward(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome) error
	ForwardStandIn(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome) error
	Replicate(ctx context.Context, addr string, handoff bool, counters []bucket.Counter) (installed, stale int, err error)
	Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration) error
}

// ErrNoPeers is returned by NoPeers.
var ErrNoPeers = errors.New("no peer transport")

// NoPeers is a Peers that reaches nobody: a single node, or tests of the
// fallback paths.
type NoPeers struct{}

var _ Peers = NoPeers{}

// Forward fails at once.
func (NoPeers) Forward(context.Context, string, []bucket.Request, []bucket.Outcome) error {
	return ErrNoPeers
}

// ForwardStandIn fails at once.
func (NoPeers) ForwardStandIn(context.Context, string, []bucket.Request, []bucket.Outcome) error {
	return ErrNoPeers
}

// Replicate fails at once.
func (NoPeers) Replicate(context.Context, string, bool, []bucket.Counter) (int, int, error) {
	return 0, 0, ErrNoPeers
}

// Pull fails at once.
func (NoPeers) Pull(context.Context, string, []bucket.Counter, bool, time.Duration) error {
	return ErrNoPeers
}
