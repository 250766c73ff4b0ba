package transport

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/bucket"
)

// FailurePolicy is what HTTPMiddleware and UnaryServerInterceptor do with a
// request when Sluice cannot decide it: no node answered in time, or the
// node refused the check itself (an invalid name or key).
type FailurePolicy uint8

const (
	// FailOpen, the default, lets the request through unlimited: an outage
	// of the limiter does not become an outage of the service.
	FailOpen FailurePolicy = iota
	// FailClosed refuses the request: HTTP 503 Service Unavailable, gRPC
	// UNAVAILABLE.
	FailClosed
)

// MiddlewareOption configures HTTPMiddleware and UnaryServerInterceptor.
type MiddlewareOption func(*limitGuard)

// WithFailurePolicy sets what happens when Sluice cannot decide (default
// FailOpen).
func WithFailurePolicy(p FailurePolicy) MiddlewareOption {
	return func(g *limitGuard) { g.policy = p }
}

// WithLimit gives the limit inline (limit hits per window, counted by alg,
// with burst for the bucket algorithms; see CheckRequest) instead of taking
// it from the rule in force for the name on the nodes, the default.
func WithLimit(limit int64, window time.Duration, alg bucket.Algorithm, burst int64) MiddlewareOption {
	return func(g *limitGuard) {
		g.tmpl.Limit, g.tmpl.Window, g.tmpl.Algorithm, g.tmpl.Burst = limit, window, alg, burst
	}
}

// WithHits sets the cost of every request (default 1).
func WithHits(hits int64) MiddlewareOption {
	return func(g *limitGuard) { g.tmpl.Hits = hits }
}

// WithErrorHandler calls f with the error of every request Sluice could not
// decide, before the failure policy applies (for a log or a counter). f
// must be safe for concurrent use.
func WithErrorHandler(f func(error)) MiddlewareOption {
	return func(g *limitGuard) { g.onError = f }
}

// limitGuard is what the middleware and the interceptor share.
type limitGuard struct {
	c       *ClusterClient
	tmpl    CheckRequest
	policy  FailurePolicy
	onError func(error)
}

func newGuard(c *ClusterClient, name string, opts []MiddlewareOption) *limitGuard {
	g := &limitGuard{c: c}
	for _, o := range opts {
		o(g)
	}
	g.tmpl.Name = name
	return g
}

// check decides one request for key; a non-nil error has gone to onError.
func (g *limitGuard) check(ctx context.Context, key string) (CheckResult, error) {
	r := g.tmpl
	r.Key = key
	res, err := g.c.Check(ctx, r)
	if err != nil && g.onError != nil {
		g.onError(err)
	}
	return res, err
}

// windowSeconds is the w of RateLimit-Policy: the inline window, unknown
// (0) for a rules-based limit.
func (g *limitGuard) windowSeconds() int64 {
	if g.tmpl.Limit == 0 {
		return 0
	}
	return ceilSeconds(g.tmpl.Window.Milliseconds())
}

// retrySeconds is Retry-After for a refusal: whole seconds rounded up, at
// least 1 (never "retry now").
func retrySeconds(r CheckResult) int64 {
	return max(ceilSeconds(r.RetryAfter.Milliseconds()), 1)
}

// HTTPMiddleware limits the requests of an http.Handler with c: each
// request checks one hit (WithHits) against the limit name for the key that
// key returns, the limit being the rule in force for name on the nodes
// unless WithLimit gives it. A request whose key is "" is not limited.
//
// An allowed request goes on to the handler with the IETF RateLimit-Policy
// and RateLimit headers (draft-ietf-httpapi-ratelimit-headers) set on its
// response; a refused one is answered 429 Too Many Requests with those
// headers and Retry-After, and never reaches the handler. When Sluice
// cannot decide (no node answered within the context and the client's
// WithCallTimeout, or the check was invalid) the FailurePolicy applies:
// FailOpen (default) passes the request on without headers, FailClosed
// answers 503.
func HTTPMiddleware(c *ClusterClient, name string, key func(*http.Request) string, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	g := newGuard(c, name, opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			res, err := g.check(r.Context(), k)
			if err != nil {
				if g.policy == FailClosed {
					http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			h := w.Header()
			putRateLimitHeaders(h, name, res.Limit, g.windowSeconds(), res.Remaining, res.ResetAfter.Milliseconds())
			if !res.Allowed {
				h.Set("Retry-After", strconv.FormatInt(retrySeconds(res), 10))
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// UnaryServerInterceptor limits the unary calls of a gRPC server with c,
// as HTTPMiddleware does requests: key gives the key of each call ("" for
// a call not limited). A refused call fails with RESOURCE_EXHAUSTED,
// carrying a google.rpc.RetryInfo detail and a "retry-after" header
// (seconds), and never reaches the handler. When Sluice cannot decide,
// FailOpen (default) calls the handler, FailClosed fails with UNAVAILABLE.
func UnaryServerInterceptor(c *ClusterClient, name string, key func(ctx context.Context, fullMethod string, req any) string, opts ...MiddlewareOption) grpc.UnaryServerInterceptor {
	g := newGuard(c, name, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		k := key(ctx, info.FullMethod, req)
		if k == "" {
			return handler(ctx, req)
		}
		res, err := g.check(ctx, k)
		switch {
		case err != nil && g.policy == FailClosed:
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable")
		case err != nil || res.Allowed:
			return handler(ctx, req)
		}
		secs := retrySeconds(res)
		_ = grpc.SetHeader(ctx, metadata.Pairs("retry-after", strconv.FormatInt(secs, 10)))
		st := status.Newf(codes.ResourceExhausted, "rate limit %q exceeded: retry after %ds", name, secs)
		if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(secs) * time.Second)}); err == nil {
			st = d
		}
		return nil, st.Err()
	}
}
