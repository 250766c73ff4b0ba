package cluster

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/bucket"
)

// Peers sends checks to other nodes. transport.PeerClient implements it over
// gRPC; MemNetwork implements it in memory with failure controls.
//
// Forward asks the node whose gRPC address is addr to decide reqs and fills
// out (len(out) == len(reqs)) with its answers. It is called concurrently by
// many goroutines. It must return before ctx's deadline, with an error when
// the peer could not answer; out is then left unspecified.
type Peers interface {
	Forward(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome) error
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
