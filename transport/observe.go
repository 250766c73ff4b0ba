package transport

import (
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// API names a public entry point of checks, for an Observer.
type API uint8

// The public check APIs.
const (
	APIGRPC        API = iota // sluice.v1.RateLimiter/Check
	APIHTTP                   // POST /v1/check
	APIEnvoy                  // envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
	APIForwardAuth            // GET|POST /v1/forward-auth
	NumAPIs                   // the number of APIs, for arrays indexed by API
)

var apiNames = [NumAPIs]string{"grpc", "http", "envoy", "forward_auth"}

// String is the API's metric label value: grpc, http, envoy or forward_auth.
func (a API) String() string {
	if a < NumAPIs {
		return apiNames[a]
	}
	return "unknown"
}

// Result is how a check ended, for an Observer.
type Result uint8

// The results of a check.
const (
	ResultUnder Result = iota // allowed
	ResultOver                // over its limit
	ResultError               // no decision: invalid, no rule, or undecidable
	NumResults                // the number of results, for arrays indexed by Result
)

var resultNames = [NumResults]string{"under", "over", "error"}

// String is the result's metric label value: under, over or error.
func (r Result) String() string {
	if r < NumResults {
		return resultNames[r]
	}
	return "unknown"
}

// Counts are the checks of one call by Result.
type Counts [NumResults]int

// Observer is told about every call to a public check API; cmd/sluice
// implements it with Prometheus metrics (transport does not import a
// metrics library: see the package doc). Every method is called
// concurrently from the goroutines that serve calls, once the answer is
// known; it must not block or allocate, and must not keep its arguments'
// memory.
type Observer interface {
	// ObserveCall is told of one answered (or refused) call: its checks by
	// result and how long it took from the start of its handler to its
	// answer. A native call counts one check per item of the batch; a
	// forward-auth call one; an Envoy call one, with the call's overall
	// code (its descriptors are counted by ObserveEnvoyRule). A call
	// refused whole (malformed, too large, undecidable) counts one error.
	ObserveCall(api API, c Counts, d time.Duration)
	// ObserveRule is told of each native check whose limits were to come
	// from the rules (the request gave no limit): name is the request's
	// name, which the Observer must look up in the rules before it
	// counts anything, so that series follow the rules, not the requests.
	ObserveRule(name string, r Result)
	// ObserveEnvoyRule is told of each descriptor checked against a rule
	// of an envoy-format rules file (EnvoyRule.Path not empty; never an
	// override from the request): domain and the rule's Path.
	ObserveEnvoyRule(domain, path string, r Result)
}

// NoObserver observes nothing: the default of ServerConfig.Observer.
type NoObserver struct{}

var _ Observer = NoObserver{}

// ObserveCall does nothing.
func (NoObserver) ObserveCall(API, Counts, time.Duration) {}

// ObserveRule does nothing.
func (NoObserver) ObserveRule(string, Result) {}

// ObserveEnvoyRule does nothing.
func (NoObserver) ObserveEnvoyRule(string, string, Result) {}

// responseResult is the Result of one native answer.
func responseResult(o *sluicev1.RateLimitResponse) Result {
	switch {
	case o.GetError() != "":
		return ResultError
	case o.GetStatus() == sluicev1.Status_STATUS_OVER_LIMIT:
		return ResultOver
	case o.GetStatus() == sluicev1.Status_STATUS_UNDER_LIMIT:
		return ResultUnder
	}
	return ResultError
}

// observeNative reports a native call (gRPC, HTTP or forward-auth) that was
// answered with resps (one per item of reqs) to the Observer.
func (s *Server) observeNative(api API, start time.Time, reqs []*sluicev1.RateLimitRequest, resps []*sluicev1.RateLimitResponse) {
	var c Counts
	for i, o := range resps {
		r := responseResult(o)
		c[r]++
		if q := reqs[i]; q.GetLimit() == 0 && len(q.GetLimits()) == 0 {
			s.obs.ObserveRule(q.GetName(), r)
		}
	}
	s.obs.ObserveCall(api, c, time.Since(start))
}

// observeRefused reports a call refused whole.
func (s *Server) observeRefused(api API, start time.Time) {
	s.obs.ObserveCall(api, Counts{ResultError: 1}, time.Since(start))
}
