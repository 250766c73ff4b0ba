package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Defaults of PeerConfig.
const (
	// DefaultForwardTimeout bounds each forward when the caller's context has
	// no earlier deadline: far above a loopback or same-zone round trip
	// (tens to hundreds of µs), short enough that an unreachable owner costs
	// a check a quarter of a second, not a hang.
	DefaultForwardTimeout = 250 * time.Millisecond
	// PeerAckTimeout is the shortest time a peer connection may hold sent
	// data that its peer has not acknowledged before it is dropped and
	// redialled (TCP_USER_TIMEOUT); the PeerClient uses 4 forward
	// timeouts when that is longer: a peer that acknowledges nothing for
	// that long answers no forward on that connection.
	PeerAckTimeout = time.Second
	// PeerKeepaliveTime is how long a peer connection with calls pending
	// may be silent before the client pings it (gRPC's minimum is 10 s).
	PeerKeepaliveTime = 10 * time.Second
	// DefaultMaxInFlight is how many batches may be on the wire to one peer
	// at once. One batch per peer gives the fewest RPCs and the most checks
	// per second on 2 cores (BenchmarkForwardParallel: about 31 µs/op at 1, 34 at
	// 2, 47-70 at 4); more can help when the round trip, not the CPU, dominates.
	DefaultMaxInFlight = 1
	// DefaultMaxCounters is the most counters (or keys) PeerClient puts in
	// one Replicate or Pull RPC: with small states a few hundred KiB, well
	// under the receiver's 4 MiB message limit.
	DefaultMaxCounters = 5000
	// DefaultBulkTimeout bounds a Replicate when the caller's context has no
	// deadline: a handoff may carry many counters.
	DefaultBulkTimeout = 10 * time.Second
)

// ErrClosed is returned by Forward, Replicate and Pull after Close.
var ErrClosed = errors.New("transport: peer client closed")

// PeerConfig configures a PeerClient.
type PeerConfig struct {
	// NodeName is this node's name, sent as ForwardRequest.from.
	NodeName string
	// ClusterName is sent with every call (ForwardRequest.cluster, …); a
	// receiver whose ServerConfig.ClusterName differs refuses the call.
	ClusterName string
	// Timeout bounds each Forward when ctx has no earlier deadline;
	// 0 means DefaultForwardTimeout (250 ms).
	Timeout time.Duration
	// MaxBatch is the most items in one Forward RPC; 0 or more than
	// bucket.MaxBatchSize means bucket.MaxBatchSize (the receiver's limit).
	MaxBatch int
	// MaxInFlight is the most Forward RPCs on the wire to one peer at once;
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// MaxCounters is the most counters in one Replicate RPC and keys in one
	// Pull RPC; 0 means DefaultMaxCounters (5000), more than MaxCounters
	// (the receiver's limit, 100 000) means MaxCounters.
	MaxCounters int
	// BulkTimeout bounds a whole Replicate call when ctx has no deadline;
	// 0 means DefaultBulkTimeout (10 s). A Pull without a deadline is
	// bounded by Timeout, like a Forward.
	BulkTimeout time.Duration
	// TLS, when set, makes every connection to a peer TLS: it presents the
	// node's certificate and accepts peers whose certificate chains to the
	// node CA.
	TLS *TLS
	// Prover, when set and TLS is not, signs every call with a proof of
	// cluster membership (the receiver's ServerConfig.Prover checks it).
	Prover *Prover
	// DialOptions are added after the defaults (insecure transport
	// credentials, StreamWindowSize and ConnWindowSize, reconnect backoff of
	// at most 1 s), so they override them:
	// pass grpc.WithTransportCredentials for TLS.
	DialOptions []grpc.DialOption
	// Tracing, when set, traces the RPCs made in a traced context and
	// carries the trace on them (tracing.go); nil installs nothing.
	Tracing *Tracing
}

