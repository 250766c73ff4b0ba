package transport

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// holdingHandler is a Handler and Holder that keeps one key's holders in
// a real holders state, at a fixed time.
type holdingHandler struct {
	recordingHandler
	mu    sync.Mutex
	st    bucket.State
	calls int
}

func (h *holdingHandler) Hold(_ context.Context, r check.Request) check.Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	if err := r.Validate(); err != nil {
		panic("an invalid operation reached the node: " + err.Error())
	}
	const now = 1_700_000_000_000_000_000
	var o check.Outcome
	switch r.Op {
	case check.OpAcquire:
		o.Decision = bucket.Acquire(&h.st, r.Limit.Limit, r.WindowMS, int64(h.calls), now)
		if o.Allowed() {
			o.LeaseID = int64(h.calls)
		}
	case check.OpRenew:
		var ok bool
		if o.Decision, ok = bucket.Renew(&h.st, r.Limit.Limit, r.WindowMS, r.LeaseID, now); ok {
			o.LeaseID = r.LeaseID
		}
	case check.OpRelease:
		var ok bool
		if o.Decision, ok = bucket.Release(&h.st, bucket.MaxHolders, r.LeaseID, now); ok {
			o.LeaseID = r.LeaseID
		}
	}
	return o
}

// POST /v1/acquire, /v1/renew and /v1/release, whatever the body: no
// panic, a status the API documents, and an invalid operation never
// reaches the node.
func FuzzHoldHTTP(f *testing.F) {
	f.Add(uint8(0), `{"name":"jobs","key":"t","limit":"2","ttl_ms":"1000"}`)
	f.Add(uint8(1), `{"name":"jobs","key":"t","limit":2,"ttl_ms":1000,"lease_id":"1"}`)
	f.Add(uint8(2), `{"name":"jobs","key":"t","lease_id":"x"}`)
	f.Add(uint8(0), `{"name":"","key":"t","limit":"0"}`)
	f.Add(uint8(2), `{"nope":1}`)
	h := &holdingHandler{}
	s := &Server{cfg: ServerConfig{Handler: h}, log: slog.New(slog.DiscardHandler)}
	paths := []string{"/v1/acquire", "/v1/renew", "/v1/release"}
	ops := []check.LeaseOp{check.OpAcquire, check.OpRenew, check.OpRelease}
	f.Fuzz(func(t *testing.T, which uint8, body string) {
		i := int(which) % 3
		w := httptest.NewRecorder()
		s.serveHold(ops[i])(w, httptest.NewRequest(http.MethodPost, paths[i], strings.NewReader(body)))
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		default:
			t.Fatalf("%s %q: status %d", paths[i], body, w.Code)
		}
		if w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
			t.Fatalf("%s %q: 429 without Retry-After", paths[i], body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %q: Content-Type %q", paths[i], body, ct)
		}
	})
}
