package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Write([]byte("ok"))
})

func userKey(r *http.Request) string { return r.Header.Get("X-User") }

func serveOnce(h http.Handler, user string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/thing", nil)
	if user != "" {
		r.Header.Set("X-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHTTPMiddleware(t *testing.T) {
	t.Parallel()
	n := startNode(t, &fakeNode{})
	c := newClient(t, []string{n.addr})

	allowed := HTTPMiddleware(c, "api", userKey, WithLimit(10, time.Minute, SlidingWindow, 0), WithHits(3))(okHandler)
	w := serveOnce(allowed, "u1")
	if w.Code != 200 || w.Body.String() != "ok" {
		t.Fatalf("allowed: %d %q", w.Code, w.Body)
	}
	if got, want := w.Header().Get("RateLimit-Policy"), `"api";q=10;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := w.Header().Get("RateLimit"), `"api";r=7;t=60`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got := w.Header().Get("Retry-After"); got != "" {
		t.Errorf("allowed answer with Retry-After %q", got)
	}

	over := HTTPMiddleware(c, "api", userKey, WithLimit(2, 30*time.Second, GCRA, 0), WithHits(3))(okHandler)
	w = serveOnce(over, "u1")
	if w.Code != http.StatusTooManyRequests || w.Body.String() == "ok" {
		t.Fatalf("over: %d %q", w.Code, w.Body)
	}
	for k, want := range map[string]string{"Retry-After": "2", "RateLimit-Policy": `"api";q=2;w=30`, "RateLimit": `"api";r=0;t=12`} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("over: %s %q, want %q", k, got, want)
		}
	}
	if got := n.lastRequest().Requests[0].Algorithm.String(); got != "ALGORITHM_GCRA" {
		t.Errorf("the node got algorithm %s, want GCRA", got)
	}

	// No key: not limited, not checked.
	calls := n.calls.Load()
	if w = serveOnce(over, ""); w.Code != 200 || w.Header().Get("RateLimit") != "" || n.calls.Load() != calls {
		t.Errorf("no key: %d, RateLimit %q, %d checks", w.Code, w.Header().Get("RateLimit"), n.calls.Load()-calls)
	}
}

func TestHTTPMiddlewareFailurePolicy(t *testing.T) {
	t.Parallel()
	c := newClient(t, []string{closedAddr(t), closedAddr(t)}, WithCallTimeout(10*time.Second))
	var mu sync.Mutex
	var errs []error
	onErr := WithErrorHandler(func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })

	w := serveOnce(HTTPMiddleware(c, "api", userKey, onErr)(okHandler), "u1")
	if w.Code != 200 || w.Body.String() != "ok" || w.Header().Get("RateLimit") != "" {
		t.Errorf("fail open: %d %q, RateLimit %q", w.Code, w.Body, w.Header().Get("RateLimit"))
	}
	w = serveOnce(HTTPMiddleware(c, "api", userKey, onErr, WithFailurePolicy(FailClosed))(okHandler), "u1")
	if w.Code != http.StatusServiceUnavailable || w.Body.String() == "ok" {
		t.Errorf("fail closed: %d %q", w.Code, w.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 2 || status.Code(errs[0]) != codes.Unavailable {
		t.Errorf("error handler got %v, want two Unavailable", errs)
	}
}

func TestPolicyName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"api": `"api"`, `a"b\c`: `"a\"b\\c"`, "": `"default"`, "é": `"default"`, string(make([]byte, 129)): `"default"`} {
		if got := policyName(in); got != want {
			t.Errorf("policyName(%q) = %s, want %s", in, got, want)
		}
	}
}

// healthServer serves grpc.health.v1 behind the interceptors and returns
// a client of it and the health server, whose status changes reach Watch
// streams.
func healthServer(t *testing.T, opts ...grpc.ServerOption) (healthpb.HealthClient, *health.Server) {
	t.Helper()
	l := listen(t)
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn), hs
}

func callerKey(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-user"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// checkRefusal asserts err is a refusal with a retry of secs seconds, in
// its RetryInfo detail and in the retry-after header hdr.
func checkRefusal(t *testing.T, what string, err error, hdr metadata.MD, secs int) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: got %v, want ResourceExhausted", what, err)
	}
	if got := hdr.Get("retry-after"); len(got) != 1 || got[0] != strconv.Itoa(secs) {
		t.Errorf("%s: retry-after header %v, want [%d]", what, got, secs)
	}
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.RetryDelay.AsDuration() != time.Duration(secs)*time.Second {
		t.Errorf("%s: RetryInfo %v in details %v, want %ds", what, ri, st.Details(), secs)
	}
}

func TestUnaryServerInterceptor(t *testing.T) {
	t.Parallel()
	n := startNode(t, &fakeNode{})
	c := newClient(t, []string{n.addr})
	ctx := testCtx(t)
	key := func(ctx context.Context, _ string, _ any) string { return callerKey(ctx) }
	as := func(user string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-user", user) }
	unary := func(c *Client, opts ...MiddlewareOption) healthpb.HealthClient {
		hc, _ := healthServer(t, grpc.UnaryInterceptor(UnaryServerInterceptor(c, "api", key, opts...)))
		return hc
	}

	allowed := unary(c, WithLimit(5, time.Second, SlidingWindow, 0))
	if _, err := allowed.Check(as("u1"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("allowed: %v", err)
	}
	if got := n.lastRequest().Requests[0].Key; got != "u1" {
		t.Errorf("the node checked key %q, want u1", got)
	}

	over := unary(c, WithLimit(5, time.Second, SlidingWindow, 0), WithHits(6))
	var hdr metadata.MD
	_, err := over.Check(as("u1"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	checkRefusal(t, "over", err, hdr, 2)
	if _, err := over.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("no key: %v, want the call through", err)
	}

	down := newClient(t, []string{closedAddr(t)})
	if _, err := unary(down).Check(as("u1"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("fail open: %v", err)
	}
	if _, err := unary(down, WithFailurePolicy(FailClosed)).Check(as("u1"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: got %v, want Unavailable", err)
	}
}

// TestStreamServerInterceptor: a stream is checked once, when it starts;
// a refused one ends before the handler with the unary refusal's status,
// detail and header; the failure policy is the unary one.
func TestStreamServerInterceptor(t *testing.T) {
	t.Parallel()
	n := startNode(t, &fakeNode{})
	c := newClient(t, []string{n.addr})
	ctx := testCtx(t)
	var methods sync.Map
	key := func(ctx context.Context, method string) string {
		methods.Store(method, true)
		return callerKey(ctx)
	}
	as := func(ctx context.Context, user string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "x-user", user)
	}
	stream := func(c *Client, opts ...MiddlewareOption) (healthpb.HealthClient, *health.Server) {
		return healthServer(t, grpc.StreamInterceptor(StreamServerInterceptor(c, "watch", key, opts...)))
	}
	recv := func(w healthpb.Health_WatchClient) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		return m.Status
	}

	// Admitted: one check for the whole stream, however many messages.
	hc, hs := stream(c, WithLimit(5, time.Second, TokenBucket, 0))
	sctx, cancel := context.WithCancel(as(ctx, "u1"))
	w, err := hc.Watch(sctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(w); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first message %v, want SERVING", got)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if got := recv(w); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("second message %v, want NOT_SERVING", got)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if got := recv(w); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("third message %v, want SERVING", got)
	}
	cancel()
	if got := n.calls.Load(); got != 1 {
		t.Errorf("a stream of three messages made %d checks, want 1", got)
	}
	if r := n.lastRequest().Requests[0]; r.Key != "u1" || r.Name != "watch" || r.Limit != 5 || r.Algorithm.String() != "ALGORITHM_TOKEN_BUCKET" {
		t.Errorf("the node checked %v", r)
	}
	if _, ok := methods.Load("/grpc.health.v1.Health/Watch"); !ok {
		t.Errorf("key was not given the stream's method")
	}

	// Refused: the stream ends before the handler sends anything.
	hc, _ = stream(c, WithLimit(5, time.Second, SlidingWindow, 0), WithHits(6))
	w, err = hc.Watch(as(ctx, "u1"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Recv()
	hdr, _ := w.Header()
	checkRefusal(t, "over", err, hdr, 2)

	// No key: not checked.
	calls := n.calls.Load()
	w, err = hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(w); got != healthpb.HealthCheckResponse_SERVING || n.calls.Load() != calls {
		t.Errorf("no key: %v after %d checks, want SERVING and none", got, n.calls.Load()-calls)
	}

	down := newClient(t, []string{closedAddr(t)})
	var mu sync.Mutex
	var errs []error
	onErr := WithErrorHandler(func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
	hc, _ = stream(down, onErr)
	w, err = hc.Watch(as(ctx, "u1"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(w); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("fail open: %v, want SERVING", got)
	}
	hc, _ = stream(down, onErr, WithFailurePolicy(FailClosed))
	w, err = hc.Watch(as(ctx, "u1"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: got %v, want Unavailable", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 2 || status.Code(errs[0]) != codes.Unavailable {
		t.Errorf("error handler got %v, want two Unavailable", errs)
	}
}
