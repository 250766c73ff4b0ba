package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/rules"
)

const nativeRules = `rules:
  - name: login
    limits:
      - {limit: 2, window: 1m}
`

const envoyRulesFile = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 1
`

// writeRules writes a rules directory with a native and an envoy-format file.
func writeRules(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{"native.yaml": nativeRules, "envoy.yaml": envoyRulesFile} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestObserverAllocatesNothing: what a check costs in metrics, once a
// peer's or a rule's handles exist, is a few atomic adds: no allocation.
// Not parallel: AllocsPerRun refuses to run beside other tests.
func TestObserverAllocatesNothing(t *testing.T) {
	w, err := rules.NewWatcher(writeRules(t), nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	m := newNodeMetrics(w)
	start := time.Now()
	run := func() {
		m.ObserveCall(transport.APIGRPC, transport.Counts{transport.ResultUnder: 1}, 90*time.Microsecond)
		m.ObserveCall(transport.APIHTTP, transport.Counts{1, 2, 3}, 3*time.Millisecond)
		m.ObserveRule("login", transport.ResultOver)
		m.ObserveRule("no-such-rule", transport.ResultError)
		m.ObserveEnvoyRule("edge", "edge.remote_address", transport.ResultUnder)
		m.peers.observe(rpcForward, "127.0.0.1:8081", start, nil)
		m.peers.observe(rpcPull, "127.0.0.1:8081", start, errors.New("down"))
		m.observeFlush(100, 2*time.Millisecond, nil)
	}
	run() // the first sight of the peer and the rules resolves their handles
	if a := testing.AllocsPerRun(1000, run); a != 0 {
		t.Fatalf("observing a call allocates %v times, want 0", a)
	}
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "sluice_rule_checks_total" {
			for _, mt := range f.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "name" && l.GetValue() != "login" {
						t.Errorf("sluice_rule_checks_total has a series for %q, which is no rule", l.GetValue())
					}
				}
			}
		}
	}
}

// TestCheckDurationIsANativeHistogramToo: the registry exposes the check
// latency with native buckets beside the classic ones.
func TestCheckDurationIsANativeHistogramToo(t *testing.T) {
	t.Parallel()
	m := newNodeMetrics(nil)
	for _, d := range []time.Duration{40 * time.Microsecond, 300 * time.Microsecond, 20 * time.Millisecond} {
		m.ObserveCall(transport.APIEnvoy, transport.Counts{transport.ResultUnder: 1}, d)
	}
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sluice_check_duration_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			if mt.GetLabel()[0].GetValue() != "envoy" {
				continue
			}
			h := mt.GetHistogram()
			if h.GetSampleCount() != 3 || len(h.GetBucket()) != len(latencyBuckets) {
				t.Fatalf("classic part: %d samples, %d buckets; want 3 and %d", h.GetSampleCount(), len(h.GetBucket()), len(latencyBuckets))
			}
			if h.GetSchema() != 3 || len(h.GetPositiveSpan()) == 0 {
				t.Fatalf("native part: schema %d, %d spans; want schema 3 (factor 1.1) and spans", h.GetSchema(), len(h.GetPositiveSpan()))
			}
			return
		}
	}
	t.Fatal("no sluice_check_duration_seconds{api=\"envoy\"}")
}

// TestPeerSeriesFollowTheMembers: the series of an address no member has
// any more are dropped; those of members stay.
func TestPeerSeriesFollowTheMembers(t *testing.T) {
	t.Parallel()
	p := newPeerMetrics()
	for _, addr := range []string{"10.0.0.1:8081", "10.0.0.2:8081"} {
		p.observe(rpcReplicate, addr, time.Now(), nil)
	}
	if n := testutil.CollectAndCount(p.dur); n != 2*int(numPeerRPCs) {
		t.Fatalf("%d duration series for 2 peers, want %d", n, 2*numPeerRPCs)
	}
	p.prune(map[string]bool{"10.0.0.2:8081": true})
	if _, ok := (*p.byAddr.Load())["10.0.0.1:8081"]; ok {
		t.Fatal("the departed address keeps its handles")
	}
	if n := testutil.CollectAndCount(p.dur); n != int(numPeerRPCs) {
		t.Fatalf("%d duration series after one peer left, want %d", n, numPeerRPCs)
	}
	if _, ok := (*p.byAddr.Load())["10.0.0.2:8081"]; !ok {
		t.Fatal("the member lost its handles")
	}
}

// servedNode is `sluice serve` running in this process.
type servedNode struct {
	grpc, http, gossip string
	log                *syncBuf
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingLine = regexp.MustCompile(`sluice serving.* grpc=(\S+) http=(\S+) gossip=(\S+)`)

// startServe runs serve with args plus loopback listen addresses and a
// temporary data directory, and stops it when the test ends.
func startServe(t *testing.T, args ...string) *servedNode {
	t.Helper()
	return startServeWith(t, tracingFromEnv(os.LookupEnv), args...)
}

// startServeWith is startServe with the given tracing setup; the args
// given come after the defaults, so they override them.
func startServeWith(t *testing.T, tracing tracingSetup, args ...string) *servedNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lg := &syncBuf{}
	args = append([]string{"--node-name", "m", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--gossip-addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--gc-min-heap", "0"}, args...)
	done := make(chan error, 1)
	go func() { done <- serveWith(ctx, args, lg, tracing) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := servingLine.FindStringSubmatch(lg.String()); m != nil {
			n := &servedNode{grpc: m[1], http: m[2], gossip: m[3], log: lg}
			waitUntil(t, deadline, "the node is ready", func() bool {
				resp, err := http.Get("http://" + n.http + "/readyz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
			return n
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v\n%s", err, lg.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", lg.String())
		}
	}
}

func waitUntil(t *testing.T, deadline time.Time, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

// samples parses the text exposition at url into "name{labels}" → value.
func samples(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for l := range strings.Lines(string(body)) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		out[l[:i]] = v
	}
	return out
}

// TestMetricsOfEveryAPI runs a node, checks through each public API and
// reads the counters, histograms and per-rule series back from /metrics.
// Long on purpose: one story (a check through each API, then /metrics).
func TestMetricsOfEveryAPI(t *testing.T) {
	t.Parallel()
	n := startServe(t, "--rules", writeRules(t))
	c, err := client.Dial(n.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	// gRPC: login allows 2 a minute; the third is over. One inline check.
	for range 3 {
		if _, err := c.Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{Name: "login", Key: "u1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{
		{Name: "inline", Key: "k", Limit: 5, WindowMs: 60_000},
		{Name: "unknown-rule", Key: "k"}, // no limit, no rule: an error
	}}); err != nil {
		t.Fatal(err)
	}
	// HTTP: one allowed, then a malformed body.
	post := func(body string) {
		resp, err := http.Post("http://"+n.http+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post(`{"requests":[{"name":"login","key":"u2"}]}`)
	post(`{not json`)
	// Forward-auth: one allowed by the rule.
	req, _ := http.NewRequest("GET", "http://"+n.http+"/v1/forward-auth?name=login", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("forward-auth answered %d", resp.StatusCode)
	}
	// Envoy: remote_address allows 1 a minute; the second is over.
	env := rlsv3.NewRateLimitServiceClient(c.Conn())
	for range 2 {
		if _, err := env.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.1"}}},
		}}); err != nil {
			t.Fatal(err)
		}
	}

	got := samples(t, "http://"+n.http+"/metrics")
	want := map[string]float64{
		`sluice_checks_total{api="grpc",result="under"}`:                                           3,
		`sluice_checks_total{api="grpc",result="over"}`:                                            1,
		`sluice_checks_total{api="grpc",result="error"}`:                                           1,
		`sluice_checks_total{api="http",result="under"}`:                                           1,
		`sluice_checks_total{api="http",result="error"}`:                                           1,
		`sluice_checks_total{api="forward_auth",result="under"}`:                                   1,
		`sluice_checks_total{api="envoy",result="under"}`:                                          1,
		`sluice_checks_total{api="envoy",result="over"}`:                                           1,
		`sluice_check_duration_seconds_count{api="grpc"}`:                                          4,
		`sluice_check_duration_seconds_count{api="http"}`:                                          2,
		`sluice_check_duration_seconds_count{api="envoy"}`:                                         2,
		`sluice_check_duration_seconds_count{api="forward_auth"}`:                                  1,
		`sluice_rule_checks_total{name="login",result="under"}`:                                    4,
		`sluice_rule_checks_total{name="login",result="over"}`:                                     1,
		`sluice_envoy_rule_checks_total{descriptor="remote_address",domain="edge",result="under"}`: 1,
		`sluice_envoy_rule_checks_total{descriptor="remote_address",domain="edge",result="over"}`:  1,
		`sluice_envoy_calls_total`:                                                                 2,
		`sluice_envoy_over_limit_total`:                                                            1,
		`sluice_members_alive`:                                                                     1,
		`sluice_members{state="alive"}`:                                                            1,
		`sluice_ready`:                                                                             1,
		`sluice_rules`:                                                                             2,
		`sluice_store_writable`:                                                                    1,
		`sluice_keys`:                                                                              5,
		`sluice_rules_reload_failures_total`:                                                       0,
		`sluice_rules_info{hash="` + mustHash(t, c) + `"}`:                                         1,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "sluice_rule_checks_total") && strings.Contains(k, "unknown-rule") {
			t.Errorf("a series for a name that is no rule: %s", k)
		}
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "sluice_store_size_bytes",
		`sluice_cache_lookups_total{result="hit"}`, `sluice_membership_changes_total{event="join"}`} {
		if _, ok := got[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
	// A flush of the 5 changed keys shows up in the flush histograms.
	waitUntil(t, time.Now().Add(10*time.Second), "a flush is measured", func() bool {
		s := samples(t, "http://"+n.http+"/metrics")
		return s["sluice_flush_batch_records_count"] >= 1 && s["sluice_flush_duration_seconds_count"] >= 1 && s["sluice_unflushed_keys"] == 0
	})
}

func mustHash(t *testing.T, c *client.Node) string {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.RulesHash == "" {
		t.Fatal("no rules hash")
	}
	return st.RulesHash
}

// BenchmarkObserveCall is the metrics' cost of one native call of one
// rules-based check, once handles exist.
func BenchmarkObserveCall(b *testing.B) {
	w, err := rules.NewWatcher(writeRules(b), nil, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	m := newNodeMetrics(w)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ObserveRule("login", transport.ResultUnder)
			m.ObserveCall(transport.APIGRPC, transport.Counts{transport.ResultUnder: 1}, 120*time.Microsecond)
		}
	})
}
