package transport

// The Admin key calls (InspectKey, DrainKey): validated as checks are,
// answered by the KeysSource; a drain is logged as an audit line naming
// its caller and counted.

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
	inspected, drained, failed atomic.Uint64
}

// KeyAdminStats are the Admin key calls answered: inspections and drains
// done, and calls of either that failed (refused as invalid, or the key
// could not be decided).
type KeyAdminStats struct{ Inspected, Drained, Failed uint64 }

// KeyAdminStats returns the Admin key calls this server answered.
func (s *Server) KeyAdminStats() KeyAdminStats {
	return KeyAdminStats{s.keyAdmin.inspected.Load(), s.keyAdmin.drained.Load(), s.keyAdmin.failed.Load()}
}

// keyRequest validates an Admin key call's request as a check's.
func keyRequest(req *sluicev1.KeyRequest) (check.Request, error) {
	if req.GetRequest() == nil {
		return check.Request{}, status.Error(codes.InvalidArgument, "request is missing: give name, key and the limits as for a check")
	}
	r := peer.RequestFromProto(req.GetRequest())
	r.Hits = 0
	if err := r.Validate(); err != nil {
		return r, status.Error(codes.InvalidArgument, err.Error())
	}
	return r, nil
}

func (g adminServer) InspectKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return g.keyCall(ctx, req, false)
}

func (g adminServer) DrainKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return g.keyCall(ctx, req, true)
}

func (g adminServer) keyCall(ctx context.Context, req *sluicev1.KeyRequest, drain bool) (*sluicev1.KeyInspection, error) {
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
	if drain {
		ins, err = s.cfg.Keys.DrainKey(ctx, r)
	} else {
		ins, err = s.cfg.Keys.InspectKey(ctx, r)
	}
	if drain {
		// The audit line: who drained which key, and what came of it.
		args := []any{"name", r.Name, "key", r.Key, "caller", callerOf(ctx)}
		if err != nil {
			s.log.Warn("audit: key drain failed", append(args, "err", err)...)
		} else {
			s.log.Info("audit: key drained", append(args, "drained", ins.GetDrained(), "remaining", ins.GetPeek().GetRemaining(), "owner", ins.GetOwner())...)
		}
	}
	switch {
	case err != nil:
		s.keyAdmin.failed.Add(1)
		return nil, status.Error(codes.Unavailable, err.Error())
	case drain:
		s.keyAdmin.drained.Add(1)
	default:
		s.keyAdmin.inspected.Add(1)
	}
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
