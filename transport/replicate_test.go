package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// fakePeer is a PeerHandler over a map: it installs what is newer and
// answers pulls from what it holds, recording every call.
type fakePeer struct {
	mu         sync.Mutex
	held       map[string]bucket.Counter // name + "\x00" + key
	replicates []replicateCall
	pulls      []pullCall
	block      chan struct{} // when set, both methods wait on it, ignoring ctx
}

type replicateCall struct {
	from    string
	handoff bool
	n       int
}

type pullCall struct {
	from    string
	n       int
	release bool
	ttl     time.Duration
}

func (c pullCall) String() string {
	return fmt.Sprintf("{%s %d %t %v}", c.from, c.n, c.release, c.ttl)
}

var _ PeerHandler = (*fakePeer)(nil)

func (h *fakePeer) Replicate(_ context.Context, from string, handoff bool, counters []bucket.Counter) (installed, stale int) {
	h.mu.Lock()
	h.replicates = append(h.replicates, replicateCall{from, handoff, len(counters)})
	block := h.block
	h.mu.Unlock()
	if block != nil {
		<-block
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = make(map[string]bucket.Counter)
	}
	for _, c := range counters {
		k := c.Name + "\x00" + c.Key
		if c.Version > h.held[k].Version {
			h.held[k] = c
			installed++
		} else {
			stale++
		}
	}
	return installed, stale
}

func (h *fakePeer) Pull(_ context.Context, from string, keys []bucket.Counter, release bool, ttl time.Duration) {
	h.mu.Lock()
	h.pulls = append(h.pulls, pullCall{from, len(keys), release, ttl})
	block := h.block
	h.mu.Unlock()
	if block != nil {
		<-block
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range keys {
		c := h.held[keys[i].Name+"\x00"+keys[i].Key]
		keys[i].State, keys[i].Version = c.State, c.Version
	}
}

func (h *fakePeer) replicateCalls() []replicateCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]replicateCall(nil), h.replicates...)
}

func (h *fakePeer) pullCalls() []pullCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]pullCall(nil), h.pulls...)
}

// counter is a valid sliding-window counter for key k whose Count is n.
func counter(k string, n int64, version uint64) bucket.Counter {
	return bucket.Counter{
		Name:    "api",
		Key:     k,
		State:   bucket.State{Algorithm: bucket.SlidingWindow, Start: 1_700_000_040_000_000_000, Count: n, Prev: 2, Expires: 1_700_000_160_000_000_000},
		Version: version,
	}
}

func counters(prefix string, n int, version uint64) []bucket.Counter {
	cs := make([]bucket.Counter, n)
	for i := range cs {
		cs[i] = counter(prefix+strconv.Itoa(i), int64(i%10), version)
	}
	return cs
}

// bigCounter holds a sliding log of 10 000 timestamps: about 80 KB encoded.
func bigCounter(t testing.TB, k string) bucket.Counter {
	t.Helper()
	var s bucket.State
	lim := bucket.Limit{Algorithm: bucket.SlidingLog, Limit: bucket.MaxLogLimit, WindowMS: 60_000}
	if d := bucket.Decide(&s, lim, bucket.MaxLogLimit, 1_700_000_000_000_000_000); d.Status != bucket.UnderLimit {
		t.Fatalf("sliding log refused its own limit: %+v", d)
	}
	if n := s.EncodedLen(); n < 80_000 {
		t.Fatalf("sliding log state of %d bytes, want about 80 KB", n)
	}
	return bucket.Counter{Name: "log", Key: k, State: s, Version: 7}
}

func startPeerServer(t testing.TB, h PeerHandler, edit ...func(*ServerConfig)) *Server {
	t.Helper()
	return startServer(t, &fakeHandler{}, append([]func(*ServerConfig){func(c *ServerConfig) { c.Peer = h }}, edit...)...)
}

// rawPeer dials addr with the generated client, to send what PeerClient
// never would.
func rawPeer(t testing.TB, addr string) sluicev1.PeerClient {
	t.Helper()
	return sluicev1.NewPeerClient(dial(t, addr).Conn())
}

