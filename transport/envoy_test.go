package transport

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/transport/rules"
)

// memHandler decides with the bucket algorithms over an in-memory map, as
// one node holding every key would.
type memHandler struct {
	mu     sync.Mutex
	states map[[2]string]*bucket.State
	calls  int
	last   []check.Request
	err    string // when set, every item answers this error
}

func (h *memHandler) Check(_ context.Context, reqs []check.Request, out []check.Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	h.last = append(h.last[:0], reqs...)
	if h.states == nil {
		h.states = make(map[[2]string]*bucket.State)
	}
	now := time.Now().UnixNano()
	for i := range reqs {
		r := &reqs[i]
		if h.err != "" {
			out[i] = check.Outcome{Err: h.err}
			continue
		}
		if err := r.Validate(); err != nil {
			out[i] = check.Outcome{Err: err.Error()}
			continue
		}
		if r.Limit.Limit == 0 {
			out[i] = check.Outcome{Err: "no limit given and no rule for name " + strconv.Quote(r.Name)}
			continue
		}
		k := [2]string{r.Name, r.Key}
		st := h.states[k]
		if st == nil {
			st = new(bucket.State)
			h.states[k] = st
		}
		out[i] = check.Outcome{Decision: bucket.Decide(st, r.Limit, r.Hits, now), Owner: "mem"}
	}
}

func (h *memHandler) CheckStandIn(ctx context.Context, _ string, reqs []check.Request, _ []string, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

func (h *memHandler) CheckForwarded(ctx context.Context, _ string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

func (h *memHandler) checks() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// mapRules is EnvoyRules from a map: the domain "d" is known, and a
// descriptor's rule is found by its entries written "k=v,k2=v2".
type mapRules map[string]rules.EnvoyRule

func (m mapRules) MatchEnvoy(domain string, entries []rules.EnvoyEntry) EnvoyMatch {
	if domain != "d" {
		return EnvoyMatch{}
	}
	var parts []string
	for _, e := range entries {
		parts = append(parts, e.Key+"="+e.Value)
	}
	r, ok := m[strings.Join(parts, ",")]
	return EnvoyMatch{Known: true, Name: "envoy:d", Found: ok, Rule: r}
}

// perHour is a rule as the rules file gives it. An hour, so that a test
// crossing a window's edge is a one-in-tens-of-thousands event.
func perHour(n int64) rules.EnvoyRule {
	return rules.EnvoyRule{
		Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: n, WindowMS: 3_600_000, CountRefused: true},
		Unit:  rules.UnitHour,
	}
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

type envoyRig struct {
	h   *memHandler
	s   *Server
	cli rlsv3.RateLimitServiceClient
}

func newEnvoyRig(t *testing.T, rules mapRules, edit ...func(*EnvoyConfig)) *envoyRig {
	t.Helper()
	h := &memHandler{}
	s := startServer(t, h, func(c *ServerConfig) {
		if rules != nil {
			c.Envoy.Rules = rules
		}
		for _, e := range edit {
			e(&c.Envoy)
		}
	})
	return &envoyRig{h: h, s: s, cli: rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()).Conn())}
}

