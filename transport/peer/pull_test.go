package peer

// Tests of the Pull RPC: asking a peer for the counters it holds of given
// keys, and an answer over the message limit asked again in halves.

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

func TestPull(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	addr := s.GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "b", NodeAddr: "10.0.0.2:8081", MaxCounters: 2})
	defer pc.Close()
	ctx := testCtx(t)
	held := []bucket.Counter{counter("x", 3, 9), counter("z", 4, 11)}
	if _, _, err := pc.Replicate(ctx, addr, false, held); err != nil {
		t.Fatal(err)
	}

	ks := []bucket.Counter{
		{Name: "api", Key: "z"},
		{Name: "api", Key: "none"},
		{Name: "api", Key: "x"},
		{Name: "api", Key: "none", State: bucket.State{Count: 5}, Version: 3}, // output only
		{Name: "api", Key: "z"},
	}
	ans := make([]keymove.PullAnswer, len(ks))
	if err := pc.Pull(ctx, addr, ks, true, 1500*time.Microsecond, ans); err != nil {
		t.Fatal(err)
	}
	want := []bucket.Counter{held[1], {Name: "api", Key: "none"}, held[0], {Name: "api", Key: "none"}, held[1]}
	for i := range want {
		if ks[i] != want[i] {
			t.Fatalf("keys[%d] = %+v, want %+v", i, ks[i], want[i])
		}
		if ans[i].MovedTo != "" || ans[i].Holders != nil {
			t.Fatalf("answer %d = %+v, want nothing besides the record", i, ans[i])
		}
	}
	if got := fmt.Sprint(h.pullCalls()); got != "[{b@10.0.0.2:8081 2 true 2ms} {b@10.0.0.2:8081 2 true 2ms} {b@10.0.0.2:8081 1 true 2ms}]" {
		t.Fatalf("handler calls %s, want chunks of 2, 2, 1 from b (at its address) with release for 2ms", got)
	}

	raw := rawPeer(t, addr)
	resp, err := raw.Pull(ctx, &sluicev1.PullRequest{From: "c", ReleaseTtlMs: int64(time.Hour / time.Millisecond),
		Keys: []*sluicev1.CounterKey{{Name: "api", Key: "none"}, {Name: "api", Key: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.Counters[0]; m.Name != "api" || m.Key != "none" || m.Version != 0 || len(m.State) != 0 {
		t.Fatalf("answer for a key not held: %v, want version 0 and no state", m)
	}
	if !proto.Equal(resp.Counters[1], CounterToProto(held[0])) {
		t.Fatalf("answer %v, want %v", resp.Counters[1], CounterToProto(held[0]))
	}
	if _, err := raw.Pull(ctx, &sluicev1.PullRequest{ReleaseTtlMs: -5, Keys: []*sluicev1.CounterKey{{Name: "api", Key: "x"}}}); err != nil {
		t.Fatal(err)
	}
	calls := h.pullCalls()
	if got := fmt.Sprint(calls[len(calls)-2:]); got != "[{c 2 false 10m0s} { 1 false 0s}]" {
		t.Fatalf("ttls %s, want clamped to 10m and 0", got)
	}

	// One invalid key refuses the call, naming it.
	bad := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api"}}
	err = pc.Pull(ctx, addr, bad, false, 0, make([]keymove.PullAnswer, len(bad)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "key 1") {
		t.Fatalf("pull of an empty key: %v, want InvalidArgument naming key 1", err)
	}
	if bad[0].Version != 0 {
		t.Fatal("a failed pull filled keys")
	}
	if err := pc.Pull(ctx, addr, nil, true, time.Second, nil); err != nil {
		t.Fatalf("empty pull: %v", err)
	}
	many := &sluicev1.PullRequest{Keys: make([]*sluicev1.CounterKey, MaxCounters+1)}
	for i := range many.Keys {
		many.Keys[i] = &sluicev1.CounterKey{Name: "n", Key: "k"}
	}
	if _, err := raw.Pull(ctx, many); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d keys: %v, want InvalidArgument", len(many.Keys), err)
	}
	// A from_addr that is not a host:port refuses the call, and the
	// handler never sees it.
	before := len(h.pullCalls())
	for _, a := range []string{"no-port", "host:", ":8081", strings.Repeat("h", 300) + ":1"} {
		_, err := raw.Pull(ctx, &sluicev1.PullRequest{From: "c", FromAddr: a, Release: true, Keys: []*sluicev1.CounterKey{{Name: "api", Key: "x"}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "from_addr") {
			t.Errorf("from_addr %.20q: %v, want InvalidArgument naming from_addr", a, err)
		}
	}
	if n := len(h.pullCalls()); n != before {
		t.Fatalf("%d refused pulls reached the handler", n-before)
	}
}

// An answer over the 4 MiB message limit is asked again in halves.
func TestPullHalvesLargeAnswers(t *testing.T) {
	t.Parallel()
	big := bigCounter(t, "x")
	h := &fakePeer{held: make(map[string]bucket.Counter)}
	ks := make([]bucket.Counter, 100)
	for i := range ks {
		c := big
		c.Key = "k" + strconv.Itoa(i)
		h.held[c.Name+"\x00"+c.Key] = c
		ks[i] = bucket.Counter{Name: c.Name, Key: c.Key}
	}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b", Timeout: time.Minute})
	defer pc.Close()
	if err := pc.Pull(testCtx(t), s.GRPCAddr(), ks, false, 0, make([]keymove.PullAnswer, len(ks))); err != nil {
		t.Fatal(err)
	}
	for i := range ks {
		if ks[i].Version != big.Version || ks[i].State.EncodedLen() != big.State.EncodedLen() {
			t.Fatalf("keys[%d] = version %d, %d state bytes", i, ks[i].Version, ks[i].State.EncodedLen())
		}
	}
	if got := fmt.Sprint(h.pullCalls()); got != "[{b 100 false 0s} {b 50 false 0s} {b 50 false 0s}]" {
		t.Fatalf("handler calls %s, want 100 then two halves", got)
	}
}