// lockedBuffer is a log destination the server's goroutines may write while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// movingHandler answers forwarded items whose key starts with "moved" with
// MovedTo instead of a decision.
type movingHandler struct{ fakeHandler }

const movedAddr = "10.0.0.9:8081"

func (h *movingHandler) CheckForwarded(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome) {
	h.fakeHandler.CheckForwarded(ctx, from, reqs, out)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "moved") {
			out[i] = bucket.Outcome{MovedTo: movedAddr}
		}
	}
}

func checkMovedOut(reqs []bucket.Request, out []bucket.Outcome) error {
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "moved") {
			if out[i].MovedTo != movedAddr || out[i].Allowed() {
				return fmt.Errorf("moved item %d: %+v, want MovedTo %s and no decision", i, out[i], movedAddr)
			}
			continue
		}
		if out[i].MovedTo != "" || out[i].Owner != "a/"+reqs[i].Key || !out[i].Allowed() {
			return fmt.Errorf("decided item %d: %+v", i, out[i])
		}
	}
	return nil
}

// moved_to travels with the answers, on direct sends and on queued batches
// (each caller gets its own slice of it), and is absent when nothing moved.
func TestForwardMovedTo(t *testing.T) {
	t.Parallel()
	h := &movingHandler{fakeHandler: fakeHandler{block: make(chan struct{})}}
	s := startServer(t, h)
	addr := s.GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: 1, Timeout: time.Minute})
	defer pc.Close()

	const callers = 4
	errs := make(chan error, callers)
	for i := range callers {
		rs := []bucket.Request{req("k"+strconv.Itoa(i), 1), req("moved"+strconv.Itoa(i), 1)}
		if i%2 == 1 {
			rs[0], rs[1] = rs[1], rs[0]
		}
		if i == 3 {
			rs = keys("still"+strconv.Itoa(i), 2) // nothing moved in this caller's part
		}
		go func() {
			out := make([]bucket.Outcome, len(rs))
			if err := pc.Forward(testCtx(t), addr, rs, out); err != nil {
				errs <- err
				return
			}
			errs <- checkMovedOut(rs, out)
		}()
	}
	waitFor(t, 10*time.Second, "one forward on the wire and the rest queued", func() bool {
		in, q := peerState(pc, addr)
		return in == 1 && q == callers-1 && h.forwards.Load() == 1
	})
	close(h.block)
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(h.forwardSizes()); got != "[2 6]" {
		t.Fatalf("RPC sizes %s, want [2 6]", got)
	}

	raw := rawPeer(t, addr)
	ctx := testCtx(t)
	resp, err := raw.Forward(ctx, &sluicev1.ForwardRequest{From: "a", Requests: protoReqs(keys("k", 3)).Requests})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.MovedTo) != 0 || len(resp.Responses) != 3 {
		t.Fatalf("no move: %d responses, moved_to %q; want 3 and none", len(resp.Responses), resp.MovedTo)
	}
	rs := []bucket.Request{req("k", 1), req("moved", 1), req("j", 1)}
	resp, err = raw.Forward(ctx, &sluicev1.ForwardRequest{From: "a", Requests: protoReqs(rs).Requests})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%q", resp.MovedTo); got != `["" "`+movedAddr+`" ""]` {
		t.Fatalf("moved_to %s, want one entry per item", got)
	}
}

func TestReplicateChunksAndSums(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b", MaxCounters: 5000})
	defer pc.Close()
	ctx := testCtx(t)

	cs := counters("k", 12_000, 5)
	installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), true, cs)
	if err != nil || installed != 12_000 || stale != 0 {
		t.Fatalf("Replicate: %d installed, %d stale, %v; want 12000, 0, nil", installed, stale, err)
	}
	if got := fmt.Sprint(h.replicateCalls()); got != "[{b true 5000} {b true 5000} {b true 2000}]" {
		t.Fatalf("handler calls %s, want three from b, handoff, of 5000, 5000, 2000", got)
	}
	// The same versions again are stale; newer ones for half are installed.
	for i := range 6000 {
		cs[i].Version = 6
		cs[i].State.Count++
	}
	installed, stale, err = pc.Replicate(ctx, s.GRPCAddr(), false, cs)
	if err != nil || installed != 6000 || stale != 6000 {
		t.Fatalf("second Replicate: %d installed, %d stale, %v; want 6000, 6000, nil", installed, stale, err)
	}
	if calls := h.replicateCalls(); len(calls) != 6 || calls[5].handoff {
		t.Fatalf("handler calls %v, want three more, not handoffs", calls)
	}
	h.mu.Lock()
	got := h.held["api\x00k42"]
	h.mu.Unlock()
	if !reflect.DeepEqual(got, cs[42]) {
		t.Fatalf("held %+v, want %+v", got, cs[42])
	}
	if installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), false, nil); installed != 0 || stale != 0 || err != nil {
		t.Fatalf("empty Replicate: %d, %d, %v", installed, stale, err)
	}
}

