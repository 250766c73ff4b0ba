package transport

import (
	"context"
	"errors"
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

// guard decides who may call the internal RPCs and the operator pages, and
// counts and logs whom it refuses.
type guard struct {
	tls    *TLS    // nil: no certificates
	prover *Prover // nil: no proofs
	now    func() time.Time

	refused atomic.Uint64
	logged  sync.Map // caller host → struct{}
	nLogged atomic.Int64
}

// open reports whether every caller is trusted (no TLS, no proofs).
func (g *guard) open() bool { return g.tls == nil && g.prover == nil }

// authorizeUnary is the gRPC interceptor: an internal call needs a node certificate
// (with TLS) or a valid proof (with a gossip key and no TLS).
func (s *Server) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if !internalMethod(info.FullMethod) || s.guard.open() {
		return next(ctx, req)
	}
	if err := s.guard.checkGRPC(ctx, info.FullMethod, req); err != nil {
		s.refuse(ctx, info.FullMethod, err)
		return nil, err
	}
	return next(ctx, req)
}

func (g *guard) checkGRPC(ctx context.Context, method string, req any) error {
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

// refuse counts a refused call and logs it once per caller host.
func (s *Server) refuse(ctx context.Context, what string, err error) {
	s.guard.refused.Add(1)
	caller := "unknown"
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		caller = p.Addr.String()
	}
	s.logRefusal(caller, what, err)
}

func (s *Server) logRefusal(caller, what string, err error) {
	host := caller
	if h, _, e := net.SplitHostPort(caller); e == nil {
		host = h
	}
	if _, seen := s.guard.logged.Load(host); seen {
		return
	}
	if s.guard.nLogged.Add(1) > maxLoggedCallers {
		return
	}
	if _, seen := s.guard.logged.LoadOrStore(host, struct{}{}); seen {
		return
	}
	msg := "refused call from a caller that is not a cluster member (logged once per caller host)"
	if s.guard.nLogged.Load() == maxLoggedCallers {
		msg += "; further callers are only counted (sluice_auth_refused_total)"
	}
	s.log.Warn(msg, "caller", caller, "call", what, "err", err)
}

// AuthRefused is how many internal calls and operator pages this server
// refused for want of a node certificate or a valid proof.
func (s *Server) AuthRefused() uint64 { return s.guard.refused.Load() }

// operatorOnly wraps an HTTP handler that shows the cluster's inside (the
// status page, pprof): with TLS it needs a node certificate, like Admin.
func (s *Server) operatorOnly(h http.Handler) http.Handler {
	if s.guard.tls == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || !s.guard.tls.isNode(r.TLS.VerifiedChains) {
			err := errors.New("needs a node certificate signed by the cluster's node CA (--tls-ca)")
			s.guard.refused.Add(1)
			s.logRefusal(r.RemoteAddr, r.Method+" "+r.URL.Path, err)
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

// withStreamProofs is WithProofs for internal streams too (PeerClient).
func withStreamProofs(p *Prover) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(proofStreamInterceptor(p))
}

// SecuritySummary describes how a member is secured, for status output:
// "tls+client-auth, gossip encrypted", "plaintext, gossip in clear", …
func SecuritySummary(m interface {
	GetTls() bool
	GetClientAuth() bool
	GetGossipEncrypted() bool
}) string {
	s := "plaintext"
	if m.GetTls() {
		s = "tls"
		if m.GetClientAuth() {
			s += "+client-auth"
		}
	}
	if m.GetGossipEncrypted() {
		return s + ", gossip encrypted"
	}
	return s + ", gossip in clear"
}

// MemberVersion is a member's release for status output: its version as
// it said it; "unknown" when it answered without one (a release from
// before versions were reported); "-" when it was not asked or did not
// answer (keys < 0).
func MemberVersion(m interface {
	GetKeys() int64
	GetVersion() string
}) string {
	switch {
	case m.GetKeys() < 0:
		return "-"
	case m.GetVersion() == "":
		return "unknown"
	}
	return m.GetVersion()
}
