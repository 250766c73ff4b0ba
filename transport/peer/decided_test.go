package peer

// Tests of Peer/Decided: a node that noticed a pause asks which of its
// keys a member decided meanwhile.

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// decidedHandler answers every partition asked with its number as a hash,
// and records what it was asked.
type decidedHandler struct {
	fakeHandler
	mu     sync.Mutex
	from   string
	within time.Duration
	count  int
	parts  []uint32
	calls  int
}

func (h *decidedHandler) Decided(_ context.Context, from string, within time.Duration, count int, parts []uint32) keymove.DecidedAnswer {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	h.from, h.within, h.count, h.parts = from, within, count, slices.Clone(parts)
	hs := make([]uint64, len(parts))
	for i, p := range parts {
		hs[i] = uint64(p) << 32
	}
	return keymove.DecidedAnswer{Hashes: hs, Complete: true, Removed: from == "gone"}
}

func TestDecidedCarriesTheAnswer(t *testing.T) {
	t.Parallel()
	h := &decidedHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	a, err := pc.Decided(testCtx(t), s.GRPCAddr(), 1500*time.Microsecond, 7919, []uint32{3, 7918})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Hashes, []uint64{3 << 32, 7918 << 32}) || !a.Complete || a.Removed {
		t.Fatalf("answer %+v", a)
	}
	h.mu.Lock()
	if h.from != "a" || h.within != 2*time.Millisecond || h.count != 7919 || !slices.Equal(h.parts, []uint32{3, 7918}) {
		t.Errorf("the handler was asked from %q within %v count %d partitions %v; want a, 2ms (rounded up), 7919, [3 7918]",
			h.from, h.within, h.count, h.parts)
	}
	h.mu.Unlock()
	gone := NewPeerClient(PeerConfig{NodeName: "gone", Timeout: time.Minute})
	defer gone.Close()
	if a, err := gone.Decided(testCtx(t), s.GRPCAddr(), time.Second, 10, nil); err != nil || !a.Removed {
		t.Errorf("asked by a member the receiver took out: %+v, %v; want removed", a, err)
	}
	plain := startServer(t, &fakeHandler{})
	if _, err := pc.Decided(testCtx(t), plain.GRPCAddr(), time.Second, 10, nil); status.Code(err) != codes.Unimplemented {
		t.Fatalf("server without a ledger: %v, want Unimplemented", err)
	}
}

// A malformed request is refused with a message saying what is wrong,
// and the handler is not asked; the server goes on answering.
func TestDecidedRefusesMalformedRequests(t *testing.T) {
	t.Parallel()
	h := &decidedHandler{}
	s := startServer(t, h)
	c := rawPeer(t, s.GRPCAddr())
	for _, tc := range []struct {
		name string
		req  *sluicev1.DecidedRequest
		want string
	}{
		{"no span", &sluicev1.DecidedRequest{From: "x", WithinMs: 0, PartitionCount: 10}, "within_ms 0"},
		{"span too long", &sluicev1.DecidedRequest{From: "x", WithinMs: 3_600_001, PartitionCount: 10}, "within_ms 3600001"},
		{"no partitions in the ring", &sluicev1.DecidedRequest{From: "x", WithinMs: 5, PartitionCount: 0}, "partition_count 0"},
		{"partition past the count", &sluicev1.DecidedRequest{From: "x", WithinMs: 5, PartitionCount: 10, Partitions: []uint32{1, 10}}, "partition 10 (index 1)"},
		{"more partitions than the ring", &sluicev1.DecidedRequest{From: "x", WithinMs: 5, PartitionCount: 2, Partitions: []uint32{0, 1, 1}}, "3 partitions of a ring of 2"},
	} {
		_, err := c.Decided(testCtx(t), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument and %q", tc.name, err, tc.want)
		}
	}
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	if calls != 0 {
		t.Fatalf("the handler answered %d refused requests", calls)
	}
	if _, err := c.Decided(testCtx(t), &sluicev1.DecidedRequest{From: "x", WithinMs: 5, PartitionCount: 10, Partitions: []uint32{9}}); err != nil {
		t.Fatalf("a good request after the bad ones: %v", err)
	}
}
