package peer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/security"
)

// rpcCounter counts the unary Peer/Forward calls and the Peer/Forwards
// streams a server was asked for.
type rpcCounter struct {
	unary, streams atomic.Int64
}

func (c *rpcCounter) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if info.FullMethod == "/sluice.v1.Peer/Forward" {
				c.unary.Add(1)
			}
			return next(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			if info.FullMethod == forwardsMethod {
				c.streams.Add(1)
			}
			return next(srv, ss)
		}),
	}
}

// forwardN makes n forwards of one item each, in turn, and checks every
// answer is its own item's.
func forwardN(t *testing.T, pc *PeerClient, addr string, n int) {
	t.Helper()
	for i := range n {
		rs := []check.Request{req("k"+strconv.Itoa(i), 1)}
		out := make([]check.Outcome, 1)
		if err := pc.Forward(testCtx(t), addr, rs, out, make([]string, 1)); err != nil {
			t.Fatalf("forward %d: %v", i, err)
		}
		if err := checkOwn("a", rs, out); err != nil {
			t.Fatalf("forward %d: %v", i, err)
		}
	}
}

// Once the connection is up, forwards travel as envelopes on one Forwards
// stream, not as unary calls; UnaryForwards keeps them unary.
func TestForwardsTravelOnOneStream(t *testing.T) {
	t.Parallel()
	for _, unary := range []bool{false, true} {
		t.Run("unary="+strconv.FormatBool(unary), func(t *testing.T) {
			t.Parallel()
			h := &fakeHandler{}
			var c rpcCounter
			s := startServer(t, h, func(cfg *testConfig) { cfg.GRPCOptions = c.options() })
			pc := NewPeerClient(PeerConfig{NodeName: "a", UnaryForwards: unary})
			defer pc.Close()
			const n = 200
			forwardN(t, pc, s.GRPCAddr(), n)
			if got := h.forwards.Load(); got != n {
				t.Fatalf("%d forwards decided, want %d", got, n)
			}
			u, st := c.unary.Load(), c.streams.Load()
			t.Logf("%d forwards: %d unary calls, %d streams", n, u, st)
			if unary && (u != n || st != 0) {
				t.Fatalf("UnaryForwards: %d unary calls and %d streams, want %d and 0", u, st, n)
			}
			// The first forward dials and goes unary (a stream is opened
			// only on a ready connection); the rest share one stream.
			if !unary && (u > 1 || st != 1) {
				t.Fatalf("%d unary calls and %d streams, want at most 1 and 1", u, st)
			}
		})
	}
}

// oldPeer is a node of a release without Forwards.
type oldPeer struct{ *Server }

func (oldPeer) Forwards(grpc.BidiStreamingServer[sluicev1.ForwardEnvelope, sluicev1.ForwardReply]) error {
	return status.Error(codes.Unimplemented, "method Forwards not implemented")
}

// A peer that does not serve Forwards (an older release, in a rolling
// upgrade) gets unary forwards, every one answered, and the stream is not
// asked for again on every call.
func TestForwardsFallBackToUnaryForAnOldPeer(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	var c rpcCounter
	gs := grpc.NewServer(c.options()...)
	sluicev1.RegisterPeerServer(gs, oldPeer{NewServer(ServerConfig{Handler: h})})
	lis := listen(t)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	defer pc.Close()
	const n = 100
	forwardN(t, pc, lis.Addr().String(), n)
	if got := h.forwards.Load(); got != n {
		t.Fatalf("%d forwards decided, want %d", got, n)
	}
	if st := c.streams.Load(); st > 1 {
		t.Fatalf("Forwards asked for %d times in %d calls, want at most once per %v", st, n, unaryRetry)
	}
}

