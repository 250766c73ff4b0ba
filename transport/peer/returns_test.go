package peer

// Tests of Peer/Return: lease holders give back unspent leased hits.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// returnsHandler takes back up to 3 hits of each return (hits+1 of a key
// starting with "greedy", which no owner may answer), and records them.
type returnsHandler struct {
	fakeHandler
	mu   sync.Mutex
	from string
	got  []check.LeaseReturn
}

func (h *returnsHandler) ReturnLeases(_ context.Context, from string, rets []check.LeaseReturn, taken []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from = from
	for i, r := range rets {
		h.got = append(h.got, r)
		taken[i] = min(r.Request.Hits, 3)
		if strings.HasPrefix(r.Request.Key, "greedy") {
			taken[i] = r.Request.Hits + 1
		}
	}
}

func (h *returnsHandler) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.got)
}

func TestReturnCarriesLeaseReturns(t *testing.T) {
	t.Parallel()
	h := &returnsHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	rets := []check.LeaseReturn{{Request: req("hot1", 5), GrantedAt: 11}, {Request: req("hot2", 2), GrantedAt: 12}}
	taken, err := pc.Return(testCtx(t), s.GRPCAddr(), rets)
	if err != nil {
		t.Fatal(err)
	}
	if len(taken) != 2 || taken[0] != 3 || taken[1] != 2 {
		t.Fatalf("taken %v, want [3 2]", taken)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.from != "a" || len(h.got) != 2 || h.got[0].GrantedAt != 11 || h.got[1].Request.Key != "hot2" ||
		h.got[0].Request.Hits != 5 || h.got[0].Request.Limit != rets[0].Request.Limit {
		t.Fatalf("the handler saw %q %+v", h.from, h.got)
	}
}

// A malformed return refuses the whole call with a message naming it, and
// nothing is taken back; the server goes on serving.
func TestReturnRefusesMalformedReturns(t *testing.T) {
	t.Parallel()
	h := &returnsHandler{}
	s := startServer(t, h)
	c := rawPeer(t, s.GRPCAddr())
	good := func() *sluicev1.LeaseReturn {
		return &sluicev1.LeaseReturn{Request: RequestToProto(req("hot", 4)), GrantedAt: 9}
	}
	for _, tc := range []struct {
		name string
		edit func(*sluicev1.LeaseReturn)
		want string
	}{
		{"no request", func(m *sluicev1.LeaseReturn) { m.Request = nil }, "no request"},
		{"no hits", func(m *sluicev1.LeaseReturn) { m.Request.Hits = proto.Int64(0) }, "returns 0 hits"},
		{"too many hits", func(m *sluicev1.LeaseReturn) { m.Request.Hits = proto.Int64(MaxReturnHits + 1) }, "returns 1048577 hits"},
		{"no grant id", func(m *sluicev1.LeaseReturn) { m.GrantedAt = 0 }, "granted_at 0"},
		{"no limit", func(m *sluicev1.LeaseReturn) { m.Request.Limit, m.Request.WindowMs = 0, 0 }, "want the one the lease was granted under"},
		{"bad key", func(m *sluicev1.LeaseReturn) { m.Request.Key = "" }, "key"},
	} {
		bad := good()
		tc.edit(bad)
		_, err := c.Return(testCtx(t), &sluicev1.ReturnRequest{From: "x", Returns: []*sluicev1.LeaseReturn{good(), bad}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "return 1") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument naming return 1 and %q", tc.name, err, tc.want)
		}
	}
	if n := h.calls(); n != 0 {
		t.Fatalf("the handler took %d returns from refused calls", n)
	}
	if _, err := c.Return(testCtx(t), &sluicev1.ReturnRequest{From: "x", Returns: []*sluicev1.LeaseReturn{good()}}); err != nil {
		t.Fatalf("a good return after the bad ones: %v", err)
	}
}

// An owner that claims to take back more than was returned is an error
// to the holder; a server whose handler takes no returns says so.
func TestReturnAnswersChecked(t *testing.T) {
	t.Parallel()
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	s := startServer(t, &returnsHandler{})
	if _, err := pc.Return(testCtx(t), s.GRPCAddr(), []check.LeaseReturn{{Request: req("greedy", 2), GrantedAt: 1}}); err == nil ||
		!strings.Contains(err.Error(), "took back 3 of the 2 hits") {
		t.Fatalf("greedy answer: %v", err)
	}
	plain := startServer(t, &fakeHandler{})
	if _, err := pc.Return(testCtx(t), plain.GRPCAddr(), []check.LeaseReturn{{Request: req("hot", 2), GrantedAt: 1}}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("server without returns: %v, want Unimplemented", err)
	}
}
