package transport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/transport/rules"
)

// EnvoyService is the health-checked name of Envoy's rate limit service.
const EnvoyService = "envoy.service.ratelimit.v3.RateLimitService"

// EnvoyMatch is the answer of EnvoyRules for one descriptor.
type EnvoyMatch struct {
	// Known: the domain is in the rules. Name is then the check name of the
	// domain's counters (1..bucket.MaxNameLen bytes, no NUL).
	Known bool
	Name  string
	// Found: a rule matched the descriptor; Rule is it (the rules
	// package's own type: its Unit has the values of Envoy's units).
	Found bool
	Rule  rules.EnvoyRule
}

// EnvoyRules finds the rule of a descriptor of an Envoy rate limit request.
// cmd/sluice passes an adapter of the rules watcher. MatchEnvoy is called
// concurrently, once per descriptor of every ShouldRateLimit call; it must
// not block or keep entries, which the caller reuses.
type EnvoyRules interface {
	MatchEnvoy(domain string, entries []rules.EnvoyEntry) EnvoyMatch
}

// EnvoyConfig configures the envoy.service.ratelimit.v3 service.
type EnvoyConfig struct {
	// Rules gives the descriptors' limits; nil means no domain is known
	// (every request is answered OK).
	Rules EnvoyRules
	// StopCountingRefused makes refused hits consume nothing, for rules
	// that do not say (envoyproxy/ratelimit's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). By default refused hits
	// count, as envoyproxy/ratelimit counts them.
	StopCountingRefused bool
	// ResponseHeaders adds RateLimit-Policy, RateLimit and, when over the
	// limit, Retry-After to response_headers_to_add, for the descriptor
	// nearest its limit.
	ResponseHeaders bool
}

// EnvoyStats are the counters of the Envoy service since the server
// started.
type EnvoyStats struct {
	Calls      uint64 // ShouldRateLimit calls answered (not refused as invalid)
	Descriptor uint64 // descriptors that had a limit
	OverLimit  uint64 // descriptors answered OVER_LIMIT
	Shadow     uint64 // descriptors over their limit but answered OK (shadow_mode)
}

type envoyCounters struct {
	calls, descriptors, over, shadow atomic.Uint64
}

// EnvoyStats returns the counters of the Envoy service.
func (s *Server) EnvoyStats() EnvoyStats {
	c := &s.envoyStats
	return EnvoyStats{Calls: c.calls.Load(), Descriptor: c.descriptors.Load(), OverLimit: c.over.Load(), Shadow: c.shadow.Load()}
}

type envoyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

// envoyKind is what a descriptor needs.
type envoyKind uint8

const (
	envoyNone      envoyKind = iota // no limit: OK
	envoyUnlimited                  // unlimited: OK, remaining max
	envoyBlock                      // a limit of 0: OVER_LIMIT without a counter
	envoyCheck                      // a check, reqs[item]
)

// envoyPlan is one descriptor's part of a call.
type envoyPlan struct {
	kind  envoyKind
	rule  rules.EnvoyRule
	item  int   // index in the checks
	multi int64 // unit multiplier of an override (1 otherwise)
}

// ShouldRateLimit answers one Envoy rate limit request: every descriptor
// with a limit becomes one check, all of them handed to the Handler in one
// call (so they are routed, batched and failed over like native checks).
func (g envoyServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := g.shouldRateLimit(ctx, req)
	var c Counts
	switch {
	case err != nil:
		c[ResultError]++
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		c[ResultOver]++
	default:
		c[ResultUnder]++
	}
	g.s.obs.ObserveCall(APIEnvoy, c, time.Since(start))
	return resp, err
}

func (g envoyServer) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validateEnvoy(req); err != nil {
		return nil, err
	}
	descs := req.GetDescriptors()
	plans, name, n := g.plan(req)
	var outs []check.Outcome
	if n > 0 {
		b := g.s.getBuf(n)
		defer g.s.putBuf(b)
		for i, d := range descs {
			p := &plans[i]
			if p.kind != envoyCheck {
				continue
			}
			b.reqs[p.item] = check.Request{
				Name:  name,
				Key:   envoyKey(d.GetEntries(), p.rule.Shared),
				Hits:  envoyHits(req, d),
				Limit: p.rule.Limit,
			}
		}
		g.s.cfg.Handler.Check(ctx, b.reqs, b.outs)
		outs = b.outs
		for i := range outs {
			if outs[i].Err != "" {
				// No decision (the owner and its replica unreachable, the
				// node not in the cluster yet): let Envoy's
				// failure_mode_deny decide.
				return nil, status.Errorf(codes.Unavailable, "descriptor %d of domain %q: %s", i, req.GetDomain(), outs[i].Err)
			}
		}
	}
	return g.respond(req, plans, outs, time.Now()), nil
}