// rawForwards opens a Forwards stream to s by hand, proving its opening
// with p when p is set.
func rawForwards(t *testing.T, addr string, p *security.Prover) grpc.BidiStreamingClient[sluicev1.ForwardEnvelope, sluicev1.ForwardReply] {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if p != nil {
		opts = append(opts, security.WithStreamProofs(p))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := sluicev1.NewPeerClient(conn).Forwards(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// exchange sends env on st and returns the reply.
func exchange(t *testing.T, st grpc.BidiStreamingClient[sluicev1.ForwardEnvelope, sluicev1.ForwardReply], env *sluicev1.ForwardEnvelope) *sluicev1.ForwardReply {
	t.Helper()
	if err := st.Send(env); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("envelope %d: %v", env.GetId(), err)
	}
	if r.GetId() != env.GetId() {
		t.Fatalf("reply for envelope %d, want %d", r.GetId(), env.GetId())
	}
	return r
}

func oneItem(key string) *sluicev1.ForwardRequest {
	return &sluicev1.ForwardRequest{From: "a", Requests: []*sluicev1.RateLimitRequest{{Name: "api", Key: key, Limit: 10, WindowMs: 60_000}}}
}

// A malformed envelope (no request, no timeout) is refused with a message
// saying what is wrong, nothing is decided, and the stream goes on serving.
func TestForwardsRefuseMalformedEnvelopes(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	st := rawForwards(t, s.GRPCAddr(), nil)
	for _, tc := range []struct {
		env  *sluicev1.ForwardEnvelope
		want string
	}{
		{&sluicev1.ForwardEnvelope{Id: 1, TimeoutMicros: 1e6}, "forward envelope without a request"},
		{&sluicev1.ForwardEnvelope{Id: 2, Request: oneItem("k")}, "forward envelope timeout_micros is 0, want more than 0"},
		{&sluicev1.ForwardEnvelope{Id: 3, Request: oneItem("k"), TimeoutMicros: -5}, "forward envelope timeout_micros is -5, want more than 0"},
	} {
		r := exchange(t, st, tc.env)
		if codes.Code(r.GetCode()) != codes.InvalidArgument || r.GetMessage() != tc.want || r.GetResponse() != nil {
			t.Errorf("envelope %d: reply %v, want InvalidArgument %q", tc.env.GetId(), r, tc.want)
		}
	}
	if got := h.forwards.Load(); got != 0 {
		t.Fatalf("%d malformed envelopes decided", got)
	}
	r := exchange(t, st, &sluicev1.ForwardEnvelope{Id: 4, Request: oneItem("k"), TimeoutMicros: 1e6})
	if err := replyErr(r); err != nil || len(r.GetResponse().GetResponses()) != 1 {
		t.Fatalf("a good envelope after the bad ones: %v, %v", r, err)
	}
}

// With members proven by the gossip key, a Forwards stream needs a proof to
// open and every envelope one of its own: a stream from a node with another
// key is refused, and on a proven stream an envelope without a proof, with
// a wrong one, or with one already used is refused and decides nothing.
func TestForwardsEnvelopeProofs(t *testing.T) {
	t.Parallel()
	good, _ := security.NewProver([][]byte{testKey(1)}, 10*time.Second)
	other, _ := security.NewProver([][]byte{testKey(2)}, 10*time.Second)
	h := &fakeHandler{}
	var c rpcCounter
	server, _ := security.NewProver([][]byte{testKey(1)}, 10*time.Second)
	s := startServer(t, h, func(cfg *testConfig) { cfg.Prover = server; cfg.GRPCOptions = c.options() })

	pc := NewPeerClient(PeerConfig{NodeName: "a", Prover: good})
	defer pc.Close()
	forwardN(t, pc, s.GRPCAddr(), 20)
	if u := c.unary.Load(); u > 1 {
		t.Fatalf("%d of 20 proven forwards went unary, want at most the first", u)
	}

	bad := NewPeerClient(PeerConfig{NodeName: "a", Prover: other, Timeout: 5 * time.Second})
	defer bad.Close()
	before := h.forwards.Load()
	for i := range 3 {
		err := bad.Forward(testCtx(t), s.GRPCAddr(), []check.Request{req("x", 1)}, make([]check.Outcome, 1), make([]string, 1))
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("forward %d with another key: %v, want Unauthenticated", i, err)
		}
	}
	if h.forwards.Load() != before {
		t.Fatal("a forward with another key was decided")
	}

	st := rawForwards(t, s.GRPCAddr(), good)
	env := &sluicev1.ForwardEnvelope{Id: 7, Request: oneItem("p"), TimeoutMicros: 1e6}
	if r := exchange(t, st, env); codes.Code(r.GetCode()) != codes.Unauthenticated {
		t.Fatalf("envelope without a proof: %v, want Unauthenticated", r)
	}
	env.Proof, _ = other.Sign(time.Now(), forwardsMethod, env)
	if r := exchange(t, st, env); codes.Code(r.GetCode()) != codes.Unauthenticated {
		t.Fatalf("envelope proven with another key: %v, want Unauthenticated", r)
	}
	env.Proof = ""
	env.Proof, _ = good.Sign(time.Now(), forwardsMethod, env)
	if r := exchange(t, st, env); replyErr(r) != nil {
		t.Fatalf("proven envelope: %v", r)
	}
	if r := exchange(t, st, env); codes.Code(r.GetCode()) != codes.Unauthenticated {
		t.Fatalf("the same envelope and proof again: %v, want Unauthenticated", r)
	}
	if got := h.forwards.Load() - before; got != 1 {
		t.Fatalf("%d envelopes decided on the raw stream, want 1 (the proven one)", got)
	}
	if s.AuthRefused() == 0 {
		t.Fatal("no refusal counted")
	}
}

// Shutdown answers the envelopes a stream took before it and then ends the
// stream (GracefulStop would wait for it forever otherwise): a forward being
// decided when Shutdown begins gets its answer, and Shutdown returns.
func TestForwardsShutdownAnswersWhatItTook(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	forwardN(t, pc, s.GRPCAddr(), 3) // the stream is open
	block := make(chan struct{})
	h.mu.Lock()
	h.block = block
	h.mu.Unlock()
	errc := make(chan error, 1)
	rs := []check.Request{req("late", 1)}
	out := make([]check.Outcome, 1)
	go func() { errc <- pc.Forward(testCtx(t), s.GRPCAddr(), rs, out, make([]string, 1)) }()
	waitFor(t, 10*time.Second, "the forward to be deciding", func() bool { return h.forwards.Load() == 4 })
	var wg sync.WaitGroup
	var shutErr error
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shutErr = s.Shutdown(ctx)
	})
	waitFor(t, 10*time.Second, "shutdown to begin", s.stopping.Load)
	close(block)
	if err := <-errc; err != nil {
		t.Fatalf("the forward taken before shutdown: %v", err)
	}
	if err := checkOwn("a", rs, out); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if shutErr != nil {
		t.Fatalf("Shutdown: %v", shutErr)
	}
}

