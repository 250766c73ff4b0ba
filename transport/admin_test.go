package transport

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/transport/peer"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeTopKeys answers with limit keys, and records what it was asked.
type fakeTopKeys struct {
	by    *sluicev1.TopBy
	limit *int
}

func (f fakeTopKeys) TopKeys(_ context.Context, by sluicev1.TopBy, limit int) (*sluicev1.TopKeysResponse, error) {
	*f.by, *f.limit = by, limit
	return &sluicev1.TopKeysResponse{Node: "n1"}, nil
}

// Admin.TopKeys passes a valid request on (a limit of 0 as the default)
// and refuses any other with InvalidArgument, without asking the node.
func FuzzTopKeysRequest(f *testing.F) {
	f.Add(int32(0), int32(0))
	f.Add(int32(1), int32(MaxTopKeys))
	f.Add(int32(2), int32(5))
	f.Add(int32(0), int32(-1))
	f.Add(int32(0), int32(MaxTopKeys+1))
	f.Fuzz(func(t *testing.T, by, limit int32) {
		var gotBy sluicev1.TopBy
		gotLimit := -1
		g := adminServer{s: &Server{cfg: ServerConfig{TopKeys: fakeTopKeys{&gotBy, &gotLimit}}}}
		resp, err := g.TopKeys(context.Background(), &sluicev1.TopKeysRequest{By: sluicev1.TopBy(by), Limit: limit})
		valid := (by == 0 || by == 1) && limit >= 0 && limit <= MaxTopKeys
		if !valid {
			if status.Code(err) != codes.InvalidArgument || gotLimit != -1 {
				t.Fatalf("by %d, limit %d: %v (asked the node for %d)", by, limit, err, gotLimit)
			}
			return
		}
		want := int(limit)
		if want == 0 {
			want = DefaultTopKeys
		}
		if err != nil || resp.Node != "n1" || gotLimit != want || gotBy != sluicev1.TopBy(by) {
			t.Fatalf("by %d, limit %d: %v, %v; asked by %v limit %d", by, limit, resp, err, gotBy, gotLimit)
		}
	})
}

func TestTopKeysUnimplementedWithoutASource(t *testing.T) {
	t.Parallel()
	g := adminServer{s: &Server{}}
	if _, err := g.TopKeys(context.Background(), &sluicev1.TopKeysRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("without a source: %v", err)
	}
}

// fakeKeys answers every key call, and records that it was asked.
type fakeKeys struct{ asked *int }

func (f fakeKeys) InspectKey(_ context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	*f.asked++
	return &sluicev1.KeyInspection{Name: r.Name, Key: r.Key}, nil
}

func (f fakeKeys) DrainKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	return f.InspectKey(ctx, r)
}

func (f fakeKeys) ResetKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	return f.InspectKey(ctx, r)
}

// The Admin key calls pass on exactly the requests a check would accept
// (hits aside, and never with reset_key, which nodes alone send each
// other) and refuse every other with InvalidArgument, without asking the
// node; an invalid call is counted as failed.
func FuzzKeyRequest(f *testing.F) {
	f.Add("api", "user:1", int64(10), int64(60000), int32(3), int64(5), uint8(1), false)
	f.Add("", "k", int64(10), int64(60000), int32(0), int64(1), uint8(0), false)
	f.Add("api", "k", int64(-1), int64(0), int32(9), int64(-3), uint8(2), false)
	f.Add("api", "k", int64(0), int64(0), int32(0), int64(0), uint8(0), false) // the rule for api
	f.Add("api", "k", int64(10), int64(60000), int32(1), int64(0), uint8(0), true)
	f.Fuzz(func(t *testing.T, name, key string, limit, window int64, alg int32, hits int64, which uint8, resetKey bool) {
		asked := 0
		srv := &Server{cfg: ServerConfig{Keys: fakeKeys{&asked}}, log: slog.New(slog.DiscardHandler)}
		g := adminServer{s: srv}
		wire := &sluicev1.RateLimitRequest{Name: name, Key: key, Limit: limit, WindowMs: window, Algorithm: sluicev1.Algorithm(alg), Hits: &hits, ResetKey: resetKey}
		call := [...]func(context.Context, *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error){g.InspectKey, g.DrainKey, g.ResetKey}[which%3]
		ins, err := call(context.Background(), &sluicev1.KeyRequest{Request: wire})
		r := peer.RequestFromProto(wire)
		r.Hits, r.Reset = 0, false
		if r.Validate() != nil || resetKey {
			if status.Code(err) != codes.InvalidArgument || asked != 0 || srv.KeyAdminStats().Failed != 1 {
				t.Fatalf("%q %q limit %d window %d alg %d reset_key %v: %v (asked %d)", name, key, limit, window, alg, resetKey, err, asked)
			}
			return
		}
		if err != nil || asked != 1 || ins.Name != name || ins.Key != key {
			t.Fatalf("%q %q limit %d window %d alg %d: %v, %v (asked %d)", name, key, limit, window, alg, ins, err, asked)
		}
	})
}

func TestKeyRequestWithoutARequest(t *testing.T) {
	t.Parallel()
	asked := 0
	g := adminServer{s: &Server{cfg: ServerConfig{Keys: fakeKeys{&asked}}, log: slog.New(slog.DiscardHandler)}}
	if _, err := g.InspectKey(context.Background(), &sluicev1.KeyRequest{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request is missing") {
		t.Fatalf("no request: %v", err)
	}
}
