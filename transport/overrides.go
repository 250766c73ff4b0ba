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

	"github.com/sluicehq/sluice/cluster/overrides"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
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

// OverrideFromProto converts an Override as a client sends it; the node's
// fields (version, origin, set_by, set_at) are not read.
func OverrideFromProto(m *sluicev1.Override) overrides.Override {
	o := overrides.Override{Target: overrides.Target{Name: m.GetName(), Key: m.GetKey(), Prefix: m.GetPrefix()}, Note: m.GetNote()}
	for _, l := range m.GetLimits() {
		o.Limits = append(o.Limits, peer.LimitFromProto(l))
	}
	return o
}

// OverrideToProto converts a stored override for a client.
func OverrideToProto(o overrides.Override) *sluicev1.Override {
	m := &sluicev1.Override{Name: o.Name, Key: o.Key, Prefix: o.Prefix, Note: o.Note, Version: o.Version, Origin: o.Origin,
		SetBy: o.SetBy, SetAtUnixMs: o.SetAt / 1e6}
	for _, l := range o.Limits {
		m.Limits = append(m.Limits, peer.LimitToProto(l))
	}
	return m
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
	o := OverrideFromProto(req.GetOverride())
	o.SetBy = callerOf(ctx)
	stored, err := s.cfg.Overrides.SetOverride(o)
	args := []any{"name", o.Name, "key", o.Key, "prefix", o.Prefix, "caller", o.SetBy}
	if err != nil {
		s.overrideN.failed.Add(1)
		s.log.Warn("audit: override refused", append(args, "err", err)...)
		if errors.Is(err, overrides.ErrFull) {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.overrideN.set.Add(1)
	s.log.Info("audit: override set", append(args, "limits", len(stored.Limits), "limit", stored.Limits[0].Limit,
		"window_ms", stored.Limits[0].WindowMS, "note", stored.Note, "version", stored.Version)...)
	return OverrideToProto(stored), nil
}

func (g adminServer) DeleteOverride(ctx context.Context, req *sluicev1.DeleteOverrideRequest) (*sluicev1.DeleteOverrideResponse, error) {
	s := g.s
	if s.cfg.Overrides == nil {
		return nil, status.Error(codes.Unimplemented, "overrides are not available on this server")
	}
	t := overrides.Target{Name: req.GetName(), Key: req.GetKey(), Prefix: req.GetPrefix()}
	caller := callerOf(ctx)
	ok, err := s.cfg.Overrides.DeleteOverride(t, caller)
	args := []any{"name", t.Name, "key", t.Key, "prefix", t.Prefix, "caller", caller}
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
	resp := &sluicev1.ListOverridesResponse{Max: overrides.MaxOverrides}
	for _, o := range s.cfg.Overrides.Overrides(req.GetName()) {
		resp.Overrides = append(resp.Overrides, OverrideToProto(o))
	}
	return resp, nil
}
