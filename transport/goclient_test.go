package transport

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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

	"github.com/sluicehq/sluice/bucket"
)

// closedAddr is a loopback address where nothing listens: a call there
// fails with UNAVAILABLE.
func closedAddr(t testing.TB) string {
	t.Helper()
	l := listen(t)
	addr := l.Addr().String()
	l.Close()
	return addr
}

// attempts records the node each attempt of a ClusterClient goes to.
type attempts struct {
	mu      sync.Mutex
	targets []string
}

func (a *attempts) option() ClientOption {
	return WithDialOptions(grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		a.mu.Lock()
		a.targets = append(a.targets, cc.Target())
		a.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func (a *attempts) get() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.targets...)
}

func newClusterClient(t testing.TB, addrs []string, opts ...ClientOption) *ClusterClient {
	t.Helper()
	c, err := NewClient(addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClusterClientTypedResults(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := newClusterClient(t, []string{s.GRPCAddr()}, WithCallTimeout(10*time.Second))
	ctx := testCtx(t)

	res, err := c.Check(ctx, CheckRequest{Name: "api", Key: "user:1", Hits: 3, Limit: 10, Window: time.Minute, Algorithm: bucket.TokenBucket, Burst: 12})
	if err != nil {
		t.Fatal(err)
	}
	want := CheckResult{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: time.Minute, Owner: "user:1"}
	if res != want {
		t.Fatalf("allowed: got %+v, want %+v", res, want)
	}
	h.mu.Lock()
	got := h.last[0]
	h.mu.Unlock()
	if wantReq := (bucket.Request{Name: "api", Key: "user:1", Hits: 3, Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Limit: 10, WindowMS: 60_000, Burst: 12}}); got.Name != wantReq.Name || got.Key != wantReq.Key || got.Hits != wantReq.Hits || got.Limit != wantReq.Limit {
		t.Fatalf("the node got %+v, want %+v", got, wantReq)
	}

	res, err = c.Check(ctx, CheckRequest{Name: "api", Key: "user:2", Hits: 11, Limit: 10, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want = CheckResult{Limit: 10, ResetAfter: 11200 * time.Millisecond, RetryAfter: 1500 * time.Millisecond, Owner: "user:2"}
	if res != want {
		t.Fatalf("over: got %+v, want %+v", res, want)
	}

	// Hits 0 is one hit; Peek sends 0.
	for _, tc := range []struct {
		r    CheckRequest
		hits int64
	}{{CheckRequest{Name: "api", Key: "k", Limit: 5, Window: time.Second}, 1}, {CheckRequest{Name: "api", Key: "k", Hits: 4, Peek: true, Limit: 5, Window: time.Second}, 0}} {
		if _, err := c.Check(ctx, tc.r); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		hits := h.last[0].Hits
		h.mu.Unlock()
		if hits != tc.hits {
			t.Errorf("%+v: the node got %d hits, want %d", tc.r, hits, tc.hits)
		}
	}

	// A batch answers in order; an invalid item carries its own error.
	rs, err := c.CheckBatch(ctx, []CheckRequest{
		{Name: "api", Key: "a", Limit: 2, Window: time.Second},
		{Name: "api", Key: "", Limit: 2, Window: time.Second},
		{Name: "api", Key: "c", Hits: 3, Limit: 2, Window: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || !rs[0].Allowed || rs[0].Owner != "a" || rs[2].Allowed || rs[2].Owner != "c" {
		t.Fatalf("batch: got %+v", rs)
	}
	var ie *ItemError
	if !errors.As(rs[1].Err, &ie) || !strings.Contains(ie.Msg, "key is empty") || rs[0].Err != nil || rs[2].Err != nil {
		t.Fatalf("batch item errors: %v, %v, %v", rs[0].Err, rs[1].Err, rs[2].Err)
	}
	if _, err := c.Check(ctx, CheckRequest{Name: "api", Key: ""}); !errors.As(err, &ie) {
		t.Fatalf("Check of an invalid item: got %v, want an *ItemError", err)
	}
}

func TestClusterClientRetriesUnavailableOnAnotherNode(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	down := closedAddr(t)
	var a attempts
	c := newClusterClient(t, []string{down, s.GRPCAddr()}, a.option())
	ctx := testCtx(t)
	// The rotation starts each call at the next node: two calls begin once
	// at each, and both succeed.
	for i := range 2 {
		res, err := c.Check(ctx, CheckRequest{Name: "api", Key: "k", Limit: 10, Window: time.Minute})
		if err != nil || !res.Allowed {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := a.get(); strings.Join(got, " ") != strings.Join([]string{down, s.GRPCAddr(), s.GRPCAddr()}, " ") {
		t.Fatalf("attempts went to %v, want the down node once, then the live one twice", got)
	}
	if n := h.calls.Load(); n != 2 {
		t.Fatalf("the live node decided %d calls, want 2", n)
	}
}

func TestClusterClientTriesEachNodeOnce(t *testing.T) {
	t.Parallel()
	downs := []string{closedAddr(t), closedAddr(t)}
	var a attempts
	c := newClusterClient(t, downs, a.option())
	_, err := c.Check(testCtx(t), CheckRequest{Name: "api", Key: "k"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := a.get(); len(got) != 2 || got[0] == got[1] {
		t.Fatalf("attempts went to %v, want each down node once", got)
	}
}

func TestClusterClientDoesNotRetryInvalidArgument(t *testing.T) {
	t.Parallel()
	s1, s2 := startServer(t, &fakeHandler{}), startServer(t, &fakeHandler{})
	var a attempts
	c := newClusterClient(t, []string{s1.GRPCAddr(), s2.GRPCAddr()}, a.option())
	rs := make([]CheckRequest, bucket.MaxBatchSize+1)
	for i := range rs {
		rs[i] = CheckRequest{Name: "api", Key: "k", Limit: 1, Window: time.Second}
	}
	_, err := c.CheckBatch(testCtx(t), rs)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	if got := a.get(); len(got) != 1 {
		t.Fatalf("attempts went to %v, want one", got)
	}
}

func TestNewClientRefusesBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := NewClient(nil); err == nil {
		t.Error("NewClient with no address: no error")
	}
	if _, err := NewClient([]string{"127.0.0.1:1"}, WithClientTLS(ClientTLSFiles{CA: t.TempDir() + "/missing.pem"})); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("NewClient with a missing CA file: %v", err)
	}
}

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
	s := startServer(t, &fakeHandler{})
	c := newClusterClient(t, []string{s.GRPCAddr()})

	allowed := HTTPMiddleware(c, "api", userKey, WithLimit(10, time.Minute, bucket.SlidingWindow, 0), WithHits(3))(okHandler)
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

	over := HTTPMiddleware(c, "api", userKey, WithLimit(2, 30*time.Second, bucket.GCRA, 0), WithHits(3))(okHandler)
	w = serveOnce(over, "u1")
	if w.Code != http.StatusTooManyRequests || w.Body.String() == "ok" {
		t.Fatalf("over: %d %q", w.Code, w.Body)
	}
	for k, want := range map[string]string{"Retry-After": "2", "RateLimit-Policy": `"api";q=2;w=30`, "RateLimit": `"api";r=0;t=12`} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("over: %s %q, want %q", k, got, want)
		}
	}

	// No key: not limited, not checked.
	if w = serveOnce(over, ""); w.Code != 200 || w.Header().Get("RateLimit") != "" {
		t.Errorf("no key: %d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
	}
}

func TestHTTPMiddlewareFailurePolicy(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t, []string{closedAddr(t), closedAddr(t)}, WithCallTimeout(10*time.Second))
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

// startHealthServer serves grpc.health.v1 behind interceptor and returns a
// client of it.
func startHealthServer(t *testing.T, interceptor grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	l := listen(t)
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestUnaryServerInterceptor(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	c := newClusterClient(t, []string{s.GRPCAddr()})
	ctx := testCtx(t)
	callerKey := func(ctx context.Context, _ string, _ any) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-user"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	as := func(user string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-user", user) }

	allowed := startHealthServer(t, UnaryServerInterceptor(c, "api", callerKey, WithLimit(5, time.Second, bucket.SlidingWindow, 0)))
	if _, err := allowed.Check(as("u1"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("allowed: %v", err)
	}

	over := startHealthServer(t, UnaryServerInterceptor(c, "api", callerKey, WithLimit(5, time.Second, bucket.SlidingWindow, 0), WithHits(6)))
	var hdr metadata.MD
	_, err := over.Check(as("u1"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("over: got %v, want ResourceExhausted", err)
	}
	if got := hdr.Get("retry-after"); len(got) != 1 || got[0] != "2" {
		t.Errorf("over: retry-after header %v, want [2]", got)
	}
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.RetryDelay.AsDuration() != 2*time.Second {
		t.Errorf("over: RetryInfo %v, want 2s", ri)
	}
	if _, err := over.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("no key: %v, want the call through", err)
	}

	down := newClusterClient(t, []string{closedAddr(t)})
	open := startHealthServer(t, UnaryServerInterceptor(down, "api", callerKey))
	if _, err := open.Check(as("u1"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("fail open: %v", err)
	}
	closed := startHealthServer(t, UnaryServerInterceptor(down, "api", callerKey, WithFailurePolicy(FailClosed)))
	if _, err := closed.Check(as("u1"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: got %v, want Unavailable", err)
	}
}

func TestClusterClientStopsAtContextEnd(t *testing.T) {
	t.Parallel()
	var a attempts
	c := newClusterClient(t, []string{closedAddr(t), closedAddr(t), closedAddr(t)}, a.option())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Check(ctx, CheckRequest{Name: "api", Key: "k"})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("got %v, want Canceled", err)
	}
	if got := a.get(); len(got) > 1 {
		t.Fatalf("attempts went to %v after the context ended, want at most one", got)
	}
}