// PeerClient forwards checks to the nodes that own their keys over the
// internal sluice.v1.Peer/Forward RPC, and replicates and pulls counters
// (Peer/Replicate, Peer/Pull). It keeps one grpc.ClientConn per peer
// address, made on first use and kept until ClosePeer or Close.
//
// Forwards to one peer are batched without a timer: when fewer than
// MaxInFlight batches are on the wire to that peer, a Forward is sent at once
// on the caller's goroutine; otherwise it joins a queue, and the next batch to
// finish sends everything queued (up to MaxBatch items) as one RPC. So a lone
// caller pays one round trip and nothing more, and under load the RPC count
// grows with the round trip time, not with the number of callers.
//
// A PeerClient is safe for concurrent use.
type PeerClient struct {
	name        string
	cluster     string
	timeout     time.Duration
	maxBatch    int
	maxInFlight int
	maxCounters int
	bulkTimeout time.Duration
	dialOpts    []grpc.DialOption
	traced      bool // Tracing set: queued forwards keep their caller's span

	ctx    context.Context // parent of queued batches' RPCs; canceled by Close
	cancel context.CancelFunc

	peers   sync.Map   // addr → *peer
	mu      sync.Mutex // serialises making and dropping peers, and closed
	closed  bool
	calls   sync.Pool // *call
	batches sync.Pool // *batch
}

// NewPeerClient returns a PeerClient. It dials nothing until the first Forward
// to an address.
func NewPeerClient(cfg PeerConfig) *PeerClient {
	pc := &PeerClient{
		name:        cfg.NodeName,
		cluster:     cfg.ClusterName,
		timeout:     cfg.Timeout,
		maxBatch:    cfg.MaxBatch,
		maxInFlight: cfg.MaxInFlight,
		maxCounters: cfg.MaxCounters,
		bulkTimeout: cfg.BulkTimeout,
	}
	if pc.timeout <= 0 {
		pc.timeout = DefaultForwardTimeout
	}
	if pc.maxBatch <= 0 || pc.maxBatch > bucket.MaxBatchSize {
		pc.maxBatch = bucket.MaxBatchSize
	}
	if pc.maxInFlight <= 0 {
		pc.maxInFlight = DefaultMaxInFlight
	}
	if pc.maxCounters <= 0 {
		pc.maxCounters = DefaultMaxCounters
	}
	pc.maxCounters = min(pc.maxCounters, MaxCounters)
	if pc.bulkTimeout <= 0 {
		pc.bulkTimeout = DefaultBulkTimeout
	}
	pc.dialOpts = []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(StreamWindowSize),
		grpc.WithInitialConnWindowSize(ConnWindowSize),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// A connection whose sent data goes unacknowledged for
		// PeerAckTimeout is dropped (grpc sets TCP_USER_TIMEOUT to the
		// keepalive timeout) and redialled within the backoff above.
		// Without it, a connection that lost packets for a while (one-way
		// loss, a flapping link) sits in TCP's exponential retransmission
		// backoff, its next retransmission up to tens of seconds away, and
		// every forward on it times out long after the link is back.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: PeerKeepaliveTime, Timeout: max(PeerAckTimeout, 4*pc.timeout)}),
	}
	switch {
	case cfg.TLS != nil:
		pc.dialOpts = append(pc.dialOpts, grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS.PeerClientConfig())))
	case cfg.Prover != nil:
		pc.dialOpts = append(pc.dialOpts, WithProofs(cfg.Prover))
	}
	if cfg.Tracing != nil && cfg.Tracing.Provider != nil {
		pc.dialOpts = append(pc.dialOpts, grpc.WithStatsHandler(cfg.Tracing.clientHandler()))
		pc.traced = true
	}
	pc.dialOpts = append(pc.dialOpts, cfg.DialOptions...)
	pc.ctx, pc.cancel = context.WithCancel(context.Background())
	pc.calls.New = func() any { return &call{done: make(chan error, 1)} }
	pc.batches.New = func() any { return new(batch) }
	return pc
}

