package peer

// The receiving end of Peer/Forwards: forwards carried on one long-lived
// stream per pair of nodes instead of one unary call each (the sending end
// is forwards_client.go).
//
// A unary Forward costs the receiver a whole gRPC call: a new HTTP/2 stream
// with its headers to decode (HPACK), a context and a deadline timer, the
// hand-off from the connection's reader to a stream worker, and response
// headers and trailers to encode. On a stream an envelope is one DATA frame
// each way; the receiver decides it on a goroutine of its own (a decision
// may wait for a pull, and must not hold up the envelopes behind it) and
// writes the reply under the stream's send lock.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// forwardsMethod is the full name of Peer/Forwards, which envelope proofs
// are signed for.
const forwardsMethod = "/sluice.v1.Peer/Forwards"

// maxEnvelopeMicros caps an envelope's timeout_micros (an hour).
const maxEnvelopeMicros = int64(time.Hour / time.Microsecond)

// forwardsStream is the server's state of one Forwards stream.
type forwardsStream struct {
	stream grpc.BidiStreamingServer[sluicev1.ForwardEnvelope, sluicev1.ForwardReply]

	mu      sync.Mutex                    // guards what follows, and is held while sending
	closed  bool                          // the handler is returning: nothing more is sent
	running map[uint64]context.CancelFunc // envelopes being decided, by id
	idle    *sync.Cond                    // signalled when running empties
}

// Forwards serves a stream of forwards until the sender closes it, the
// connection breaks, or the server shuts down. At shutdown it stops taking
// envelopes (those that arrive later are answered UNAVAILABLE, undecided,
// and their senders fail over) and returns once the envelopes it took have
// been answered, or the stream's context ends.
func (g *Server) Forwards(stream grpc.BidiStreamingServer[sluicev1.ForwardEnvelope, sluicev1.ForwardReply]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	fs := &forwardsStream{stream: stream, running: map[uint64]context.CancelFunc{}}
	fs.idle = sync.NewCond(&fs.mu)
	recvDone := make(chan error, 1)
	go func() {
		for {
			env, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			g.take(ctx, fs, env)
		}
	}()
	var err error
	select {
	case err = <-recvDone:
		if errors.Is(err, io.EOF) {
			err = nil // the sender closed the stream
		}
	case <-g.cfg.Draining:
		err = status.Error(codes.Unavailable, "node shutting down")
	}
	// Answer what was taken, unless the stream is gone (the sender's calls
	// then fail with it, as a unary call's would).
	fs.mu.Lock()
	for len(fs.running) > 0 && ctx.Err() == nil {
		fs.idleWait(ctx)
	}
	fs.closed = true
	fs.mu.Unlock()
	return err
}

// take handles one envelope as it arrives: a cancellation at once; a
// forward is decided on a goroutine of its own, under a context that ends
// at its timeout or its cancellation.
func (g *Server) take(ctx context.Context, fs *forwardsStream, env *sluicev1.ForwardEnvelope) {
	id := env.GetId()
	if env.GetCancel() {
		if g.checkProof(ctx, env) != nil {
			return
		}
		fs.mu.Lock()
		if stop, ok := fs.running[id]; ok {
			stop()
		}
		fs.mu.Unlock()
		return
	}
	if err := checkEnvelope(env); err != nil {
		fs.reply(errorReply(id, err))
		return
	}
	if g.stopping() {
		fs.reply(&sluicev1.ForwardReply{Id: id, Code: int32(codes.Unavailable), Message: "node shutting down"})
		return
	}
	// Capped, so that no timeout overflows a time.Duration: a decision
	// never takes an hour.
	dctx, stop := context.WithTimeout(ctx, time.Duration(min(env.GetTimeoutMicros(), maxEnvelopeMicros))*time.Microsecond)
	fs.mu.Lock()
	_, dup := fs.running[id]
	if fs.closed || dup {
		fs.mu.Unlock()
		stop()
		if dup {
			fs.reply(&sluicev1.ForwardReply{Id: id, Code: int32(codes.InvalidArgument), Message: fmt.Sprintf("forward envelope %d is already being decided", id)})
		}
		return
	}
	fs.running[id] = stop
	fs.mu.Unlock()
	go func() {
		r := g.serveEnvelope(dctx, env)
		fs.mu.Lock()
		if !fs.closed {
			_ = fs.stream.Send(r) // a failed send fails the stream: its Recv ends the handler
		}
		delete(fs.running, id)
		if len(fs.running) == 0 {
			fs.idle.Broadcast()
		}
		fs.mu.Unlock()
		stop()
	}()
}

