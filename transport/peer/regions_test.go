package peer

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// regionHandler lends half of each ask for 300 ms and takes back every
// returned hit; key "liar" gets twice what it asked.
type regionHandler struct {
	fakeHandler
	got *check.RegionQuery
}

func (h *regionHandler) GrantRegion(_ context.Context, q *check.RegionQuery, ans []check.RegionAnswer) string {
	h.got = q
	for i, a := range q.Asks {
		ans[i].Taken = a.Return
		if a.Request.Hits > 0 {
			ans[i].Lease = check.Lease{Tokens: a.Request.Hits / 2, TTL: 300 * time.Millisecond, GrantedAt: 42}
			if a.Request.Key == "liar" {
				ans[i].Lease.Tokens = 2 * a.Request.Hits
			}
		}
	}
	return "home"
}

func globalReq(k string, hits int64) check.Request {
	r := req(k, hits)
	r.Limit.Global = true
	return r
}

func TestRegionGrantRoundTrip(t *testing.T) {
	t.Parallel()
	h := &regionHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b0", Timeout: time.Minute})
	defer pc.Close()
	q := &check.RegionQuery{Region: "away", ToRegion: "home", Asks: []check.RegionAsk{
		{Request: globalReq("k1", 10)}, {Request: globalReq("k2", 0), Return: 3, ReturnGrantedAt: 7}}}
	ans := make([]check.RegionAnswer, 2)
	region, err := pc.RegionGrant(testCtx(t), s.GRPCAddr(), q, ans)
	if err != nil || region != "home" {
		t.Fatalf("%q, %v", region, err)
	}
	if ans[0].Lease != (check.Lease{Tokens: 5, TTL: 300 * time.Millisecond, GrantedAt: 42}) || ans[1].Taken != 3 || ans[1].Lease.TTL != 0 {
		t.Fatalf("answers %+v", ans)
	}
	if g := h.got; g.From != "b0" || g.Region != "away" || g.Routed || !g.Asks[0].Request.Limit.Global || g.Asks[1].ReturnGrantedAt != 7 {
		t.Fatalf("the handler saw %+v", g)
	}
	// A grant of more than was asked is an error, and fills nothing.
	bad := make([]check.RegionAnswer, 1)
	if _, err := pc.RegionGrant(testCtx(t), s.GRPCAddr(), &check.RegionQuery{Region: "away", ToRegion: "home",
		Asks: []check.RegionAsk{{Request: globalReq("liar", 4)}}}, bad); err == nil || !strings.Contains(err.Error(), "8 hits (of 4 asked)") || bad[0].Lease.TTL != 0 {
		t.Fatalf("a grant of 8 for 4 asked: %v, %+v", err, bad)
	}
}

func TestRegionGrantRefusesMalformedAsks(t *testing.T) {
	t.Parallel()
	h := &regionHandler{}
	s := startServer(t, h)
	c := rawPeer(t, s.GRPCAddr())
	good := func() *sluicev1.RegionAsk {
		return &sluicev1.RegionAsk{Request: RequestToProto(globalReq("k", 4))}
	}
	for _, tc := range []struct {
		name string
		edit func(*sluicev1.RegionAsk)
		want string
	}{
		{"no request", func(m *sluicev1.RegionAsk) { m.Request = nil }, "no request"},
		{"not global", func(m *sluicev1.RegionAsk) { m.Request.Global = false }, "global"},
		{"too many hits", func(m *sluicev1.RegionAsk) { m.Request.Hits = proto.Int64(MaxReturnHits + 1) }, "asks for 1048577 hits"},
		{"negative return", func(m *sluicev1.RegionAsk) { m.ReturnHits = -1 }, "returns -1 hits"},
		{"return without id", func(m *sluicev1.RegionAsk) { m.ReturnHits = 2 }, "not a grant's id"},
		{"nothing", func(m *sluicev1.RegionAsk) { m.Request.Hits = proto.Int64(0) }, "asks for nothing"},
		{"global sliding log", func(m *sluicev1.RegionAsk) { m.Request.Algorithm = sluicev1.Algorithm_ALGORITHM_SLIDING_LOG }, "a global limit must be"},
	} {
		bad := good()
		tc.edit(bad)
		_, err := c.RegionGrant(testCtx(t), &sluicev1.RegionGrantRequest{From: "x", Region: "away", ToRegion: "home", Asks: []*sluicev1.RegionAsk{good(), bad}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ask 1") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument naming ask 1 and %q", tc.name, err, tc.want)
		}
	}
	if _, err := c.RegionGrant(testCtx(t), &sluicev1.RegionGrantRequest{From: "x", Asks: []*sluicev1.RegionAsk{good()}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no regions named: %v", err)
	}
	if h.got != nil {
		t.Fatalf("a refused call reached the handler: %+v", h.got)
	}
}