// Forward asks the node at addr to decide reqs (CheckForwarded there) and
// fills out with its answers, in order; an item whose key that node has
// handed to another comes back undecided with MovedTo set to the other
// node's address. It returns an error, and leaves out
// unspecified, when the peer could not answer: the wrapped gRPC error, or
// ctx.Err() (context.DeadlineExceeded also when Timeout ran out). It never
// waits past min(ctx's deadline, now+Timeout).
func (pc *PeerClient) Forward(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome) error {
	return pc.chunked(ctx, addr, reqs, out, func(ctx context.Context, p *peer, reqs []bucket.Request, out []bucket.Outcome) error {
		if err := p.forward(ctx, reqs, out); err != nil {
			return fmt.Errorf("transport: forward %d requests to %s: %w", len(reqs), addr, err)
		}
		return nil
	})
}

// ForwardStandIn asks the node at addr to decide reqs although it may not
// own their keys, because their owner did not answer (CheckStandIn there).
// It is sent at once, in one RPC per MaxBatch items, outside the batching
// of Forward: stand-ins are rare. Answers and errors are as for Forward.
func (pc *PeerClient) ForwardStandIn(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome) error {
	return pc.chunked(ctx, addr, reqs, out, func(ctx context.Context, p *peer, reqs []bucket.Request, out []bucket.Outcome) error {
		return p.forwardStandIn(ctx, reqs, out)
	})
}

// chunked checks reqs and out, finds the peer at addr and calls send on
// chunks of at most MaxBatch items under one deadline (ctx's, or
// now+Timeout when that is sooner).
func (pc *PeerClient) chunked(ctx context.Context, addr string, reqs []bucket.Request, out []bucket.Outcome,
	send func(ctx context.Context, p *peer, reqs []bucket.Request, out []bucket.Outcome) error) error {
	if len(reqs) != len(out) {
		return fmt.Errorf("transport: forward: %d requests but %d outcomes", len(reqs), len(out))
	}
	if len(reqs) == 0 {
		return nil
	}
	p, err := pc.peer(addr)
	if err != nil {
		return err
	}
	ctx, cancel := pc.withDeadline(ctx)
	defer cancel()
	for start := 0; start < len(reqs); start += pc.maxBatch {
		end := min(start+pc.maxBatch, len(reqs))
		if err := send(ctx, p, reqs[start:end], out[start:end]); err != nil {
			return err
		}
	}
	return nil
}

// forwardStandIn sends one chunk as a stand-in Forward RPC.
func (p *peer) forwardStandIn(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome) error {
	req := &sluicev1.ForwardRequest{From: p.pc.name, Cluster: p.pc.cluster, StandIn: true, Requests: make([]*sluicev1.RateLimitRequest, 0, len(reqs))}
	for i := range reqs {
		req.Requests = append(req.Requests, RequestToProto(reqs[i]))
		if reqs[i].PullFrom != "" && req.PullFrom == nil {
			req.PullFrom = make([]string, len(reqs))
		}
	}
	if req.PullFrom != nil {
		for i := range reqs {
			req.PullFrom[i] = reqs[i].PullFrom
		}
	}
	resp, err := p.client.Forward(ctx, req)
	if err != nil {
		return fmt.Errorf("transport: stand-in forward of %d requests to %s: %w", len(reqs), p.addr, err)
	}
	if len(resp.GetResponses()) != len(reqs) {
		return fmt.Errorf("transport: %s answered %d of %d stand-in requests", p.addr, len(resp.GetResponses()), len(reqs))
	}
	if err := checkMoved(resp, len(reqs)); err != nil {
		return fmt.Errorf("transport: %s: %w", p.addr, err)
	}
	for i, r := range resp.GetResponses() {
		out[i] = OutcomeFromProto(r)
		if mv := resp.GetMovedTo(); len(mv) > 0 {
			out[i].MovedTo = mv[i]
		}
	}
	return nil
}

func noop() {}

// withDeadline gives ctx a deadline no later than now+timeout.
func (pc *PeerClient) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d := time.Now().Add(pc.timeout)
	if dl, ok := ctx.Deadline(); ok && !dl.After(d) {
		return ctx, noop
	}
	return context.WithDeadline(ctx, d)
}

