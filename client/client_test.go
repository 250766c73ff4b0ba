package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// attempts records the node each attempt of a Client goes to.
type attempts struct {
	mu      sync.Mutex
	targets []string
}

func (a *attempts) option() Option {
	return WithDialOptions(grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		a.mu.Lock()
		a.targets = append(a.targets, cc.Target())
		a.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func (a *attempts) get() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.targets...)
}

func TestClientTypedResults(t *testing.T) {
	t.Parallel()
	n := startNode(t, &fakeNode{})
	c := newClient(t, []string{n.addr}, WithCallTimeout(10*time.Second))
	ctx := testCtx(t)

	res, err := c.Check(ctx, Request{Name: "api", Key: "user:1", Hits: 3, Limit: 10, Window: time.Minute, Algorithm: TokenBucket, Burst: 12})
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: time.Minute, Owner: "user:1"}
	if res != want {
		t.Fatalf("allowed: got %+v, want %+v", res, want)
	}
	hits := int64(3)
	wantReq := &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{Name: "api", Key: "user:1", Hits: &hits, Limit: 10, WindowMs: 60_000, Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, Burst: 12}}}
	if got := n.lastRequest(); !proto.Equal(got, wantReq) {
		t.Fatalf("the node got %v, want %v", got, wantReq)
	}

	res, err = c.Check(ctx, Request{Name: "api", Key: "user:2", Hits: 11, Limit: 10, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want = Result{Limit: 10, ResetAfter: 11200 * time.Millisecond, RetryAfter: 1500 * time.Millisecond, Owner: "user:2"}
	if res != want {
		t.Fatalf("over: got %+v, want %+v", res, want)
	}

	// Hits 0 is one hit; Peek sends 0.
	for _, tc := range []struct {
		r    Request
		hits int64
	}{{Request{Name: "api", Key: "k", Limit: 5, Window: time.Second}, 1}, {Request{Name: "api", Key: "k", Hits: 4, Peek: true, Limit: 5, Window: time.Second}, 0}} {
		if _, err := c.Check(ctx, tc.r); err != nil {
			t.Fatal(err)
		}
		if got := n.lastRequest().Requests[0].Hits; got == nil || *got != tc.hits {
			t.Errorf("%+v: the node got hits %v, want %d", tc.r, got, tc.hits)
		}
	}

	// A batch answers in order; an invalid item carries its own error.
	rs, err := c.CheckBatch(ctx, []Request{
		{Name: "api", Key: "a", Limit: 2, Window: time.Second},
		{Name: "api", Key: "", Limit: 2, Window: time.Second},
		{Name: "api", Key: "c", Hits: 3, Limit: 2, Window: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || !rs[0].Allowed || rs[0].Owner != "a" || rs[2].Allowed || rs[2].Owner != "c" {
		t.Fatalf("batch: got %+v", rs)
	}
	var ie *ItemError
	if !errors.As(rs[1].Err, &ie) || !strings.Contains(ie.Msg, "key is empty") || rs[0].Err != nil || rs[2].Err != nil {
		t.Fatalf("batch item errors: %v, %v, %v", rs[0].Err, rs[1].Err, rs[2].Err)
	}
	if _, err := c.Check(ctx, Request{Name: "api", Key: ""}); !errors.As(err, &ie) {
		t.Fatalf("Check of an invalid item: got %v, want an *ItemError", err)
	}
}

// TestResultFromProtoNeverMakesAVerdictOfWhatItCannotRead: a missing
// answer, no status or a status this release does not know is the item's
// error, not an allowed or refused check.
func TestResultFromProtoNeverMakesAVerdictOfWhatItCannotRead(t *testing.T) {
	t.Parallel()
	r := Request{Name: "api", Key: "k"}
	for _, tc := range []struct {
		m    *sluicev1.RateLimitResponse
		want string
	}{
		{nil, "missing response"},
		{&sluicev1.RateLimitResponse{Limit: 5}, "no verdict"},
		{&sluicev1.RateLimitResponse{Status: 7, Limit: 5, Remaining: 5}, "unknown status"},
		{&sluicev1.RateLimitResponse{Status: sluicev1.Status_STATUS_UNDER_LIMIT, Error: "bad limit"}, "bad limit"},
	} {
		res := resultFromProto(r, tc.m)
		var ie *ItemError
		if !errors.As(res.Err, &ie) || !strings.Contains(ie.Msg, tc.want) || res.Allowed || ie.Key != "k" {
			t.Errorf("%v: got %+v, want an *ItemError saying %q", tc.m, res, tc.want)
		}
	}
}

func TestClientRetriesUnavailableOnAnotherNode(t *testing.T) {
	t.Parallel()
	n := startNode(t, &fakeNode{})
	down := closedAddr(t)
	var a attempts
	c := newClient(t, []string{down, n.addr}, a.option())
	ctx := testCtx(t)
	// The rotation starts each call at the next node: two calls begin once
	// at each, and both succeed.
	for i := range 2 {
		res, err := c.Check(ctx, Request{Name: "api", Key: "k", Limit: 10, Window: time.Minute})
		if err != nil || !res.Allowed {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := a.get(); strings.Join(got, " ") != strings.Join([]string{down, n.addr, n.addr}, " ") {
		t.Fatalf("attempts went to %v, want the down node once, then the live one twice", got)
	}
	if calls := n.calls.Load(); calls != 2 {
		t.Fatalf("the live node decided %d calls, want 2", calls)
	}
}

func TestClientTriesEachNodeOnce(t *testing.T) {
	t.Parallel()
	downs := []string{closedAddr(t), closedAddr(t)}
	var a attempts
	c := newClient(t, downs, a.option())
	_, err := c.Check(testCtx(t), Request{Name: "api", Key: "k"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := a.get(); len(got) != 2 || got[0] == got[1] {
		t.Fatalf("attempts went to %v, want each down node once", got)
	}
}

func TestClientDoesNotRetryInvalidArgument(t *testing.T) {
	t.Parallel()
	n1, n2 := startNode(t, &fakeNode{}), startNode(t, &fakeNode{})
	var a attempts
	c := newClient(t, []string{n1.addr, n2.addr}, a.option())
	rs := make([]Request, MaxBatch+1)
	for i := range rs {
		rs[i] = Request{Name: "api", Key: "k", Limit: 1, Window: time.Second}
	}
	_, err := c.CheckBatch(testCtx(t), rs)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	if got := a.get(); len(got) != 1 {
		t.Fatalf("attempts went to %v, want one", got)
	}
}

func TestClientStopsAtContextEnd(t *testing.T) {
	t.Parallel()
	var a attempts
	c := newClient(t, []string{closedAddr(t), closedAddr(t), closedAddr(t)}, a.option())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Check(ctx, Request{Name: "api", Key: "k"})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("got %v, want Canceled", err)
	}
	if got := a.get(); len(got) > 1 {
		t.Fatalf("attempts went to %v after the context ended, want at most one", got)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := New(nil); err == nil {
		t.Error("New with no address: no error")
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, dir, "ca")
	cert, _ := ca.issue(t, "api")
	for _, tc := range []struct {
		f    TLSFiles
		want string
	}{
		{TLSFiles{CA: filepath.Join(dir, "missing.pem")}, "--tls-ca"},
		{TLSFiles{CA: junk}, "trailing data"},
		{TLSFiles{CA: ca.path, Cert: cert}, "go together"},
		{TLSFiles{CA: ca.path, Cert: cert, Key: junk}, "--tls-cert"},
	} {
		if _, err := New([]string{"127.0.0.1:1"}, WithTLS(tc.f)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %+v: %v, want an error saying %q", tc.f, err, tc.want)
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	t.Parallel()
	for a := AlgorithmUnspecified + 1; a <= GCRA; a++ {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
		if want := strings.ToLower(strings.TrimPrefix(sluicev1.Algorithm(a).String(), "ALGORITHM_")); a.String() != want {
			t.Errorf("Algorithm %d is %q, the wire enum says %q", a, a.String(), want)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil || !strings.Contains(err.Error(), "token_bucket") {
		t.Errorf("ParseAlgorithm(leaky): %v, want an error listing the names", err)
	}
}
