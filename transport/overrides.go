package transport

// The Admin override calls (SetOverride, DeleteOverride, ListOverrides):
// converted and validated here, kept by the OverridesSource; each change
// is logged as an audit line naming its caller, and counted.

import (
	"context"
	"errors"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// overrideCounters count the override changes answered, by result.
type overrideCounters struct {
	set, deleted, failed atomic.Uint64
}

// OverrideStats are the override changes this server answered: sets and
// deletions done, and changes refused or failed.
type OverrideStats struct{ Set, Deleted, Failed uint64 }

// OverrideStats returns the override changes this server answered.
func (s *Server) OverrideStats() OverrideStats {
	return OverrideStats{s.overrideN.set.Load(), s.overrideN.deleted.Load(), s.overrideN.failed.Load()}
}

func (g adminServer) SetOverride(ctx context.Context, req *sluicev1.SetOverrideRequest) (*sluicev1.Override, error) {
	s := g.s
	if s.cfg.Overrides == nil {
		return nil, status.Error(codes.Unimplemented, "overrides are not available on this server")
	}
	if req.GetOverride() == nil {
		s.overrideN.failed.Add(1)
		return nil, status.Error(codes.InvalidArgument, "override is missing: give name, key (or prefix) and limits")
	}
	o := req.GetOverride()
	caller := callerOf(ctx)
	stored, err := s.cfg.Overrides.SetOverride(o, caller)
	args := []any{"name", o.GetName(), "key", o.GetKey(), "prefix", o.GetPrefix(), "caller", caller}
	if err != nil {
		s.overrideN.failed.Add(1)
		s.log.Warn("audit: override refused", append(args, "err", err)...)
		if errors.Is(err, ErrOverridesFull) {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.overrideN.set.Add(1)
	first := stored.GetLimits()[0]
	s.log.Info("audit: override set", append(args, "limits", len(stored.GetLimits()), "limit", first.GetLimit(),
		"window_ms", first.GetWindowMs(), "note", stored.GetNote(), "version", stored.GetVersion())...)
	return stored, nil
}

func (g adminServer) DeleteOverride(ctx context.Context, req *sluicev1.DeleteOverrideRequest) (*sluicev1.DeleteOverrideResponse, error) {
	s := g.s
	if s.cfg.Overrides == nil {
		return nil, status.Error(codes.Unimplemented, "overrides are not available on this server")
	}
	caller := callerOf(ctx)
	ok, err := s.cfg.Overrides.DeleteOverride(req.GetName(), req.GetKey(), req.GetPrefix(), caller)
	args := []any{"name", req.GetName(), "key", req.GetKey(), "prefix", req.GetPrefix(), "caller", caller}
	if err != nil {
		s.overrideN.failed.Add(1)
		s.log.Warn("audit: override deletion failed", append(args, "err", err)...)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if ok {
		s.overrideN.deleted.Add(1)
		s.log.Info("audit: override deleted", args...)
	}
	return &sluicev1.DeleteOverrideResponse{Deleted: ok}, nil
}

func (g adminServer) ListOverrides(ctx context.Context, req *sluicev1.ListOverridesRequest) (*sluicev1.ListOverridesResponse, error) {
	s := g.s
	if s.cfg.Overrides == nil {
		return nil, status.Error(codes.Unimplemented, "overrides are not available on this server")
	}
	list, max := s.cfg.Overrides.Overrides(req.GetName())
	return &sluicev1.ListOverridesResponse{Overrides: list, Max: int32(max)}, nil
}