// peer returns the peer for addr, making it (and its lazy ClientConn) on
// first use.
func (pc *PeerClient) peer(addr string) (*peer, error) {
	if v, ok := pc.peers.Load(addr); ok {
		return v.(*peer), nil
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed {
		return nil, ErrClosed
	}
	if v, ok := pc.peers.Load(addr); ok {
		return v.(*peer), nil
	}
	if addr == "" {
		return nil, errors.New("transport: empty peer address")
	}
	p := &peer{pc: pc, addr: addr}
	opts := append(append([]grpc.DialOption{}, pc.dialOpts...), grpc.WithChainUnaryInterceptor(p.waitWhileWaking))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("transport: peer %s: %w", addr, err)
	}
	p.conn, p.client = conn, sluicev1.NewPeerClient(conn)
	p.idle = sync.NewCond(&p.mu)
	pc.peers.Store(addr, p)
	return p, nil
}

// Status asks the node at addr for its own status (Admin.Status) on the
// connection forwards use, signed or authenticated like the other internal
// calls; the status page asks each member this way. It never waits past
// min(ctx's deadline, now+Timeout).
func (pc *PeerClient) Status(ctx context.Context, addr string) (*sluicev1.StatusResponse, error) {
	p, err := pc.peer(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := pc.withDeadline(ctx)
	defer cancel()
	return sluicev1.NewAdminClient(p.conn).Status(ctx, &sluicev1.StatusRequest{})
}

// ClosePeer closes the connection to addr (a member that left). Forwards in
// progress to it fail; a later Forward to addr dials again.
func (pc *PeerClient) ClosePeer(addr string) error {
	pc.mu.Lock()
	v, ok := pc.peers.LoadAndDelete(addr)
	pc.mu.Unlock()
	if !ok {
		return nil
	}
	return v.(*peer).close()
}

// ResetBackoff makes the connection to addr, if any, try to reconnect at
// once instead of waiting out gRPC's reconnect backoff: the node at addr has
// come back. Calls in progress are not disturbed; calls made in the next
// wakeWindow wait for the connection to be ready (within their deadline)
// instead of failing with the error of the last failed dial.
func (pc *PeerClient) ResetBackoff(addr string) {
	if v, ok := pc.peers.Load(addr); ok {
		p := v.(*peer)
		p.wake(time.Now())
		p.conn.ResetConnectBackoff()
	}
}

// Close closes every connection, fails the forwards in progress and waits
// until no batch is on the wire. Forward after Close returns ErrClosed.
func (pc *PeerClient) Close() error {
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		return nil
	}
	pc.closed = true
	var ps []*peer
	pc.peers.Range(func(k, v any) bool {
		ps = append(ps, v.(*peer))
		pc.peers.Delete(k)
		return true
	})
	pc.mu.Unlock()
	pc.cancel()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
}

// peer is the connection to one address and its batching state.
//
// Invariant (under mu): the queue is non-empty only while inflight ==
// maxInFlight, so whoever finishes a batch either finds the queue empty and
// frees its slot, or keeps the slot and sends the queue's head next. Nothing
// queued is ever stranded, and no timer is needed.
type peer struct {
	pc     *PeerClient
	addr   string
	conn   *grpc.ClientConn
	client sluicev1.PeerClient
	wokeAt atomic.Int64 // unix ns of the last ResetBackoff; 0: never

	mu       sync.Mutex
	idle     *sync.Cond // signalled when inflight drops to 0
	inflight int        // batches on the wire (direct sends included)
	queue    []*call    // waiting, in arrival order
}

// The states of a call. A queued call is callWaiting until the sender of its
// batch claims it to write the answers, or its caller gives up on it; the
// compare-and-swap decides which happens, so a caller that returned early
// never has its out written afterwards.
const (
	callWaiting int32 = iota
	callClaimed
	callAbandoned
)

// call is one caller's items on their way to a peer. Its proto messages are
// built by the caller, so a batch never reads the caller's slices.
type call struct {
	items []sluicev1.RateLimitRequest
	hits  []int64 // what items[i].Hits points to
	ptrs  []*sluicev1.RateLimitRequest
	req   sluicev1.ForwardRequest // for a direct send
	out   []bucket.Outcome
	dl    time.Time
	span  trace.SpanContext // the caller's, when traced: parent of a queued batch's RPC
	state atomic.Int32
	done  chan error // capacity 1; the sender's last touch of the call
}