// A caller that stops waiting cancels its envelope: the peer stops deciding
// it at once, not at the envelope's timeout (a minute here), as a unary
// call's cancellation would stop it.
func TestForwardsCancelReachesThePeer(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	var c rpcCounter
	s := startServer(t, h, func(cfg *testConfig) { cfg.GRPCOptions = c.options() })
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	forwardN(t, pc, s.GRPCAddr(), 3) // the stream is open
	h.mu.Lock()
	h.block = make(chan struct{}) // never closed: only the context ends the wait
	h.mu.Unlock()
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		errc <- pc.Forward(ctx, s.GRPCAddr(), []check.Request{req("c", 1)}, make([]check.Outcome, 1), make([]string, 1))
	}()
	waitFor(t, 10*time.Second, "the forward to be deciding", func() bool { return h.forwards.Load() == 4 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled forward: %v, want context.Canceled", err)
	}
	waitFor(t, 10*time.Second, "the peer to stop deciding the canceled envelope", func() bool { return h.ctxEnded.Load() == 1 })
	if u := c.unary.Load(); u > 1 {
		t.Fatalf("%d unary calls: the forwards did not use the stream", u)
	}
}

// stuckPeer serves Forwards without ever reading: a peer whose process
// stopped with its connection open.
type stuckPeer struct {
	sluicev1.UnimplementedPeerServer
}

func (stuckPeer) Forwards(st grpc.BidiStreamingServer[sluicev1.ForwardEnvelope, sluicev1.ForwardReply]) error {
	<-st.Context().Done()
	return nil
}

// Forwards to a peer that reads nothing fill the stream's flow-control
// window until a send blocks; every caller still returns by its own
// deadline with an error, and the stream is cut, not left wedged.
func TestForwardsToAStuckPeerEndAtTheirDeadlines(t *testing.T) {
	t.Parallel()
	gs := grpc.NewServer(grpc.InitialWindowSize(StreamWindowSize), grpc.InitialConnWindowSize(ConnWindowSize))
	sluicev1.RegisterPeerServer(gs, stuckPeer{})
	lis := listen(t)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	const timeout = 300 * time.Millisecond
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: timeout, MaxInFlight: 64})
	defer pc.Close()
	addr := lis.Addr().String()
	// Dial first (a unary Forward, answered UNIMPLEMENTED), so the big
	// calls below find a ready connection and use the stream.
	_ = pc.Forward(testCtx(t), addr, []check.Request{req("dial", 1)}, make([]check.Outcome, 1), make([]string, 1))
	// Each call carries 1,000 items of a 1 KiB key, about 1 MiB: the
	// second fills the stream's window and the write quota behind it.
	big := make([]check.Request, 1000)
	for i := range big {
		big[i] = req(strings.Repeat("k", 1024)+strconv.Itoa(i), 1)
	}
	const callers = 8
	errs := make(chan error, callers)
	for range callers {
		go func() {
			errs <- pc.Forward(context.Background(), addr, big, make([]check.Outcome, len(big)), make([]string, len(big)))
		}()
	}
	deadline := time.After(30 * time.Second) // a wedged caller would wait for the connection's keepalive, or forever
	for i := range callers {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatalf("caller %d: answered by a peer that reads nothing", i)
			}
			t.Logf("caller %d: %v", i, err)
		case <-deadline:
			t.Fatalf("%d of %d callers still waiting; each should end at its %v deadline", callers-i, callers, timeout)
		}
	}
}

