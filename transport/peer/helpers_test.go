package peer

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/internal/wiretest"
	"github.com/sluicehq/sluice/transport/security"
)

// fakeHandler decides like a limiter with no memory: a valid request is over
// its limit when Hits > Limit. Owner echoes the key prefixed with the
// sender, so tests can check each answer belongs to its item.
type fakeHandler struct {
	forwards atomic.Int64 // CheckForwarded calls (= Forward RPCs)
	standIns atomic.Int64 // CheckStandIn calls
	ctxEnded atomic.Int64 // CheckForwarded calls that stopped waiting on block because their context ended
	mu       sync.Mutex
	sizes    []int           // items per CheckForwarded call, in order
	lastFwd  []check.Request // copy of the last CheckForwarded's requests
	lastPull []string        // copy of the last CheckStandIn's pullFrom
	lastFrom string
	block    chan struct{} // when set, CheckForwarded waits on it (or ctx, unless hang)
	hang     bool          // wait on block even when the RPC's context ends
}

var _ ForwardHandler = (*fakeHandler)(nil)

// CheckStandIn records the call, then answers like CheckForwarded.
func (h *fakeHandler) CheckStandIn(ctx context.Context, from string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) {
	h.standIns.Add(1)
	h.mu.Lock()
	h.lastPull = append([]string(nil), pullFrom...)
	h.mu.Unlock()
	h.CheckForwarded(ctx, from, reqs, out, movedTo)
}

func (h *fakeHandler) CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.forwards.Add(1)
	h.mu.Lock()
	h.sizes = append(h.sizes, len(reqs))
	h.lastFwd = append(h.lastFwd[:0], reqs...)
	h.lastFrom = from
	block := h.block
	h.mu.Unlock()
	if block != nil && h.hang {
		<-block
	} else if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			h.ctxEnded.Add(1)
		}
	}
	decide(reqs, out, from+"/")
}

func (h *fakeHandler) forwardSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// testConfig configures a testServer: the fields of transport.ServerConfig
// that the tests of the Peer service set.
type testConfig struct {
	GRPCListener net.Listener // nil: a loopback port the kernel chooses
	Handler      ForwardHandler
	Peer         PeerHandler
	ClusterName  string
	Prover       *security.Prover
	Logger       *slog.Logger
	GRPCOptions  []grpc.ServerOption
}

// testServer serves the Peer service (a Server) alone on a gRPC listener,
// composed as transport.Server composes it, which this package cannot
// import: the same server options, the guard's checks of internal calls
// and of the openings of streams, panics recovered as INTERNAL, and a
// Shutdown that ends the Forwards streams.
type testServer struct {
	grpc     *grpc.Server
	guard    *security.Guard
	lis      net.Listener
	drain    chan struct{} // closed when Shutdown begins
	stopping atomic.Bool
	wg       sync.WaitGroup
	shutOnce sync.Once
}

func newTestServer(cfg testConfig) (*testServer, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &testServer{lis: cfg.GRPCListener, drain: make(chan struct{})}
	s.guard = security.NewGuard(nil, cfg.Prover, time.Now, log)
	recoverUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return next(ctx, req)
	}
	authorizeUnary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if err := s.guard.Authorize(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
	authorizeStream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		if err := s.guard.AuthorizeStream(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return next(srv, ss)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(4 << 20), // transport.DefaultMaxRecvMsgSize
		grpc.ChainUnaryInterceptor(recoverUnary, authorizeUnary),
		grpc.ChainStreamInterceptor(authorizeStream),
		grpc.InitialWindowSize(StreamWindowSize),
		grpc.InitialConnWindowSize(ConnWindowSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: PeerKeepaliveTime / 2}),
		grpc.NumStreamWorkers(128), // transport.DefaultStreamWorkers
	}
	s.grpc = grpc.NewServer(append(opts, cfg.GRPCOptions...)...)
	sluicev1.RegisterPeerServer(s.grpc, NewServer(ServerConfig{
		Handler: cfg.Handler, Peer: cfg.Peer, ClusterName: cfg.ClusterName,
		Guard: s.guard, Logger: log, Draining: s.drain, Stopping: s.stopping.Load,
	}))
	return s, nil
}

// Start serves in a goroutine, on a loopback port when no listener was given.
func (s *testServer) Start() error {
	if s.lis == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.lis = l
	}
	lis := s.lis
	s.wg.Go(func() { s.grpc.Serve(lis) })
	return nil
}

// GRPCAddr is the address the server listens on.
func (s *testServer) GRPCAddr() string { return s.lis.Addr().String() }

// AuthRefused is how many calls and envelopes the guard refused.
func (s *testServer) AuthRefused() uint64 { return s.guard.Refused() }

// Shutdown is transport.Server's: it ends the Forwards streams, lets calls
// in progress finish until ctx ends (then cuts them off, returning
// ctx.Err()), and waits for the serving goroutine.
func (s *testServer) Shutdown(ctx context.Context) error {
	var cut error
	s.shutOnce.Do(func() {
		s.stopping.Store(true)
		close(s.drain)
		stopped := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			s.grpc.Stop()
			<-stopped
			cut = ctx.Err()
		}
		s.wg.Wait()
	})
	return cut
}

// startServer starts a testServer on a loopback port chosen by the kernel
// and shuts it down when the test ends.
func startServer(t testing.TB, h ForwardHandler, edit ...func(*testConfig)) *testServer {
	t.Helper()
	cfg := testConfig{GRPCListener: listen(t), Handler: h}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := newTestServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}

// peerState reads a peer's batching state (0, 0 when not dialled yet).
func peerState(pc *PeerClient, addr string) (inflight, queued int) {
	v, ok := pc.peers.Load(addr)
	if !ok {
		return 0, 0
	}
	p := v.(*peer)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight, len(p.queue)
}

// testKey is a gossip key of 32 bytes, distinct for each b.
func testKey(b byte) []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

// protoReqs is rs on the wire, as a client's call would carry them.
func protoReqs(rs []check.Request) *sluicev1.CheckRequest {
	m := &sluicev1.CheckRequest{}
	for _, r := range rs {
		m.Requests = append(m.Requests, RequestToProto(r))
	}
	return m
}

// The shared helpers of the transport tests (wiretest), by their short
// names here.
var (
	decide  = wiretest.Decide
	req     = wiretest.Req
	keys    = wiretest.Keys
	listen  = wiretest.Listen
	waitFor = wiretest.WaitFor
	testCtx = wiretest.Ctx
	dial    = wiretest.Dial
)