// batch is several queued calls sent as one RPC.
type batch struct {
	calls []*call
	ptrs  []*sluicev1.RateLimitRequest
	req   sluicev1.ForwardRequest
}

func (pc *PeerClient) getCall(reqs []bucket.Request, out []bucket.Outcome, dl time.Time) *call {
	c := pc.calls.Get().(*call)
	n := len(reqs)
	if cap(c.items) < n {
		c.items = make([]sluicev1.RateLimitRequest, n)
		c.ptrs = make([]*sluicev1.RateLimitRequest, n)
		c.hits = make([]int64, n)
	}
	c.items, c.ptrs, c.hits = c.items[:n], c.ptrs[:n], c.hits[:n]
	for i := range reqs {
		fillRequest(&c.items[i], &reqs[i], &c.hits[i])
		c.ptrs[i] = &c.items[i]
	}
	c.out, c.dl = out, dl
	return c
}

// putCall recycles c; only calls no batch can still touch come here.
func (pc *PeerClient) putCall(c *call) {
	for i := range c.items {
		c.items[i].Name, c.items[i].Key, c.items[i].Limits = "", "", nil
	}
	clear(c.ptrs)
	c.out = nil
	c.span = trace.SpanContext{}
	c.req.Requests = nil
	c.state.Store(callWaiting)
	pc.calls.Put(c)
}

// forward sends one chunk of at most maxBatch items; ctx has a deadline.
func (p *peer) forward(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome) error {
	pc := p.pc
	dl, _ := ctx.Deadline()
	c := pc.getCall(reqs, out, dl)

	p.mu.Lock()
	if p.inflight < pc.maxInFlight { // the queue is empty: send now
		p.inflight++
		p.mu.Unlock()
		c.req.Requests, c.req.From, c.req.Cluster = c.ptrs, pc.name, pc.cluster
		resp, err := p.client.Forward(ctx, &c.req)
		if err == nil {
			err = checkMoved(resp, len(c.ptrs))
		}
		if err == nil {
			err = fill(c, resp.GetResponses(), resp.GetMovedTo())
		} else {
			err = callerErr(ctx, dl, err)
		}
		p.finish()
		pc.putCall(c)
		return err
	}
	if pc.traced {
		c.span = trace.SpanContextFromContext(ctx)
	}
	p.queue = append(p.queue, c)
	p.mu.Unlock()

	var err error
	select {
	case err = <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return ctx.Err() // c stays with its batch or queue; not recycled
		}
		err = <-c.done // claimed: the answers are being written now
	}
	pc.putCall(c)
	if err != nil {
		err = callerErr(ctx, dl, err)
	}
	return err
}

// callerErr is the error a caller whose RPC failed with err sees: its
// context's error when that has ended, or is about to because dl has passed
// (the RPC's deadline timer can fire before the context's), else err.
func callerErr(ctx context.Context, dl time.Time, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if status.Code(err) == codes.DeadlineExceeded && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return err
}

// checkMoved checks the shape of a Forward answer to n items: moved_to is
// empty or has one entry per item.
func checkMoved(resp *sluicev1.ForwardResponse, n int) error {
	if m := len(resp.GetMovedTo()); m != 0 && m != n {
		return fmt.Errorf("peer answered moved_to for %d of %d requests", m, n)
	}
	return nil
}

// fill copies a peer's answers for c's items; moved is empty or has one
// entry per answer (checkMoved).
func fill(c *call, resps []*sluicev1.RateLimitResponse, moved []string) error {
	if len(resps) != len(c.ptrs) {
		return fmt.Errorf("peer answered %d of %d requests", len(resps), len(c.ptrs))
	}
	for i, r := range resps {
		c.out[i] = OutcomeFromProto(r)
	}
	for i, addr := range moved {
		c.out[i].MovedTo = addr
	}
	return nil
}

