package test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyRules is an envoyproxy/ratelimit config, as its users write them.
// Hour units, so that a test never crosses a window's edge in practice.
const envoyRules = `# envoyproxy/ratelimit's format
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 4
  - key: path
    value: "/static/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: "/shared/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: remote_address
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: user
        value: admin
        rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// writeAtomic replaces path's content with data the way editors and
// ConfigMaps do.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// rlsClient is a client of Envoy's rate limit service built on
// go-control-plane's generated stubs, as Envoy's own filter calls it.
func rlsClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func envoyDesc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s, %v): %v", domain, ds, err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

const (
	rlsOK   = rlsv3.RateLimitResponse_OK
	rlsOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestEnvoyRateLimitServiceOnACluster drives three `sluice serve` processes
// with Envoy's rate limit protocol and an envoyproxy/ratelimit config, in a
// rules directory that holds a Sluice rules file too.
// Long on purpose: one cluster for all its subtests, each of which reads alone.
func TestEnvoyRateLimitServiceOnACluster(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	envoyPath := filepath.Join(dir, "envoy.yaml")
	writeAtomic(t, envoyPath, envoyRules)
	writeAtomic(t, filepath.Join(dir, "native.yaml"), "rules:\n  - name: login\n    limits: [{limit: 1, window: 1h}]\n")
	ps := make([]*proc, 3)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", 40+i))
		ps[i].extra = []string{"--rules", dir, "--rules-interval", "50ms"}
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)
	cs := make([]rlsv3.RateLimitServiceClient, len(ps))
	for i, p := range ps {
		cs[i] = rlsClient(t, p.grpc)
	}

	t.Run("each descriptor exhausted exactly at its limit, across nodes", func(t *testing.T) {
		for i := range 6 {
			resp := shouldRateLimit(t, cs[i%3], "edge", envoyDesc("api_key", "k1"), envoyDesc("api_key", "k2"))
			st := resp.Statuses[0]
			want, rem := rlsOK, uint32(3-i)
			if i >= 4 {
				want, rem = rlsOver, 0
			}
			if st.Code != want || st.LimitRemaining != rem || resp.OverallCode != want {
				t.Fatalf("call %d through node %d: %v remaining %d (overall %v), want %v remaining %d", i, i%3, st.Code, st.LimitRemaining, resp.OverallCode, want, rem)
			}
			if cl := st.CurrentLimit; cl.GetRequestsPerUnit() != 4 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
				t.Fatalf("current_limit %v", cl)
			}
			if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Hour {
				t.Fatalf("duration_until_reset %v", d)
			}
			// The same rule, another value: its own counter, which the six
			// calls use up to 4 as well.
			if k2 := resp.Statuses[1]; k2.Code != want {
				t.Fatalf("call %d: api_key=k2 answered %v", i, k2.Code)
			}
		}
	})

	t.Run("wildcard, per value and shared", func(t *testing.T) {
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsOK, rlsOK, rlsOver} {
			if got := shouldRateLimit(t, cs[i%3], "edge", envoyDesc("path", "/static/a")).OverallCode; got != want {
				t.Fatalf("/static/a call %d: %v, want %v", i, got, want)
			}
		}
		if got := shouldRateLimit(t, cs[0], "edge", envoyDesc("path", "/static/b")).OverallCode; got != rlsOK {
			t.Fatalf("/static/b has its own counter, answered %v", got)
		}
		// share_threshold: every value under /shared/ counts in one counter.
		for i, p := range []string{"/shared/a", "/shared/b", "/shared/c", "/shared/d"} {
			want := rlsOK
			if i == 3 {
				want = rlsOver
			}
			if got := shouldRateLimit(t, cs[(i+1)%3], "edge", envoyDesc("path", p)).OverallCode; got != want {
				t.Fatalf("%s: %v, want %v", p, got, want)
			}
		}
		if got := shouldRateLimit(t, cs[0], "edge", envoyDesc("path", "/other")).Statuses[0]; got.Code != rlsOK || got.CurrentLimit != nil {
			t.Fatalf("a path no pattern matches: %v", got)
		}
	})

	t.Run("nested and unlimited", func(t *testing.T) {
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsOK, rlsOK, rlsOver} {
			if got := shouldRateLimit(t, cs[(i+2)%3], "edge", envoyDesc("remote_address", "10.0.0.1", "user", "bob")).OverallCode; got != want {
				t.Fatalf("nested call %d: %v, want %v", i, got, want)
			}
		}
		for i := range 5 {
			st := shouldRateLimit(t, cs[i%3], "edge", envoyDesc("remote_address", "10.0.0.1", "user", "admin")).Statuses[0]
			if st.Code != rlsOK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
				t.Fatalf("unlimited call %d: %v", i, st)
			}
		}
		// One entry where the rule is at depth 2: no limit.
		if st := shouldRateLimit(t, cs[1], "edge", envoyDesc("remote_address", "10.0.0.1")).Statuses[0]; st.CurrentLimit != nil {
			t.Fatalf("depth 1: %v", st)
		}
	})

	t.Run("shadow mode answers OK and counts as over", func(t *testing.T) {
		before := metric(t, ps[2], "sluice_envoy_shadow_over_limit_total")
		for i := range 3 {
			resp := shouldRateLimit(t, cs[2], "edge", envoyDesc("shadow", "s"))
			if resp.OverallCode != rlsOK || resp.Statuses[0].Code != rlsOK {
				t.Fatalf("shadow call %d: %v", i, resp)
			}
		}
		if got := metric(t, ps[2], "sluice_envoy_shadow_over_limit_total") - before; got != 2 {
			t.Fatalf("shadow over-limit metric rose by %v, want 2", got)
		}
	})

	t.Run("unknown domain and invalid requests", func(t *testing.T) {
		resp := shouldRateLimit(t, cs[0], "nobody", envoyDesc("api_key", "k1"))
		if resp.OverallCode != rlsOK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain: %v", resp)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, req := range []*rlsv3.RateLimitRequest{
			{Descriptors: []*rlcommon.RateLimitDescriptor{envoyDesc("api_key", "k1")}},
			{Domain: "edge"},
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{}}},
		} {
			if _, err := cs[1].ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: %v, want InvalidArgument", req, err)
			}
		}
	})

	// A peek (descriptor hits_addend 0) shows the limit in force without
	// counting.
	limitOf := func(c rlsv3.RateLimitServiceClient, key string) uint32 {
		d := envoyDesc("api_key", key)
		d.HitsAddend = wrapperspb.UInt64(0)
		return shouldRateLimit(t, c, "edge", d).Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}

	t.Run("a bad envoy-format file is refused whole", func(t *testing.T) {
		// The first descriptor is fine, the last is not: nothing of it applies.
		bad := strings.Replace(envoyRules, "requests_per_unit: 4", "requests_per_unit: 50", 1) +
			"  - key: broken\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
		failures := make([]float64, len(ps))
		for i, p := range ps {
			failures[i] = metric(t, p, "sluice_rules_reload_failures_total")
		}
		writeAtomic(t, envoyPath, bad)
		waitFor(t, 10*time.Second, "every node refuses the bad file", func() bool {
			for i, p := range ps {
				if metric(t, p, "sluice_rules_reload_failures_total") <= failures[i] {
					return false
				}
			}
			return true
		})
		for i, c := range cs {
			if got := limitOf(c, "k9"); got != 4 {
				t.Fatalf("node %d: limit %d after a refused file, want the old 4", i, got)
			}
		}
		if got := shouldRateLimit(t, cs[0], "edge", envoyDesc("api_key", "k1")).OverallCode; got != rlsOver {
			t.Fatalf("k1 after a refused file: %v, want still over", got)
		}
	})

	t.Run("reload of an envoy-format file", func(t *testing.T) {
		writeAtomic(t, envoyPath, strings.Replace(envoyRules, "requests_per_unit: 4", "requests_per_unit: 6", 1))
		waitFor(t, 10*time.Second, "every node has the new limit", func() bool {
			for _, c := range cs {
				if limitOf(c, "k9") != 6 {
					return false
				}
			}
			return true
		})
		// k1 used 4 (refused hits count, as envoyproxy/ratelimit counts them:
		// 7 calls in all, the counter saturates at the old limit of 4); the
		// new limit of 6 admits 2 more.
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsOK, rlsOK, rlsOver} {
			if got := shouldRateLimit(t, cs[i%3], "edge", envoyDesc("api_key", "k1")).OverallCode; got != want {
				t.Fatalf("k1 after reload, call %d: %v, want %v", i, got, want)
			}
		}
	})
}
