package transport

// Tests of quota leases on the wire (docs/leases.md): a LeasingHandler's
// grants travel in ForwardResponse.leases to the sender that takes them,
// on the stream, on unary calls and in queued batches, and a malformed
// lease fails the forward.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// leasingHandler grants a lease of 5 hits for 50 ms on every forwarded
// item whose key starts with "hot", and records whether the leasing path
// was taken.
type leasingHandler struct {
	fakeHandler
	mu      sync.Mutex
	leasing int
}

func (h *leasingHandler) CheckForwardedLeasing(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome, movedTo []string) {
	h.mu.Lock()
	h.leasing++
	h.mu.Unlock()
	h.fakeHandler.CheckForwarded(ctx, from, reqs, out, movedTo)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "hot") {
			out[i].Lease = bucket.Lease{Tokens: 5, TTL: 50 * time.Millisecond}
		}
	}
}

func TestForwardCarriesLeases(t *testing.T) {
	t.Parallel()
	for _, unary := range []bool{false, true} {
		h := &leasingHandler{}
		s := startServer(t, h)
		pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute, UnaryForwards: unary})
		defer pc.Close()
		reqs := []bucket.Request{req("cold1", 1), req("hot1", 1), req("cold2", 1), req("hot2", 1)}
		out := make([]bucket.Outcome, len(reqs))
		moved := make([]string, len(reqs))
		if err := pc.Forward(testCtx(t), s.GRPCAddr(), reqs, out, moved); err != nil {
			t.Fatalf("unary %v: %v", unary, err)
		}
		for i, o := range out {
			want := bucket.Lease{}
			if strings.HasPrefix(reqs[i].Key, "hot") {
				want = bucket.Lease{Tokens: 5, TTL: 50 * time.Millisecond}
			}
			if o.Lease != want || !o.Allowed() {
				t.Errorf("unary %v, item %d (%s): %+v, want lease %+v", unary, i, reqs[i].Key, o, want)
			}
		}
		if h.leasing == 0 {
			t.Errorf("unary %v: the server did not take the leasing path for a sender that takes leases", unary)
		}
		// A public check never carries a lease, nor takes the leasing path.
		before := h.leasing
		c := dial(t, s.GRPCAddr())
		resp, err := c.Check(testCtx(t), &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{RequestToProto(req("hot3", 1))}})
		if err != nil || len(resp.Responses) != 1 || h.leasing != before {
			t.Fatalf("public check: %v, %v, leasing calls %d → %d", resp, err, before, h.leasing)
		}
	}
}

// A sender that does not say it takes leases (an older node) gets none:
// the server never calls the leasing path for it.
func TestForwardWithoutTakesLeasesGetsNone(t *testing.T) {
	t.Parallel()
	h := &leasingHandler{}
	s := startServer(t, h)
	c := sluicev1.NewPeerClient(dial(t, s.GRPCAddr()).Conn())
	resp, err := c.Forward(testCtx(t), &sluicev1.ForwardRequest{From: "old", Requests: []*sluicev1.RateLimitRequest{RequestToProto(req("hot1", 1))}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 0 || h.leasing != 0 {
		t.Fatalf("leases %v, leasing calls %d: want none", resp.Leases, h.leasing)
	}
}

func TestCheckMovedRefusesBadLeases(t *testing.T) {
	t.Parallel()
	lease := func(i uint32, tokens, ttl int64) *sluicev1.LeaseGrant {
		return &sluicev1.LeaseGrant{Index: i, Tokens: tokens, TtlMicros: ttl}
	}
	for _, c := range []struct {
		leases []*sluicev1.LeaseGrant
		want   string // "" accepted
	}{
		{nil, ""},
		{[]*sluicev1.LeaseGrant{lease(0, 5, 1000), lease(2, 1, 1)}, ""},
		{[]*sluicev1.LeaseGrant{lease(3, 5, 1000)}, "lease for item 3 of 3"},
		{[]*sluicev1.LeaseGrant{lease(1, 0, 1000)}, ""}, // a refusal lease
		{[]*sluicev1.LeaseGrant{lease(1, -4, 1000)}, "lease of -4 tokens"},
		{[]*sluicev1.LeaseGrant{lease(1, 4, 0)}, "for 0 µs"},
		{[]*sluicev1.LeaseGrant{lease(1, 4, 10), lease(1, 4, 10)}, "two leases for item 1"},
		{[]*sluicev1.LeaseGrant{lease(0, 1, 1), lease(1, 1, 1), lease(2, 1, 1), lease(0, 1, 1)}, "4 leases for 3 requests"},
	} {
		err := checkMoved(&sluicev1.ForwardResponse{Leases: c.leases}, 3)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: refused: %v", c.leases, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: error %v, want one saying %q", c.leases, err, c.want)
		}
	}
}
