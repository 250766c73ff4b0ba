package transport

// The server's side of its security: its gRPC interceptors ask the guard of
// package transport/security about every call; status output says how a
// member is secured.

import (
	"context"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// authorizeUnary is the gRPC interceptor: an internal call needs a node
// certificate (with TLS) or a valid proof (with a gossip key and no TLS);
// the guard decides, counts and logs (security.Guard.Authorize).
func (s *Server) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if err := s.guard.Authorize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

// authorizeStream is authorizeUnary for streams: opening an internal stream
// needs a node certificate (with TLS) or a valid proof for the method and an
// empty message (with a gossip key and no TLS; each Forwards envelope is
// proven as well), and a panic in the handler becomes INTERNAL.
func (s *Server) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in gRPC handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	if err := s.guard.AuthorizeStream(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return next(srv, ss)
}

// AuthRefused is how many internal calls and operator pages this server
// refused for want of a node certificate or a valid proof.
func (s *Server) AuthRefused() uint64 { return s.guard.Refused() }

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