// reply sends r unless the handler has returned.
func (fs *forwardsStream) reply(r *sluicev1.ForwardReply) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.closed {
		_ = fs.stream.Send(r)
	}
}

// idleWait waits (fs.mu held) for fs.idle, or for ctx to end.
func (fs *forwardsStream) idleWait(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		fs.mu.Lock()
		fs.idle.Broadcast()
		fs.mu.Unlock()
	})
	fs.idle.Wait()
	stop()
}

// serveEnvelope decides one well-formed envelope and returns its reply: the
// answer, or the error a unary Forward would have returned. A panic
// becomes INTERNAL.
func (g *Server) serveEnvelope(ctx context.Context, env *sluicev1.ForwardEnvelope) (reply *sluicev1.ForwardReply) {
	id := env.GetId()
	defer func() {
		if r := recover(); r != nil {
			g.log.Error("panic in gRPC handler", "method", forwardsMethod, "panic", r, "stack", string(debug.Stack()))
			reply = &sluicev1.ForwardReply{Id: id, Code: int32(codes.Internal), Message: "internal error"}
		}
	}()
	if err := g.checkProof(ctx, env); err != nil {
		return errorReply(id, err)
	}
	resp, err := g.Forward(ctx, env.GetRequest())
	if err != nil {
		return errorReply(id, err)
	}
	return &sluicev1.ForwardReply{Id: id, Response: resp}
}

// checkEnvelope refuses a forward envelope without a request or a timeout.
func checkEnvelope(env *sluicev1.ForwardEnvelope) error {
	if env.GetRequest() == nil {
		return status.Error(codes.InvalidArgument, "forward envelope without a request")
	}
	if env.GetTimeoutMicros() <= 0 {
		return status.Errorf(codes.InvalidArgument, "forward envelope timeout_micros is %d, want more than 0", env.GetTimeoutMicros())
	}
	return nil
}

// checkProof, when members prove themselves with the gossip key, refuses an
// envelope without a valid proof (counted and logged like a refused call).
func (g *Server) checkProof(ctx context.Context, env *sluicev1.ForwardEnvelope) error {
	gd := g.cfg.Guard
	if !gd.Proofs() {
		return nil
	}
	proof := env.Proof
	env.Proof = ""
	err := gd.VerifyProof(forwardsMethod, env, proof)
	env.Proof = proof
	if err != nil {
		err = status.Errorf(codes.Unauthenticated, "%s envelope refused: %v", forwardsMethod, err)
		gd.Refuse(ctx, forwardsMethod, err)
		return err
	}
	return nil
}

func errorReply(id uint64, err error) *sluicev1.ForwardReply {
	st, ok := status.FromError(err)
	if !ok {
		st = status.New(codes.Unknown, err.Error())
	}
	return &sluicev1.ForwardReply{Id: id, Code: int32(st.Code()), Message: st.Message()}
}

// replyErr is the error a reply carries, nil for an answer.
func replyErr(r *sluicev1.ForwardReply) error {
	if r.GetCode() == 0 {
		if r.GetResponse() == nil {
			return fmt.Errorf("peer answered envelope %d with neither a response nor an error", r.GetId())
		}
		return nil
	}
	return status.Error(codes.Code(r.GetCode()), r.GetMessage())
}