// finish is called by a direct sender when its RPC is over. It frees the
// in-flight slot, or keeps it and sends what queued meanwhile on a new
// goroutine, so the direct caller returns at once.
func (p *peer) finish() {
	p.mu.Lock()
	b := p.takeLocked()
	if b == nil {
		p.releaseLocked()
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	go p.send(b)
}

func (p *peer) releaseLocked() {
	p.inflight--
	if p.inflight == 0 {
		p.idle.Broadcast()
	}
}

// takeLocked removes the oldest queued calls, up to maxBatch items, into a
// batch; nil when nothing live is queued. Abandoned calls are dropped.
func (p *peer) takeLocked() *batch {
	var b *batch
	items, k := 0, 0
	for ; k < len(p.queue); k++ {
		c := p.queue[k]
		if c.state.Load() == callAbandoned {
			continue
		}
		if items+len(c.ptrs) > p.pc.maxBatch {
			break
		}
		if b == nil {
			b = p.pc.batches.Get().(*batch)
		}
		b.calls = append(b.calls, c)
		b.ptrs = append(b.ptrs, c.ptrs...)
		items += len(c.ptrs)
	}
	n := copy(p.queue, p.queue[k:])
	clear(p.queue[n:])
	p.queue = p.queue[:n]
	return b
}

// send puts one queued batch on the wire, hands each live caller its answers
// or the error, and goes on with the next queued batch until none is left.
func (p *peer) send(b *batch) {
	for {
		dl := b.calls[0].dl
		for _, c := range b.calls[1:] {
			if c.dl.After(dl) {
				dl = c.dl
			}
		}
		// The RPC lives as long as its most patient caller; each caller
		// still returns at its own deadline. A batch whose callers have all
		// given up is not sent.
		var resp *sluicev1.ForwardResponse
		err := context.Canceled
		if b.live() {
			parent := p.pc.ctx
			if sc := b.firstSpan(); sc.IsValid() {
				parent = trace.ContextWithSpanContext(parent, sc)
			}
			ctx, cancel := context.WithDeadline(parent, dl)
			b.req.Requests, b.req.From, b.req.Cluster = b.ptrs, p.pc.name, p.pc.cluster
			resp, err = p.client.Forward(ctx, &b.req)
			cancel()
		}
		var resps []*sluicev1.RateLimitResponse
		var moved []string
		if err == nil {
			resps, moved = resp.GetResponses(), resp.GetMovedTo()
			if len(resps) != len(b.ptrs) {
				err = fmt.Errorf("peer answered %d of %d requests", len(resps), len(b.ptrs))
			} else {
				err = checkMoved(resp, len(b.ptrs))
			}
		}
		off := 0
		for _, c := range b.calls {
			n := len(c.ptrs)
			if c.state.CompareAndSwap(callWaiting, callClaimed) {
				cerr := err
				if cerr == nil {
					var m []string
					if len(moved) != 0 {
						m = moved[off : off+n]
					}
					cerr = fill(c, resps[off:off+n], m)
				}
				c.done <- cerr
			}
			off += n
		}
		p.pc.putBatch(b)

		p.mu.Lock()
		b = p.takeLocked()
		if b == nil {
			p.releaseLocked()
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// firstSpan is the span of b's first caller still waiting, if it has one.
func (b *batch) firstSpan() trace.SpanContext {
	for _, c := range b.calls {
		if c.state.Load() == callWaiting {
			return c.span
		}
	}
	return trace.SpanContext{}
}

// live reports whether any caller of b still waits for its answers.
func (b *batch) live() bool {
	for _, c := range b.calls {
		if c.state.Load() == callWaiting {
			return true
		}
	}
	return false
}

func (pc *PeerClient) putBatch(b *batch) {
	clear(b.calls)
	clear(b.ptrs)
	b.calls, b.ptrs = b.calls[:0], b.ptrs[:0]
	b.req.Requests = nil
	pc.batches.Put(b)
}

// close closes the connection and waits until nothing is on the wire to p:
// with the connection closed, every RPC in progress fails at once, and so
// does each queued batch sent after it.
func (p *peer) close() error {
	err := p.conn.Close()
	p.mu.Lock()
	for p.inflight > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
	return err
}