// fakeForwards is the server's side of a Forwards stream, recording replies.
type fakeForwards struct {
	grpc.ServerStream
	ctx     context.Context
	replies chan *sluicev1.ForwardReply
}

func (f *fakeForwards) Context() context.Context            { return f.ctx }
func (f *fakeForwards) Send(r *sluicev1.ForwardReply) error { f.replies <- r; return nil }
func (f *fakeForwards) Recv() (*sluicev1.ForwardEnvelope, error) {
	<-f.ctx.Done()
	return nil, f.ctx.Err()
}

// FuzzForwardEnvelope: any envelope a Forwards stream receives gets at most
// one reply, with its id; a cancellation gets none; an envelope without a
// request or a positive timeout is refused with INVALID_ARGUMENT and
// decides nothing; an answer has one item per request.
func FuzzForwardEnvelope(f *testing.F) {
	seed := func(m *sluicev1.ForwardEnvelope) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&sluicev1.ForwardEnvelope{Id: 1, Request: oneItem("k"), TimeoutMicros: 1e6})
	seed(&sluicev1.ForwardEnvelope{Id: 2, Request: &sluicev1.ForwardRequest{Cluster: "other"}, TimeoutMicros: 5})
	seed(&sluicev1.ForwardEnvelope{Id: 3, TimeoutMicros: 1e6})
	seed(&sluicev1.ForwardEnvelope{Id: 4, Cancel: true})
	seed(&sluicev1.ForwardEnvelope{Id: 5, Request: oneItem("k"), TimeoutMicros: -1, Proof: "v1:x"})
	h := &fakeHandler{}
	g := NewServer(ServerConfig{Handler: h})
	f.Fuzz(func(t *testing.T, data []byte) {
		var env sluicev1.ForwardEnvelope
		if proto.Unmarshal(data, &env) != nil {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st := &fakeForwards{ctx: ctx, replies: make(chan *sluicev1.ForwardReply, 2)}
		fs := &forwardsStream{stream: st, running: map[uint64]context.CancelFunc{}}
		fs.idle = sync.NewCond(&fs.mu)
		before := h.forwards.Load()
		g.take(ctx, fs, &env)
		// take answers a refusal at once and a forward from a goroutine;
		// wait for that one to finish.
		fs.mu.Lock()
		for len(fs.running) > 0 {
			fs.idle.Wait()
		}
		fs.mu.Unlock()
		decided := h.forwards.Load() - before
		if env.Cancel {
			if len(st.replies) != 0 || decided != 0 {
				t.Fatalf("a cancellation got %d replies and decided %d", len(st.replies), decided)
			}
			return
		}
		if len(st.replies) != 1 {
			t.Fatalf("%d replies, want 1", len(st.replies))
		}
		r := <-st.replies
		if r.GetId() != env.GetId() {
			t.Fatalf("reply id %d for envelope %d", r.GetId(), env.GetId())
		}
		malformed := env.GetRequest() == nil || env.GetTimeoutMicros() <= 0
		if malformed && (codes.Code(r.GetCode()) != codes.InvalidArgument || decided != 0) {
			t.Fatalf("malformed envelope: reply %v, %d decided", r, decided)
		}
		if r.GetCode() == 0 {
			if n := len(env.GetRequest().GetRequests()); len(r.GetResponse().GetResponses()) != n {
				t.Fatalf("%d answers for %d requests", len(r.GetResponse().GetResponses()), n)
			}
		} else if r.GetResponse() != nil {
			t.Fatalf("an error reply with a response: %v", r)
		}
	})
}
