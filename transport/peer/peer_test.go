package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// checkOwn verifies that out answers exactly reqs, as forwarded by from.
func checkOwn(from string, reqs []check.Request, out []check.Outcome) error {
	for i := range reqs {
		if out[i].Owner != from+"/"+reqs[i].Key || out[i].Err != "" {
			return fmt.Errorf("out[%d] = %+v, want the answer for %s", i, out[i], reqs[i].Key)
		}
	}
	return nil
}

// A lone caller is sent at once, alone: no timer, no waiting for company.
func TestForwardLoneCallerSentAtOnce(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Hour})
	defer pc.Close()
	for i := range 5 {
		rs := []check.Request{req("k"+strconv.Itoa(i), 1)}
		out := make([]check.Outcome, 1)
		if err := pc.Forward(context.Background(), s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
			t.Fatal(err)
		}
		if err := checkOwn("a", rs, out); err != nil {
			t.Fatal(err)
		}
	}
	sizes := h.forwardSizes()
	if len(sizes) != 5 {
		t.Fatalf("RPC sizes %v, want five RPCs of 1 item", sizes)
	}
	for _, n := range sizes {
		if n != 1 {
			t.Fatalf("RPC sizes %v, want five RPCs of 1 item", sizes)
		}
	}
	if in, q := peerState(pc, s.GRPCAddr()); in != 0 || q != 0 {
		t.Fatalf("after the calls: %d in flight, %d queued", in, q)
	}
}

// While the in-flight slots are taken, callers queue; the queue then goes out
// as one batch and each caller gets exactly its own answers.
func TestForwardCoalescesConcurrentCallers(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{block: make(chan struct{})}
	s := startServer(t, h)
	const inFlight, callers = 2, 60
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: inFlight, Timeout: time.Minute})
	defer pc.Close()
	addr := s.GRPCAddr()

	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		rs := keys("c"+strconv.Itoa(i)+"-", 1+i%3)
		wg.Go(func() {
			out := make([]check.Outcome, len(rs))
			if err := pc.Forward(testCtx(t), addr, rs, out, make([]string, len(out))); err != nil {
				errs <- err
				return
			}
			errs <- checkOwn("a", rs, out)
		})
	}
	waitFor(t, 10*time.Second, "two RPCs in flight and the rest queued", func() bool {
		in, q := peerState(pc, addr)
		return in == inFlight && q == callers-inFlight && h.forwards.Load() == inFlight
	})
	close(h.block)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sizes := h.forwardSizes()
	if len(sizes) != inFlight+1 {
		t.Fatalf("%d callers took RPCs of sizes %v; want %d direct and one batch", callers, sizes, inFlight)
	}
	total := 0
	for _, n := range sizes {
		total += n
	}
	if want := callers + callers/3*3; total != want { // sizes 1,2,3 repeating
		t.Fatalf("RPCs carried %d items, want %d", total, want)
	}
}

// Under free-running load every caller gets its own answers, some callers
// give up early, and no call is lost or crossed.
func TestForwardStress(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxBatch: 50, Timeout: time.Minute})
	defer pc.Close()
	addr := s.GRPCAddr()
	const workers, rounds = 16, 150
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	calls := 0
	for w := range workers {
		calls += rounds
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range rounds {
				rs := keys(fmt.Sprintf("w%d-%d-", w, i), 1+rng.IntN(70))
				out := make([]check.Outcome, len(rs))
				ctx, cancel := context.WithCancel(context.Background())
				if i%10 == 9 {
					cancel() // gives up at once: error or answers, never a crossed answer
				}
				err := pc.Forward(ctx, addr, rs, out, make([]string, len(out)))
				cancel()
				if err == nil {
					err = checkOwn("a", rs, out)
				} else if i%10 == 9 && errors.Is(err, context.Canceled) {
					err = nil
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d calls took %d RPCs", calls, h.forwards.Load())
	waitFor(t, 10*time.Second, "the peer to go idle", func() bool {
		in, q := peerState(pc, addr)
		return in == 0 && q == 0
	})
}

func TestForwardSplitsLargeCalls(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxBatch: 10})
	defer pc.Close()
	rs := keys("k", 25)
	out := make([]check.Outcome, len(rs))
	if err := pc.Forward(testCtx(t), s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	if err := checkOwn("a", rs, out); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(h.forwardSizes()); got != "[10 10 5]" {
		t.Fatalf("RPC sizes %s, want [10 10 5]", got)
	}
}

// A closed port fails fast with Unavailable, long before the deadline.
func TestForwardUnreachablePeer(t *testing.T) {
	t.Parallel()
	l := listen(t)
	addr := l.Addr().String()
	l.Close()
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: time.Minute})
	defer pc.Close()
	for range 3 { // the first dial and the reconnects after it
		start := time.Now()
		err := pc.Forward(context.Background(), addr, keys("k", 1), make([]check.Outcome, 1), make([]string, 1))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("forward to a closed port: %v (after %v), want Unavailable", err, time.Since(start))
		}
	}
}

