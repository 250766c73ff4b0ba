package test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
)

// TestConcurrencyLimitOnThreeNodes: a concurrency limit of 3 on three real
// nodes, through the CLI, HTTP and the Go client: at most 3 holders at
// once whichever node is asked; release frees a slot; a lease nobody
// renews frees its slot after its TTL; the in-flight middleware answers
// 429 past the limit; and the holders outlive the owner's SIGKILL.
func TestConcurrencyLimitOnThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.37", 3)
	clients := clientsOf(t, ps)
	acquire := func(node int, key string, limit, ttl string) (map[string]any, int) {
		t.Helper()
		out, code := runCLI(t, "acquire", "--addr", ps[node].grpc, "--name", "jobs", "--key", key, "--limit", limit, "--ttl", ttl, "--json")
		var m map[string]any
		if code != 2 {
			if err := json.Unmarshal([]byte(out), &m); err != nil {
				t.Fatalf("acquire --json: %q: %v", out, err)
			}
		}
		return m, code
	}
	var ids []string
	for i := range 4 {
		m, code := acquire(i%3, "export", "3", "30s")
		if want := map[bool]int{true: 0, false: 1}[i < 3]; code != want {
			t.Fatalf("acquire %d via %s: exit %d, want %d: %v", i+1, ps[i%3].name, code, want, m)
		}
		if code == 0 {
			if m["lease_id"] == "" || m["expires_in_ms"] == "" || m["holders"] != string(rune('1'+i)) {
				t.Fatalf("acquire %d --json: %v", i+1, m)
			}
			ids = append(ids, m["lease_id"].(string))
		}
	}
	if out, code := runCLI(t, "release", "--addr", ps[2].grpc, "--name", "jobs", "--key", "export", "--lease", ids[0]); code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("release: exit %d: %s", code, out)
	}
	if out, code := runCLI(t, "release", "--addr", ps[1].grpc, "--name", "jobs", "--key", "export", "--lease", ids[0]); code != 1 {
		t.Fatalf("a second release: exit %d: %s", code, out)
	}
	if _, code := acquire(1, "export", "3", "30s"); code != 0 {
		t.Fatalf("acquire after a release: exit %d", code)
	}

	// Over HTTP, leases nobody renews: refused while held, free after
	// their TTL.
	post := func(node int, path, body string) (int, string, http.Header) {
		resp, err := http.Post("http://"+ps[node].http+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	short := `{"name":"jobs","key":"crashy","limit":"1","ttl_ms":"1500"}`
	if code, body, _ := post(0, "/v1/acquire", short); code != http.StatusOK || !strings.Contains(body, `"held":true`) {
		t.Fatalf("HTTP acquire: %d %s", code, body)
	}
	code, body, h := post(1, "/v1/acquire", short)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(body, `"held":false`) {
		t.Fatalf("HTTP acquire past the limit: %d %s (Retry-After %q)", code, body, h.Get("Retry-After"))
	}
	waitFor(t, 10*time.Second, "the unrenewed lease's slot free after its TTL", func() bool {
		code, _, _ := post(2, "/v1/acquire", short)
		return code == http.StatusOK
	})
	if code, body, _ := post(2, "/v1/acquire", `{"name":"jobs","key":"x","limit":"0","ttl_ms":"1000"}`); code != http.StatusBadRequest || !strings.Contains(body, "limit is 0") {
		t.Fatalf("HTTP acquire with limit 0: %d %s", code, body)
	}

	// The Go client and the in-flight middleware: 2 at once.
	gc, err := client.New([]string{ps[0].grpc, ps[1].grpc, ps[2].grpc})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	entered, hold := make(chan struct{}, 4), make(chan struct{})
	h2 := client.InFlightMiddleware(gc, "jobs", func(*http.Request) string { return "render" }, 2, 10*time.Second)(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { entered <- struct{}{}; <-hold }))
	srv := httptest.NewServer(h2)
	defer srv.Close()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.Get(srv.URL); err == nil {
				resp.Body.Close()
			}
		}()
	}
	<-entered
	<-entered
	resp, err := http.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third request in flight: %v %v", resp, err)
	}
	resp.Body.Close()
	close(hold)
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := gc.Acquire(ctx, "jobs", "render", 2, 10*time.Second)
	if err != nil {
		t.Fatalf("after the requests ended, an acquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The client's lease renews itself: for three of its TTLs, another
	// acquire of the limit of one is refused, and it is not lost.
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	const ttl = 1500 * time.Millisecond
	renewed, err := gc.Acquire(rctx, "jobs", "renewed", 1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(ttl / 5)
	for start := time.Now(); time.Since(start) < 3*ttl; <-tick.C {
		if _, err := gc.Acquire(rctx, "jobs", "renewed", 1, ttl); !errors.Is(err, client.ErrNotAcquired) {
			t.Fatalf("%v after the lease was taken, another acquire: %v (want ErrNotAcquired: the lease renews itself)", time.Since(start), err)
		}
		select {
		case <-renewed.Lost():
			t.Fatal("the lease was lost while it renewed itself")
		default:
		}
	}
	tick.Stop()
	if err := renewed.Release(rctx); err != nil {
		t.Fatal(err)
	}
	if l, err := gc.Acquire(rctx, "jobs", "renewed", 1, ttl); err != nil {
		t.Fatalf("after the release: %v", err)
	} else {
		l.Release(rctx)
	}

	// The owner of "export" dies with its 3 leases replicated.
	owner := ""
	for _, p := range ps {
		if out, code := runCLI(t, "acquire", "--addr", p.grpc, "--name", "jobs", "--key", "export", "--limit", "3", "--ttl", "30s"); code == 1 {
			owner = out[strings.LastIndex(out, "decided by ")+len("decided by ") : strings.LastIndex(out, ")")]
			break
		}
	}
	waitSettled(t, clients)
	victim := -1
	for i, p := range ps {
		if p.name == owner {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("owner %q of the key not found", owner)
	}
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	other := (victim + 1) % len(ps)
	waitFor(t, 20*time.Second, "a survivor answering the key", func() bool {
		actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		l, err := gc.Acquire(actx, "jobs", "export", 3, 30*time.Second)
		if err == nil {
			l.Release(actx)
			t.Fatalf("after the owner's SIGKILL, a fourth holder: lease %s", l.ID())
		}
		return errors.Is(err, client.ErrNotAcquired)
	})
	if out, code := runCLI(t, "release", "--addr", ps[other].grpc, "--name", "jobs", "--key", "export", "--lease", ids[1]); code != 0 {
		t.Fatalf("release at the new owner: exit %d: %s", code, out)
	}
}