// Large states are chunked by size too, so no RPC nears the 4 MiB limit.
func TestReplicateChunksLargeStates(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	big := bigCounter(t, "x")
	cs := make([]bucket.Counter, 100)
	for i := range cs {
		cs[i] = big
		cs[i].Key = "k" + strconv.Itoa(i)
	}
	installed, stale, err := pc.Replicate(testCtx(t), s.GRPCAddr(), false, cs)
	if err != nil || installed != 100 || stale != 0 {
		t.Fatalf("Replicate of 100 large counters: %d installed, %d stale, %v", installed, stale, err)
	}
	calls := h.replicateCalls()
	if len(calls) < 4 {
		t.Fatalf("%d RPCs for 8 MB of counters, want at least 4", len(calls))
	}
	for _, c := range calls {
		if c.n*big.State.EncodedLen() > maxChunkBytes {
			t.Fatalf("an RPC carried %d counters of %d bytes", c.n, big.State.EncodedLen())
		}
	}
}

// Malformed counters are refused, counted and logged once per call; the
// others are installed and the server keeps serving.
func TestReplicateRefusesMalformed(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	var logs lockedBuffer
	s := startPeerServer(t, h, func(c *ServerConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	raw := rawPeer(t, s.GRPCAddr())
	ctx := testCtx(t)

	good := counters("g", 3, 1)
	badState := CounterToProto(counter("bad", 1, 1))
	badState.State = badState.State[:10]
	noName := CounterToProto(counter("noname", 1, 1))
	noName.Name = ""
	nul := CounterToProto(counter("nul", 1, 1))
	nul.Name = "a\x00b"
	unversioned := CounterToProto(counter("v0", 1, 1))
	unversioned.Version = 0
	req := &sluicev1.ReplicateRequest{From: "node-c", Counters: []*sluicev1.Counter{
		CounterToProto(good[0]), badState, CounterToProto(good[1]), noName, nul, unversioned, CounterToProto(good[2]),
	}}
	resp, err := raw.Replicate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Installed != 3 || resp.Stale != 0 || resp.Refused != 4 {
		t.Fatalf("answer %v, want 3 installed, 4 refused", resp)
	}
	if got := fmt.Sprint(h.replicateCalls()); got != "[{node-c false 3}]" {
		t.Fatalf("handler calls %s, want one of the 3 valid counters", got)
	}
	out := logs.String()
	if n := strings.Count(out, "refused malformed counters"); n != 1 {
		t.Fatalf("%d log lines for one call, want 1:\n%s", n, out)
	}
	for _, want := range []string{"from=node-c", "refused=4", "index=1", "bad counter state"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}

	// The server keeps serving, and PeerClient reports refusals as errors.
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	cs := counters("h", 3, 1)
	cs[1].Name = ""
	installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), false, cs)
	if err == nil || !strings.Contains(err.Error(), "refused 1 of 3") || installed != 2 || stale != 0 {
		t.Fatalf("Replicate with an empty name: %d installed, %d stale, %v; want 2, 0 and a refusal error", installed, stale, err)
	}

	// Too many counters, or an unknown kind, refuse the call.
	many := &sluicev1.ReplicateRequest{Counters: make([]*sluicev1.Counter, MaxCounters+1)}
	for i := range many.Counters {
		many.Counters[i] = &sluicev1.Counter{}
	}
	if _, err := raw.Replicate(ctx, many); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d counters: %v, want InvalidArgument", len(many.Counters), err)
	}
	if _, err := raw.Replicate(ctx, &sluicev1.ReplicateRequest{Kind: 7}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown kind: %v, want InvalidArgument", err)
	}
}

