package transport

import (
	"context"
	"strconv"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/transport/rules"
)

// oneRule gives every descriptor of every domain one rule: the lookup
// costs next to nothing, so the benchmark measures the service.
type oneRule struct{}

func (oneRule) MatchEnvoy(string, []rules.EnvoyEntry) EnvoyMatch {
	return EnvoyMatch{Known: true, Name: "envoy:d", Found: true, Rule: perHour(10)}
}

// BenchmarkEnvoyVsCheck is ShouldRateLimit with n descriptors beside Check
// with n items, one call at a time over loopback gRPC, client and server in
// one process, the handler allowing everything (trivialHandler): the
// transport's cost of a descriptor against a native check's.
func BenchmarkEnvoyVsCheck(b *testing.B) {
	for _, n := range []int{1, 5} {
		b.Run("ShouldRateLimit/descriptors="+strconv.Itoa(n), func(b *testing.B) {
			s := startServer(b, &trivialHandler{}, func(c *ServerConfig) { c.Envoy.Rules = oneRule{} })
			cli := rlsv3.NewRateLimitServiceClient(dial(b, s.GRPCAddr()).Conn())
			req := &rlsv3.RateLimitRequest{Domain: "d"}
			for i := range n {
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{
					{Key: "remote_address", Value: "10.0.0." + strconv.Itoa(i)}}})
			}
			ctx := context.Background()
			if _, err := cli.ShouldRateLimit(ctx, req); err != nil { // connect
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			done := cpuMeter(b)
			for b.Loop() {
				resp, err := cli.ShouldRateLimit(ctx, req)
				if err != nil || len(resp.Statuses) != n {
					b.Fatal(err)
				}
			}
			done()
		})
		b.Run("Check/items="+strconv.Itoa(n), func(b *testing.B) { benchCheck(b, n, nil) })
	}
}
