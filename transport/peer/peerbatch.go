package peer

// One peer connection and its batching: the queue of forwards waiting for
// an in-flight slot, and the batches sent from it (see PeerClient).

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

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

	mu       sync.Mutex
	idle     *sync.Cond // signalled when inflight drops to 0
	inflight int        // batches on the wire (direct sends included)
	queue    []*call    // waiting, in arrival order

	smu        sync.Mutex // guards fs and unaryUntil
	fs         *fwdStream // the Forwards stream; nil until opened or after it ended
	unaryUntil time.Time  // the peer answered UNIMPLEMENTED to Forwards: unary until then
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
	out   []check.Outcome
	moved []string // the caller's movedTo
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

func (pc *PeerClient) getCall(reqs []check.Request, out []check.Outcome, movedTo []string, dl time.Time) *call {
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
	c.out, c.moved, c.dl = out, movedTo, dl
	return c
}

// putCall recycles c; only calls no batch can still touch come here.
func (pc *PeerClient) putCall(c *call) {
	for i := range c.items {
		c.items[i].Name, c.items[i].Key, c.items[i].Limits = "", "", nil
	}
	clear(c.ptrs)
	c.out, c.moved = nil, nil
	c.span = trace.SpanContext{}
	c.req.Requests = nil
	c.state.Store(callWaiting)
	pc.calls.Put(c)
}

// forward sends one chunk of at most maxBatch items; ctx has a deadline.
func (p *peer) forward(ctx context.Context, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	pc := p.pc
	dl, _ := ctx.Deadline()
	c := pc.getCall(reqs, out, movedTo, dl)

	p.mu.Lock()
	if p.inflight < pc.maxInFlight { // the queue is empty: send now
		p.inflight++
		p.mu.Unlock()
		c.req.Requests, c.req.From, c.req.Cluster, c.req.TakesLeases = c.ptrs, pc.name, pc.cluster, true
		resp, err := p.forwardRPC(ctx, &c.req)
		if err == nil {
			err = checkMoved(resp, len(c.ptrs))
		}
		if err == nil {
			err = fill(c, resp.GetResponses(), resp.GetMovedTo(), resp.GetLeases(), 0)
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
// empty or has one entry per item, and each lease names a distinct item
// with tokens ≥ 0 (0: a refusal lease) and a positive lifetime (their
// upper bounds are the holder's to check).
func checkMoved(resp *sluicev1.ForwardResponse, n int) error {
	if m := len(resp.GetMovedTo()); m != 0 && m != n {
		return fmt.Errorf("peer answered moved_to for %d of %d requests", m, n)
	}
	ls := resp.GetLeases()
	if len(ls) == 0 {
		return nil
	}
	if len(ls) > n {
		return fmt.Errorf("peer answered %d leases for %d requests", len(ls), n)
	}
	for j, l := range ls {
		switch {
		case l.GetIndex() >= uint32(n):
			return fmt.Errorf("peer answered a lease for item %d of %d", l.GetIndex(), n)
		case l.GetTokens() < 0 || l.GetTtlMicros() <= 0:
			return fmt.Errorf("peer answered a lease of %d tokens for %d µs for item %d", l.GetTokens(), l.GetTtlMicros(), l.GetIndex())
		case l.GetGrantedAt() < 0:
			return fmt.Errorf("peer answered a lease granted at %d for item %d", l.GetGrantedAt(), l.GetIndex())
		}
		for _, o := range ls[:j] {
			if o.GetIndex() == l.GetIndex() {
				return fmt.Errorf("peer answered two leases for item %d", l.GetIndex())
			}
		}
	}
	return nil
}

// fill copies a peer's answers for c's items, which are the answers'
// items from off on; moved is empty or has one entry per answer, and the
// leases are the whole answer's (checkMoved).
func fill(c *call, resps []*sluicev1.RateLimitResponse, moved []string, leases []*sluicev1.LeaseGrant, off int) error {
	if len(resps) != len(c.ptrs) {
		return fmt.Errorf("peer answered %d of %d requests", len(resps), len(c.ptrs))
	}
	for i, r := range resps {
		c.out[i] = OutcomeFromProto(r)
	}
	for _, l := range leases {
		if i := int(l.GetIndex()) - off; i >= 0 && i < len(resps) {
			c.out[i].Lease = check.Lease{Tokens: l.GetTokens(), TTL: time.Duration(l.GetTtlMicros()) * time.Microsecond, GrantedAt: l.GetGrantedAt()}
		}
	}
	if len(moved) == 0 { // all decided
		clear(c.moved)
	} else {
		copy(c.moved, moved)
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
			b.req.Requests, b.req.From, b.req.Cluster, b.req.TakesLeases = b.ptrs, p.pc.name, p.pc.cluster, true
			resp, err = p.forwardRPC(ctx, &b.req)
			cancel()
		}
		var resps []*sluicev1.RateLimitResponse
		var moved []string
		var leases []*sluicev1.LeaseGrant
		if err == nil {
			resps, moved, leases = resp.GetResponses(), resp.GetMovedTo(), resp.GetLeases()
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
					cerr = fill(c, resps[off:off+n], m, leases, off)
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