// A peer that never answers costs each caller its deadline, no more: both the
// callers on the wire and those queued behind them.
func TestForwardHangingPeer(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{block: make(chan struct{}), hang: true}
	s := startServer(t, h)
	t.Cleanup(func() { close(h.block) }) // runs before the server's Shutdown
	const timeout = 100 * time.Millisecond
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: timeout, MaxInFlight: 1})
	defer pc.Close()
	const callers = 6
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			start := time.Now()
			err := pc.Forward(context.Background(), s.GRPCAddr(), keys("k"+strconv.Itoa(i), 1), make([]check.Outcome, 1), make([]string, 1))
			if err == nil || !errors.Is(err, context.DeadlineExceeded) {
				errs <- fmt.Errorf("caller %d: %v, want DeadlineExceeded", i, err)
				return
			}
			if d := time.Since(start); d < timeout {
				errs <- fmt.Errorf("caller %d gave up after %v, before its deadline", i, d)
				return
			}
			errs <- nil
		}()
	}
	for range callers {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a forward to a hanging peer is still waiting after 30 s")
		}
	}
}

// A caller whose context ends while its items wait in the queue returns at
// once with ctx.Err(), and the batch that later goes out skips it.
func TestForwardCancelWhileQueued(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{block: make(chan struct{})}
	s := startServer(t, h)
	addr := s.GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: 1, Timeout: time.Minute})
	defer pc.Close()

	first := make(chan error, 1)
	go func() {
		first <- pc.Forward(context.Background(), addr, keys("first", 1), make([]check.Outcome, 1), make([]string, 1))
	}()
	waitFor(t, 10*time.Second, "the first forward on the wire", func() bool { return h.forwards.Load() == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	out := make([]check.Outcome, 1)
	go func() { queued <- pc.Forward(ctx, addr, keys("queued", 1), out, make([]string, len(out))) }()
	waitFor(t, 10*time.Second, "the second forward queued", func() bool { _, q := peerState(pc, addr); return q == 1 })
	cancel()
	select {
	case err := <-queued:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled queued forward: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("canceled queued forward did not return")
	}

	// A third caller queues behind the abandoned one; when the first RPC
	// ends, the batch carries the third caller only.
	third := make(chan error, 1)
	rs := keys("third", 2)
	out3 := make([]check.Outcome, 2)
	go func() { third <- pc.Forward(context.Background(), addr, rs, out3, make([]string, len(out3))) }()
	waitFor(t, 10*time.Second, "the third forward queued", func() bool { _, q := peerState(pc, addr); return q == 2 })
	close(h.block)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if err := checkOwn("a", rs, out3); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(h.forwardSizes()); got != "[1 2]" {
		t.Fatalf("RPC sizes %s, want [1 2]", got)
	}
	if out[0] != (check.Outcome{}) {
		t.Fatalf("the abandoned caller's out was written: %+v", out[0])
	}
}

func TestForwardEdges(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	ctx := testCtx(t)
	if err := pc.Forward(ctx, s.GRPCAddr(), nil, nil, nil); err != nil {
		t.Errorf("empty forward: %v", err)
	}
	if err := pc.Forward(ctx, s.GRPCAddr(), keys("k", 2), make([]check.Outcome, 1), make([]string, 1)); err == nil {
		t.Error("forward with a short out succeeded")
	}
	if err := pc.Forward(ctx, "", keys("k", 1), make([]check.Outcome, 1), make([]string, 1)); err == nil {
		t.Error("forward to an empty address succeeded")
	}
	if h.forwards.Load() != 0 {
		t.Errorf("%d RPCs for edge cases, want 0", h.forwards.Load())
	}
	if err := pc.Forward(ctx, s.GRPCAddr(), keys("k", 1), make([]check.Outcome, 1), make([]string, 1)); err != nil {
		t.Fatal(err)
	}
	if err := pc.ClosePeer(s.GRPCAddr()); err != nil {
		t.Fatal(err)
	}
	if err := pc.Forward(ctx, s.GRPCAddr(), keys("k", 1), make([]check.Outcome, 1), make([]string, 1)); err != nil {
		t.Fatalf("forward after ClosePeer (redials): %v", err)
	}
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pc.Forward(ctx, s.GRPCAddr(), keys("k", 1), make([]check.Outcome, 1), make([]string, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("forward after Close: %v, want ErrClosed", err)
	}
	if err := pc.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// Close fails what is on the wire and queued, and returns once nothing is.
func TestPeerClientCloseFailsInFlight(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{block: make(chan struct{})}
	s := startServer(t, h)
	t.Cleanup(func() { close(h.block) })
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: 1, Timeout: time.Minute})
	addr := s.GRPCAddr()
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			errs <- pc.Forward(context.Background(), addr, keys("k"+strconv.Itoa(i), 1), make([]check.Outcome, 1), make([]string, 1))
		}()
	}
	waitFor(t, 10*time.Second, "one forward on the wire, two queued", func() bool {
		in, q := peerState(pc, addr)
		return in == 1 && q == 2 && h.forwards.Load() == 1
	})
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-errs:
			if err == nil {
				t.Error("a forward succeeded across Close")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("forward still waiting after Close")
		}
	}
}

