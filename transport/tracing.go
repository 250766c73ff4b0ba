package transport

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	"github.com/sluicehq/sluice/transport/peer"
)

// Tracing turns on OpenTelemetry spans in a Server (ServerConfig.Tracing)
// and a peer.PeerClient (peer.PeerConfig.Tracing, through ClientHandler). A
// nil *Tracing, the default, installs nothing: no stats handler, no wrapper,
// no cost on the hot path.
//
// With it, a Server starts a span for every call of the public API (gRPC
// sluice.v1.RateLimiter/Check, Envoy ShouldRateLimit, HTTP POST /v1/check
// and /v1/forward-auth), continuing the caller's trace when the call
// carries one (W3C traceparent), and for every internal call (Peer, Admin)
// that carries a trace context; internal calls without one (replication
// every 100 ms, status polls) start no trace. A PeerClient starts a client
// span for each Forward, Pull or Replicate RPC whose context has a span
// (a forward to the owner, the pull of a moved key on first touch) and
// carries the context on the call; background RPCs are not traced. A
// forward that waits in the per-peer batch rides in an RPC whose span is a
// child of the span of the first caller in that batch.
//
// The spans come from otelgrpc (go.opentelemetry.io/contrib), the field's
// standard gRPC instrumentation; its metrics are off (Sluice's Prometheus
// metrics cover the same ground).
type Tracing struct {
	// Provider makes the tracers. Required.
	Provider trace.TracerProvider
	// Propagator reads and writes trace context on calls; nil means W3C
	// tracecontext (propagation.TraceContext).
	Propagator propagation.TextMapPropagator
}

func (t *Tracing) propagator() propagation.TextMapPropagator {
	if t.Propagator != nil {
		return t.Propagator
	}
	return propagation.TraceContext{}
}

func (t *Tracing) otelOptions() []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(t.Provider),
		otelgrpc.WithPropagators(t.propagator()),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
	}
}

var _ peer.ClientTracing = (*Tracing)(nil)

// tracedMethods are the public API's gRPC methods: traced even when the
// caller sends no trace context.
var tracedMethods = map[string]bool{
	"/sluice.v1.RateLimiter/Check":                                 true,
	"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit": true,
}

// serverHandler is the gRPC server's stats handler: otelgrpc's, for the
// calls that should be traced (gatedHandler).
func (t *Tracing) serverHandler() stats.Handler {
	prop := t.propagator()
	return &gatedHandler{next: otelgrpc.NewServerHandler(t.otelOptions()...), traced: func(ctx context.Context, info *stats.RPCTagInfo) bool {
		if tracedMethods[info.FullMethodName] {
			return true
		}
		md, _ := metadata.FromIncomingContext(ctx)
		return trace.SpanContextFromContext(prop.Extract(ctx, metadataCarrier(md))).IsValid()
	}}
}

// ClientHandler is the stats handler of a peer.PeerClient's connections
// (peer.PeerConfig.Tracing): otelgrpc's, for the calls made in a traced
// context. It is nil for a nil t or one without a Provider, with which a
// PeerClient traces nothing.
func (t *Tracing) ClientHandler() stats.Handler {
	if t == nil || t.Provider == nil {
		return nil
	}
	return &gatedHandler{next: otelgrpc.NewClientHandler(t.otelOptions()...), traced: func(ctx context.Context, _ *stats.RPCTagInfo) bool {
		return trace.SpanContextFromContext(ctx).IsValid()
	}}
}

// gatedHandler passes an RPC to next only when traced says so at its
// start; the others cost one check and nothing more.
type gatedHandler struct {
	next   stats.Handler
	traced func(context.Context, *stats.RPCTagInfo) bool
}

type gatedKey struct{}

func (g *gatedHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if !g.traced(ctx, info) {
		return ctx
	}
	return context.WithValue(g.next.TagRPC(ctx, info), gatedKey{}, true)
}

func (g *gatedHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if ctx.Value(gatedKey{}) != nil {
		g.next.HandleRPC(ctx, s)
	}
}

func (g *gatedHandler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return g.next.TagConn(ctx, info)
}

func (g *gatedHandler) HandleConn(ctx context.Context, s stats.ConnStats) {
	g.next.HandleConn(ctx, s)
}

// metadataCarrier reads gRPC metadata for a propagator.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// wrapHTTP gives each request of h a server span named name, continuing
// the trace of the request's traceparent header if any.
func (t *Tracing) wrapHTTP(name string, h http.HandlerFunc) http.HandlerFunc {
	tracer := t.Provider.Tracer("github.com/sluicehq/sluice/transport")
	prop := t.propagator()
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		if sw.code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.code))
		}
	}
}

// statusWriter records the status code a handler answers with.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