func (r *envoyRig) ask(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.cli.ShouldRateLimit(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

func rlReq(ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: ds}
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestEnvoyInvalidRequests(t *testing.T) {
	t.Parallel()
	r := newEnvoyRig(t, mapRules{"k=v": perHour(1)})
	many := make([]*rlcommon.RateLimitDescriptor, check.MaxBatchSize+1)
	for i := range many {
		many[i] = desc("k", "v")
	}
	neg := desc("k", "v")
	neg.IsNegativeHits = true
	cases := map[string]*rlsv3.RateLimitRequest{
		"empty domain":          {Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}},
		"no descriptors":        {Domain: "d"},
		"descriptor no entries": rlReq(desc()),
		"entry with empty key":  rlReq(desc("", "v")),
		"too many":              rlReq(many...),
		"negative hits":         rlReq(neg),
		"huge hits_addend":      rlReq(&rlcommon.RateLimitDescriptor{Entries: desc("k", "v").Entries, HitsAddend: wrapperspb.UInt64(1 << 41)}),
		"override without unit": rlReq(&rlcommon.RateLimitDescriptor{Entries: desc("k", "v").Entries,
			Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}),
		"override over 366 days": rlReq(&rlcommon.RateLimitDescriptor{Entries: desc("k", "v").Entries,
			Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(2)}}),
	}
	for name, req := range cases {
		if _, err := r.cli.ShouldRateLimit(testCtx(t), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if n := r.h.checks(); n != 0 {
		t.Fatalf("invalid requests reached the handler %d times", n)
	}
	if st := r.s.EnvoyStats(); st.Calls != 0 {
		t.Fatalf("invalid calls counted: %+v", st)
	}
}

func TestEnvoyNoLimit(t *testing.T) {
	t.Parallel()
	for _, rules := range []mapRules{nil, {"k=v": perHour(1)}} {
		r := newEnvoyRig(t, rules)
		for _, req := range []*rlsv3.RateLimitRequest{
			{Domain: "unknown", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v"), desc("k", "v")}},
			rlReq(desc("k", "other"), desc("k", "v", "deeper", "x")),
		} {
			resp := r.ask(t, req)
			if resp.OverallCode != ok {
				t.Fatalf("overall %v", resp.OverallCode)
			}
			for _, st := range resp.Statuses {
				if st.Code != ok || st.CurrentLimit != nil || st.DurationUntilReset != nil {
					t.Fatalf("status %v, want OK with no limit", st)
				}
			}
		}
		if n := r.h.checks(); n != 0 {
			t.Fatalf("the handler was asked %d times for descriptors without limits", n)
		}
	}
}

func TestEnvoyExhaustExactly(t *testing.T) {
	t.Parallel()
	rule := perHour(3)
	rule.Name = "three"
	r := newEnvoyRig(t, mapRules{"k=v": rule, "k=w": perHour(5)})
	for i := range 5 {
		resp := r.ask(t, rlReq(desc("k", "v"), desc("k", "w")))
		st := resp.Statuses[0]
		wantCode, wantRem := ok, uint32(2-i)
		if i >= 3 {
			wantCode, wantRem = over, 0
		}
		if st.Code != wantCode || st.LimitRemaining != wantRem {
			t.Fatalf("call %d: %v remaining %d, want %v remaining %d", i, st.Code, st.LimitRemaining, wantCode, wantRem)
		}
		if resp.OverallCode != wantCode {
			t.Fatalf("call %d: overall %v, want %v", i, resp.OverallCode, wantCode)
		}
		cl := st.CurrentLimit
		if cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || cl.GetName() != "three" {
			t.Fatalf("current_limit %v", cl)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Hour {
			t.Fatalf("duration_until_reset %v", d)
		}
		if w := resp.Statuses[1]; w.Code != ok || w.LimitRemaining != uint32(4-i) {
			t.Fatalf("call %d: the other descriptor %v", i, w)
		}
	}
	r.h.mu.Lock()
	last := r.h.last
	r.h.mu.Unlock()
	if len(last) != 2 || last[0].Name != "envoy:d" || last[0].Key != "k=v" || last[1].Key != "k=w" {
		t.Fatalf("checks %+v", last)
	}
	if st := r.s.EnvoyStats(); st.Calls != 5 || st.OverLimit != 2 || st.Shadow != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEnvoyShadowMode(t *testing.T) {
	t.Parallel()
	rule := perHour(1)
	rule.ShadowMode = true
	r := newEnvoyRig(t, mapRules{"k=v": rule})
	for i := range 3 {
		resp := r.ask(t, rlReq(desc("k", "v")))
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok {
			t.Fatalf("call %d: %v", i, resp)
		}
		if i > 0 && resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("call %d: remaining %d", i, resp.Statuses[0].LimitRemaining)
		}
	}
	if st := r.s.EnvoyStats(); st.OverLimit != 2 || st.Shadow != 2 {
		t.Fatalf("stats %+v: want the two refusals counted as over, in shadow", st)
	}
}

func TestEnvoyUnlimitedReplacesAndBlock(t *testing.T) {
	t.Parallel()
	named := perHour(1)
	named.Name = "per_user"
	replacer := perHour(2)
	replacer.Replaces = []string{"per_user"}
	unl := rules.EnvoyRule{Unlimited: true, Replaces: []string{"other"}}
	other := perHour(1)
	other.Name = "other"
	r := newEnvoyRig(t, mapRules{"u=1": named, "r=1": replacer, "x=1": unl, "o=1": other, "z=1": perHour(0)})

	// Alone, per_user applies.
	r.ask(t, rlReq(desc("u", "1")))
	if resp := r.ask(t, rlReq(desc("u", "1"))); resp.OverallCode != over {
		t.Fatalf("per_user alone: %v", resp)
	}
	// With the replacer, per_user does not apply (no limit), the replacer does.
	resp := r.ask(t, rlReq(desc("u", "1"), desc("r", "1")))
	if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Fatalf("replaced: %v", resp)
	}
	// An unlimited rule replaces too, and answers remaining max.
	resp = r.ask(t, rlReq(desc("x", "1"), desc("o", "1"), desc("o", "1")))
	if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != math.MaxUint32 || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit != nil {
		t.Fatalf("unlimited: %v", resp)
	}
	// requests_per_unit 0 refuses without a counter.
	calls := r.h.checks()
	resp = r.ask(t, rlReq(desc("z", "1")))
	if resp.OverallCode != over || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 0 || resp.Statuses[0].DurationUntilReset == nil {
		t.Fatalf("limit 0: %v", resp)
	}
	if r.h.checks() != calls {
		t.Fatal("a limit of 0 reached the handler")
	}
}

func TestEnvoyHitsAddend(t *testing.T) {
	t.Parallel()
	r := newEnvoyRig(t, mapRules{"k=v": perHour(10)})
	remaining := func(req *rlsv3.RateLimitRequest) uint32 {
		t.Helper()
		return r.ask(t, req).Statuses[0].LimitRemaining
	}
	if got := remaining(rlReq(desc("k", "v"))); got != 9 {
		t.Fatalf("hits_addend 0 counts 1: remaining %d", got)
	}
	req := rlReq(desc("k", "v"))
	req.HitsAddend = 3
	if got := remaining(req); got != 6 {
		t.Fatalf("hits_addend 3: remaining %d", got)
	}
	d := desc("k", "v")
	d.HitsAddend = wrapperspb.UInt64(2) // wins over the request's
	req = rlReq(d)
	req.HitsAddend = 5
	if got := remaining(req); got != 4 {
		t.Fatalf("descriptor hits_addend 2: remaining %d", got)
	}
	d = desc("k", "v")
	d.HitsAddend = wrapperspb.UInt64(0) // checks without counting
	if got := remaining(rlReq(d)); got != 4 {
		t.Fatalf("descriptor hits_addend 0: remaining %d", got)
	}
	if got := remaining(rlReq(d)); got != 4 {
		t.Fatalf("descriptor hits_addend 0 again: remaining %d", got)
	}
}

func TestEnvoyRefusedHitsCount(t *testing.T) {
	t.Parallel()
	for _, stop := range []bool{false, true} {
		r := newEnvoyRig(t, mapRules{"k=v": perHour(3)}, func(c *EnvoyConfig) { c.StopCountingRefused = stop })
		hits := func(n uint32) rlsv3.RateLimitResponse_Code {
			req := rlReq(desc("k", "v"))
			req.HitsAddend = n
			return r.ask(t, req).OverallCode
		}
		if hits(2) != ok || hits(2) != over {
			t.Fatal("limit 3: 2 then 2 more")
		}
		// envoyproxy/ratelimit counted the refused 2: one more is over.
		// With StopCountingRefused it was not counted: one more fits.
		want := over
		if stop {
			want = ok
		}
		if got := hits(1); got != want {
			t.Fatalf("stop=%v: the last hit answered %v, want %v", stop, got, want)
		}
	}
}

func TestEnvoyQuotaMode(t *testing.T) {
	t.Parallel()
	q1, q2 := perHour(1), perHour(5)
	q1.QuotaMode, q2.QuotaMode = true, true
	r := newEnvoyRig(t, mapRules{"q=1": q1, "q=2": q2})
	r.ask(t, rlReq(desc("q", "1")))
	resp := r.ask(t, rlReq(desc("q", "1"), desc("q", "2")))
	if resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok || resp.OverallCode != ok {
		t.Fatalf("one quota descriptor over: %v", resp)
	}
	resp = r.ask(t, rlReq(desc("q", "1")))
	if resp.OverallCode != over {
		t.Fatalf("every quota descriptor over: %v", resp)
	}
}

func TestEnvoyLimitOverride(t *testing.T) {
	t.Parallel()
	r := newEnvoyRig(t, mapRules{"k=v": perHour(100)})
	d := desc("k", "v")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}
	resp := r.ask(t, rlReq(d))
	cl := resp.Statuses[0].CurrentLimit
	if resp.OverallCode != ok || cl.GetRequestsPerUnit() != 1 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || cl.GetUnitMultiplier().GetValue() != 2 {
		t.Fatalf("override: %v", resp)
	}
	if d := resp.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 2*time.Hour {
		t.Fatalf("duration_until_reset %v for a 2 h period", d)
	}
	if resp := r.ask(t, rlReq(d)); resp.OverallCode != over {
		t.Fatalf("override, second call: %v", resp)
	}
	// An override for a descriptor the rules do not know applies (the
	// domain is known); for an unknown domain it does not.
	d2 := desc("unknown", "x")
	d2.Limit = d.Limit
	r.ask(t, rlReq(d2))
	if resp := r.ask(t, rlReq(d2)); resp.OverallCode != over {
		t.Fatalf("override of an unmatched descriptor: %v", resp)
	}
	req := rlReq(d2)
	req.Domain = "other"
	if resp := r.ask(t, req); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("override in an unknown domain: %v", resp)
	}
}

func TestEnvoyResponseHeaders(t *testing.T) {
	t.Parallel()
	rule := perHour(1)
	rule.Name = "one"
	r := newEnvoyRig(t, mapRules{"k=v": rule, "k=w": perHour(10)}, func(c *EnvoyConfig) { c.ResponseHeaders = true })
	headers := func(resp *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range resp.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	h := headers(r.ask(t, rlReq(desc("k", "w"), desc("k", "v"))))
	if h["RateLimit-Policy"] != `"one";q=1;w=3600` || !strings.HasPrefix(h["RateLimit"], `"one";r=0;t=`) || h["Retry-After"] != "" {
		t.Fatalf("allowed: %v", h)
	}
	h = headers(r.ask(t, rlReq(desc("k", "w"), desc("k", "v"))))
	if h["Retry-After"] == "" || !strings.HasPrefix(h["RateLimit"], `"one";r=0;t=`) {
		t.Fatalf("over: %v", h)
	}
	r2 := newEnvoyRig(t, mapRules{"k=v": rule})
	if hs := r2.ask(t, rlReq(desc("k", "v"))).ResponseHeadersToAdd; hs != nil {
		t.Fatalf("headers without ResponseHeaders: %v", hs)
	}
}

func TestEnvoyUndecidedIsUnavailable(t *testing.T) {
	t.Parallel()
	r := newEnvoyRig(t, mapRules{"k=v": perHour(1)})
	r.h.mu.Lock()
	r.h.err = "owner and replica unreachable"
	r.h.mu.Unlock()
	_, err := r.cli.ShouldRateLimit(testCtx(t), rlReq(desc("k", "v")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("%v, want Unavailable", err)
	}
}

func TestEnvoyServiceListedAndHealthChecked(t *testing.T) {
	t.Parallel()
	r := newEnvoyRig(t, nil)
	c := dial(t, r.s.GRPCAddr())
	stream, err := reflectionpb.NewServerReflectionClient(c.Conn()).ServerReflectionInfo(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: EnvoyService}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFileDescriptorResponse() == nil || len(resp.GetFileDescriptorResponse().FileDescriptorProto) == 0 {
		t.Fatalf("reflection has no file for %s: %v", EnvoyService, resp)
	}
	hc := healthpb.NewHealthClient(c.Conn())
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		st, err := hc.Check(testCtx(t), &healthpb.HealthCheckRequest{Service: EnvoyService})
		if err != nil {
			t.Fatal(err)
		}
		return st.Status
	}
	if got := check(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("before ready: %v", got)
	}
	r.s.SetReady(true)
	if got := check(); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("ready: %v", got)
	}
}

// decodeEnvoyKey inverts envoyKey for keys that were not hashed and have no
// shared level.
func decodeEnvoyKey(t *testing.T, key string) [][2]string {
	t.Helper()
	unescape := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) {
				var c byte
				for _, h := range s[i+1 : i+3] {
					c <<= 4
					switch {
					case h >= '0' && h <= '9':
						c |= byte(h - '0')
					default:
						c |= byte(h-'A') + 10
					}
				}
				b.WriteByte(c)
				i += 2
				continue
			}
			b.WriteByte(s[i])
		}
		return b.String()
	}
	var out [][2]string
	for part := range strings.SplitSeq(key, "&") {
		k, v, found := strings.Cut(part, "=")
		if !found {
			t.Fatalf("key %q: entry %q has no '='", key, part)
		}
		out = append(out, [2]string{unescape(k), unescape(v)})
	}
	return out
}