func TestPull(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	addr := s.GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "b", MaxCounters: 2})
	defer pc.Close()
	ctx := testCtx(t)
	held := []bucket.Counter{counter("x", 3, 9), counter("z", 4, 11)}
	if _, _, err := pc.Replicate(ctx, addr, false, held); err != nil {
		t.Fatal(err)
	}

	ks := []bucket.Counter{
		{Name: "api", Key: "z"},
		{Name: "api", Key: "none"},
		{Name: "api", Key: "x"},
		{Name: "api", Key: "none", State: bucket.State{Count: 5}, Version: 3}, // output only
		{Name: "api", Key: "z"},
	}
	if err := pc.Pull(ctx, addr, ks, true, 1500*time.Microsecond); err != nil {
		t.Fatal(err)
	}
	want := []bucket.Counter{held[1], {Name: "api", Key: "none"}, held[0], {Name: "api", Key: "none"}, held[1]}
	for i := range want {
		if !reflect.DeepEqual(ks[i], want[i]) {
			t.Fatalf("keys[%d] = %+v, want %+v", i, ks[i], want[i])
		}
	}
	if got := fmt.Sprint(h.pullCalls()); got != "[{b 2 true 2ms} {b 2 true 2ms} {b 1 true 2ms}]" {
		t.Fatalf("handler calls %s, want chunks of 2, 2, 1 from b with release for 2ms", got)
	}

	raw := rawPeer(t, addr)
	resp, err := raw.Pull(ctx, &sluicev1.PullRequest{From: "c", ReleaseTtlMs: int64(time.Hour / time.Millisecond),
		Keys: []*sluicev1.CounterKey{{Name: "api", Key: "none"}, {Name: "api", Key: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.Counters[0]; m.Name != "api" || m.Key != "none" || m.Version != 0 || len(m.State) != 0 {
		t.Fatalf("answer for a key not held: %v, want version 0 and no state", m)
	}
	if !proto.Equal(resp.Counters[1], CounterToProto(held[0])) {
		t.Fatalf("answer %v, want %v", resp.Counters[1], CounterToProto(held[0]))
	}
	if _, err := raw.Pull(ctx, &sluicev1.PullRequest{ReleaseTtlMs: -5, Keys: []*sluicev1.CounterKey{{Name: "api", Key: "x"}}}); err != nil {
		t.Fatal(err)
	}
	calls := h.pullCalls()
	if got := fmt.Sprint(calls[len(calls)-2:]); got != "[{c 2 false 10m0s} { 1 false 0s}]" {
		t.Fatalf("ttls %s, want clamped to 10m and 0", got)
	}

	// One invalid key refuses the call, naming it.
	bad := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api"}}
	err = pc.Pull(ctx, addr, bad, false, 0)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "key 1") {
		t.Fatalf("pull of an empty key: %v, want InvalidArgument naming key 1", err)
	}
	if bad[0].Version != 0 {
		t.Fatal("a failed pull filled keys")
	}
	if err := pc.Pull(ctx, addr, nil, true, time.Second); err != nil {
		t.Fatalf("empty pull: %v", err)
	}
	many := &sluicev1.PullRequest{Keys: make([]*sluicev1.CounterKey, MaxCounters+1)}
	for i := range many.Keys {
		many.Keys[i] = &sluicev1.CounterKey{Name: "n", Key: "k"}
	}
	if _, err := raw.Pull(ctx, many); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d keys: %v, want InvalidArgument", len(many.Keys), err)
	}
}

// An answer over the 4 MiB message limit is asked again in halves.
func TestPullHalvesLargeAnswers(t *testing.T) {
	t.Parallel()
	big := bigCounter(t, "x")
	h := &fakePeer{held: make(map[string]bucket.Counter)}
	ks := make([]bucket.Counter, 100)
	for i := range ks {
		c := big
		c.Key = "k" + strconv.Itoa(i)
		h.held[c.Name+"\x00"+c.Key] = c
		ks[i] = bucket.Counter{Name: c.Name, Key: c.Key}
	}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b", Timeout: time.Minute})
	defer pc.Close()
	if err := pc.Pull(testCtx(t), s.GRPCAddr(), ks, false, 0); err != nil {
		t.Fatal(err)
	}
	for i := range ks {
		if ks[i].Version != big.Version || ks[i].State.EncodedLen() != big.State.EncodedLen() {
			t.Fatalf("keys[%d] = version %d, %d state bytes", i, ks[i].Version, ks[i].State.EncodedLen())
		}
	}
	if got := fmt.Sprint(h.pullCalls()); got != "[{b 100 false 0s} {b 50 false 0s} {b 50 false 0s}]" {
		t.Fatalf("handler calls %s, want 100 then two halves", got)
	}
}

func TestReplicatePullUnimplementedWithoutPeer(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	ctx := testCtx(t)
	if _, _, err := pc.Replicate(ctx, s.GRPCAddr(), false, counters("k", 1, 1)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Replicate: %v, want Unimplemented", err)
	}
	if err := pc.Pull(ctx, s.GRPCAddr(), []bucket.Counter{{Name: "a", Key: "k"}}, false, 0); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Pull: %v, want Unimplemented", err)
	}
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pc.Replicate(ctx, s.GRPCAddr(), false, counters("k", 1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Replicate after Close: %v, want ErrClosed", err)
	}
	if err := pc.Pull(ctx, s.GRPCAddr(), []bucket.Counter{{Name: "a", Key: "k"}}, false, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pull after Close: %v, want ErrClosed", err)
	}
}

// A hanging handler costs Replicate and Pull their deadline, no more: the
// context's when it has one, else BulkTimeout or Timeout.
func TestReplicatePullDeadline(t *testing.T) {
	t.Parallel()
	h := &fakePeer{block: make(chan struct{})}
	s := startPeerServer(t, h)
	t.Cleanup(func() { close(h.block) }) // runs before the server's Shutdown
	addr := s.GRPCAddr()
	const short = 100 * time.Millisecond
	tests := []struct {
		name string
		pc   PeerConfig
		ctx  time.Duration // 0: no deadline
		call func(ctx context.Context, pc *PeerClient) error
	}{
		{"replicate/bulk timeout", PeerConfig{Timeout: time.Hour, BulkTimeout: short}, 0, func(ctx context.Context, pc *PeerClient) error {
			_, _, err := pc.Replicate(ctx, addr, true, counters("k", 3, 1))
			return err
		}},
		{"replicate/ctx deadline", PeerConfig{Timeout: time.Millisecond, BulkTimeout: time.Hour}, short, func(ctx context.Context, pc *PeerClient) error {
			_, _, err := pc.Replicate(ctx, addr, true, counters("k", 3, 1))
			return err
		}},
		{"pull/timeout", PeerConfig{Timeout: short, BulkTimeout: time.Hour}, 0, func(ctx context.Context, pc *PeerClient) error {
			return pc.Pull(ctx, addr, []bucket.Counter{{Name: "a", Key: "k"}}, true, time.Second)
		}},
		{"pull/ctx deadline", PeerConfig{Timeout: time.Millisecond, BulkTimeout: time.Millisecond}, short, func(ctx context.Context, pc *PeerClient) error {
			return pc.Pull(ctx, addr, []bucket.Counter{{Name: "a", Key: "k"}}, true, time.Second)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pc := NewPeerClient(tt.pc)
			defer pc.Close()
			ctx := context.Background()
			if tt.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctx)
				defer cancel()
			}
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- tt.call(ctx, pc) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%v, want DeadlineExceeded", err)
				}
				if d := time.Since(start); d < short {
					t.Fatalf("gave up after %v, before the deadline of %v", d, short)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("still waiting for a hanging peer after 30 s")
			}
		})
	}
}

