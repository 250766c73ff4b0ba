package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// recordingHandler is the ForwardHandler (with the handlers of the other
// calls) and the PeerHandler of FuzzServiceMessages:
// it records what the transport gave it, checks what PeerHandler promises
// (every counter valid), and decides nothing.
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

func (h *recordingHandler) ReturnLeases(_ context.Context, _ string, rets []check.LeaseReturn, taken []int64) {
	var err error
	switch {
	case len(rets) != len(taken):
		err = errors.New("returns and answers differ in length")
	}
	for _, r := range rets {
		if e := r.Request.Validate(); e != nil || r.Request.Hits < 1 || r.Request.Hits > MaxReturnHits || r.GrantedAt <= 0 || r.Request.Limit.Limit == 0 {
			err = fmt.Errorf("ReturnLeases got an invalid return %+v (%v)", r, e)
		}
	}
	h.note(err)
}

func (h *recordingHandler) GrantRegion(_ context.Context, q *check.RegionQuery, ans []check.RegionAnswer) string {
	var err error
	if len(q.Asks) != len(ans) {
		err = errors.New("asks and answers differ in length")
	}
	for _, a := range q.Asks {
		r := a.Request
		if e := r.Validate(); e != nil || !r.Limit.Global || r.Hits < 0 || r.Hits > MaxReturnHits || a.Return < 0 || a.Return > MaxReturnHits || (a.Return > 0 && a.ReturnGrantedAt <= 0) {
			err = fmt.Errorf("GrantRegion got an invalid ask %+v (%v)", a, e)
		}
	}
	h.note(err)
	return "fuzz"
}

func (h *recordingHandler) Decided(_ context.Context, _ string, within time.Duration, count int, parts []uint32) keymove.DecidedAnswer {
	var err error
	if within <= 0 || within > MaxDecidedSpan || count < 1 || len(parts) > count {
		err = errors.New("Decided got a span, partition count or partition list out of range")
	}
	for _, p := range parts {
		if int(p) >= count {
			err = errors.New("Decided got a partition past the ring's count")
		}
	}
	h.note(err)
	// One hash per partition asked: the answer's length is checked.
	hs := make([]uint64, len(parts))
	for i, p := range parts {
		hs[i] = uint64(p)
	}
	return keymove.DecidedAnswer{Hashes: hs, Complete: true}
}

func (h *recordingHandler) CheckStandIn(_ context.Context, _ string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) {
	h.outcomes(reqs, out, pullFrom, movedTo, true)
}

func (h *recordingHandler) CheckForwarded(_ context.Context, _ string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	h.outcomes(reqs, out, nil, movedTo, true)
}

func (h *recordingHandler) Replicate(_ context.Context, _ string, _ bool, counters []bucket.Counter) (int, int) {
	var err error
	for _, c := range counters {
		if e := bucket.ValidateCounterKey(c.Name, c.Key); e != nil {
			err = errors.New("Replicate got an invalid key: " + e.Error())
			break
		}
		b, e := c.State.MarshalBinary()
		var back bucket.State
		if e == nil {
			e = back.UnmarshalBinary(b)
		}
		if e != nil {
			err = errors.New("Replicate got a state that does not decode again: " + e.Error())
			break
		}
	}
	h.note(err)
	return len(counters), 0
}

func (h *recordingHandler) Pull(_ context.Context, _, _ string, keys []bucket.Counter, _ bool, ttl time.Duration, ans []keymove.PullAnswer) {
	var err error
	if len(ans) != len(keys) {
		err = errors.New("Pull got answers and keys of different lengths")
	}
	for _, k := range keys {
		if e := bucket.ValidateCounterKey(k.Name, k.Key); e != nil {
			err = errors.New("Pull got an invalid key: " + e.Error())
			break
		}
	}
	if ttl < 0 || ttl > MaxReleaseTTL {
		err = errors.New("Pull got a release ttl out of range")
	}
	h.note(err)
}

