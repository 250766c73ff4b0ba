package security

// Who may call a server's internal RPCs and operator pages (Guard), and the
// client side that proves internal calls (WithProofs, WithStreamProofs).

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// internalMethod reports whether a gRPC method is one only members of the
// cluster may call: the Peer service (counters) and Admin (membership).
func internalMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/sluice.v1.Peer/") || strings.HasPrefix(fullMethod, "/sluice.v1.Admin/")
}

// maxLoggedCallers bounds how many distinct refused callers get a log line
// of their own; later ones are only counted.
const maxLoggedCallers = 1024

// Guard decides who may call the internal RPCs (Peer, Admin) and the
// operator pages of a server, and counts and logs whom it refuses: with TLS
// a caller needs a certificate chaining to the node CA; without TLS and with
// a Prover an internal call needs a valid proof; with neither every caller
// is trusted. transport.Server asks it about every call and page, and
// package peer about every Forwards envelope. Safe for concurrent use.
type Guard struct {
	tls    *TLS    // nil: no certificates
	prover *Prover // nil: no proofs
	now    func() time.Time
	log    *slog.Logger

	refused atomic.Uint64
	logged  sync.Map // caller host → struct{}
	nLogged atomic.Int64
}

// NewGuard returns the Guard of a server secured by tls or, when tls is
// nil, by prover's proofs; with neither it trusts every caller. now is the
// clock proofs are checked against (nil means time.Now); refusals are logged
// to log (nil discards).
func NewGuard(tls *TLS, prover *Prover, now func() time.Time, log *slog.Logger) *Guard {
	g := &Guard{tls: tls, now: now, log: log}
	if tls == nil {
		g.prover = prover
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	return g
}

// open reports whether every caller is trusted (no TLS, no proofs).
func (g *Guard) open() bool { return g.tls == nil && g.prover == nil }

// Authorize checks a gRPC call of method (its full name) with request req,
// as a server's interceptor receives it: an internal call needs a node
// certificate (with TLS; PERMISSION_DENIED otherwise) or a valid proof (with
// a gossip key and no TLS; UNAUTHENTICATED otherwise); any other call
// passes. A refusal is counted, logged once per caller host and returned.
func (g *Guard) Authorize(ctx context.Context, method string, req any) error {
	if !internalMethod(method) || g.open() {
		return nil
	}
	if err := g.checkGRPC(ctx, method, req); err != nil {
		g.Refuse(ctx, method, err)
		return err
	}
	return nil
}

// AuthorizeStream is Authorize for the opening of a stream, which has no
// request yet: its proof is of an empty message (each Forwards envelope is
// proven as well, VerifyProof).
func (g *Guard) AuthorizeStream(ctx context.Context, method string) error {
	return g.Authorize(ctx, method, streamOpening)
}

func (g *Guard) checkGRPC(ctx context.Context, method string, req any) error {
	if g.tls != nil {
		p, _ := grpcpeer.FromContext(ctx)
		if p != nil {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && g.tls.isNode(ti.State.VerifiedChains) {
				return nil
			}
		}
		return status.Errorf(codes.PermissionDenied, "%s needs a node certificate signed by the cluster's node CA (--tls-ca)", method)
	}
	var proof string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(ProofHeader); len(v) == 1 {
			proof = v[0]
		} else if len(v) > 1 {
			return status.Errorf(codes.Unauthenticated, "%s: %d proofs, want one", method, len(v))
		}
	}
	if err := g.prover.Verify(g.now(), method, req, proof); err != nil {
		return status.Errorf(codes.Unauthenticated, "%s refused: %v", method, err)
	}
	return nil
}

// Proofs reports whether members prove themselves with the gossip key (a
// Prover and no TLS), so that a message carrying a proof of its own must be
// checked with VerifyProof. A nil Guard checks no proofs.
func (g *Guard) Proofs() bool { return g != nil && g.prover != nil }

// VerifyProof checks proof, made for a call of method with message msg,
// against the guard's clock and remembers it (Prover.Verify); it is for
// messages that carry their own proof (Forwards envelopes), and needs
// Proofs. The error wraps one of the ErrProof values.
func (g *Guard) VerifyProof(method string, msg any, proof string) error {
	return g.prover.Verify(g.now(), method, msg, proof)
}

// Refuse counts a refused call of what (a method, or what a message was
// for) and logs it once per caller host, the gRPC peer of ctx.
func (g *Guard) Refuse(ctx context.Context, what string, err error) {
	g.refused.Add(1)
	caller := "unknown"
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		caller = p.Addr.String()
	}
	g.logRefusal(caller, what, err)
}

func (g *Guard) logRefusal(caller, what string, err error) {
	host := caller
	if h, _, e := net.SplitHostPort(caller); e == nil {
		host = h
	}
	if _, seen := g.logged.Load(host); seen {
		return
	}
	if g.nLogged.Add(1) > maxLoggedCallers {
		return
	}
	if _, seen := g.logged.LoadOrStore(host, struct{}{}); seen {
		return
	}
	msg := "refused call from a caller that is not a cluster member (logged once per caller host)"
	if g.nLogged.Load() == maxLoggedCallers {
		msg += "; further callers are only counted (sluice_auth_refused_total)"
	}
	g.log.Warn(msg, "caller", caller, "call", what, "err", err)
}

// Refused is how many internal calls, envelopes and operator pages the
// guard refused for want of a node certificate or a valid proof.
func (g *Guard) Refused() uint64 { return g.refused.Load() }

// OperatorOnly wraps an HTTP handler that shows the cluster's inside (the
// status page, pprof): with TLS it needs a node certificate, like Admin.
func (g *Guard) OperatorOnly(h http.Handler) http.Handler {
	if g.tls == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || !g.tls.isNode(r.TLS.VerifiedChains) {
			err := errors.New("needs a node certificate signed by the cluster's node CA (--tls-ca)")
			g.refused.Add(1)
			g.logRefusal(r.RemoteAddr, r.Method+" "+r.URL.Path, err)
			http.Error(w, r.URL.Path+" "+err.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// proofInterceptor signs every internal call made through a connection
// (PeerClient, and the CLI's Admin calls) with p.
func proofInterceptor(p *Prover) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if internalMethod(method) {
			proof, err := p.Sign(time.Now(), method, req)
			if err != nil {
				return status.Errorf(codes.Internal, "signing %s: %v", method, err)
			}
			ctx = metadata.AppendToOutgoingContext(ctx, ProofHeader, proof)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// streamOpening is the message an internal stream's opening is proven for:
// a stream has no request when it opens.
var streamOpening = &emptypb.Empty{}

// proofStreamInterceptor proves the opening of every internal stream made
// through a connection (Peer/Forwards) with p; the stream's messages carry
// proofs of their own.
func proofStreamInterceptor(p *Prover) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if internalMethod(method) {
			proof, err := p.Sign(time.Now(), method, streamOpening)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "signing %s: %v", method, err)
			}
			ctx = metadata.AppendToOutgoingContext(ctx, ProofHeader, proof)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

// WithProofs returns the dial option that signs internal calls with p, for
// a Client whose Admin calls go to a node that authenticates members by
// the gossip key.
func WithProofs(p *Prover) grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(proofInterceptor(p))
}

// WithStreamProofs is WithProofs for the openings of internal streams
// (Peer/Forwards): peer.PeerClient dials with both.
func WithStreamProofs(p *Prover) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(proofStreamInterceptor(p))
}
