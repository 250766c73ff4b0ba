package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// answeringPeers answers every forward at once, as an owner that decided
// everything; the other methods reach nobody.
type answeringPeers struct{ NoPeers }

func (answeringPeers) Forward(_ context.Context, _ string, _ []check.Request, out []check.Outcome, movedTo []string) error {
	for i := range out {
		out[i] = check.Outcome{Owner: "b", Decision: bucket.Decision{Status: bucket.UnderLimit}}
		movedTo[i] = ""
	}
	return nil
}

// BenchmarkForwardPath is this node's own work for a single check whose key
// another node owns: grouping by owner, the sub-request with the resolved
// limits, the forward's deadline, the counters; the peer answers at once,
// so the transport's cost is not in it (transport's BenchmarkClusterShape
// has that).
//
// With a caller's deadline sooner than ForwardTimeout the forward makes no
// timer of its own.
func BenchmarkForwardPath(b *testing.B) {
	b.Run("ctx=background", func(b *testing.B) { benchForwardPath(b, 0) })
	b.Run("ctx=deadline-100ms", func(b *testing.B) { benchForwardPath(b, 100*time.Millisecond) })
}

func benchForwardPath(b *testing.B, deadline time.Duration) {
	n, err := New(NodeConfig(b, "a", "a:1"), answeringPeers{})
	if err != nil {
		b.Fatal(err)
	}
	reqs := []check.Request{{Name: "api", Key: "user:1", Hits: 1, Limit: bucket.Limit{Limit: 1 << 40, WindowMS: 60_000}}}
	out := make([]check.Outcome, 1)
	owner := ring.Member{Name: "b", Addr: "b:1"}
	h := ring.Hash(reqs[0].Name, reqs[0].Key)
	ctx := context.Background()
	if deadline > 0 {
		c, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		ctx = c
	}
	b.ReportAllocs()
	for b.Loop() {
		remote := []routed{{i: 0, hash: h, lims: limits{one: &reqs[0].Limit}, owner: owner}}
		n.forward(ctx, reqs, out, remote, 0)
		if !out[0].Allowed() {
			b.Fatalf("forward answered %+v", out[0])
		}
	}
}
