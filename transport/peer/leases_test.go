package peer

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

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster/check"
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

func (h *leasingHandler) CheckForwardedLeasing(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	h.mu.Lock()
	h.leasing++
	h.mu.Unlock()
	h.fakeHandler.CheckForwarded(ctx, from, reqs, out, movedTo)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "hot") {
			out[i].Lease = check.Lease{Tokens: 5, TTL: 50 * time.Millisecond, GrantedAt: 77}
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
		reqs := []check.Request{req("cold1", 1), req("hot1", 1), req("cold2", 1), req("hot2", 1)}
		out := make([]check.Outcome, len(reqs))
		moved := make([]string, len(reqs))
		if err := pc.Forward(testCtx(t), s.GRPCAddr(), reqs, out, moved); err != nil {
			t.Fatalf("unary %v: %v", unary, err)
		}
		for i, o := range out {
			want := check.Lease{}
			if strings.HasPrefix(reqs[i].Key, "hot") {
				want = check.Lease{Tokens: 5, TTL: 50 * time.Millisecond, GrantedAt: 77}
			}
			if o.Lease != want || !o.Allowed() {
				t.Errorf("unary %v, item %d (%s): %+v, want lease %+v", unary, i, reqs[i].Key, o, want)
			}
		}
		if h.leasing == 0 {
			t.Errorf("unary %v: the server did not take the leasing path for a sender that takes leases", unary)
		}
		// A public check never carries a lease, nor takes the leasing path:
		// TestPublicCheckTakesNoLease in package transport.
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

// FuzzForwardResponse gives checkMoved and fill a Forward answer decoded
// from random bytes, as a peer could send it, for a call of n items at
// offset off in a batch: no panic; an answer checkMoved accepts has at
// most one lease per item, each naming an item of the batch with tokens
// ≥ 0, a positive lifetime and a grant id ≥ 0; fill hands the call exactly
// the leases of its items, grant ids included; a refused one says why.
func FuzzForwardResponse(f *testing.F) {
	good := &sluicev1.ForwardResponse{
		Responses: []*sluicev1.RateLimitResponse{{Status: sluicev1.Status_STATUS_UNDER_LIMIT}, {Status: sluicev1.Status_STATUS_OVER_LIMIT}, {}},
		Leases:    []*sluicev1.LeaseGrant{{Index: 0, Tokens: 4, TtlMicros: 100_000}, {Index: 1, Tokens: 0, TtlMicros: 5_000}},
	}
	b, err := proto.Marshal(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, uint8(3), uint8(1))
	f.Add([]byte{0x1a, 0x04, 0x08, 0x09, 0x10, 0x01}, uint8(3), uint8(0)) // a lease for item 9
	f.Fuzz(func(t *testing.T, data []byte, n8, off8 uint8) {
		var resp sluicev1.ForwardResponse
		if proto.Unmarshal(data, &resp) != nil {
			return
		}
		n := int(n8%16) + 1
		if err := checkMoved(&resp, n); err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a message")
			}
			return
		}
		seen := map[uint32]bool{}
		for _, l := range resp.Leases {
			if int(l.Index) >= n || seen[l.Index] || l.Tokens < 0 || l.TtlMicros <= 0 || l.GrantedAt < 0 {
				t.Fatalf("accepted lease %v for %d items", l, n)
			}
			seen[l.Index] = true
		}
		if len(resp.Responses) != n {
			return
		}
		off := int(off8) % n
		m := n - off
		c := &call{ptrs: make([]*sluicev1.RateLimitRequest, m), out: make([]check.Outcome, m), moved: make([]string, m)}
		var moved []string
		if len(resp.MovedTo) != 0 {
			moved = resp.MovedTo[off:]
		}
		if err := fill(c, resp.Responses[off:], moved, resp.Leases, off); err != nil {
			t.Fatalf("fill of an accepted answer: %v", err)
		}
		for i, o := range c.out {
			var want check.Lease
			for _, l := range resp.Leases {
				if int(l.Index) == off+i {
					want = check.Lease{Tokens: l.Tokens, TTL: time.Duration(l.TtlMicros) * time.Microsecond, GrantedAt: l.GrantedAt}
				}
			}
			if o.Lease != want {
				t.Fatalf("item %d (batch item %d): lease %+v, want %+v", i, off+i, o.Lease, want)
			}
		}
	})
}
