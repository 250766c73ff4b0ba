package transport

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// recordingHandler is the Handler of FuzzCheckMessages: it records that it
// was called, checks the lengths of what it was given, and answers every
// item without deciding it.
type recordingHandler struct {
	mu      sync.Mutex
	calls   int   // calls of any method
	invalid error // the first promise broken
}

func (h *recordingHandler) note(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	if h.invalid == nil {
		h.invalid = err
	}
}

func (h *recordingHandler) outcomes(reqs []check.Request, out []check.Outcome, pullFrom, movedTo []string, peer bool) {
	var err error
	switch {
	case len(reqs) != len(out):
		err = errors.New("outcomes and requests differ in length")
	case peer && len(movedTo) != len(reqs):
		err = errors.New("moved-to entries and requests differ in length")
	case pullFrom != nil && len(pullFrom) != len(reqs):
		err = errors.New("pull-from entries and requests differ in length")
	}
	h.note(err)
	for i := range reqs {
		out[i] = check.Outcome{Owner: "fuzz"}
		if e := reqs[i].Validate(); e != nil {
			out[i].Err = e.Error()
		}
	}
}

func (h *recordingHandler) Check(_ context.Context, reqs []check.Request, out []check.Outcome) {
	h.outcomes(reqs, out, nil, nil, false)
}

func (h *recordingHandler) CheckStandIn(_ context.Context, _ string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) {
	h.outcomes(reqs, out, pullFrom, movedTo, true)
}

func (h *recordingHandler) CheckForwarded(_ context.Context, _ string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	h.outcomes(reqs, out, nil, movedTo, true)
}

// FuzzCheckMessages gives RateLimiter.Check messages decoded from random
// bytes, as grpc-go would hand them over, and checks its contract: no
// panic; a call refused with InvalidArgument and a message reaches no
// handler; an accepted call answers one item per request. (The Peer
// service's calls are package peer's FuzzServiceMessages.)
func FuzzCheckMessages(f *testing.F) {
	req := &sluicev1.RateLimitRequest{Name: "api", Key: "u1", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{req, {Name: "", Key: "k"}}})

	// One server for every input, as in FuzzServiceMessages; the handler's
	// record is reset for each.
	h := &recordingHandler{}
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", Handler: h, ClusterName: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h.mu.Lock()
		h.calls, h.invalid = 0, nil
		h.mu.Unlock()
		var m sluicev1.CheckRequest
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		n := len(m.Requests)
		sure := n > check.MaxBatchSize // the call must be refused (not only may)
		resp, callErr := rateLimiterServer{s: s}.Check(context.Background(), &m)
		got := len(resp.GetResponses())
		h.mu.Lock()
		calls, invalid := h.calls, h.invalid
		h.mu.Unlock()
		if invalid != nil {
			t.Fatal(invalid)
		}
		if callErr != nil {
			st, ok := status.FromError(callErr)
			if !ok || (st.Code() != codes.InvalidArgument && st.Code() != codes.FailedPrecondition) || st.Message() == "" {
				t.Fatalf("refused with %v: want InvalidArgument or FailedPrecondition and a message", callErr)
			}
			if calls != 0 {
				t.Fatalf("refused call (%v) reached the handler", callErr)
			}
			return
		}
		if sure {
			t.Fatal("a message the service must refuse was accepted")
		}
		if got != n {
			t.Fatalf("%d items answered for %d asked", got, n)
		}
	})
}
