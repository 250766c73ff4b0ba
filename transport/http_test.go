package transport

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

type httpResult struct {
	code   int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url, body string) httpResult {
	t.Helper()
	r, err := http.NewRequestWithContext(testCtx(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResult{resp.StatusCode, resp.Header, b}
}

func jsonBatch(n int, hits int64) string {
	var b strings.Builder
	b.WriteString(`{"requests":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":"api","key":"k` + strconv.Itoa(i) + `","hits":` + strconv.FormatInt(hits, 10) + `,"limit":10,"window_ms":60000}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

var allResponseFields = []string{"status", "limit", "remaining", "reset_after_ms", "retry_after_ms", "error", "owner"}

func TestHTTPCheck(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	url := "http://" + s.HTTPAddr() + "/v1/check"

	// 200, proto names in, every field out with proto names.
	r := do(t, "POST", url, `{"requests":[{"name":"api","key":"a","hits":1,"limit":10,"window_ms":60000,"algorithm":"ALGORITHM_SLIDING_WINDOW"}]}`)
	if r.code != http.StatusOK {
		t.Fatalf("allowed check: %d %s", r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if r.header.Get("Retry-After") != "" {
		t.Errorf("allowed answer carries Retry-After: %v", r.header)
	}
	if p, rl := r.header.Get("RateLimit-Policy"), r.header.Get("RateLimit"); p != `"api";q=10;w=60` || rl != `"api";r=9;t=60` {
		t.Errorf("allowed answer: RateLimit-Policy %q, RateLimit %q", p, rl)
	}
	var got struct {
		Responses []map[string]any `json:"responses"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || len(got.Responses) != 1 {
		t.Fatalf("body %s: %v", r.body, err)
	}
	for _, f := range allResponseFields {
		if _, ok := got.Responses[0][f]; !ok {
			t.Errorf("response lacks field %q: %s", f, r.body)
		}
	}
	if got.Responses[0]["status"] != "STATUS_UNDER_LIMIT" || got.Responses[0]["remaining"] != "9" || got.Responses[0]["owner"] != "a" {
		t.Errorf("unexpected answer %s", r.body)
	}

	// lowerCamel names and numeric enums are accepted too.
	r = do(t, "POST", url, `{"requests":[{"name":"api","key":"b","hits":"2","limit":10,"windowMs":60000,"algorithm":1}]}`)
	if r.code != http.StatusOK || !bytes.Contains(r.body, []byte(`"remaining":"8"`)) {
		t.Fatalf("lowerCamel check: %d %s", r.code, r.body)
	}

	// Empty batch.
	r = do(t, "POST", url, `{}`)
	if r.code != http.StatusOK || !bytes.Contains(r.body, []byte(`"responses":[]`)) {
		t.Fatalf("empty check: %d %s", r.code, r.body)
	}

	// An invalid item answers 400 with its own error, and nothing is decided.
	calls := h.calls.Load()
	r = do(t, "POST", url, `{"requests":[{"name":"","key":"x","limit":10,"window_ms":1000},{"name":"api","key":"c","hits":1,"limit":10,"window_ms":1000}]}`)
	if r.code != http.StatusBadRequest || !bytes.Contains(r.body, []byte(`"error":"name is empty"`)) || h.calls.Load() != calls {
		t.Fatalf("invalid item: %d %s", r.code, r.body)
	}
}

func TestHTTPOverLimit(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	url := "http://" + s.HTTPAddr() + "/v1/check"
	// The second item is over its limit (11 hits > 10).
	r := do(t, "POST", url, `{"requests":[{"name":"api","key":"a","hits":1,"limit":10,"window_ms":60000},{"name":"api.create","key":"b","hits":11,"limit":100,"window_ms":60000},{"name":"other","key":"c","hits":11,"limit":10,"window_ms":1000}]}`)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("over-limit check: %d %s", r.code, r.body)
	}
	if got, want := r.header.Get("RateLimit-Policy"), `"other";q=10;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q (the first over-limit item)", got, want)
	}
	r = do(t, "POST", url, `{"requests":[{"name":"api","key":"a","hits":1,"limit":10,"window_ms":60000},{"name":"api.create","key":"b","hits":101,"limit":100,"window_ms":60000}]}`)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("over-limit check: %d %s", r.code, r.body)
	}
	for h, want := range map[string]string{
		"Retry-After":      "2", // 1500 ms rounded up
		"RateLimit-Policy": `"api.create";q=100;w=60`,
		"RateLimit":        `"api.create";r=0;t=12`, // 11200 ms rounded up
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	if !bytes.Contains(r.body, []byte(`"status":"STATUS_OVER_LIMIT"`)) {
		t.Errorf("body %s", r.body)
	}
}

// With several limits the headers describe the combined answer: q is the
// most restrictive limit, w its window.
func TestHTTPOverLimitSeveralLimits(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	url := "http://" + s.HTTPAddr() + "/v1/check"
	// 6 hits: the inline limit (100 per minute) admits, limits[1] (5 per
	// 10 s) refuses.
	r := do(t, "POST", url, `{"requests":[{"name":"login","key":"a","hits":6,"limit":100,"window_ms":60000,"sub_windows":6,"count_refused":true,`+
		`"limits":[{"limit":1000,"window_ms":3600000,"mode":"MODE_SOFT","soft_percent":10},{"limit":5,"windowMs":10000,"algorithm":"ALGORITHM_GCRA","burst":2}]}]}`)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("over-limit check: %d %s", r.code, r.body)
	}
	for h, want := range map[string]string{
		"RateLimit-Policy": `"login";q=5;w=10`,
		"RateLimit":        `"login";r=0;t=3600`, // the longest reset (Combine)
		"Retry-After":      "2",
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	h.mu.Lock()
	got := h.last[0]
	h.mu.Unlock()
	want := check.Request{Name: "login", Key: "a", Hits: 6,
		Limit: bucket.Limit{Limit: 100, WindowMS: 60_000, SubWindows: 6, CountRefused: true},
		More: []bucket.Limit{
			{Limit: 1000, WindowMS: 3_600_000, Mode: bucket.ModeSoft, SoftPercent: 10},
			{Limit: 5, WindowMS: 10_000, Algorithm: bucket.GCRA, Burst: 2},
		}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("JSON request arrived as\n%+v\nwant\n%+v", got, want)
	}

	// Limits alone, and a daily calendar quota: w is the day.
	r = do(t, "POST", url, `{"requests":[{"name":"q","key":"a","hits":6,`+
		`"limits":[{"limit":5,"window_ms":1,"algorithm":"ALGORITHM_FIXED_WINDOW","calendar":"CALENDAR_DAY"},{"limit":50,"window_ms":1000}]}]}`)
	if got := r.header.Get("RateLimit-Policy"); r.code != http.StatusTooManyRequests || got != `"q";q=5;w=86400` {
		t.Errorf("calendar day: %d, RateLimit-Policy %q: %s", r.code, got, r.body)
	}
	// A monthly quota has no fixed window: no w.
	r = do(t, "POST", url, `{"requests":[{"name":"q","key":"a","hits":6,`+
		`"limits":[{"limit":5,"window_ms":1,"algorithm":"ALGORITHM_FIXED_WINDOW","calendar":"CALENDAR_MONTH"}]}]}`)
	if got := r.header.Get("RateLimit-Policy"); r.code != http.StatusTooManyRequests || got != `"q";q=5` {
		t.Errorf("calendar month: %d, RateLimit-Policy %q: %s", r.code, got, r.body)
	}
	// Ambiguous inline fields beside limits: the item's own error.
	r = do(t, "POST", url, `{"requests":[{"name":"q","key":"a","hits":1,"window_ms":1000,"limits":[{"limit":5,"window_ms":1000}]}]}`)
	if r.code != http.StatusBadRequest || !bytes.Contains(r.body, []byte("the inline limit is 0 but its other fields are set")) {
		t.Errorf("ambiguous request: %d %s", r.code, r.body)
	}
}

func TestPolicyWindow(t *testing.T) {
	t.Parallel()
	lim := func(l, w int64, c sluicev1.Calendar) *sluicev1.Limit {
		return &sluicev1.Limit{Limit: l, WindowMs: w, Calendar: c}
	}
	for _, tc := range []struct {
		name  string
		req   *sluicev1.RateLimitRequest
		limit int64
		want  int64
	}{
		{"one limit", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 1500}, 10, 2},
		{"one limit, answer's limit differs", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 1500}, 11, 2},
		{"rules", &sluicev1.RateLimitRequest{}, 10, 0},
		{"calendar week", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 1, Calendar: sluicev1.Calendar_CALENDAR_WEEK}, 10, 7 * 86400},
		{"calendar month", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 1, Calendar: sluicev1.Calendar_CALENDAR_MONTH}, 10, 0},
		{"inline matches", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 60_000, Limits: []*sluicev1.Limit{lim(20, 1000, 0)}}, 10, 60},
		{"limits matches", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 60_000, Limits: []*sluicev1.Limit{lim(20, 1000, 0)}}, 20, 1},
		{"none matches", &sluicev1.RateLimitRequest{Limit: 10, WindowMs: 60_000, Limits: []*sluicev1.Limit{lim(20, 1000, 0)}}, 30, 0},
		{"two match, same window", &sluicev1.RateLimitRequest{Limits: []*sluicev1.Limit{lim(20, 1000, 0), lim(20, 1000, 0)}}, 20, 1},
		{"two match, windows differ", &sluicev1.RateLimitRequest{Limits: []*sluicev1.Limit{lim(20, 1000, 0), lim(20, 5000, 0)}}, 20, 0},
		{"limits alone, zero limit not the inline one", &sluicev1.RateLimitRequest{Limits: []*sluicev1.Limit{lim(0, 3000, 0)}}, 0, 3},
		{"nil entry", &sluicev1.RateLimitRequest{Limits: []*sluicev1.Limit{nil, lim(5, 2000, 0)}}, 5, 2},
	} {
		if got := policyWindow(tc.req, tc.limit, nil); got != tc.want {
			t.Errorf("%s: policyWindow = %d, want %d", tc.name, got, tc.want)
		}
	}
	// Limits from the rules: the window of the rule's limit the answer
	// names.
	rules := fakeRules{
		"login": {{Limit: 10, WindowMS: 60_000}, {Limit: 100, WindowMS: 3_600_000}},
		"same":  {{Limit: 10, WindowMS: 60_000}, {Limit: 10, WindowMS: 1000}},
		"month": {{Limit: 10, WindowMS: 1, Calendar: bucket.CalendarMonth}},
		"day":   {{Limit: 10, WindowMS: 1, Calendar: bucket.CalendarDay}},
	}
	for _, tc := range []struct {
		name  string
		limit int64
		want  int64
	}{
		{"login", 10, 60}, {"login", 100, 3600}, {"login", 7, 0}, {"same", 10, 0},
		{"month", 10, 0}, {"day", 10, 86400}, {"unknown", 10, 0},
	} {
		if got := policyWindow(&sluicev1.RateLimitRequest{Name: tc.name}, tc.limit, rules); got != tc.want {
			t.Errorf("rule %s, answer's limit %d: policyWindow = %d, want %d", tc.name, tc.limit, got, tc.want)
		}
	}
	// A request with its own window does not look at the rules.
	if got := policyWindow(&sluicev1.RateLimitRequest{Name: "login", Limit: 10, WindowMs: 5000}, 10, rules); got != 5 {
		t.Errorf("inline limit with rules present: %d, want 5", got)
	}
}

// fakeRules is a RuleLimits from a map.
type fakeRules map[string][]bucket.Limit

func (f fakeRules) Lookup(name string) ([]bucket.Limit, bool) {
	l, ok := f[name]
	return l, ok
}

func TestPolicyName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"api":       `"api"`,
		`a"b\c`:     `"a\"b\\c"`,
		"":          `"default"`,
		"caf\u00e9": `"default"`,
		"a\nb":      `"default"`,
	} {
		if got := policyName(in); got != want {
			t.Errorf("policyName(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestHTTPBadInput(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	base := "http://" + s.HTTPAddr()
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"malformed JSON", "POST", "/v1/check", `{"requests":[`, 400},
		{"not an object", "POST", "/v1/check", `[1,2]`, 400},
		{"unknown field", "POST", "/v1/check", `{"requests":[{"nom":"x"}]}`, 400},
		{"wrong type", "POST", "/v1/check", `{"requests":[{"hits":"many"}]}`, 400},
		{"bad enum", "POST", "/v1/check", `{"requests":[{"algorithm":"ALGORITHM_MAGIC"}]}`, 400},
		{"too many items", "POST", "/v1/check", jsonBatch(check.MaxBatchSize+1, 1), 400},
		{"too large", "POST", "/v1/check", `{"requests":[{"name":"` + strings.Repeat("x", DefaultMaxRecvMsgSize) + `"}]}`, 413},
		{"GET check", "GET", "/v1/check", "", 405},
		{"PUT check", "PUT", "/v1/check", `{}`, 405},
		{"POST healthz", "POST", "/healthz", `{}`, 405},
		{"unknown path", "GET", "/v2/check", "", 404},
	} {
		r := do(t, tc.method, base+tc.path, tc.body)
		if r.code != tc.want {
			t.Errorf("%s: %d %.200s, want %d", tc.name, r.code, r.body, tc.want)
			continue
		}
		if tc.want == 400 || tc.want == 413 {
			var e struct{ Error string }
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error == "" {
				t.Errorf("%s: body %.200s has no error message", tc.name, r.body)
			}
		}
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("handler called %d times for bad input", n)
	}
	// A body of unknown length (chunked) is cut off at the limit too.
	body := io.MultiReader(strings.NewReader(`{"requests":[{"name":"`), strings.NewReader(strings.Repeat("x", DefaultMaxRecvMsgSize)), strings.NewReader(`"}]}`))
	r, err := http.NewRequestWithContext(testCtx(t), "POST", base+"/v1/check", body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked 4 MiB body: %d, want 413", resp.StatusCode)
	}
	// Exactly 1000 items is fine.
	if r := do(t, "POST", base+"/v1/check", jsonBatch(check.MaxBatchSize, 1)); r.code != 200 {
		t.Errorf("1000 items: %d", r.code)
	}
}

func TestHTTPProbesAndPages(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{}, func(c *ServerConfig) {
		c.Status = fakeStatus{}
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "sluice_up 1\n") })
		c.Pprof = true
	})
	base := "http://" + s.HTTPAddr()
	if r := do(t, "GET", "http://"+startServer(t, &fakeHandler{}).HTTPAddr()+"/debug/pprof/", ""); r.code != 404 {
		t.Errorf("/debug/pprof/ without ServerConfig.Pprof = %d, want 404", r.code)
	}
	if r := do(t, "GET", base+"/healthz", ""); r.code != 200 {
		t.Errorf("/healthz = %d", r.code)
	}
	if r := do(t, "GET", base+"/readyz", ""); r.code != 503 {
		t.Errorf("/readyz before SetReady(true) = %d, want 503", r.code)
	}
	s.SetReady(true)
	if r := do(t, "GET", base+"/readyz", ""); r.code != 200 {
		t.Errorf("/readyz after SetReady(true) = %d, want 200", r.code)
	}
	s.SetReady(false)
	if r := do(t, "GET", base+"/readyz", ""); r.code != 503 {
		t.Errorf("/readyz after SetReady(false) = %d, want 503", r.code)
	}
	if r := do(t, "GET", base+"/", ""); r.code != 200 || !bytes.Contains(r.body, []byte("node-a")) {
		t.Errorf("/ = %d %s", r.code, r.body)
	}
	if r := do(t, "GET", base+"/debug/pprof/", ""); r.code != 200 || !bytes.Contains(r.body, []byte("goroutine")) {
		t.Errorf("/debug/pprof/ = %d", r.code)
	}
	if r := do(t, "GET", base+"/metrics", ""); r.code != 200 || string(r.body) != "sluice_up 1\n" {
		t.Errorf("/metrics = %d %s", r.code, r.body)
	}
}

// FuzzCheckJSON feeds arbitrary bodies to POST /v1/check: it never panics,
// a body decodeCheckRequest refuses answers 400, anything else 200, 429 or
// 400 (an invalid item), and a handler is asked to decide only a batch of
// valid items.
func FuzzCheckJSON(f *testing.F) {
	for _, seed := range []string{
		`{"requests":[{"name":"api","key":"a","hits":1,"limit":10,"window_ms":60000}]}`,
		`{"requests":[{"name":"api","key":"a","hits":11,"limit":10,"windowMs":60000,"algorithm":"ALGORITHM_GCRA"}]}`,
		`{"requests":[{"algorithm":300,"limit":-1,"burst":"9223372036854775807"}]}`,
		`{"requests":[{"name":"api","key":"a","hits":6,"limit":10,"window_ms":1000,"mode":"MODE_SOFT","soft_percent":10,"limits":[{"limit":5,"window_ms":1000,"calendar":"CALENDAR_DAY","algorithm":"ALGORITHM_FIXED_WINDOW"},{"limit":5,"windowMs":2000}]}]}`,
		`{"requests":[{"name":"api","key":"a","hits":1,"mode":-7,"calendar":99,"limits":[null,{},{"mode":"MODE_ELASTIC","elastic_ceiling":"9","elasticLoadPercent":50,"shaping":true,"count_refused":true,"sub_windows":1001}]}]}`,
		`{}`, `[]`, `null`, `{"requests":[null]}`, `{"requests":[{"name":"\u0000"}]}`, "\xff",
		`{"requests":[{"name":"a","key":"k","limit":5,"window_ms":1000,"algorithm":"gcra","mode":"soft","soft_percent":5}]}`,
		`{"requests":[{"name":"a","key":"k","limits":[{"limit":5,"window_ms":1,"algorithm":"fixed_window","calendar":"week"}]}]}`,
	} {
		f.Add([]byte(seed))
	}
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Handler: &fakeHandler{}})
	if err != nil {
		f.Fatal(err)
	}
	h := s.httpHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewReader(body)))
		code := rec.Code
		parseErr := decodeCheckRequest(body, new(sluicev1.CheckRequest))
		switch {
		case parseErr != nil:
			if code != http.StatusBadRequest {
				t.Fatalf("body %q refused (%v) answered %d", body, parseErr, code)
			}
		case code != http.StatusOK && code != http.StatusTooManyRequests && code != http.StatusBadRequest:
			t.Fatalf("body %q answered %d", body, code)
		}
	})
}