// A forwarded request keeps its further limits (More) and every option of
// its limits, and the answer is the combined one.
func TestForwardKeepsMore(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	defer pc.Close()
	full := fullRequest()
	alone := check.Request{Name: "api", Key: "alone", Hits: 6, More: []bucket.Limit{{Limit: 100, WindowMS: 1000}, {Algorithm: bucket.GCRA, Limit: 5, WindowMS: 60_000}}}
	rs := []check.Request{full, req("plain", 1), alone}
	out := make([]check.Outcome, len(rs))
	for range 2 { // the second time on recycled messages
		if err := pc.Forward(testCtx(t), s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		got := append([]check.Request(nil), h.lastFwd...)
		h.mu.Unlock()
		if !reflect.DeepEqual(got, rs) {
			t.Fatalf("forwarded\n%+v\narrived as\n%+v", rs, got)
		}
		if err := checkOwn("a", rs, out); err != nil {
			t.Fatal(err)
		}
		// full: 3 hits against limits of 1000, 5, 20, 10000: 2 remaining of 5.
		if o := out[0]; !o.Allowed() || o.Limit != 5 || o.Remaining != 2 {
			t.Errorf("full request answered %+v, want allowed, 2 of 5 remaining", o)
		}
		// alone: 6 hits, the second limit (5) refuses.
		if o := out[2]; o.Status != bucket.OverLimit || o.Limit != 5 {
			t.Errorf("limits-alone request answered %+v, want over the limit of 5", o)
		}
	}
}

func TestForwardStandInReachesCheckStandIn(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	addr := startServer(t, h).GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	defer pc.Close()
	reqs := []check.Request{
		{Name: "n", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 5, WindowMS: 1000}},
		{Name: "n", Key: "k2", Hits: 1, Limit: bucket.Limit{Limit: 5, WindowMS: 1000}},
	}
	out := make([]check.Outcome, 2)
	if err := pc.ForwardStandIn(context.Background(), addr, reqs, []string{"10.0.0.1:8081", ""}, out, make([]string, 2)); err != nil {
		t.Fatal(err)
	}
	if h.standIns.Load() != 1 {
		t.Fatalf("CheckStandIn called %d times, want 1", h.standIns.Load())
	}
	h.mu.Lock()
	got, pull := append([]check.Request(nil), h.lastFwd...), h.lastPull
	h.mu.Unlock()
	if len(got) != 2 || len(pull) != 2 || pull[0] != "10.0.0.1:8081" || pull[1] != "" {
		t.Fatalf("the handler saw %+v pulling from %q, want pull_from carried per request", got, pull)
	}
	if out[0].Err != "" || out[0].Status == bucket.StatusUnspecified {
		t.Fatalf("answer %+v", out[0])
	}
}

