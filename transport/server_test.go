package transport

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

func protoReqs(rs []check.Request) *sluicev1.CheckRequest {
	m := &sluicev1.CheckRequest{}
	for _, r := range rs {
		m.Requests = append(m.Requests, peer.RequestToProto(r))
	}
	return m
}

func TestCheckRoundTripKeepsOrder(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	rs := keys("k", check.MaxBatchSize)
	for i := range rs {
		rs[i].Hits = int64(i % 15) // some over the limit of 10
	}
	resp, err := c.Check(testCtx(t), protoReqs(rs))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Responses) != len(rs) {
		t.Fatalf("got %d responses for %d requests", len(resp.Responses), len(rs))
	}
	for i, r := range resp.Responses {
		want := sluicev1.Status_STATUS_UNDER_LIMIT
		if rs[i].Hits > 10 {
			want = sluicev1.Status_STATUS_OVER_LIMIT
		}
		if r.Owner != rs[i].Key || r.Status != want {
			t.Fatalf("response %d = %v, want owner %s status %v", i, r, rs[i].Key, want)
		}
	}
}

func TestCheckBatchLimits(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	ctx := testCtx(t)

	resp, err := c.Check(ctx, &sluicev1.CheckRequest{})
	if err != nil || len(resp.Responses) != 0 {
		t.Fatalf("empty batch: %v, %v", resp, err)
	}
	_, err = c.Check(ctx, protoReqs(keys("k", check.MaxBatchSize+1)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "1001 requests, more than 1000") {
		t.Fatalf("1001 items: got %v, want InvalidArgument", err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times, want 0", n)
	}
	// The server keeps serving on the same connection.
	if resp, err := c.Check(ctx, protoReqs(keys("k", check.MaxBatchSize))); err != nil || len(resp.Responses) != check.MaxBatchSize {
		t.Fatalf("1000 items after the refusal: %d answers, %v", len(resp.GetResponses()), err)
	}
	// The Peer service refuses the same.
	_, err = sluicev1.NewPeerClient(c.Conn()).Forward(ctx, &sluicev1.ForwardRequest{Requests: protoReqs(keys("k", 1001)).Requests})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("forward of 1001 items: got %v, want InvalidArgument", err)
	}
}

func TestCheckOversizeMessageRefused(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	big := strings.Repeat("x", 1<<20)
	m := &sluicev1.CheckRequest{}
	for i := range 5 { // 5 MiB of keys
		m.Requests = append(m.Requests, &sluicev1.RateLimitRequest{Name: "n", Key: big + strconv.Itoa(i), Limit: 1, WindowMs: 1000})
	}
	_, err := c.Check(testCtx(t), m)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("5 MiB message: got %v, want ResourceExhausted", err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times, want 0", n)
	}
	// The server keeps serving on the same connection.
	if resp, err := c.Check(testCtx(t), protoReqs(keys("k", 3))); err != nil || len(resp.Responses) != 3 {
		t.Fatalf("a small call after the refusal: %v, %v", resp, err)
	}
}

func TestInvalidAlgorithmNeverBecomesValid(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	algs := []sluicev1.Algorithm{7, 255, 256, 257, 256 + 6, -1, -255, 1<<31 - 1, -1 << 31}
	m := &sluicev1.CheckRequest{}
	for _, a := range algs {
		m.Requests = append(m.Requests, &sluicev1.RateLimitRequest{Name: "n", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 1000, Algorithm: a})
	}
	resp, err := c.Check(testCtx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	got := append([]check.Request(nil), h.last...)
	h.mu.Unlock()
	for i, a := range algs {
		if got[i].Algorithm <= bucket.GCRA {
			t.Errorf("wire algorithm %d arrived as valid %v", a, got[i].Algorithm)
		}
		if got[i].Validate() == nil || resp.Responses[i].Error == "" {
			t.Errorf("wire algorithm %d was not refused: %v", a, resp.Responses[i])
		}
	}
}

func TestHealthFollowsSetReady(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	c := dial(t, s.GRPCAddr())
	hc := healthpb.NewHealthClient(c.Conn())
	ctx := testCtx(t)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range []string{"", RateLimiterService} {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || r.Status != want {
				t.Fatalf("health %q = %v, %v; want %v", svc, r.GetStatus(), err, want)
			}
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	s.SetReady(true)
	check(healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	s.SetReady(true)
	check(healthpb.HealthCheckResponse_SERVING)
}

func TestReflectionListsServices(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	c := dial(t, s.GRPCAddr())
	stream, err := reflectionpb.NewServerReflectionClient(c.Conn()).ServerReflectionInfo(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range r.GetListServicesResponse().GetService() {
		names = append(names, svc.Name)
	}
	for _, want := range []string{"sluice.v1.RateLimiter", "sluice.v1.Admin", "sluice.v1.Peer", "grpc.health.v1.Health", EnvoyService} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
}

type fakeStatus struct{ err error }

func (f fakeStatus) Status(context.Context) (*sluicev1.StatusResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &sluicev1.StatusResponse{Node: "node-a", Keys: 7, Members: []*sluicev1.Member{{Name: "node-a", GrpcAddr: "127.0.0.1:1", State: "alive", Share: 1}}}, nil
}

func TestStatus(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := startServer(t, &fakeHandler{})
	if _, err := dial(t, s.GRPCAddr()).Status(ctx); status.Code(err) != codes.Unimplemented {
		t.Fatalf("no StatusSource: got %v, want Unimplemented", err)
	}
	s = startServer(t, &fakeHandler{}, func(c *ServerConfig) { c.Status = fakeStatus{} })
	r, err := dial(t, s.GRPCAddr()).Status(ctx)
	if err != nil || r.Node != "node-a" || len(r.Members) != 1 {
		t.Fatalf("Status = %v, %v", r, err)
	}
	s = startServer(t, &fakeHandler{}, func(c *ServerConfig) { c.Status = fakeStatus{err: errors.New("boom")} })
	if _, err := dial(t, s.GRPCAddr()).Status(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("failing StatusSource: got %v, want Unavailable", err)
	}
}

func TestHandlerPanicIsInternal(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{panicking: true})
	c := dial(t, s.GRPCAddr())
	ctx := testCtx(t)
	for range 2 { // and the server keeps serving
		if _, err := c.Check(ctx, protoReqs(keys("k", 1))); status.Code(err) != codes.Internal {
			t.Fatalf("panicking handler: got %v, want Internal", err)
		}
	}
}

func TestForwardRPCPassesSender(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := peer.NewPeerClient(peer.PeerConfig{NodeName: "node-b"})
	defer pc.Close()
	rs := keys("k", 3)
	out := make([]check.Outcome, len(rs))
	if err := pc.Forward(testCtx(t), s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if out[i].Owner != "node-b/"+rs[i].Key || !out[i].Allowed() {
			t.Fatalf("out[%d] = %+v", i, out[i])
		}
	}
	if h.calls.Load() != 0 || h.forwards.Load() != 1 {
		t.Fatalf("Check %d times, CheckForwarded %d times; want 0 and 1", h.calls.Load(), h.forwards.Load())
	}
}

func TestShutdownCutsOffAtDeadline(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{block: make(chan struct{})}
	defer close(h.block)
	cfg := ServerConfig{GRPCListener: listen(t), HTTPListener: listen(t), Handler: h}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	pc := peer.NewPeerClient(peer.PeerConfig{Timeout: time.Minute})
	defer pc.Close()
	errc := make(chan error, 1)
	go func() {
		errc <- pc.Forward(context.Background(), s.GRPCAddr(), keys("k", 1), make([]check.Outcome, 1), make([]string, 1))
	}()
	waitFor(t, 10*time.Second, "the forward to reach the handler", func() bool { return h.forwards.Load() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a hung call = %v, want DeadlineExceeded", err)
	}
	if s.ready.Load() {
		t.Fatal("ready after Shutdown")
	}
	s.SetReady(true)
	if s.ready.Load() {
		t.Fatal("SetReady(true) after Shutdown made the server ready")
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the cut-off forward succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("forward still hanging after Shutdown")
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start after Shutdown succeeded")
	}
}

func TestNewServerValidates(t *testing.T) {
	t.Parallel()
	if _, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0"}); err == nil {
		t.Error("no Handler accepted")
	}
	if _, err := NewServer(ServerConfig{Handler: &fakeHandler{}}); err == nil {
		t.Error("no gRPC address accepted")
	}
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", Handler: &fakeHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.GRPCAddr() == "" || s.HTTPAddr() != "" {
		t.Errorf("addresses %q %q; want a gRPC address and no HTTP", s.GRPCAddr(), s.HTTPAddr())
	}
	if err := s.Start(); err == nil {
		t.Error("second Start succeeded")
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The server allocates only the response messages of a client's check:
// the request and outcome slices the Handler works on are pooled. (The
// forwarded checks of the Peer service: TestDecideAllocs in package peer.)
func TestCheckDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", Handler: &fakeHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	m := protoReqs(keys("k", 100))
	s.decide(context.Background(), m.Requests) // warm the pool
	allocs := testing.AllocsPerRun(100, func() { s.decide(context.Background(), m.Requests) })
	// CheckResponse, its pointer slice, one array of 100 messages; the fake
	// handler's owner strings are the keys, and its record of the requests
	// is amortised.
	if allocs > 3+1 {
		t.Fatalf("decide of 100 items: %.0f allocations", allocs)
	}
}

// Check carries every option and the further limits to the Handler.
func TestCheckCarriesMore(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	bad := fullRequest()
	bad.More = append(bad.More, bucket.Limit{Limit: 5}) // no window
	rs := []check.Request{fullRequest(), bad}
	resp, err := c.Check(testCtx(t), protoReqs(rs))
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	got := append([]check.Request(nil), h.last...)
	h.mu.Unlock()
	if !reflect.DeepEqual(got, rs) {
		t.Fatalf("sent\n%+v\narrived as\n%+v", rs, got)
	}
	if r := resp.Responses[0]; r.Status != sluicev1.Status_STATUS_UNDER_LIMIT || r.Limit != 5 || r.Remaining != 2 {
		t.Errorf("valid item answered %v", r)
	}
	if r := resp.Responses[1]; r.Status != sluicev1.Status_STATUS_UNSPECIFIED || r.Error != "limits[3]: window is 0 ms, must be at least 1 ms" {
		t.Errorf("invalid item answered %v", r)
	}
}

// barrierHandler holds every Check until n of them are in progress at once.
type barrierHandler struct {
	trivialHandler
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

func (h *barrierHandler) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	h.mu.Lock()
	if h.arrived++; h.arrived == h.n {
		close(h.all)
	}
	h.mu.Unlock()
	select {
	case <-h.all:
		h.trivialHandler.Check(ctx, reqs, out)
	case <-ctx.Done():
		for i := range out {
			out[i] = check.Outcome{Err: "barrier not reached: " + ctx.Err().Error()}
		}
	}
}

// TestStreamWorkersNeverQueueCalls: with fewer stream workers than calls
// in progress, every call still runs at once (a busy server starts a
// goroutine for the rest), so n calls that each wait for all n to arrive
// finish, with workers, the default and none.
func TestStreamWorkersNeverQueueCalls(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{2, 0, -1} {
		t.Run(strconv.Itoa(workers), func(t *testing.T) {
			t.Parallel()
			const n = 20
			h := &barrierHandler{n: n, all: make(chan struct{})}
			s := startServer(t, h, func(c *ServerConfig) { c.StreamWorkers = workers })
			c := dial(t, s.GRPCAddr())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan string, n)
			for i := range n {
				wg.Go(func() {
					resp, err := c.Check(ctx, protoReqs(keys("k"+strconv.Itoa(i), 1)))
					switch {
					case err != nil:
						errs <- err.Error()
					case resp.Responses[0].Error != "":
						errs <- resp.Responses[0].Error
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Errorf("workers %d: %s", workers, e)
			}
		})
	}
}

// fullRequest is a valid request that sets every field of check.Request,
// the options of the inline limit and three further limits (as package
// peer's tests of the conversions have it).
func fullRequest() check.Request {
	return check.Request{
		Name: "login", Key: "user:42", Hits: 3,
		Limit: bucket.Limit{
			Algorithm: bucket.SlidingWindow, Limit: 1000, WindowMS: 3_600_000, SubWindows: 60,
			Mode: bucket.ModeSoft, SoftPercent: 10, CountRefused: true,
		},
		More: []bucket.Limit{
			{Algorithm: bucket.LeakyBucket, Limit: 5, WindowMS: 1000, Burst: 10, Shaping: true},
			{Algorithm: bucket.GCRA, Limit: 20, WindowMS: 60_000, Burst: 5, Mode: bucket.ModeElastic, ElasticCeiling: 40, ElasticLoadPercent: 70},
			{Algorithm: bucket.FixedWindow, Limit: 10_000, WindowMS: 86_400_000, Calendar: bucket.CalendarMonth, CountRefused: true},
		},
	}
}

// leasingHandler grants a lease of 5 hits for 50 ms on every forwarded
// item whose key starts with "hot" (peer.LeasingHandler), and records
// whether the leasing path was taken.
type leasingHandler struct {
	fakeHandler
	mu      sync.Mutex
	leasing int
}

func (h *leasingHandler) CheckForwardedLeasing(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	h.mu.Lock()
	h.leasing++
	h.mu.Unlock()
	h.fakeHandler.CheckForwarded(ctx, from, reqs, out, movedTo)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "hot") {
			out[i].Lease = check.Lease{Tokens: 5, TTL: 50 * time.Millisecond, GrantedAt: 77}
		}
	}
}

// A public check never carries a lease, nor takes the leasing path of a
// Handler that grants leases to the forwards of other nodes (their leases:
// TestForwardCarriesLeases in package peer).
func TestPublicCheckTakesNoLease(t *testing.T) {
	t.Parallel()
	h := &leasingHandler{}
	s := startServer(t, h)
	c := dial(t, s.GRPCAddr())
	resp, err := c.Check(testCtx(t), &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{peer.RequestToProto(req("hot3", 1))}})
	h.mu.Lock()
	leasing := h.leasing
	h.mu.Unlock()
	if err != nil || len(resp.Responses) != 1 || leasing != 0 {
		t.Fatalf("public check: %v, %v, leasing calls %d", resp, err, leasing)
	}
}