func TestEnvoyKey(t *testing.T) {
	entries := func(kv ...string) []*rlcommon.RateLimitDescriptor_Entry { return desc(kv...).Entries }
	cases := []struct {
		entries []*rlcommon.RateLimitDescriptor_Entry
		shared  []string
		want    string
	}{
		{entries("k", "v"), nil, "k=v"},
		{entries("k", "v", "j", ""), nil, "k=v&j="},
		{entries("a=b", "c&d", "%", "*"), nil, "a%3Db=c%26d&%25=%2A"},
		{entries("path", "/x/y"), []string{"/x/*"}, "path=/x/*"},
		{entries("path", "/x/*"), nil, "path=/x/%2A"},
		{entries("a", "1", "path", "/x/y"), []string{"", "/x/*"}, "a=1&path=/x/*"},
	}
	for _, c := range cases {
		if got := envoyKey(c.entries, c.shared); got != c.want {
			t.Errorf("envoyKey(%v, %q) = %q, want %q", c.entries, c.shared, got, c.want)
		}
	}
	long := envoyKey(entries("k", strings.Repeat("v", bucket.MaxKeyLen)), nil)
	if !strings.HasPrefix(long, "sha256:") || len(long) != len("sha256:")+64 || bucket.ValidateKey("n", long) != nil {
		t.Fatalf("long key %q", long)
	}
}

