package transport

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

type faRig struct {
	h    *memHandler
	base string
}

func newFARig(t *testing.T, deny int) *faRig {
	t.Helper()
	h := &memHandler{}
	s := startServer(t, h, func(c *ServerConfig) { c.ForwardAuthDenyStatus = deny })
	return &faRig{h: h, base: "http://" + s.HTTPAddr() + "/v1/forward-auth"}
}

// call sends one forward-auth request with the query q and header kv pairs.
func (r *faRig) call(t *testing.T, method, q string, kv ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), method, r.base+"?"+q, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestForwardAuthAllowsThenDenies(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		deny  int
		query string
		want  int
	}{
		{0, "", http.StatusTooManyRequests},
		{403, "", http.StatusForbidden},
		{0, "&deny_status=401", http.StatusUnauthorized},
	} {
		r := newFARig(t, c.deny)
		q := "name=login&limit=2&window=1h" + c.query
		for i, method := range []string{"GET", "POST", "GET"} {
			resp, body := r.call(t, method, q, "X-Forwarded-For", "203.0.113.9, 10.0.0.1")
			want := http.StatusOK
			if i == 2 {
				want = c.want
			}
			if resp.StatusCode != want {
				t.Fatalf("deny %d%s, call %d: %d %q, want %d", c.deny, c.query, i, resp.StatusCode, body, want)
			}
			if resp.Header.Get("RateLimit-Policy") != `"login";q=2;w=3600` || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"login";r=`) {
				t.Fatalf("call %d headers %v", i, resp.Header)
			}
			if (resp.Header.Get("Retry-After") != "") != (i == 2) {
				t.Fatalf("call %d: Retry-After %q", i, resp.Header.Get("Retry-After"))
			}
		}
		r.h.mu.Lock()
		last := r.h.last[0]
		r.h.mu.Unlock()
		if last.Key != "203.0.113.9" || last.Name != "login" || last.Hits != 1 {
			t.Fatalf("check %+v: want the first X-Forwarded-For address as key", last)
		}
	}
}

func TestForwardAuthKeys(t *testing.T) {
	t.Parallel()
	r := newFARig(t, 0)
	sum := sha256.Sum256([]byte("Bearer s3cret"))
	cases := []struct {
		header, value, want string
	}{
		{"x-real-ip", "198.51.100.7", "198.51.100.7"},
		{"Authorization", "Bearer s3cret", "sha256:" + hex.EncodeToString(sum[:])},
		{"Forwarded", `for="[2001:db8::1]:4711";proto=https, for=10.0.0.1`, "2001:db8::1"},
		{"Forwarded", "for=192.0.2.60;proto=http", "192.0.2.60"},
		{"X-Api-Key", "k-42", "k-42"},
	}
	for _, c := range cases {
		resp, body := r.call(t, "GET", "name=n&limit=100&window=1h&key_header="+url.QueryEscape(c.header), c.header, c.value)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.header, resp.StatusCode, body)
		}
		r.h.mu.Lock()
		got := r.h.last[0].Key
		r.h.mu.Unlock()
		if got != c.want {
			t.Fatalf("%s: %q: key %q, want %q", c.header, c.value, got, c.want)
		}
	}
}

func TestForwardAuthBadInput(t *testing.T) {
	t.Parallel()
	r := newFARig(t, 0)
	cases := []struct{ query, header, want string }{
		{"limit=1&window=1h", "X-Forwarded-For", "needs name="},
		{"name=n&limit=1&window=1h", "", "no X-Forwarded-For header"},
		{"name=n&limit=1&window=1h&key_header=X-Real-IP", "X-Forwarded-For", "no X-Real-Ip header"},
		{"name=n&limit=1&window=forever", "X-Forwarded-For", "is not a duration"},
		{"name=n&limit=x", "X-Forwarded-For", "limit \"x\" is not an integer"},
		{"name=n&limit=1&window=1h&hits=-1", "X-Forwarded-For", "hits is -1"},
		{"name=n&limit=1&window=1h&deny_status=200", "X-Forwarded-For", "want a status in 400..499"},
		{"name=n&limit=1&window=1h&algorithm=magic", "X-Forwarded-For", "unknown algorithm"},
		{"name=no-rule", "X-Forwarded-For", "no limit given and no rule"},
	}
	for _, c := range cases {
		var kv []string
		if c.header != "" {
			kv = []string{c.header, "1.2.3.4"}
		}
		resp, body := r.call(t, "GET", c.query, kv...)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Fatalf("%s: %d %q, want 400 with %q", c.query, resp.StatusCode, body, c.want)
		}
	}
	r.h.mu.Lock()
	calls := r.h.calls
	r.h.mu.Unlock()
	if calls != 1 { // only the check whose rule is missing got to the handler
		t.Fatalf("the handler was called %d times", calls)
	}
}

func TestForwardAuthUndecidedIs503(t *testing.T) {
	t.Parallel()
	r := newFARig(t, 0)
	r.h.mu.Lock()
	r.h.err = "not in a cluster yet"
	r.h.mu.Unlock()
	if resp, body := r.call(t, "GET", "name=n&limit=1&window=1h", "X-Forwarded-For", "1.2.3.4"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}
