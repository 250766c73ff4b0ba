package transport

// The gRPC services' methods: RateLimiter (Check, Owners), Peer (Forward;
// Replicate and Pull are in replicate.go) and Admin (Status), and the pooled
// buffers checks are decided on.

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// checkBuf holds the per-call slices the handler works on; pooled.
type checkBuf struct {
	reqs  []bucket.Request
	outs  []bucket.Outcome
	moved []string // a peer's answer: where each undecided item went
}

func (s *Server) getBuf(n int) *checkBuf {
	b := s.bufs.Get().(*checkBuf)
	if cap(b.reqs) < n {
		b.reqs = make([]bucket.Request, n)
		b.outs = make([]bucket.Outcome, n)
		b.moved = make([]string, n)
	}
	b.reqs, b.outs, b.moved = b.reqs[:n], b.outs[:n], b.moved[:n]
	return b
}

func (s *Server) putBuf(b *checkBuf) {
	clear(b.reqs) // drop references to names, keys, owners and addresses
	clear(b.outs)
	clear(b.moved)
	s.bufs.Put(b)
}

func batchTooLarge(n int) error {
	return status.Errorf(codes.InvalidArgument, "batch has %d requests, more than %d", n, bucket.MaxBatchSize)
}

// decide converts reqs, runs the Handler on pooled slices and returns the
// response. from is "" for a client's check.
func (s *Server) decide(ctx context.Context, reqs []*sluicev1.RateLimitRequest, forwarded bool, from string) *sluicev1.CheckResponse {
	resp := &sluicev1.CheckResponse{}
	resp.Responses, _, _ = s.run(ctx, reqs, forwarded, false, false, from, nil)
	return resp
}

// run is decide's work: the wire answers, and moved (nil unless the
// Handler moved some item, else one address per item, "" for the decided
// ones). pullFrom, for stand-ins, has one address per item or none. With
// leasing (a forward whose sender takes leases) a LeasingHandler decides,
// and leases holds the grants it made.
func (s *Server) run(ctx context.Context, reqs []*sluicev1.RateLimitRequest, forwarded, standIn, leasing bool, from string, pullFrom []string) (resps []*sluicev1.RateLimitResponse, moved []string, leases []*sluicev1.LeaseGrant) {
	n := len(reqs)
	if n == 0 {
		return nil, nil, nil
	}
	b := s.getBuf(n)
	for i, r := range reqs {
		b.reqs[i] = RequestFromProto(r)
	}
	if len(pullFrom) != n {
		pullFrom = nil
	}
	switch {
	case standIn:
		s.cfg.Handler.CheckStandIn(ctx, from, b.reqs, pullFrom, b.outs, b.moved)
	case forwarded && leasing:
		if lh, ok := s.cfg.Handler.(LeasingHandler); ok {
			lh.CheckForwardedLeasing(ctx, from, b.reqs, b.outs, b.moved)
			leases = appendLeases(nil, b.outs)
			break
		}
		s.cfg.Handler.CheckForwarded(ctx, from, b.reqs, b.outs, b.moved)
	case forwarded:
		s.cfg.Handler.CheckForwarded(ctx, from, b.reqs, b.outs, b.moved)
	default:
		s.cfg.Handler.Check(ctx, b.reqs, b.outs)
	}
	resps = AppendResponses(make([]*sluicev1.RateLimitResponse, 0, n), b.outs)
	for i, addr := range b.moved {
		if addr == "" {
			continue
		}
		if moved == nil {
			moved = make([]string, n)
		}
		moved[i] = addr
	}
	s.putBuf(b)
	return resps, moved, leases
}

// appendLeases appends the grants among outs (Outcome.Lease), by index.
func appendLeases(dst []*sluicev1.LeaseGrant, outs []bucket.Outcome) []*sluicev1.LeaseGrant {
	for i := range outs {
		if l := outs[i].Lease; l.TTL > 0 { // Tokens 0: a refusal lease
			dst = append(dst, &sluicev1.LeaseGrant{Index: uint32(i), Tokens: l.Tokens, TtlMicros: l.TTL.Microseconds(), GrantedAt: l.GrantedAt})
		}
	}
	return dst
}

type rateLimiterServer struct {
	sluicev1.UnimplementedRateLimiterServer
	s *Server
}

func (g rateLimiterServer) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	start := time.Now()
	if n := len(req.GetRequests()); n > bucket.MaxBatchSize {
		g.s.observeRefused(APIGRPC, start)
		return nil, batchTooLarge(n)
	}
	resp := g.s.decide(ctx, req.GetRequests(), false, "")
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

type peerServer struct {
	sluicev1.UnimplementedPeerServer
	s *Server
}

// Forward decides forwarded items; moved_to is filled only when some item's
// key has moved to another node, and then has one entry per item.
// It serves a unary call and an envelope on a Forwards stream alike.
func (g peerServer) Forward(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	if err := g.sameCluster("forward", req.GetFrom(), req.GetCluster()); err != nil {
		return nil, err
	}
	if n := len(req.GetRequests()); n > bucket.MaxBatchSize {
		g.s.log.Warn("refused forwarded batch", "from", req.GetFrom(), "requests", n)
		return nil, batchTooLarge(n)
	}
	resp := &sluicev1.ForwardResponse{}
	if pf := req.GetPullFrom(); len(pf) != 0 && len(pf) != len(req.GetRequests()) {
		return nil, status.Errorf(codes.InvalidArgument, "pull_from has %d entries for %d requests", len(pf), len(req.GetRequests()))
	}
	resp.Responses, resp.MovedTo, resp.Leases = g.s.run(ctx, req.GetRequests(), true, req.GetStandIn(), req.GetTakesLeases(), req.GetFrom(), req.GetPullFrom())
	return resp, nil
}

// sameCluster refuses a peer call from another cluster: a node whose
// address another cluster's node once had, or a misconfigured --join.
func (g peerServer) sameCluster(call, from, cluster string) error {
	if cluster == g.s.cfg.ClusterName {
		return nil
	}
	g.s.log.Warn("refused peer call from another cluster", "call", call, "from", from, "cluster", cluster, "this_cluster", g.s.cfg.ClusterName)
	return status.Errorf(codes.FailedPrecondition, "%s from node %q of cluster %q refused: this node is in cluster %q", call, from, cluster, g.s.cfg.ClusterName)
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