// plan matches each descriptor of req against the rules and plans what to
// do with it: nothing, a check (numbered 0 .. n−1 in plans[i].item), a
// refusal (a limit of 0) or an unlimited answer. name is the domain's
// counter name.
func (g envoyServer) plan(req *rlsv3.RateLimitRequest) (plans []envoyPlan, name string, n int) {
	cfg := &g.s.cfg.Envoy
	descs := req.GetDescriptors()
	plans = make([]envoyPlan, len(descs))
	var (
		entries   []rules.EnvoyEntry
		replacing map[string]bool
	)
	for i, d := range descs {
		p := &plans[i]
		if cfg.Rules == nil {
			continue
		}
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, rules.EnvoyEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		m := cfg.Rules.MatchEnvoy(req.GetDomain(), entries)
		if !m.Known {
			continue
		}
		name = m.Name
		if o := d.GetLimit(); o != nil {
			// Envoy's per-descriptor override replaces the rules (no shadow
			// mode, name, replaces or path), for a domain the rules know.
			p.rule = rules.EnvoyRule{Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: int64(o.GetRequestsPerUnit())},
				Unit: rules.EnvoyUnit(o.GetUnit())}
			p.multi = int64(max(o.GetUnitMultiplier().GetValue(), 1))
			p.rule.Limit.WindowMS = envoyUnitSeconds(rlsv3.RateLimitResponse_RateLimit_Unit(p.rule.Unit)) * p.multi * 1000
			p.kind = envoyCheck
		} else if m.Found {
			p.rule, p.kind, p.multi = m.Rule, envoyCheck, 1
			for _, r := range m.Rule.Replaces {
				if replacing == nil {
					replacing = make(map[string]bool)
				}
				replacing[r] = true
			}
		}
		if p.kind == envoyCheck && p.rule.Unlimited {
			p.kind = envoyUnlimited
		}
		if p.kind == envoyCheck && !p.rule.CountRefusedSet {
			p.rule.Limit.CountRefused = !cfg.StopCountingRefused
		}
	}
	// A rule whose name another matched rule replaces does not apply.
	if replacing != nil {
		for i := range plans {
			if p := &plans[i]; p.kind == envoyCheck && p.rule.Name != "" && replacing[p.rule.Name] {
				p.kind = envoyNone
			}
		}
	}
	// Number the checks; a limit of 0 refuses without one.
	for i := range plans {
		if p := &plans[i]; p.kind == envoyCheck {
			if p.rule.Limit.Limit == 0 {
				p.kind = envoyBlock
				continue
			}
			p.item = n
			n++
		}
	}
	return plans, name, n
}

// respond builds the answer from the plans and the checks' outcomes.
func (g envoyServer) respond(req *rlsv3.RateLimitRequest, plans []envoyPlan, outs []check.Outcome, now time.Time) *rlsv3.RateLimitResponse {
	c := &g.s.envoyStats
	c.calls.Add(1)
	resp := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(plans))}
	msgs := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(plans))
	var overOther, quota, overQuota int
	nearest := -1 // for the response headers: over first, then fewest remaining
	for i := range plans {
		p := &plans[i]
		st := &msgs[i]
		resp.Statuses[i] = st
		st.Code = rlsv3.RateLimitResponse_OK
		if p.kind == envoyNone {
			continue
		}
		if p.kind == envoyUnlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		c.descriptors.Add(1)
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
			Name:            p.rule.Name,
			RequestsPerUnit: uint32(min(p.rule.Limit.Limit, math.MaxUint32)),
			Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(p.rule.Unit),
		}
		if p.multi > 1 {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(uint32(p.multi))
		}
		over := true
		var reset int64
		if p.kind == envoyCheck {
			o := &outs[p.item]
			over = o.Status == bucket.OverLimit
			st.LimitRemaining = uint32(min(max(o.Remaining, 0), math.MaxUint32))
			reset = o.ResetAfterMS
		}
		if l := p.rule.Limit; l.Algorithm == bucket.FixedWindow && l.Calendar == bucket.CalendarNone && l.WindowMS > 0 {
			// The window's end, whether or not anything was counted
			// (envoyproxy/ratelimit always says when the window turns).
			ms := now.UnixMilli()
			reset = l.WindowMS - ms%l.WindowMS
		}
		st.DurationUntilReset = durationpb.New(time.Duration(reset) * time.Millisecond)
		if p.rule.Path != "" {
			r := ResultUnder
			if over {
				r = ResultOver
			}
			g.s.obs.ObserveEnvoyRule(req.GetDomain(), p.rule.Path, r)
		}
		if over {
			st.LimitRemaining = 0
			c.over.Add(1)
			if p.rule.ShadowMode {
				c.shadow.Add(1)
			} else {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				if p.rule.QuotaMode {
					overQuota++
				} else {
					overOther++
				}
			}
		}
		if p.rule.QuotaMode {
			quota++
		}
		if nearest < 0 || envoyNearer(st, msgs[nearest].Code, msgs[nearest].LimitRemaining) {
			nearest = i
		}
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if overOther > 0 || (quota > 0 && overQuota == quota) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if g.s.cfg.Envoy.ResponseHeaders && nearest >= 0 {
		resp.ResponseHeadersToAdd = envoyHeaders(req.GetDomain(), &plans[nearest], &msgs[nearest])
	}
	return resp
}

