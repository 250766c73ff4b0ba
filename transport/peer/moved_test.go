package peer

// Tests of moved_to: a forwarded check's answer saying which keys moved
// to another owner, on direct sends and on queued batches.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// movingHandler answers forwarded items whose key starts with "moved" with
// a moved-to address instead of a decision.
type movingHandler struct{ fakeHandler }

const movedAddr = "10.0.0.9:8081"

func (h *movingHandler) CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	h.fakeHandler.CheckForwarded(ctx, from, reqs, out, movedTo)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "moved") {
			out[i], movedTo[i] = check.Outcome{}, movedAddr
		}
	}
}

func checkMovedOut(reqs []check.Request, out []check.Outcome, moved []string) error {
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "moved") {
			if moved[i] != movedAddr || out[i].Allowed() {
				return fmt.Errorf("moved item %d: %+v moved to %q, want moved to %s and no decision", i, out[i], moved[i], movedAddr)
			}
			continue
		}
		if moved[i] != "" || out[i].Owner != "a/"+reqs[i].Key || !out[i].Allowed() {
			return fmt.Errorf("decided item %d: %+v moved to %q", i, out[i], moved[i])
		}
	}
	return nil
}

// moved_to travels with the answers, on direct sends and on queued batches
// (each caller gets its own slice of it), and is absent when nothing moved.
func TestForwardMovedTo(t *testing.T) {
	t.Parallel()
	h := &movingHandler{fakeHandler: fakeHandler{block: make(chan struct{})}}
	s := startServer(t, h)
	addr := s.GRPCAddr()
	pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: 1, Timeout: time.Minute})
	defer pc.Close()

	const callers = 4
	errs := make(chan error, callers)
	for i := range callers {
		rs := []check.Request{req("k"+strconv.Itoa(i), 1), req("moved"+strconv.Itoa(i), 1)}
		if i%2 == 1 {
			rs[0], rs[1] = rs[1], rs[0]
		}
		if i == 3 {
			rs = keys("still"+strconv.Itoa(i), 2) // nothing moved in this caller's part
		}
		go func() {
			out, moved := make([]check.Outcome, len(rs)), make([]string, len(rs))
			for j := range moved {
				moved[j] = "stale" // Forward writes every entry
			}
			if err := pc.Forward(testCtx(t), addr, rs, out, moved); err != nil {
				errs <- err
				return
			}
			errs <- checkMovedOut(rs, out, moved)
		}()
	}
	waitFor(t, 10*time.Second, "one forward on the wire and the rest queued", func() bool {
		in, q := peerState(pc, addr)
		return in == 1 && q == callers-1 && h.forwards.Load() == 1
	})
	close(h.block)
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(h.forwardSizes()); got != "[2 6]" {
		t.Fatalf("RPC sizes %s, want [2 6]", got)
	}

	raw := rawPeer(t, addr)
	ctx := testCtx(t)
	resp, err := raw.Forward(ctx, &sluicev1.ForwardRequest{From: "a", Requests: protoReqs(keys("k", 3)).Requests})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.MovedTo) != 0 || len(resp.Responses) != 3 {
		t.Fatalf("no move: %d responses, moved_to %q; want 3 and none", len(resp.Responses), resp.MovedTo)
	}
	rs := []check.Request{req("k", 1), req("moved", 1), req("j", 1)}
	resp, err = raw.Forward(ctx, &sluicev1.ForwardRequest{From: "a", Requests: protoReqs(rs).Requests})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%q", resp.MovedTo); got != `["" "`+movedAddr+`" ""]` {
		t.Fatalf("moved_to %s, want one entry per item", got)
	}
}
