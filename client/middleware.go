package client

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FailurePolicy is what HTTPMiddleware and the gRPC interceptors do with a
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

// MiddlewareOption configures HTTPMiddleware and the gRPC interceptors.
type MiddlewareOption func(*limitGuard)

// WithFailurePolicy sets what happens when Sluice cannot decide (default
// FailOpen).
func WithFailurePolicy(p FailurePolicy) MiddlewareOption {
	return func(g *limitGuard) { g.policy = p }
}

// WithLimit gives the limit inline (limit hits per window, counted by alg,
// with burst for the bucket algorithms; see Request) instead of taking it
// from the rule in force for the name on the nodes, the default.
func WithLimit(limit int64, window time.Duration, alg Algorithm, burst int64) MiddlewareOption {
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

// limitGuard is what the middleware and the interceptors share.
type limitGuard struct {
	c       *Client
	tmpl    Request
	policy  FailurePolicy
	onError func(error)
}

func newGuard(c *Client, name string, opts []MiddlewareOption) *limitGuard {
	g := &limitGuard{c: c}
	for _, o := range opts {
		o(g)
	}
	g.tmpl.Name = name
	return g
}

// check decides one request for key; a non-nil error has gone to onError.
func (g *limitGuard) check(ctx context.Context, key string) (Result, error) {
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
func HTTPMiddleware(c *Client, name string, key func(*http.Request) string, opts ...MiddlewareOption) func(http.Handler) http.Handler {
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
			putRateLimitHeaders(w.Header(), name, res, g.windowSeconds())
			if !res.Allowed {
				w.Header().Set("Retry-After", strconv.FormatInt(retrySeconds(res), 10))
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
func UnaryServerInterceptor(c *Client, name string, key func(ctx context.Context, fullMethod string, req any) string, opts ...MiddlewareOption) grpc.UnaryServerInterceptor {
	g := newGuard(c, name, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		k := key(ctx, info.FullMethod, req)
		if k == "" {
			return handler(ctx, req)
		}
		if err := g.admit(ctx, k, func(md metadata.MD) { _ = grpc.SetHeader(ctx, md) }); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor limits the streams of a gRPC server with c: one
// check per stream, when it starts (before the handler reads any
// message), for the key that key returns from the stream's context and
// method ("" for a stream not limited). A refused stream ends with
// RESOURCE_EXHAUSTED, a google.rpc.RetryInfo detail and a "retry-after"
// header, as UnaryServerInterceptor's calls do, and never reaches the
// handler; the messages of an admitted stream are not counted. The options
// and the failure policy are UnaryServerInterceptor's.
func StreamServerInterceptor(c *Client, name string, key func(ctx context.Context, fullMethod string) string, opts ...MiddlewareOption) grpc.StreamServerInterceptor {
	g := newGuard(c, name, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		k := key(ctx, info.FullMethod)
		if k == "" {
			return handler(srv, ss)
		}
		if err := g.admit(ctx, k, func(md metadata.MD) { _ = ss.SetHeader(md) }); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// admit checks one call of an interceptor for key: nil lets it through;
// otherwise the status error to end it with, the refusal's retry-after
// header having been given to setHeader.
func (g *limitGuard) admit(ctx context.Context, key string, setHeader func(metadata.MD)) error {
	res, err := g.check(ctx, key)
	switch {
	case err != nil && g.policy == FailClosed:
		return status.Error(codes.Unavailable, "rate limiter unavailable")
	case err != nil || res.Allowed:
		return nil
	}
	secs := retrySeconds(res)
	setHeader(metadata.Pairs("retry-after", strconv.FormatInt(secs, 10)))
	st := status.Newf(codes.ResourceExhausted, "rate limit %q exceeded: retry after %ds", g.tmpl.Name, secs)
	return withRetryInfo(st, time.Duration(secs)*time.Second).Err()
}

// withRetryInfo adds a google.rpc.RetryInfo detail (retry_delay d) to st.
// The message is one field, a google.protobuf.Duration, encoded here so
// that the client need not import the googleapis packages; a caller that
// has them linked reads it with status.Details as usual.
func withRetryInfo(st *status.Status, d time.Duration) *status.Status {
	delay, err := proto.Marshal(durationpb.New(d))
	if err != nil {
		return st
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, delay)
	p := st.Proto()
	p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/google.rpc.RetryInfo", Value: b})
	return status.FromProto(p)
}

// retrySeconds is Retry-After for a refusal: whole seconds rounded up, at
// least 1 (never "retry now").
func retrySeconds(r Result) int64 {
	return max(ceilSeconds(r.RetryAfter.Milliseconds()), 1)
}

// ceilSeconds rounds milliseconds up to whole seconds.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// putRateLimitHeaders sets RateLimit-Policy (the policy's name, quota q
// and window w in seconds when known) and RateLimit (remaining r, reset t
// in seconds rounded up) for res.
func putRateLimitHeaders(h http.Header, name string, res Result, w int64) {
	name = policyName(name)
	policy := name + ";q=" + strconv.FormatInt(max(res.Limit, 0), 10)
	if w > 0 {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", name+";r="+strconv.FormatInt(max(res.Remaining, 0), 10)+
		";t="+strconv.FormatInt(ceilSeconds(res.ResetAfter.Milliseconds()), 10))
}

// policyName is the quoted name of a RateLimit policy: the limit's name
// when it is printable ASCII of at most 128 bytes, "default" otherwise.
func policyName(name string) string {
	if name == "" || len(name) > 128 {
		return `"default"`
	}
	var b strings.Builder
	b.Grow(len(name) + 4)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e {
			return `"default"`
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}
