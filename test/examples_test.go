package test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// buildExamples builds every program of examples/ into a temporary
// directory (one go build) and returns it.
func buildExamples(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/sluicehq/sluice/examples/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./examples/...: %v\n%s", err, out)
	}
	return dir
}

// startExample starts a long-running example and kills it (by its PID) when
// the test ends.
func startExample(t *testing.T, bin string, args ...string) *logBuf {
	t.Helper()
	cmd := exec.Command(bin, args...)
	log := &logBuf{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("log of %s:\n%s", filepath.Base(bin), log.String())
		}
	})
	return log
}

// waitListening waits until addr accepts TCP connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	waitFor(t, 30*time.Second, addr+" accepts connections", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// TestExamples builds every program of examples/ and runs it against a real
// node: the plain check prints its verdicts and exits 1 once over the limit,
// the HTTP middleware answers 429 with the rate-limit headers, the gRPC
// interceptor fails the call with RESOURCE_EXHAUSTED and RetryInfo.
// Long on purpose: one node for a subtest per example, each of which reads alone.
func TestExamples(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir("../examples")
	if err != nil {
		t.Fatal(err)
	}
	// examples/python is run by TestPythonClient.
	tested := map[string]bool{"check": true, "httpmiddleware": true, "grpcinterceptor": true, "python": true}
	for _, e := range entries {
		if e.IsDir() && !tested[e.Name()] {
			t.Errorf("examples/%s has no case in TestExamples", e.Name())
		}
	}
	bin := buildExamples(t)
	node := startCluster(t, 1)[0]

	t.Run("check", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(bin, "check"), "-nodes", node.grpc, "-key", "ex:check", "-limit", "3", "-n", "5").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("examples/check: %v (want exit status 1: last check over the limit)\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 5 {
			t.Fatalf("examples/check printed %d lines, want 5:\n%s", len(lines), out)
		}
		for i, l := range lines {
			if want := i < 3; strings.HasPrefix(l, "allowed") != want {
				t.Errorf("check %d: %q, want allowed=%v", i+1, l, want)
			}
		}
	})

	t.Run("httpmiddleware", func(t *testing.T) {
		addr := freePort(t, "127.0.0.1", false)
		startExample(t, filepath.Join(bin, "httpmiddleware"), "-nodes", node.grpc, "-listen", addr, "-limit", "2", "-name", "ex.http")
		waitListening(t, addr)
		get := func(apiKey string) *http.Response {
			req, _ := http.NewRequest("GET", "http://"+addr+"/hello", nil)
			if apiKey != "" {
				req.Header.Set("X-Api-Key", apiKey)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		for i := range 3 {
			resp := get("k1")
			want := http.StatusOK
			if i == 2 {
				want = http.StatusTooManyRequests
			}
			if resp.StatusCode != want {
				t.Fatalf("request %d: %s, want %d", i+1, resp.Status, want)
			}
			if resp.Header.Get("RateLimit") == "" || resp.Header.Get("RateLimit-Policy") == "" {
				t.Errorf("request %d: no RateLimit/RateLimit-Policy headers: %v", i+1, resp.Header)
			}
			if got := resp.Header.Get("Retry-After") != ""; got != (i == 2) {
				t.Errorf("request %d: Retry-After %q", i+1, resp.Header.Get("Retry-After"))
			}
		}
		if resp := get(""); resp.StatusCode != http.StatusOK {
			t.Errorf("request without X-Api-Key: %s, want 200 (not limited)", resp.Status)
		}
	})

	t.Run("grpcinterceptor", func(t *testing.T) {
		addr := freePort(t, "127.0.0.1", false)
		startExample(t, filepath.Join(bin, "grpcinterceptor"), "-nodes", node.grpc, "-listen", addr, "-limit", "2", "-name", "ex.grpc")
		waitListening(t, addr)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hc := healthpb.NewHealthClient(conn)
		call := func(user string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if user != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-user", user)
			}
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		}
		for i := range 2 {
			if err := call("u1"); err != nil {
				t.Fatalf("call %d: %v, want allowed", i+1, err)
			}
		}
		err = call("u1")
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted {
			t.Fatalf("call 3: %v, want ResourceExhausted", err)
		}
		var retry bool
		for _, d := range st.Details() {
			if _, ok := d.(*errdetails.RetryInfo); ok {
				retry = true
			}
		}
		if !retry {
			t.Errorf("call 3: no RetryInfo detail in %v", st.Details())
		}
		for i := range 3 {
			if err := call(""); err != nil {
				t.Fatalf("call %d without x-user: %v, want not limited", i+1, err)
			}
		}
	})
}
