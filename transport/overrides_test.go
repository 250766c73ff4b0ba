package transport

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster/overrides"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// tableSource keeps overrides in a real table, as the node does.
type tableSource struct {
	mu sync.Mutex
	t  *overrides.Table
	v  uint64
}

func fromWire(m *sluicev1.Override) overrides.Override {
	o := overrides.Override{Target: overrides.Target{Name: m.GetName(), Key: m.GetKey(), Prefix: m.GetPrefix()}, Note: m.GetNote(), Origin: "n1"}
	for _, l := range m.GetLimits() {
		o.Limits = append(o.Limits, peer.LimitFromProto(l))
	}
	return o
}

func (s *tableSource) SetOverride(m *sluicev1.Override, setBy string) (*sluicev1.Override, error) {
	o := fromWire(m)
	o.SetBy = setBy
	s.mu.Lock()
	s.v++
	o.Version = s.v
	s.mu.Unlock()
	if _, err := s.t.Apply(o); err != nil {
		return nil, err
	}
	return m, nil
}

func (s *tableSource) DeleteOverride(name, key string, prefix bool, setBy string) (bool, error) {
	return false, nil
}

func (s *tableSource) Overrides(name string) ([]*sluicev1.Override, int) {
	var out []*sluicev1.Override
	for _, o := range s.t.List(name) {
		out = append(out, &sluicev1.Override{Name: o.Name, Key: o.Key, Prefix: o.Prefix})
	}
	return out, overrides.MaxOverrides
}

// SetOverride stores exactly the overrides that validate, refuses every
// other with InvalidArgument and changes nothing, counts each, and lists
// what it stored.
func FuzzSetOverride(f *testing.F) {
	f.Add("api", "user:", true, int64(5), int64(60000), int32(5), "incident")
	f.Add("api", "", true, int64(5), int64(60000), int32(1), "")
	f.Add("", "k", false, int64(5), int64(60000), int32(1), "")
	f.Add("api", "k", false, int64(0), int64(60000), int32(1), "")
	f.Add("api", "k", false, int64(5), int64(0), int32(9), "\xff")
	f.Fuzz(func(t *testing.T, name, key string, prefix bool, limit, window int64, alg int32, note string) {
		src := &tableSource{t: overrides.NewTable()}
		srv := &Server{cfg: ServerConfig{Overrides: src}, log: slog.New(slog.DiscardHandler)}
		g := adminServer{s: srv}
		o := &sluicev1.Override{Name: name, Key: key, Prefix: prefix, Note: note,
			Limits: []*sluicev1.Limit{{Limit: limit, WindowMs: window, Algorithm: sluicev1.Algorithm(alg)}}}
		// As the source will stamp it: the caller, the first version.
		want := fromWire(o)
		want.SetBy, want.Version = callerOf(context.Background()), 1
		valid := want.Validate() == nil
		got, err := g.SetOverride(context.Background(), &sluicev1.SetOverrideRequest{Override: o})
		list, _ := g.ListOverrides(context.Background(), &sluicev1.ListOverridesRequest{})
		if !valid {
			if status.Code(err) != codes.InvalidArgument || len(list.Overrides) != 0 || srv.OverrideStats().Failed != 1 {
				t.Fatalf("%+v: %v, listed %d", o, err, len(list.Overrides))
			}
			return
		}
		if err != nil || got.Name != name || got.Key != key || len(list.Overrides) != 1 || srv.OverrideStats().Set != 1 {
			t.Fatalf("%+v: %v, %v, listed %d", o, got, err, len(list.Overrides))
		}
	})
}
