package peer

import (
	"context"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The server allocates only the response messages: the request and outcome
// slices the Handler works on are pooled.
func TestDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	s := NewServer(ServerConfig{Handler: &fakeHandler{}})
	m := &sluicev1.ForwardRequest{From: "b"}
	for _, r := range keys("k", 100) {
		m.Requests = append(m.Requests, RequestToProto(r))
	}
	ctx := context.Background()
	s.Forward(ctx, m) // warm the pool
	allocs := testing.AllocsPerRun(100, func() { s.Forward(ctx, m) })
	// ForwardResponse, its pointer slice, one array of 100 messages; the
	// fake handler's owner strings (100) and its record of sizes
	// (amortised).
	if allocs > 3+100+1 {
		t.Fatalf("decide of 100 items: %.0f allocations", allocs)
	}
}
