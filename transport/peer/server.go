package peer

// The server side of sluice.v1.Peer: its configuration, Forward (the
// Forwards stream is in forwards_server.go, Replicate and Pull in
// replicate.go, Decided, RegionGrant and Return beside their clients), and
// the pooled buffers forwarded checks are decided on.

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/security"
)

// ServerConfig configures a Server. transport.NewServer fills it from its
// own ServerConfig.
type ServerConfig struct {
	// Handler decides forwarded checks (Forward, Forwards). A Handler that
	// is also a LeasingHandler, DecidedLedger, LeaseReturner or
	// RegionGranter serves those too; without them their calls answer
	// Unimplemented (and forwards get no leases). Required.
	Handler ForwardHandler
	// Peer answers Replicate and Pull; nil answers Unimplemented.
	Peer PeerHandler
	// ClusterName is this node's cluster. Calls that carry another cluster
	// name are refused with FAILED_PRECONDITION and change nothing.
	ClusterName string
	// Guard, when members prove themselves with the gossip key
	// (security.Guard.Proofs), refuses a Forwards envelope without a valid
	// proof of its own, counted and logged like a refused call; nil checks
	// no envelope. The calls themselves, and the openings of streams, are
	// authorized by the grpc.Server's interceptors (transport.Server's).
	Guard *security.Guard
	// Logger receives refusals and recovered panics; nil discards.
	Logger *slog.Logger
	// Draining, closed when the node begins to shut down, ends the
	// Forwards streams (GracefulStop waits for them); nil never does.
	Draining <-chan struct{}
	// Stopping reports whether the node is shutting down: a Forwards
	// envelope that arrives then is answered UNAVAILABLE, undecided. nil
	// means never.
	Stopping func() bool
}

// Server is the server side of sluice.v1.Peer: it validates what other
// nodes send and hands it to the handlers of its ServerConfig.
// transport.NewServer registers one on the node's grpc.Server, behind the
// interceptors that authorize internal calls. Safe for concurrent use.
type Server struct {
	sluicev1.UnimplementedPeerServer
	cfg  ServerConfig
	log  *slog.Logger
	bufs sync.Pool // *checkBuf
}

// NewServer returns a Server for cfg.
func NewServer(cfg ServerConfig) *Server {
	g := &Server{cfg: cfg, log: cfg.Logger}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.bufs.New = func() any { return new(checkBuf) }
	return g
}

// stopping reports whether the node is shutting down (ServerConfig.Stopping).
func (g *Server) stopping() bool { return g.cfg.Stopping != nil && g.cfg.Stopping() }

// checkBuf holds the per-call slices the handler works on; pooled.
type checkBuf struct {
	reqs  []check.Request
	outs  []check.Outcome
	moved []string // a peer's answer: where each undecided item went
}

func (g *Server) getBuf(n int) *checkBuf {
	b := g.bufs.Get().(*checkBuf)
	if cap(b.reqs) < n {
		b.reqs = make([]check.Request, n)
		b.outs = make([]check.Outcome, n)
		b.moved = make([]string, n)
	}
	b.reqs, b.outs, b.moved = b.reqs[:n], b.outs[:n], b.moved[:n]
	return b
}

func (g *Server) putBuf(b *checkBuf) {
	clear(b.reqs) // drop references to names, keys, owners and addresses
	clear(b.outs)
	clear(b.moved)
	g.bufs.Put(b)
}

// BatchTooLarge is the refusal of a call of n checks, more than
// check.MaxBatchSize: of a forward here, of a client's call in package
// transport.
func BatchTooLarge(n int) error {
	return status.Errorf(codes.InvalidArgument, "batch has %d requests, more than %d", n, check.MaxBatchSize)
}

// run converts forwarded reqs, runs the Handler on pooled slices and
// returns the wire answers, and moved (nil unless the Handler moved some
// item, else one address per item, "" for the decided ones). standIn asks
// CheckStandIn; pullFrom, for stand-ins, has one address per item or none.
// With leasing (a forward whose sender takes leases) a LeasingHandler
// decides, and leases holds the grants it made.
func (g *Server) run(ctx context.Context, reqs []*sluicev1.RateLimitRequest, standIn, leasing bool, from string, pullFrom []string) (resps []*sluicev1.RateLimitResponse, moved []string, leases []*sluicev1.LeaseGrant) {
	n := len(reqs)
	if n == 0 {
		return nil, nil, nil
	}
	b := g.getBuf(n)
	for i, r := range reqs {
		b.reqs[i] = RequestFromProto(r)
	}
	if len(pullFrom) != n {
		pullFrom = nil
	}
	switch {
	case standIn:
		g.cfg.Handler.CheckStandIn(ctx, from, b.reqs, pullFrom, b.outs, b.moved)
	case leasing:
		if lh, ok := g.cfg.Handler.(LeasingHandler); ok {
			lh.CheckForwardedLeasing(ctx, from, b.reqs, b.outs, b.moved)
			leases = appendLeases(nil, b.outs)
			break
		}
		g.cfg.Handler.CheckForwarded(ctx, from, b.reqs, b.outs, b.moved)
	default:
		g.cfg.Handler.CheckForwarded(ctx, from, b.reqs, b.outs, b.moved)
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
	g.putBuf(b)
	return resps, moved, leases
}

// appendLeases appends the grants among outs (Outcome.Lease), by index.
func appendLeases(dst []*sluicev1.LeaseGrant, outs []check.Outcome) []*sluicev1.LeaseGrant {
	for i := range outs {
		if l := outs[i].Lease; l.TTL > 0 { // Tokens 0: a refusal lease
			dst = append(dst, &sluicev1.LeaseGrant{Index: uint32(i), Tokens: l.Tokens, TtlMicros: l.TTL.Microseconds(), GrantedAt: l.GrantedAt})
		}
	}
	return dst
}

// Forward decides forwarded items; moved_to is filled only when some item's
// key has moved to another node, and then has one entry per item.
// It serves a unary call and an envelope on a Forwards stream alike.
func (g *Server) Forward(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	if err := g.sameCluster("forward", req.GetFrom(), req.GetCluster()); err != nil {
		return nil, err
	}
	if n := len(req.GetRequests()); n > check.MaxBatchSize {
		g.log.Warn("refused forwarded batch", "from", req.GetFrom(), "requests", n)
		return nil, BatchTooLarge(n)
	}
	resp := &sluicev1.ForwardResponse{}
	if pf := req.GetPullFrom(); len(pf) != 0 && len(pf) != len(req.GetRequests()) {
		return nil, status.Errorf(codes.InvalidArgument, "pull_from has %d entries for %d requests", len(pf), len(req.GetRequests()))
	}
	resp.Responses, resp.MovedTo, resp.Leases = g.run(ctx, req.GetRequests(), req.GetStandIn(), req.GetTakesLeases(), req.GetFrom(), req.GetPullFrom())
	return resp, nil
}

// sameCluster refuses a peer call from another cluster: a node whose
// address another cluster's node once had, or a misconfigured --join.
func (g *Server) sameCluster(call, from, cluster string) error {
	if cluster == g.cfg.ClusterName {
		return nil
	}
	g.log.Warn("refused peer call from another cluster", "call", call, "from", from, "cluster", cluster, "this_cluster", g.cfg.ClusterName)
	return status.Errorf(codes.FailedPrecondition, "%s from node %q of cluster %q refused: this node is in cluster %q", call, from, cluster, g.cfg.ClusterName)
}