// FuzzEnvoyKey: the descriptor → key mapping is injective: an unhashed key
// decodes to exactly its entries, two different descriptors never share a
// key, and every key is valid for bucket.
func FuzzEnvoyKey(f *testing.F) {
	f.Add("k", "v", "j", "w", "")
	f.Add("a=b", "c&d", "%", "*", "x*")
	f.Add("k", "v=j", "w", "", "*")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, pattern string) {
		a := desc(k1, v1, k2, v2).Entries
		key := envoyKey(a, nil)
		if err := bucket.ValidateKey("n", key); err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		if !strings.HasPrefix(key, "sha256:") {
			got := decodeEnvoyKey(t, key)
			if len(got) != 2 || got[0] != [2]string{k1, v1} || got[1] != [2]string{k2, v2} {
				t.Fatalf("key %q decodes to %q", key, got)
			}
		}
		// Moving bytes between key and value, or between entries, changes
		// the key.
		if b := desc(k1+v1, "", k2, v2).Entries; v1 != "" && envoyKey(b, nil) == key {
			t.Fatalf("%q and %q share key %q", a, b, key)
		}
		if b := desc(k1, v1+k2, "", v2).Entries; k2 != "" && envoyKey(b, nil) == key {
			t.Fatalf("%q and %q share key %q", a, b, key)
		}
		// A shared pattern never meets a literal value, unless the value is
		// the pattern with no '*' at all.
		if strings.Contains(pattern, "*") {
			if envoyKey(a, []string{"", pattern}) == key {
				t.Fatalf("pattern %q and literal %q share key %q", pattern, v2, key)
			}
		}
	})
}

// The rules file's units are Envoy's, number for number: the service
// answers a rule's Unit as Envoy's unit, and an override's unit becomes
// a rule's.
func TestEnvoyUnitsAreEnvoys(t *testing.T) {
	t.Parallel()
	for u := rules.UnitUnknown; u <= rules.UnitYear; u++ {
		name, ok := rlsv3.RateLimitResponse_RateLimit_Unit_name[int32(u)]
		want := strings.ToUpper(u.String())
		if u == rules.UnitUnknown {
			want = "UNKNOWN"
		}
		if !ok || name != want {
			t.Errorf("rules unit %d (%s) is Envoy's %q, want %q", u, u, name, want)
		}
	}
}
