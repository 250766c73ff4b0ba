package transport

import (
	"strings"
	"sync/atomic"
	"testing"
)

// TestReadyzDegraded: a ready server whose Degraded hook gives a reason
// answers /readyz 200 with the reason (it still decides every check), and
// plain "ready" once the reason is gone; a node not ready stays 503.
func TestReadyzDegraded(t *testing.T) {
	t.Parallel()
	var why atomic.Value
	why.Store("")
	s := startServer(t, &fakeHandler{}, func(c *ServerConfig) {
		c.Degraded = func() string { return why.Load().(string) }
	})
	url := "http://" + s.HTTPAddr() + "/readyz"
	why.Store("store not writable: disk full")
	if r := do(t, "GET", url, ""); r.code != 503 {
		t.Errorf("degraded and not ready: %d %s, want 503", r.code, r.body)
	}
	s.SetReady(true)
	if r := do(t, "GET", url, ""); r.code != 200 || string(r.body) != "ready, degraded: store not writable: disk full\n" {
		t.Errorf("degraded: %d %q", r.code, r.body)
	}
	why.Store("")
	if r := do(t, "GET", url, ""); r.code != 200 || strings.TrimSpace(string(r.body)) != "ready" {
		t.Errorf("recovered: %d %q", r.code, r.body)
	}
}
