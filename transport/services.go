package transport

// The gRPC services' methods: RateLimiter (Check, Owners) and Admin
// (Status), and the pooled buffers a client's checks are decided on. The
// Peer service is package peer's; NewServer registers it.

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// checkBuf holds the per-call slices the handler works on; pooled.
type checkBuf struct {
	reqs []check.Request
	outs []check.Outcome
}

func (s *Server) getBuf(n int) *checkBuf {
	b := s.bufs.Get().(*checkBuf)
	if cap(b.reqs) < n {
		b.reqs = make([]check.Request, n)
		b.outs = make([]check.Outcome, n)
	}
	b.reqs, b.outs = b.reqs[:n], b.outs[:n]
	return b
}

func (s *Server) putBuf(b *checkBuf) {
	clear(b.reqs) // drop references to names, keys and owners
	clear(b.outs)
	s.bufs.Put(b)
}

// decide converts a client's reqs, runs the Handler's Check on pooled
// slices and returns the response. (The Peer service decides forwarded
// checks on its own: peer.Server.)
func (s *Server) decide(ctx context.Context, reqs []*sluicev1.RateLimitRequest) *sluicev1.CheckResponse {
	resp := &sluicev1.CheckResponse{}
	n := len(reqs)
	if n == 0 {
		return resp
	}
	b := s.getBuf(n)
	for i, r := range reqs {
		b.reqs[i] = peer.RequestFromProto(r)
	}
	s.cfg.Handler.Check(ctx, b.reqs, b.outs)
	resp.Responses = peer.AppendResponses(make([]*sluicev1.RateLimitResponse, 0, n), b.outs)
	s.putBuf(b)
	return resp
}

type rateLimiterServer struct {
	sluicev1.UnimplementedRateLimiterServer
	s *Server
}

func (g rateLimiterServer) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	start := time.Now()
	if n := len(req.GetRequests()); n > check.MaxBatchSize {
		g.s.observeRefused(APIGRPC, start)
		return nil, peer.BatchTooLarge(n)
	}
	resp := g.s.decide(ctx, req.GetRequests())
	g.s.observeNative(APIGRPC, start, req.GetRequests(), resp.Responses)
	return resp, nil
}

// Owners answers the node's owner table; Unimplemented without
// ServerConfig.Owners. It is served to every API caller, like Check: the
// members' names and addresses are what a client needs to reach them.
func (g rateLimiterServer) Owners(ctx context.Context, _ *sluicev1.OwnersRequest) (*sluicev1.OwnersResponse, error) {
	if g.s.cfg.Owners == nil {
		return nil, status.Error(codes.Unimplemented, "owner table is not available on this server")
	}
	resp, err := g.s.cfg.Owners.Owners(ctx)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if resp == nil {
		resp = &sluicev1.OwnersResponse{}
	}
	return resp, nil
}

type adminServer struct {
	sluicev1.UnimplementedAdminServer
	s *Server
}

func (g adminServer) Status(ctx context.Context, _ *sluicev1.StatusRequest) (*sluicev1.StatusResponse, error) {
	if g.s.cfg.Status == nil {
		return nil, status.Error(codes.Unimplemented, "status is not available on this server")
	}
	resp, err := g.s.cfg.Status.Status(ctx)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if resp == nil {
		resp = &sluicev1.StatusResponse{}
	}
	return resp, nil
}

func (g adminServer) TopKeys(ctx context.Context, req *sluicev1.TopKeysRequest) (*sluicev1.TopKeysResponse, error) {
	if g.s.cfg.TopKeys == nil {
		return nil, status.Error(codes.Unimplemented, "top keys are not available on this server")
	}
	limit := int(req.GetLimit())
	switch {
	case req.GetBy() != sluicev1.TopBy_TOP_BY_ADMITTED && req.GetBy() != sluicev1.TopBy_TOP_BY_REFUSED:
		return nil, status.Errorf(codes.InvalidArgument, "by is %d: want 0 (admitted) or 1 (refused)", req.GetBy())
	case limit == 0:
		limit = DefaultTopKeys
	case limit < 0 || limit > MaxTopKeys:
		return nil, status.Errorf(codes.InvalidArgument, "limit is %d: want 1..%d (0 for %d)", limit, MaxTopKeys, DefaultTopKeys)
	}
	resp, err := g.s.cfg.TopKeys.TopKeys(ctx, req.GetBy(), limit)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}
