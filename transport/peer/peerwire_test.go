package peer

// Tests of what crosses the peer connection from the other side: malformed
// answers and counters refused by the client, and peer calls from another
// cluster refused by the server.

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// bogusPeer answers with whatever its fields say, to check what PeerClient
// accepts from a peer.
type bogusPeer struct {
	sluicev1.UnimplementedPeerServer
	forward *sluicev1.ForwardResponse
	pull    *sluicev1.PullResponse
}

func (b *bogusPeer) Forward(context.Context, *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	return b.forward, nil
}

func (b *bogusPeer) Pull(context.Context, *sluicev1.PullRequest) (*sluicev1.PullResponse, error) {
	return b.pull, nil
}

func startBogusPeer(t testing.TB, b *bogusPeer) string {
	t.Helper()
	l := listen(t)
	g := grpc.NewServer()
	sluicev1.RegisterPeerServer(g, b)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// A peer's malformed answer is an error, and nothing of it is installed.
func TestPeerClientRefusesMalformedAnswers(t *testing.T) {
	t.Parallel()
	ok := CounterToProto(counter("x", 3, 9))
	badState := CounterToProto(counter("y", 3, 9))
	badState.State[0] = 9
	stateless := &sluicev1.Counter{Name: "api", Key: "y", Version: 4}
	ghost := &sluicev1.Counter{Name: "api", Key: "y", State: ok.State}
	other := CounterToProto(counter("other", 3, 9))
	decided := []*sluicev1.RateLimitResponse{ResponseToProto(check.Outcome{Owner: "p"}), ResponseToProto(check.Outcome{Owner: "p"})}
	tests := []struct {
		name string
		peer bogusPeer
		want string
	}{
		{"pull/bad state", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, badState}}}, "answer 1: bad counter state"},
		{"pull/version without state", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, stateless}}}, "answer 1: bad counter state"},
		{"pull/state without version", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, ghost}}}, "answer 1: version 0 with a state"},
		{"pull/short", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok}}}, "answered 1 of 2 keys"},
		{"pull/long", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, ok, ok}}}, "answered 3 of 2 keys"},
		{"pull/other key", bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, other}}}, "answer 1 is for another key"},
		{"forward/moved_to short", bogusPeer{forward: &sluicev1.ForwardResponse{Responses: decided, MovedTo: []string{"h:1"}}}, "moved_to for 1 of 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := startBogusPeer(t, &tt.peer)
			pc := NewPeerClient(PeerConfig{NodeName: "b", Timeout: time.Minute})
			defer pc.Close()
			var err error
			if tt.peer.forward != nil {
				out := make([]check.Outcome, 2)
				err = pc.Forward(testCtx(t), addr, keys("k", 2), out, make([]string, 2))
			} else {
				ks := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api", Key: "y"}}
				err = pc.Pull(testCtx(t), addr, ks, false, 0, make([]keymove.PullAnswer, len(ks)))
				if ks[0].Version != 0 || ks[1].Version != 0 {
					t.Fatalf("a refused answer was installed: %+v", ks)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestCounterFromProto(t *testing.T) {
	t.Parallel()
	valid := CounterToProto(counter("k", 3, 9))
	tests := []struct {
		name string
		m    *sluicev1.Counter
		want string // "" accepted
	}{
		{"valid", valid, ""},
		{"none held", &sluicev1.Counter{Name: "api", Key: "k"}, ""},
		{"nil", nil, "missing counter"},
		{"empty name", &sluicev1.Counter{Key: "k", State: valid.State, Version: 9}, "name is empty"},
		{"empty key", &sluicev1.Counter{Name: "api", State: valid.State, Version: 9}, "key is empty"},
		{"NUL in name", &sluicev1.Counter{Name: "a\x00", Key: "k", State: valid.State, Version: 9}, "NUL"},
		{"long key", &sluicev1.Counter{Name: "api", Key: strings.Repeat("k", bucket.MaxKeyLen+1), State: valid.State, Version: 9}, "more than"},
		{"no state", &sluicev1.Counter{Name: "api", Key: "k", Version: 9}, "bad counter state"},
		{"truncated state", &sluicev1.Counter{Name: "api", Key: "k", State: valid.State[:20], Version: 9}, "bad counter state"},
		{"state without version", &sluicev1.Counter{Name: "api", Key: "k", State: valid.State}, "version 0 with a state"},
	}
	for _, tt := range tests {
		c, err := CounterFromProto(tt.m)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want == "" && !proto.Equal(CounterToProto(c), tt.m):
			t.Errorf("%s: round trip gives %v, want %v", tt.name, CounterToProto(c), tt.m)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.want)
		}
	}
	if m := CounterToProto(bucket.Counter{Name: "a", Key: "k", State: bucket.State{Count: 4}}); len(m.State) != 0 {
		t.Errorf("version 0 sent %d state bytes, want none", len(m.State))
	}
}

func FuzzCounterFromProto(f *testing.F) {
	for _, c := range []bucket.Counter{counter("k", 3, 9), {Name: "a", Key: "k"}} {
		m := CounterToProto(c)
		f.Add(m.Name, m.Key, m.State, m.Version)
	}
	// Small states of the two algorithms with a variable-size part.
	var st []byte
	for _, lim := range []bucket.Limit{
		{Algorithm: bucket.SlidingLog, Limit: 10, WindowMS: 60_000},
		{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000, SubWindows: 6},
	} {
		var s bucket.State
		bucket.Decide(&s, lim, 3, 1_700_000_000_000_000_000)
		st, _ = s.MarshalBinary()
		f.Add("api", "user:1", st, uint64(1))
	}
	f.Add("", "k", []byte{1, 1}, uint64(1))
	f.Add("a\x00b", "k", st, uint64(2))
	f.Add("api", "k", []byte{2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint64(3))
	f.Fuzz(func(t *testing.T, name, key string, state []byte, version uint64) {
		m := &sluicev1.Counter{Name: name, Key: key, State: state, Version: version}
		c, err := CounterFromProto(m)
		if err != nil {
			if c != (bucket.Counter{}) {
				t.Fatalf("refused counter %v came back non-zero: %+v", err, c)
			}
			return
		}
		back := CounterToProto(c)
		if !proto.Equal(back, m) {
			t.Fatalf("accepted %v but it encodes back as %v", m, back)
		}
		again, err := CounterFromProto(back)
		if err != nil || again.Name != c.Name || again.Key != c.Key || again.Version != c.Version || again.State.EncodedLen() != c.State.EncodedLen() {
			t.Fatalf("second decode: %+v, %v; first %+v", again, err, c)
		}
	})
}

// A node whose address once belonged to another cluster's node (or a wrong
// --join) gets that cluster's peer calls: each is refused and changes
// nothing, while calls from its own cluster are served.
func TestPeerCallsFromAnotherClusterAreRefused(t *testing.T) {
	t.Parallel()
	h, p := &fakeHandler{}, &fakePeer{}
	addr := startServer(t, h, func(c *testConfig) { c.Peer, c.ClusterName = p, "blue" }).GRPCAddr()
	ctx := testCtx(t)
	counters := []bucket.Counter{{Name: "n", Key: "k", Version: 1, State: bucket.State{Count: 1}}}

	other := NewPeerClient(PeerConfig{NodeName: "x", ClusterName: "green"})
	defer other.Close()
	out, moved := make([]check.Outcome, 1), make([]string, 1)
	for what, err := range map[string]error{
		"forward":  other.Forward(ctx, addr, keys("k", 1), out, moved),
		"stand-in": other.ForwardStandIn(ctx, addr, keys("k", 1), nil, out, moved),
		"replicate": func() error {
			_, _, err := other.Replicate(ctx, addr, false, counters)
			return err
		}(),
		"pull": other.Pull(ctx, addr, []bucket.Counter{{Name: "n", Key: "k"}}, true, time.Second, make([]keymove.PullAnswer, 1)),
	} {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `cluster "green"`) || !strings.Contains(err.Error(), `"blue"`) {
			t.Errorf("%s from another cluster: %v, want FAILED_PRECONDITION naming both clusters", what, err)
		}
	}
	if n := h.forwards.Load(); n != 0 {
		t.Errorf("the handler decided %d forwarded batches from another cluster", n)
	}
	if r, pl := p.replicateCalls(), p.pullCalls(); len(r) != 0 || len(pl) != 0 {
		t.Errorf("the peer handler saw replicate %v and pull %v from another cluster", r, pl)
	}

	same := NewPeerClient(PeerConfig{NodeName: "y", ClusterName: "blue"})
	defer same.Close()
	if err := same.Forward(ctx, addr, keys("k", 1), out, make([]string, len(out))); err != nil || out[0].Err != "" {
		t.Fatalf("forward from the same cluster: %v %+v", err, out[0])
	}
	if installed, _, err := same.Replicate(ctx, addr, false, counters); err != nil || installed != 1 {
		t.Fatalf("replicate from the same cluster: installed %d, %v", installed, err)
	}
}
