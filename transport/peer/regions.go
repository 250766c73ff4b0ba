package peer

// Peer/RegionGrant: a node of one region asks a global limit's home
// region for slices of it (docs/regions.md).

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// RegionGranter is a ForwardHandler that lends slices of global limits to
// other regions (Peer/RegionGrant). GrantRegion fills ans (len(ans) ==
// len(q.Asks)) and returns its own region's name. Every ask has passed
// validateRegionAsk. Called concurrently.
type RegionGranter interface {
	GrantRegion(ctx context.Context, q *check.RegionQuery, ans []check.RegionAnswer) (region string)
}

// MaxRegionLeaseTTL is the longest a region's slice may last.
const MaxRegionLeaseTTL = 10 * time.Second

// validateRegionAsk checks one RegionAsk as it arrives.
func validateRegionAsk(m *sluicev1.RegionAsk) (check.RegionAsk, error) {
	if m.GetRequest() == nil {
		return check.RegionAsk{}, fmt.Errorf("no request")
	}
	a := check.RegionAsk{Request: RequestFromProto(m.GetRequest()), Return: m.GetReturnHits(), ReturnGrantedAt: m.GetReturnGrantedAt()}
	r := &a.Request
	if err := r.Validate(); err != nil {
		return check.RegionAsk{}, err
	}
	switch {
	case !r.Limit.Global || len(r.More) > 0 || r.Limit.Limit == 0:
		return check.RegionAsk{}, fmt.Errorf("does not name one global limit")
	case r.Hits < 0 || r.Hits > MaxReturnHits:
		return check.RegionAsk{}, fmt.Errorf("asks for %d hits, want 0 to %d", r.Hits, MaxReturnHits)
	case a.Return < 0 || a.Return > MaxReturnHits:
		return check.RegionAsk{}, fmt.Errorf("returns %d hits, want 0 to %d", a.Return, MaxReturnHits)
	case a.Return > 0 && a.ReturnGrantedAt <= 0:
		return check.RegionAsk{}, fmt.Errorf("returns hits of a slice granted at %d, not a grant's id", a.ReturnGrantedAt)
	case r.Hits == 0 && a.Return == 0:
		return check.RegionAsk{}, fmt.Errorf("asks for nothing and returns nothing")
	}
	return a, nil
}

// RegionGrant lends slices of global limits. One malformed ask refuses the
// whole call (InvalidArgument, naming it), and nothing is lent or taken
// back.
func (g *Server) RegionGrant(ctx context.Context, req *sluicev1.RegionGrantRequest) (*sluicev1.RegionGrantResponse, error) {
	h, ok := g.cfg.Handler.(RegionGranter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "region grants are not served here")
	}
	from, ms := req.GetFrom(), req.GetAsks()
	if err := g.sameCluster("region grant", from, req.GetCluster()); err != nil {
		return nil, err
	}
	if req.GetRegion() == "" || req.GetToRegion() == "" {
		return nil, status.Error(codes.InvalidArgument, "region grant: region and to_region are required")
	}
	if len(ms) > MaxCounters {
		g.log.Warn("refused region grant", "from", from, "asks", len(ms))
		return nil, tooManyCounters(len(ms))
	}
	q := &check.RegionQuery{From: from, Region: req.GetRegion(), ToRegion: req.GetToRegion(), Routed: req.GetRouted(), Asks: make([]check.RegionAsk, len(ms))}
	for i, m := range ms {
		a, err := validateRegionAsk(m)
		if err != nil {
			g.log.Warn("refused region grant", "from", from, "region", q.Region, "index", i, "reason", err)
			return nil, status.Errorf(codes.InvalidArgument, "ask %d: %v", i, err)
		}
		q.Asks[i] = a
	}
	ans := make([]check.RegionAnswer, len(q.Asks))
	region := h.GrantRegion(ctx, q, ans)
	resp := &sluicev1.RegionGrantResponse{Region: region, Taken: make([]int64, len(ans))}
	for i, a := range ans {
		resp.Taken[i] = a.Taken
		if l := a.Lease; l.TTL > 0 {
			resp.Grants = append(resp.Grants, &sluicev1.LeaseGrant{Index: uint32(i), Tokens: l.Tokens, TtlMicros: l.TTL.Microseconds(), GrantedAt: l.GrantedAt})
		}
	}
	return resp, nil
}

