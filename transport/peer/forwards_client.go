package peer

// The sending end of Peer/Forwards (forwards_server.go is the receiving
// end): one stream per peer, opened on the first forward and kept; a reader
// goroutine hands each reply to the call waiting for its id. A call whose
// envelope could not be sent, or whose peer does not serve Forwards (a node
// of an older release during a rolling upgrade), is made as a unary Forward
// instead; so are traced calls, whose span the unary call carries.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// unaryRetry is how long a peer that answered UNIMPLEMENTED to Forwards gets
// unary forwards before the stream is tried again.
const unaryRetry = time.Minute

// sendGrace is how long past its caller's deadline a send to a peer may
// still be in progress before the stream is taken for wedged and cut.
const sendGrace = time.Millisecond

// fwdStream is one Forwards stream to a peer and the calls waiting on it.
type fwdStream struct {
	p      *peer
	stream grpc.BidiStreamingClient[sluicev1.ForwardEnvelope, sluicev1.ForwardReply]
	cancel context.CancelFunc

	// sending serialises Send (capacity 1); a channel, not a mutex, so that
	// a caller waiting for its turn still leaves at its deadline.
	sending chan struct{}
	sent    atomic.Uint64 // sends completed

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan *sluicev1.ForwardReply // capacity 1 each
	broken  bool
	why     string // set before the stream is cut for a reason of its own
}

// forwardRPC sends req to p and returns the answer, over p's Forwards
// stream when it can, else as a unary Forward. ctx has a deadline.
func (p *peer) forwardRPC(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	if p.pc.unaryForwards || (p.pc.traced && trace.SpanContextFromContext(ctx).IsValid()) {
		return p.client.Forward(ctx, req)
	}
	fs := p.forwardStream()
	if fs == nil {
		return p.client.Forward(ctx, req)
	}
	resp, err, sent := fs.call(ctx, req)
	if !sent {
		return p.client.Forward(ctx, req)
	}
	return resp, err
}

// forwardStream returns p's stream, opening it if needed; nil while p is
// known not to serve Forwards, or when the stream cannot be opened.
func (p *peer) forwardStream() *fwdStream {
	p.smu.Lock()
	defer p.smu.Unlock()
	if p.fs != nil {
		return p.fs
	}
	// Opened only on a ready connection: opening waits for one, unbounded
	// by any call's deadline. A unary call meanwhile honours its own.
	if time.Now().Before(p.unaryUntil) || p.conn.GetState() != connectivity.Ready {
		return nil
	}
	ctx, cancel := context.WithCancel(p.pc.ctx)
	st, err := p.client.Forwards(ctx)
	if err != nil {
		cancel()
		return nil
	}
	fs := &fwdStream{p: p, stream: st, cancel: cancel, sending: make(chan struct{}, 1), waiting: map[uint64]chan *sluicev1.ForwardReply{}}
	p.fs = fs
	go fs.read()
	return fs
}

// call sends req as one envelope and waits for its reply or ctx's end.
// sent is false when the envelope was not decided and the call may be made
// again another way: it could not be sent, or the peer does not serve
// Forwards.
func (fs *fwdStream) call(ctx context.Context, req *sluicev1.ForwardRequest) (resp *sluicev1.ForwardResponse, err error, sent bool) {
	dl, _ := ctx.Deadline()
	ch := fs.p.pc.replyChans.Get().(chan *sluicev1.ForwardReply)
	fs.mu.Lock()
	if fs.broken {
		fs.mu.Unlock()
		fs.p.pc.replyChans.Put(ch)
		return nil, nil, false
	}
	fs.next++
	id := fs.next
	fs.waiting[id] = ch
	fs.mu.Unlock()

	env := &sluicev1.ForwardEnvelope{Id: id, Request: req, TimeoutMicros: max(1, time.Until(dl).Microseconds())}
	if err := fs.prove(env); err != nil {
		fs.forget(id, ch)
		return nil, err, true
	}
	select {
	case fs.sending <- struct{}{}:
	case <-ctx.Done():
		fs.forget(id, ch)
		return nil, ctx.Err(), true
	}
	if ctx.Err() != nil { // gave up while waiting for its turn: nothing sent
		<-fs.sending
		fs.forget(id, ch)
		return nil, ctx.Err(), true
	}
	// Send blocks while the peer reads nothing and the stream's write
	// quota is spent (a paused or wedged peer): when this send is still
	// in progress sendGrace after the caller's context ended, the stream
	// is cut, failing every call on it, as their deadlines would, and the
	// next forward opens another stream or goes unary. (A send that ends
	// within the grace was merely caught by the deadline.)
	seq := fs.sent.Load()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(sendGrace)
		<-t.C
		if fs.sent.Load() == seq {
			fs.cut("a send to the peer outlasted its call's deadline")
		}
	})
	err = fs.stream.Send(env)
	fs.sent.Add(1)
	stop()
	<-fs.sending
	if err != nil {
		// Not sent: the stream is over (its reader reports why to the
		// calls already on it); this one goes as a unary call unless its
		// caller has given up.
		fs.forget(id, ch)
		fs.p.dropStream(fs)
		if ctx.Err() != nil {
			return nil, ctx.Err(), true
		}
		return nil, nil, false
	}
	select {
	case r := <-ch:
		fs.p.pc.replyChans.Put(ch)
		if codes.Code(r.GetCode()) == codes.Unimplemented {
			return nil, nil, false
		}
		if err := replyErr(r); err != nil {
			return nil, err, true
		}
		return r.GetResponse(), nil, true
	case <-ctx.Done():
		if fs.forget(id, ch) {
			go fs.sendCancel(id)
		}
		return nil, ctx.Err(), true
	}
}