// envoyNearer reports whether st is nearer its limit than a descriptor
// with code and remaining: over the limit first, then fewer remaining.
func envoyNearer(st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, remaining uint32) bool {
	stOver, over := st.Code == rlsv3.RateLimitResponse_OVER_LIMIT, code == rlsv3.RateLimitResponse_OVER_LIMIT
	if stOver != over {
		return stOver
	}
	return st.LimitRemaining < remaining
}

// envoyHeaders are the IETF RateLimit-Policy and RateLimit headers (and
// Retry-After when over) for one descriptor's status.
func envoyHeaders(domain string, p *envoyPlan, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	name := p.rule.Name
	if name == "" {
		name = domain
	}
	pn := policyName(name)
	reset := ceilSeconds(st.GetDurationUntilReset().AsDuration().Milliseconds())
	policy := pn + ";q=" + strconv.FormatInt(p.rule.Limit.Limit, 10)
	if w := ceilSeconds(p.rule.Limit.WindowMS); w > 0 {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	hs := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: policy},
		{Key: "RateLimit", Value: pn + ";r=" + strconv.FormatUint(uint64(st.LimitRemaining), 10) + ";t=" + strconv.FormatInt(reset, 10)},
	}
	if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(max(reset, 1), 10)})
	}
	return hs
}

// envoyHits is the cost of one descriptor: its own hits_addend when set
// (0 then checks without counting), else the request's, where 0 means 1.
func envoyHits(req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(h.GetValue()) // ≤ MaxLimit: validateEnvoy
	}
	return int64(max(req.GetHitsAddend(), 1))
}

// envoyUnitSeconds is the length of a unit, as envoyproxy/ratelimit counts
// it (a month is 30 days, a year 365); 0 for an unknown unit.
func envoyUnitSeconds(u rlsv3.RateLimitResponse_RateLimit_Unit) int64 {
	const day = 24 * 60 * 60
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return 1
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return day
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * day
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * day
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * day
	}
	return 0
}

// validateEnvoy refuses a request that cannot be answered, with
// InvalidArgument, before anything is looked up or counted.
func validateEnvoy(req *rlsv3.RateLimitRequest) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, format, args...)
	}
	descs := req.GetDescriptors()
	switch {
	case req.GetDomain() == "":
		return bad("domain is empty")
	case len(descs) == 0:
		return bad("no descriptors")
	case len(descs) > check.MaxBatchSize:
		return bad("%d descriptors, more than %d", len(descs), check.MaxBatchSize)
	}
	for i, d := range descs {
		if len(d.GetEntries()) == 0 {
			return bad("descriptor %d has no entries", i)
		}
		for j, e := range d.GetEntries() {
			if e.GetKey() == "" {
				return bad("descriptor %d: entry %d has an empty key", i, j)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > uint64(bucket.MaxLimit) {
			return bad("descriptor %d: hits_addend %d is more than 2^40", i, h.GetValue())
		}
		if d.GetIsNegativeHits() {
			return bad("descriptor %d: is_negative_hits is not supported (hits never refill a limit)", i)
		}
		if o := d.GetLimit(); o != nil {
			if o.GetUnit() == typev3.RateLimitUnit_UNKNOWN || envoyUnitSeconds(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())) == 0 {
				return bad("descriptor %d: limit override has unit %v", i, o.GetUnit())
			}
			w := envoyUnitSeconds(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())) * int64(max(o.GetUnitMultiplier().GetValue(), 1)) * 1000
			if w > bucket.MaxWindowMS {
				return bad("descriptor %d: limit override's period (unit × unit_multiplier) is more than 366 days", i)
			}
		}
	}
	return nil
}

// envoyKey is the counter key of one descriptor: its entries as
// key=value joined by '&', with '%', '&', '=' and '*' in keys and values
// percent-escaped, except that a shared level (share_threshold) writes the
// rule's wildcard pattern with its '*'s bare. So different entries always
// give different keys, and a shared pattern never meets a literal value.
// A key longer than bucket.MaxKeyLen becomes "sha256:" and the hex SHA-256
// of that text (it has no '=', so it never meets a short key).
func envoyKey(entries []*rlcommon.RateLimitDescriptor_Entry, shared []string) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('&')
		}
		envoyEscape(&b, e.GetKey(), false)
		b.WriteByte('=')
		if i < len(shared) && shared[i] != "" {
			envoyEscape(&b, shared[i], true)
		} else {
			envoyEscape(&b, e.GetValue(), false)
		}
	}
	if b.Len() <= bucket.MaxKeyLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func envoyEscape(b *strings.Builder, s string, pattern bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '*' && pattern:
			b.WriteByte('*')
		case c == '%' || c == '&' || c == '=' || c == '*':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}