// FuzzServiceMessages gives the Peer service's handlers (Peer.Forward,
// Peer.Replicate, Peer.Pull, Peer.Return, Peer.RegionGrant, Peer.Decided;
// RateLimiter.Check is package transport's FuzzCheckMessages) messages
// decoded from random bytes, as grpc-go would hand them over, and checks the contract of each:
// no panic; a call refused with InvalidArgument or FailedPrecondition and a
// message reaches neither handler; an accepted call answers one item per
// request, key or valid counter, and counts every malformed counter it
// dropped; what the handlers get is what they are promised (valid keys,
// decodable states, a bounded release ttl).
// Long on purpose: the seeds, then one case per service, each read alone.
func FuzzServiceMessages(f *testing.F) {
	req := &sluicev1.RateLimitRequest{Name: "api", Key: "u1", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	seed := func(kind uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(kind, b)
	}
	seed(1, &sluicev1.ForwardRequest{Requests: []*sluicev1.RateLimitRequest{req}, From: "n1", Cluster: "fuzz", StandIn: true, PullFrom: []string{"10.0.0.1:8081"}})
	seed(1, &sluicev1.ForwardRequest{Requests: []*sluicev1.RateLimitRequest{req}, From: "n1", Cluster: "other"})
	var st bucket.State
	bucket.Decide(&st, bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000, SubWindows: 6}, 3, 1_700_000_000_000_000_000)
	sb, _ := st.MarshalBinary()
	seed(2, &sluicev1.ReplicateRequest{From: "n1", Cluster: "fuzz", Counters: []*sluicev1.Counter{{Name: "api", Key: "u1", State: sb, Version: 9}, {Name: "api", Key: "u2", State: []byte{1}, Version: 1}}})
	greq := &sluicev1.RateLimitRequest{Name: "api", Key: "u1", Hits: proto.Int64(5), Limit: 10, WindowMs: 60_000, Global: true}
	seed(5, &sluicev1.RegionGrantRequest{From: "n1", Cluster: "fuzz", Region: "b", ToRegion: "a", Asks: []*sluicev1.RegionAsk{{Request: greq, ReturnHits: 2, ReturnGrantedAt: 9}}})
	seed(4, &sluicev1.ReturnRequest{From: "n1", Cluster: "fuzz", Returns: []*sluicev1.LeaseReturn{{Request: req, GrantedAt: 5}, {Request: req}}})
	seed(6, &sluicev1.DecidedRequest{From: "n1", Cluster: "fuzz", WithinMs: 1500, PartitionCount: 7919, Partitions: []uint32{0, 17, 7918}})
	seed(6, &sluicev1.DecidedRequest{From: "n1", Cluster: "fuzz", WithinMs: 0, PartitionCount: 3, Partitions: []uint32{3}})
	seed(3, &sluicev1.PullRequest{From: "n1", FromAddr: "10.0.0.1:8081", Cluster: "fuzz", Keys: []*sluicev1.CounterKey{{Name: "api", Key: "u1"}}, Release: true, ReleaseTtlMs: 30_000})

	// One server for every input (building one per input would make it a
	// hundredth as fast); the fuzz function runs one input at a time per
	// process, and the handler's record is reset for each.
	h := &recordingHandler{}
	s := NewServer(ServerConfig{Handler: h, Peer: h, ClusterName: "fuzz"})
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		h.mu.Lock()
		h.calls, h.invalid = 0, nil
		h.mu.Unlock()
		ctx := context.Background()
		var (
			n       int   // items the answer must have
			got     int   // items it has
			callErr error // the call's error
			sure    bool  // the call must be refused (not only may)
		)
		switch kind % 7 {
		case 0:
			// RateLimiter.Check: the public API's, fuzzed in package
			// transport (FuzzCheckMessages).
			return
		case 1:
			var m sluicev1.ForwardRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Requests)
			sure = m.Cluster != "fuzz" || n > check.MaxBatchSize || (len(m.PullFrom) != 0 && len(m.PullFrom) != n)
			resp, err := s.Forward(ctx, &m)
			callErr, got = err, len(resp.GetResponses())
			if mt := resp.GetMovedTo(); mt != nil && len(mt) != n {
				t.Fatalf("moved_to has %d entries for %d requests", len(mt), n)
			}
		case 2:
			var m sluicev1.ReplicateRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Counters)
			sure = m.Cluster != "fuzz" || n > MaxCounters ||
				(m.Kind != sluicev1.ReplicateRequest_KIND_REPLICA && m.Kind != sluicev1.ReplicateRequest_KIND_HANDOFF)
			resp, err := s.Replicate(ctx, &m)
			callErr = err
			if err == nil {
				bad := 0
				for _, c := range m.Counters {
					if _, e := CounterFromProto(c); e != nil {
						bad++
					}
				}
				if resp.GetRefused() != int64(bad) {
					t.Fatalf("replicate refused %d counters, %d are malformed", resp.GetRefused(), bad)
				}
				if resp.GetInstalled()+resp.GetStale()+resp.GetRefused() != int64(n) {
					t.Fatalf("replicate accounts for %d+%d+%d of %d counters", resp.GetInstalled(), resp.GetStale(), resp.GetRefused(), n)
				}
				got = n
			}
		case 3:
			var m sluicev1.PullRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Keys)
			sure = m.Cluster != "fuzz" || n > MaxCounters || (m.FromAddr != "" && checkHostPort(m.FromAddr) != nil)
			for _, k := range m.Keys {
				sure = sure || bucket.ValidateCounterKey(k.GetName(), k.GetKey()) != nil
			}
			resp, err := s.Pull(ctx, &m)
			callErr, got = err, len(resp.GetCounters())
		case 4:
			var m sluicev1.ReturnRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Returns)
			sure = m.Cluster != "fuzz" || n > MaxCounters
			for _, r := range m.Returns {
				_, e := validateReturn(r)
				sure = sure || e != nil
			}
			resp, err := s.Return(ctx, &m)
			callErr, got = err, len(resp.GetTaken())
		case 5:
			var m sluicev1.RegionGrantRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Asks)
			sure = m.Cluster != "fuzz" || n > MaxCounters || m.Region == "" || m.ToRegion == ""
			for _, a := range m.Asks {
				_, e := validateRegionAsk(a)
				sure = sure || e != nil
			}
			resp, err := s.RegionGrant(ctx, &m)
			callErr, got = err, len(resp.GetTaken())
		case 6:
			var m sluicev1.DecidedRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			n = len(m.Partitions)
			sure = m.Cluster != "fuzz" || m.WithinMs < 1 || m.WithinMs > MaxDecidedSpan.Milliseconds() ||
				m.PartitionCount < 1 || m.PartitionCount > MaxDecidedPartitions || n > int(m.PartitionCount)
			for _, p := range m.Partitions {
				sure = sure || p >= m.PartitionCount
			}
			resp, err := s.Decided(ctx, &m)
			callErr, got = err, len(resp.GetHashes())
		}
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
			t.Fatalf("kind %d: a message the service must refuse was accepted", kind%7)
		}
		if got != n {
			t.Fatalf("kind %d: %d items answered for %d asked", kind%7, got, n)
		}
	})
}
