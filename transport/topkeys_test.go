package transport

import (
	"context"
	"testing"

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