// RegionGrant sends q to the node at addr (Peer/RegionGrant) and fills
// ans (len(ans) == len(q.Asks)); it returns the answering node's region.
// At most MaxCounters asks go in one call; the call ends by ctx's
// deadline, or Timeout when ctx has none. A malformed answer — a grant
// out of bounds or for no ask, two for one ask, more taken back than
// returned — is an error and ans is left as it was.
func (pc *PeerClient) RegionGrant(ctx context.Context, addr string, q *check.RegionQuery, ans []check.RegionAnswer) (string, error) {
	if len(ans) != len(q.Asks) {
		return "", fmt.Errorf("transport: region grant: %d asks but %d answers", len(q.Asks), len(ans))
	}
	if len(q.Asks) > MaxCounters {
		return "", fmt.Errorf("transport: region grant: %d asks, at most %d in one call", len(q.Asks), MaxCounters)
	}
	p, err := pc.peer(addr)
	if err != nil {
		return "", err
	}
	ctx, cancel := bulkDeadline(ctx, pc.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	req := &sluicev1.RegionGrantRequest{From: q.From, Cluster: pc.cluster, Region: q.Region, ToRegion: q.ToRegion, Routed: q.Routed,
		Asks: make([]*sluicev1.RegionAsk, len(q.Asks))}
	if req.From == "" {
		req.From = pc.name
	}
	for i, a := range q.Asks {
		req.Asks[i] = &sluicev1.RegionAsk{Request: RequestToProto(a.Request), ReturnHits: a.Return, ReturnGrantedAt: a.ReturnGrantedAt}
	}
	resp, err := p.client.RegionGrant(ctx, req)
	if err != nil {
		return "", fmt.Errorf("transport: region grant of %d keys to %s: %w", len(q.Asks), addr, callerErr(ctx, dl, err))
	}
	got, err := decodeRegionGrant(resp, q.Asks)
	if err != nil {
		return "", fmt.Errorf("transport: region grant from %s: %w", addr, err)
	}
	copy(ans, got)
	return resp.GetRegion(), nil
}

// decodeRegionGrant checks a RegionGrant answer against the asks.
func decodeRegionGrant(resp *sluicev1.RegionGrantResponse, asks []check.RegionAsk) ([]check.RegionAnswer, error) {
	n := len(asks)
	taken := resp.GetTaken()
	if len(taken) != n {
		return nil, fmt.Errorf("%d taken entries for %d asks", len(taken), n)
	}
	if resp.GetRegion() == "" {
		return nil, fmt.Errorf("no region named")
	}
	got := make([]check.RegionAnswer, n)
	for i, t := range taken {
		if t < 0 || t > asks[i].Return {
			return nil, fmt.Errorf("took back %d of the %d hits returned by ask %d", t, asks[i].Return, i)
		}
		got[i].Taken = t
	}
	for _, l := range resp.GetGrants() {
		i := l.GetIndex()
		switch {
		case i >= uint32(n):
			return nil, fmt.Errorf("a grant for ask %d of %d", i, n)
		case got[i].Lease.TTL > 0:
			return nil, fmt.Errorf("two grants for ask %d", i)
		case l.GetTokens() < 0 || l.GetTokens() > asks[i].Request.Hits || l.GetGrantedAt() <= 0 ||
			l.GetTtlMicros() <= 0 || l.GetTtlMicros() > MaxRegionLeaseTTL.Microseconds():
			return nil, fmt.Errorf("a grant of %d hits (of %d asked) for %d µs, granted at %d, for ask %d",
				l.GetTokens(), asks[i].Request.Hits, l.GetTtlMicros(), l.GetGrantedAt(), i)
		}
		got[i].Lease = check.Lease{Tokens: l.GetTokens(), TTL: time.Duration(l.GetTtlMicros()) * time.Microsecond, GrantedAt: l.GetGrantedAt()}
	}
	return got, nil
}
