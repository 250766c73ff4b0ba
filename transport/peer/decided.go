package peer

// Peer/Decided: a node that noticed a pause asks a member which of its
// keys that member decided while it did not run (docs/ownership.md).

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Limits of Peer/Decided.
const (
	// MaxDecidedSpan is the longest span one Decided call asks about.
	MaxDecidedSpan = time.Hour
	// MaxDecidedPartitions is the most partitions a ring may have in a
	// Decided call (the ring's own limit is far below it).
	MaxDecidedPartitions = 1 << 20
)

// DecidedLedger is a ForwardHandler that answers Peer/Decided: which keys
// of the partitions asked (of a ring of count partitions) it decided in the
// last within as a stand-in, under the owner-unavailable policy, or as
// their new owner after a ring change, and whether it took the member from
// out of its ring in that time. Called concurrently; partitions is valid
// (each below count, no more than count) and belongs to the Server.
type DecidedLedger interface {
	Decided(ctx context.Context, from string, within time.Duration, count int, partitions []uint32) keymove.DecidedAnswer
}

// validateDecided checks a DecidedRequest as it arrives.
func validateDecided(req *sluicev1.DecidedRequest) error {
	within, count, parts := req.GetWithinMs(), req.GetPartitionCount(), req.GetPartitions()
	switch {
	case within < 1 || within > MaxDecidedSpan.Milliseconds():
		return fmt.Errorf("within_ms %d: want 1 to %d", within, MaxDecidedSpan.Milliseconds())
	case count < 1 || count > MaxDecidedPartitions:
		return fmt.Errorf("partition_count %d: want 1 to %d", count, MaxDecidedPartitions)
	case len(parts) > int(count):
		return fmt.Errorf("%d partitions of a ring of %d", len(parts), count)
	}
	for i, p := range parts {
		if p >= count {
			return fmt.Errorf("partition %d (index %d) is not below partition_count %d", p, i, count)
		}
	}
	return nil
}

// Decided answers a member that noticed a pause. A malformed request is
// refused (InvalidArgument, saying what is wrong) and answers nothing.
func (g *Server) Decided(ctx context.Context, req *sluicev1.DecidedRequest) (*sluicev1.DecidedResponse, error) {
	h, ok := g.cfg.Handler.(DecidedLedger)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "decided keys are not recorded on this server")
	}
	from := req.GetFrom()
	if err := g.sameCluster("decided", from, req.GetCluster()); err != nil {
		return nil, err
	}
	if err := validateDecided(req); err != nil {
		g.log.Warn("refused decided-keys request", "from", from, "reason", err)
		return nil, status.Errorf(codes.InvalidArgument, "decided: %v", err)
	}
	a := h.Decided(ctx, from, time.Duration(req.GetWithinMs())*time.Millisecond, int(req.GetPartitionCount()), req.GetPartitions())
	if len(a.Hashes) > MaxCounters {
		a = keymove.DecidedAnswer{Removed: a.Removed} // too many to name: the asker pulls every key
	}
	return &sluicev1.DecidedResponse{Hashes: a.Hashes, Complete: a.Complete, RemovedSender: a.Removed}, nil
}

// Decided asks the node at addr (Peer/Decided) which keys of partitions
// (this node's, in a ring of count partitions) it decided in the last
// within, rounded up to a millisecond. The call ends by ctx's deadline,
// or Timeout when ctx has none.
func (pc *PeerClient) Decided(ctx context.Context, addr string, within time.Duration, count int, partitions []uint32) (keymove.DecidedAnswer, error) {
	ms := (within + time.Millisecond - 1).Milliseconds()
	req := &sluicev1.DecidedRequest{From: pc.name, Cluster: pc.cluster, WithinMs: ms, PartitionCount: uint32(count), Partitions: partitions}
	if err := validateDecided(req); err != nil {
		return keymove.DecidedAnswer{}, fmt.Errorf("transport: decided: %w", err)
	}
	p, err := pc.peer(addr)
	if err != nil {
		return keymove.DecidedAnswer{}, err
	}
	ctx, cancel := bulkDeadline(ctx, pc.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	resp, err := p.client.Decided(ctx, req)
	if err != nil {
		return keymove.DecidedAnswer{}, fmt.Errorf("transport: decided from %s: %w", addr, callerErr(ctx, dl, err))
	}
	if n := len(resp.GetHashes()); n > MaxCounters {
		return keymove.DecidedAnswer{}, fmt.Errorf("transport: decided from %s: %d keys, at most %d", addr, n, MaxCounters)
	}
	return keymove.DecidedAnswer{Hashes: resp.GetHashes(), Complete: resp.GetComplete(), Removed: resp.GetRemovedSender()}, nil
}