func TestResetBackoffReconnectsAtOnce(t *testing.T) {
	t.Parallel()
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	defer pc.Close()
	pc.ResetBackoff("127.0.0.1:1") // unknown peer: nothing to do
	h := &fakeHandler{}
	addr := startServer(t, h).GRPCAddr()
	reqs := []check.Request{{Name: "n", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 5, WindowMS: 1000}}}
	out := make([]check.Outcome, 1)
	if err := pc.Forward(context.Background(), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	pc.ResetBackoff(addr) // a known, healthy peer: calls go on
	if err := pc.Forward(context.Background(), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatalf("forward after ResetBackoff: %v", err)
	}
}

// TestResetBackoffAfterRestart: a peer that was down (forwards refused,
// the connection waiting out its reconnect backoff) comes back on the same
// address; after ResetBackoff the next forward reaches it, instead of
// failing with the error of the last refused dial.
func TestResetBackoffAfterRestart(t *testing.T) {
	t.Parallel()
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	defer pc.Close()
	h := &fakeHandler{}
	ln := listen(t)
	addr := ln.Addr().String()
	s, err := newTestServer(testConfig{GRPCListener: ln, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	reqs := []check.Request{{Name: "n", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 5, WindowMS: 1000}}}
	out := make([]check.Outcome, 1)
	if err := pc.Forward(context.Background(), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// Down: forwards fail until the connection has been refused a few
	// times, so that it waits out a backoff longer than this test's wait.
	for i := 0; i < 5; i++ {
		if err := pc.Forward(context.Background(), addr, reqs, out, make([]string, len(out))); err == nil {
			t.Fatal("forward to a stopped peer succeeded")
		}
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	startServer(t, h, func(c *testConfig) { c.GRPCListener = ln2 })
	pc.ResetBackoff(addr)
	if err := pc.Forward(context.Background(), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatalf("first forward after the peer came back and ResetBackoff: %v", err)
	}
}

// A peer that comes back on the same address (a restarted node) is woken
// with ResetBackoff; a forward made right after must reach it, not fail
// with the error of the old process's last dial ("connection refused"),
// which would send the check to a stand-in whose decision the owner never
// sees (docs/guarantees.md, "Restart after a crash").
func TestForwardRightAfterResetBackoffReachesTheReturnedPeer(t *testing.T) {
	t.Parallel()
	serveOn := func(ln net.Listener) *testServer {
		t.Helper()
		s, err := newTestServer(testConfig{GRPCListener: ln, Handler: &fakeHandler{}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	shutdown := func(s *testServer) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
	ln := listen(t)
	addr := ln.Addr().String()
	old := serveOn(ln)
	pc := NewPeerClient(PeerConfig{NodeName: "a", Timeout: 5 * time.Second})
	defer pc.Close()
	reqs := []check.Request{req("k", 1)}
	out := make([]check.Outcome, 1)
	if err := pc.Forward(testCtx(t), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	shutdown(old)
	// The old process is gone: wait until a dial to it has failed (the
	// connection is in gRPC's TRANSIENT_FAILURE, waiting out a backoff).
	var lastErr error
	waitFor(t, 10*time.Second, "a forward to fail with connection refused", func() bool {
		lastErr = pc.Forward(testCtx(t), addr, reqs, out, make([]string, len(out)))
		return lastErr != nil && strings.Contains(lastErr.Error(), "connection refused")
	})
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	back := serveOn(ln2)
	defer shutdown(back)
	pc.ResetBackoff(addr)
	if err := pc.Forward(testCtx(t), addr, reqs, out, make([]string, len(out))); err != nil {
		t.Fatalf("forward right after ResetBackoff to a peer back on %s: %v", addr, err)
	}
	if err := checkOwn("a", reqs, out); err != nil {
		t.Fatal(err)
	}
}
