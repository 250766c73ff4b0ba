package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealthProbesANode: `sluice health` exits 0 against a live node's
// /healthz and /readyz, and 1 where nothing answers.
func TestHealthProbesANode(t *testing.T) {
	t.Parallel()
	n := startServe(t)
	for _, args := range [][]string{{"--http-addr", n.http}, {"--http-addr", n.http, "--ready"}} {
		var out, errb strings.Builder
		if code := health(t.Context(), args, &out, &errb); code != exitHealthy {
			t.Fatalf("health %q = %d, want 0: %s", args, code, errb.String())
		}
		if !strings.Contains(out.String(), "ok") && !strings.Contains(out.String(), "ready") {
			t.Errorf("health %q printed %q", args, out.String())
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	var out, errb strings.Builder
	if code := health(t.Context(), []string{"--http-addr", closed, "--timeout", "1s"}, &out, &errb); code != exitUnhealthy {
		t.Fatalf("health of a closed port = %d, want 1 (%s)", code, errb.String())
	}
}

func TestHealthURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":8080":          "http://127.0.0.1:8080/healthz",
		"0.0.0.0:9000":   "http://127.0.0.1:9000/healthz",
		"10.1.2.3:8080":  "http://10.1.2.3:8080/healthz",
		"localhost:8080": "http://localhost:8080/healthz",
	} {
		url, _, err := healthRequest(addr, false, clientFlags{})
		if err != nil || url != want {
			t.Errorf("healthRequest(%q) = %q, %v; want %q", addr, url, err, want)
		}
	}
}

// TestWaitUntilReady: `sluice wait` returns 0 as soon as /readyz answers
// 200 (after answering 503 for a while), 1 with the last answer when it
// never does within --timeout, and 2 on bad flags; and 0 against a live
// node.
func TestWaitUntilReady(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	joining := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if asked.Add(1) <= 3 {
			http.Error(w, "joining the cluster", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready")
	}))
	defer joining.Close()
	never := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "joining the cluster", http.StatusServiceUnavailable)
	}))
	defer never.Close()

	var out, errb strings.Builder
	if code := waitReady(t.Context(), []string{"--http-addr", joining.Listener.Addr().String(), "--interval", "10ms"}, &out, &errb); code != exitHealthy || asked.Load() != 4 {
		t.Fatalf("wait on a node ready at the 4th probe = %d after %d probes, want 0 after 4 (%s)", code, asked.Load(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := waitReady(t.Context(), []string{"--http-addr", never.Listener.Addr().String(), "--timeout", "200ms", "--interval", "20ms"}, &out, &errb); code != exitUnhealthy ||
		!strings.Contains(errb.String(), "not ready after 200ms") || !strings.Contains(errb.String(), "joining the cluster") {
		t.Fatalf("wait on a node never ready = %d, stderr %q; want 1 naming the timeout and the last answer", code, errb.String())
	}
	for _, bad := range [][]string{{"--timeout", "0s"}, {"--interval", "-1s"}, {"--nope"}} {
		if code := waitReady(t.Context(), bad, &out, &errb); code != exitError {
			t.Errorf("wait %q = %d, want 2", bad, code)
		}
	}
	n := startServe(t)
	if code := waitReady(t.Context(), []string{"--http-addr", n.http}, &out, &errb); code != exitHealthy {
		t.Fatalf("wait on a live node = %d (%s)", code, errb.String())
	}
}
