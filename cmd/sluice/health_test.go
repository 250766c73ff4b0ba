package main

import (
	"net"
	"strings"
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