// bogusPeer answers with whatever its fields say, to check what PeerClient
// accepts from a peer.
type bogusPeer struct {
	sluicev1.UnimplementedPeerServer
	forward *sluicev1.ForwardResponse
	pull    *sluicev1.PullResponse
}

func (b *bogusPeer) Forward(context.Context, *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	return b.forward, nil
}

func (b *bogusPeer) Pull(context.Context, *sluicev1.PullRequest) (*sluicev1.PullResponse, error) {
	return b.pull, nil
}

func startBogusPeer(t testing.TB, b *bogusPeer) string {
	t.Helper()
	l := listen(t)
	g := grpc.NewServer()
	sluicev1.RegisterPeerServer(g, b)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// A peer's malformed answer is an error, and nothing of it is installed.
func TestPeerClientRefusesMalformedAnswers(t *testing.T) {
	t.Parallel()
	ok := CounterToProto(counter("x", 3, 9))
	badState := CounterToProto(counter("y", 3, 9))
	badState.State[0] = 9
	stateless := &sluicev1.Counter{Name: "api", Key: "y", Version: 4}
	ghost := &sluicev1.Counter{Name: "api", Key: "y", State: ok.State}
	other := CounterToProto(counter("other", 3, 9))
	decided := []*sluicev1.RateLimitResponse{ResponseToProto(bucket.Outcome{Owner: "p"}), ResponseToProto(bucket.Outcome{Owner: "p"})}
	tests := []struct {
		name string
		peer bogusPeer
		want string
	}{
		{"pull/bad state", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, badState}}}, "answer 1: bad counter state"},
		{"pull/version without state", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, stateless}}}, "answer 1: bad counter state"},
		{"pull/state without version", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, ghost}}}, "answer 1: version 0 with a state"},
		{"pull/short", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok}}}, "answered 1 of 2 keys"},
		{"pull/long", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, ok, ok}}}, "answered 3 of 2 keys"},
		{"pull/other key", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, other}}}, "answer 1 is for another key"},
		{"forward/moved_to short", bogusPeer{forward: &sluicev1.ForwardResponse{Responses: decided, MovedTo: []string{"h:1"}}}, "moved_to for 1 of 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := startBogusPeer(t, &tt.peer)
			pc := NewPeerClient(PeerConfig{NodeName: "b", Timeout: time.Minute})
			defer pc.Close()
			var err error
			if tt.peer.forward != nil {
				out := make([]bucket.Outcome, 2)
				err = pc.Forward(testCtx(t), addr, keys("k", 2), out)
			} else {
				ks := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api", Key: "y"}}
				err = pc.Pull(testCtx(t), addr, ks, false, 0)
				if ks[0].Version != 0 || ks[1].Version != 0 {
					t.Fatalf("a refused answer was installed: %+v", ks)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestCounterFromProto(t *testing.T) {
	t.Parallel()
	valid := CounterToProto(counter("k", 3, 9))
	tests := []struct {
		name string
		m    *sluicev1.Counter
		want string // "" accepted
	}{
		{"valid", valid, ""},
		{"none held", &sluicev1.Counter{Name: "api", Key: "k"}, ""},
		{"nil", nil, "missing counter"},
		{"empty name", &sluicev1.Counter{Key: "k", State: valid.State, Version: 9}, "name is empty"},
		{"empty key", &sluicev1.Counter{Name: "api", State: valid.State, Version: 9}, "key is empty"},
		{"NUL in name", &sluicev1.Counter{Name: "a\x00", Key: "k", State: valid.State, Version: 9}, "NUL"},
		{"long key", &sluicev1.Counter{Name: "api", Key: strings.Repeat("k", bucket.MaxKeyLen+1), State: valid.State, Version: 9}, "more than"},
		{"no state", &sluicev1.Counter{Name: "api", Key: "k", Version: 9}, "bad counter state"},
		{"truncated state", &sluicev1.Counter{Name: "api", Key: "k", State: valid.State[:20], Version: 9}, "bad counter state"},
		{"state without version", &sluicev1.Counter{Name: "api", Key: "k", State: valid.State}, "version 0 with a state"},
	}
	for _, tt := range tests {
		c, err := CounterFromProto(tt.m)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want == "" && !proto.Equal(CounterToProto(c), tt.m):
			t.Errorf("%s: round trip gives %v, want %v", tt.name, CounterToProto(c), tt.m)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.want)
		}
	}
	if m := CounterToProto(bucket.Counter{Name: "a", Key: "k", State: bucket.State{Count: 4}}); len(m.State) != 0 {
		t.Errorf("version 0 sent %d state bytes, want none", len(m.State))
	}
}

func FuzzCounterFromProto(f *testing.F) {
	for _, c := range []bucket.Counter{counter("k", 3, 9), {Name: "a", Key: "k"}} {
		m := CounterToProto(c)
		f.Add(m.Name, m.Key, m.State, m.Version)
	}
	// Small states of the two algorithms with a variable-size part.
	var st []byte
	for _, lim := range []bucket.Limit{
		{Algorithm: bucket.SlidingLog, Limit: 10, WindowMS: 60_000},
		{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000, SubWindows: 6},
	} {
		var s bucket.State
		bucket.Decide(&s, lim, 3, 1_700_000_000_000_000_000)
		st, _ = s.MarshalBinary()
		f.Add("api", "user:1", st, uint64(1))
	}
	f.Add("", "k", []byte{1, 1}, uint64(1))
	f.Add("a\x00b", "k", st, uint64(2))
	f.Add("api", "k", []byte{2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint64(3))
	f.Fuzz(func(t *testing.T, name, key string, state []byte, version uint64) {
		m := &sluicev1.Counter{Name: name, Key: key, State: state, Version: version}
		c, err := CounterFromProto(m)
		if err != nil {
			if !reflect.DeepEqual(c, bucket.Counter{}) {
				t.Fatalf("refused counter %v came back non-zero: %+v", err, c)
			}
			return
		}
		back := CounterToProto(c)
		if !proto.Equal(back, m) {
			t.Fatalf("accepted %v but it encodes back as %v", m, back)
		}
		again, err := CounterFromProto(back)
		if err != nil || again.Name != c.Name || again.Key != c.Key || again.Version != c.Version || again.State.EncodedLen() != c.State.EncodedLen() {
			t.Fatalf("second decode: %+v, %v; first %+v", again, err, c)
		}
	})
}

// A node whose address once belonged to another cluster's node (or a wrong
// --join) gets that cluster's peer calls: each is refused and changes
// nothing, while calls from its own cluster are served.
func TestPeerCallsFromAnotherClusterAreRefused(t *testing.T) {
	t.Parallel()
	h, p := &fakeHandler{}, &fakePeer{}
	addr := startServer(t, h, func(c *ServerConfig) { c.Peer, c.ClusterName = p, "blue" }).GRPCAddr()
	ctx := testCtx(t)
	counters := []bucket.Counter{{Name: "n", Key: "k", Version: 1, State: bucket.State{Count: 1}}}

	other := NewPeerClient(PeerConfig{NodeName: "x", ClusterName: "green"})
	defer other.Close()
	out := make([]bucket.Outcome, 1)
	for what, err := range map[string]error{
		"forward":  other.Forward(ctx, addr, keys("k", 1), out),
		"stand-in": other.ForwardStandIn(ctx, addr, keys("k", 1), out),
		"replicate": func() error {
			_, _, err := other.Replicate(ctx, addr, false, counters)
			return err
		}(),
		"pull": other.Pull(ctx, addr, []bucket.Counter{{Name: "n", Key: "k"}}, true, time.Second),
	} {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `cluster "green"`) || !strings.Contains(err.Error(), `"blue"`) {
			t.Errorf("%s from another cluster: %v, want FAILED_PRECONDITION naming both clusters", what, err)
		}
	}
	if n := h.forwards.Load(); n != 0 {
		t.Errorf("the handler decided %d forwarded batches from another cluster", n)
	}
	if r, pl := p.replicateCalls(), p.pullCalls(); len(r) != 0 || len(pl) != 0 {
		t.Errorf("the peer handler saw replicate %v and pull %v from another cluster", r, pl)
	}

	same := NewPeerClient(PeerConfig{NodeName: "y", ClusterName: "blue"})
	defer same.Close()
	if err := same.Forward(ctx, addr, keys("k", 1), out); err != nil || out[0].Err != "" {
		t.Fatalf("forward from the same cluster: %v %+v", err, out[0])
	}
	if installed, _, err := same.Replicate(ctx, addr, false, counters); err != nil || installed != 1 {
		t.Fatalf("replicate from the same cluster: installed %d, %v", installed, err)
	}
}
