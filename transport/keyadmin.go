package transport

// The Admin key calls (InspectKey, DrainKey, ResetKey): validated as
// checks are, answered by the KeysSource; a drain or a reset is logged as
// an audit line naming its caller, and every call is counted.

import (
	"context"
	"crypto/x509"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
	"github.com/sluicehq/sluice/transport/security"
)

// keyAdminCounters count the Admin key calls answered, by call and
// result.
type keyAdminCounters struct {
	inspected, drained, reset, failed atomic.Uint64
}

// KeyAdminStats are the Admin key calls answered: inspections, drains and
// resets done, and calls of any of them that failed (refused as invalid,
// or the key could not be decided).
type KeyAdminStats struct{ Inspected, Drained, Reset, Failed uint64 }

// KeyAdminStats returns the Admin key calls this server answered.
func (s *Server) KeyAdminStats() KeyAdminStats {
	return KeyAdminStats{s.keyAdmin.inspected.Load(), s.keyAdmin.drained.Load(), s.keyAdmin.reset.Load(), s.keyAdmin.failed.Load()}
}

// keyCallKind is which Admin key call is answered.
type keyCallKind int

const (
	keyInspect keyCallKind = iota
	keyDrain
	keyReset
)

// keyRequest validates an Admin key call's request as a check's.
func keyRequest(req *sluicev1.KeyRequest) (check.Request, error) {
	if req.GetRequest() == nil {
		return check.Request{}, status.Error(codes.InvalidArgument, "request is missing: give name, key and the limits as for a check")
	}
	if req.GetRequest().GetResetKey() {
		return check.Request{}, status.Error(codes.InvalidArgument, "request.reset_key is set by nodes only: reset a key with ResetKey")
	}
	r := peer.RequestFromProto(req.GetRequest())
	r.Hits = 0
	if err := r.Validate(); err != nil {
		return r, status.Error(codes.InvalidArgument, err.Error())
	}
	return r, nil
}

func (g adminServer) InspectKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return g.keyCall(ctx, req, keyInspect)
}

func (g adminServer) DrainKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return g.keyCall(ctx, req, keyDrain)
}

func (g adminServer) ResetKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return g.keyCall(ctx, req, keyReset)
}

func (g adminServer) keyCall(ctx context.Context, req *sluicev1.KeyRequest, kind keyCallKind) (*sluicev1.KeyInspection, error) {
	s := g.s
	if s.cfg.Keys == nil {
		return nil, status.Error(codes.Unimplemented, "key administration is not available on this server")
	}
	r, err := keyRequest(req)
	if err != nil {
		s.keyAdmin.failed.Add(1)
		return nil, err
	}
	var ins *sluicev1.KeyInspection
	// The audit line of a change: who changed which key, and what came of
	// it.
	args := []any{"name", r.Name, "key", r.Key, "caller", callerOf(ctx)}
	switch kind {
	case keyInspect:
		ins, err = s.cfg.Keys.InspectKey(ctx, r)
	case keyDrain:
		ins, err = s.cfg.Keys.DrainKey(ctx, r)
		if err != nil {
			s.log.Warn("audit: key drain failed", append(args, "err", err)...)
		} else {
			s.log.Info("audit: key drained", append(args, "drained", ins.GetDrained(), "remaining", ins.GetPeek().GetRemaining(), "owner", ins.GetOwner())...)
		}
	case keyReset:
		ins, err = s.cfg.Keys.ResetKey(ctx, r)
		if err != nil {
			s.log.Warn("audit: key reset failed", append(args, "err", err)...)
		} else {
			s.log.Info("audit: key reset", append(args, "remaining", ins.GetPeek().GetRemaining(), "owner", ins.GetOwner())...)
		}
	}
	if err != nil {
		s.keyAdmin.failed.Add(1)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	[...]*atomic.Uint64{&s.keyAdmin.inspected, &s.keyAdmin.drained, &s.keyAdmin.reset}[kind].Add(1)
	return ins, nil
}

// callerOf names the caller of an internal call for an audit line: the
// subject of its verified client certificate, or that it proved itself
// with the gossip key, or that the cluster checks no caller; with the
// address it called from.
func callerOf(ctx context.Context) string {
	addr := "unknown address"
	p, ok := grpcpeer.FromContext(ctx)
	if ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	if ok {
		if ti, isTLS := p.AuthInfo.(credentials.TLSInfo); isTLS {
			if c := leaf(ti.State.VerifiedChains); c != nil {
				return "certificate " + c.Subject.String() + " from " + addr
			}
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(security.ProofHeader)) > 0 {
		return "a gossip-key proof from " + addr
	}
	return "an unauthenticated caller (no TLS, no gossip key) from " + addr
}

func leaf(chains [][]*x509.Certificate) *x509.Certificate {
	for _, ch := range chains {
		if len(ch) > 0 {
			return ch[0]
		}
	}
	return nil
}