// prove sets env's proof, when members prove themselves with the gossip key.
func (fs *fwdStream) prove(env *sluicev1.ForwardEnvelope) error {
	pr := fs.p.pc.prover
	if pr == nil {
		return nil
	}
	proof, err := pr.Sign(time.Now(), forwardsMethod, env)
	if err != nil {
		return status.Errorf(codes.Internal, "signing %s: %v", forwardsMethod, err)
	}
	env.Proof = proof
	return nil
}

// sendCancel tells the peer that the call of envelope id stopped waiting:
// if it is still deciding it, it stops (a peer that was paused finds the
// cancellation right behind the envelope and decides nothing).
func (fs *fwdStream) sendCancel(id uint64) {
	env := &sluicev1.ForwardEnvelope{Id: id, Cancel: true}
	if fs.prove(env) != nil {
		return
	}
	ctx := fs.stream.Context()
	select {
	case fs.sending <- struct{}{}:
	case <-ctx.Done():
		return
	}
	_ = fs.stream.Send(env) // a failed send fails the stream: its reader ends it
	<-fs.sending
}

// cut ends the stream for why: its calls fail with UNAVAILABLE and why.
func (fs *fwdStream) cut(why string) {
	fs.mu.Lock()
	if fs.why == "" {
		fs.why = why
	}
	fs.mu.Unlock()
	fs.p.dropStream(fs)
}

// forget removes a call that stopped waiting, and recycles its channel once
// no reply can reach it. It reports whether the call was still waiting (no
// reply had come).
func (fs *fwdStream) forget(id uint64, ch chan *sluicev1.ForwardReply) (waiting bool) {
	fs.mu.Lock()
	if _, waiting = fs.waiting[id]; waiting {
		delete(fs.waiting, id)
	} else {
		<-ch // the reply was handed over under fs.mu: it is in ch
	}
	fs.mu.Unlock()
	fs.p.pc.replyChans.Put(ch)
	return waiting
}

// read hands each reply to its call until the stream ends, then fails
// the calls still waiting with the stream's error.
func (fs *fwdStream) read() {
	for {
		r, err := fs.stream.Recv()
		if err != nil {
			fs.fail(err)
			return
		}
		fs.mu.Lock()
		if ch, ok := fs.waiting[r.GetId()]; ok {
			delete(fs.waiting, r.GetId())
			ch <- r
		}
		fs.mu.Unlock()
	}
}

// fail ends the stream: no call is sent on it any more, and each waiting
// call gets err as its reply (codes.Unavailable when err has no code).
func (fs *fwdStream) fail(err error) {
	st, ok := status.FromError(err)
	fs.mu.Lock()
	why := fs.why
	fs.mu.Unlock()
	switch {
	case why != "":
		st = status.New(codes.Unavailable, "forwards stream cut: "+why)
	case !ok || st.Code() == codes.OK:
		st = status.New(codes.Unavailable, "forwards stream ended: "+err.Error())
	}
	if st.Code() == codes.Unimplemented {
		fs.p.smu.Lock()
		fs.p.unaryUntil = time.Now().Add(unaryRetry)
		fs.p.smu.Unlock()
	}
	fs.p.dropStream(fs)
	fs.mu.Lock()
	fs.broken = true
	for id, ch := range fs.waiting {
		delete(fs.waiting, id)
		ch <- &sluicev1.ForwardReply{Id: id, Code: int32(st.Code()), Message: st.Message()}
	}
	fs.mu.Unlock()
	fs.cancel()
}

// dropStream forgets fs as p's stream, so the next forward opens another.
func (p *peer) dropStream(fs *fwdStream) {
	p.smu.Lock()
	if p.fs == fs {
		p.fs = nil
	}
	p.smu.Unlock()
	fs.cancel()
}
