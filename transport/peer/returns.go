package peer

// Peer/Return: a lease holder gives back the hits of quota leases it did
// not spend (docs/leases.md).

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// MaxReturnHits is the most hits one LeaseReturn gives back: the most one
// lease carries.
const MaxReturnHits = 1 << 20

// LeaseReturner is a ForwardHandler that takes back hits of leases it
// granted (Peer/Return). ReturnLeases fills taken[i] (len(taken) ==
// len(rets)) with the hits of rets[i] it took back into the key's counter.
// Called concurrently; every return has passed validateReturn.
type LeaseReturner interface {
	ReturnLeases(ctx context.Context, from string, rets []check.LeaseReturn, taken []int64)
}

// validateReturn checks one LeaseReturn as it arrives.
func validateReturn(m *sluicev1.LeaseReturn) (check.LeaseReturn, error) {
	if m.GetRequest() == nil {
		return check.LeaseReturn{}, fmt.Errorf("no request")
	}
	r := check.LeaseReturn{Request: RequestFromProto(m.GetRequest()), GrantedAt: m.GetGrantedAt()}
	if err := r.Request.Validate(); err != nil {
		return check.LeaseReturn{}, err
	}
	switch {
	case r.Request.Hits < 1 || r.Request.Hits > MaxReturnHits:
		return check.LeaseReturn{}, fmt.Errorf("returns %d hits, want 1 to %d", r.Request.Hits, MaxReturnHits)
	case r.GrantedAt <= 0:
		return check.LeaseReturn{}, fmt.Errorf("granted_at %d is not a grant's id", r.GrantedAt)
	case len(r.Request.More) > 0 || r.Request.Limit.Limit == 0:
		return check.LeaseReturn{}, fmt.Errorf("names no inline limit, or more than one: want the one the lease was granted under")
	}
	return r, nil
}

// Return takes back the hits of leases the sender did not spend. One
// malformed return refuses the whole call (InvalidArgument, naming it),
// and nothing is taken back.
func (g *Server) Return(ctx context.Context, req *sluicev1.ReturnRequest) (*sluicev1.ReturnResponse, error) {
	h, ok := g.cfg.Handler.(LeaseReturner)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "lease returns are not taken on this server")
	}
	from, ms := req.GetFrom(), req.GetReturns()
	if err := g.sameCluster("return", from, req.GetCluster()); err != nil {
		return nil, err
	}
	if len(ms) > MaxCounters {
		g.log.Warn("refused lease returns", "from", from, "returns", len(ms))
		return nil, tooManyCounters(len(ms))
	}
	rets := make([]check.LeaseReturn, len(ms))
	for i, m := range ms {
		r, err := validateReturn(m)
		if err != nil {
			g.log.Warn("refused lease returns", "from", from, "index", i, "reason", err)
			return nil, status.Errorf(codes.InvalidArgument, "return %d: %v", i, err)
		}
		rets[i] = r
	}
	taken := make([]int64, len(rets))
	if len(rets) > 0 {
		h.ReturnLeases(ctx, from, rets, taken)
	}
	return &sluicev1.ReturnResponse{Taken: taken}, nil
}

// Return gives back to the node at addr (Peer/Return) the hits of the
// leases it granted this node that this node did not spend, and returns
// how many of each it took back. At most MaxCounters go in one call; the
// call ends by ctx's deadline, or Timeout when ctx has none. An answer of
// the wrong length, or that takes back more than was given, is an error.
func (pc *PeerClient) Return(ctx context.Context, addr string, rets []check.LeaseReturn) ([]int64, error) {
	if len(rets) == 0 {
		return nil, nil
	}
	if len(rets) > MaxCounters {
		return nil, fmt.Errorf("transport: return: %d leases, at most %d in one call", len(rets), MaxCounters)
	}
	p, err := pc.peer(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := bulkDeadline(ctx, pc.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	req := &sluicev1.ReturnRequest{From: pc.name, Cluster: pc.cluster, Returns: make([]*sluicev1.LeaseReturn, len(rets))}
	for i, r := range rets {
		req.Returns[i] = &sluicev1.LeaseReturn{Request: RequestToProto(r.Request), GrantedAt: r.GrantedAt}
	}
	resp, err := p.client.Return(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("transport: return %d leases to %s: %w", len(rets), addr, callerErr(ctx, dl, err))
	}
	taken := resp.GetTaken()
	if len(taken) != len(rets) {
		return nil, fmt.Errorf("transport: return to %s: %d answers for %d leases", addr, len(taken), len(rets))
	}
	for i, n := range taken {
		if n < 0 || n > rets[i].Request.Hits {
			return nil, fmt.Errorf("transport: return to %s: took back %d of the %d hits of return %d", addr, n, rets[i].Request.Hits, i)
		}
	}
	return taken, nil
}
