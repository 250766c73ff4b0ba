package transport

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// checkAnswer is a /v1/check body: the answers, or the whole call's error.
type checkAnswer struct {
	Responses []struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Owner  string `json:"owner"`
	} `json:"responses"`
	Error string `json:"error"`
}

func parseAnswer(t *testing.T, r httpResult) checkAnswer {
	t.Helper()
	var a checkAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	return a
}

// The status of POST /v1/check says what a client may do: 200 only when
// every item was allowed, 429 when one is over its limit, 400 when one is
// invalid (and then nothing is decided), 503 when one could not be decided.
func TestHTTPCheckStatusFailsClosed(t *testing.T) {
	t.Parallel()
	const (
		ok      = `{"name":"api","key":"a","limit":10,"window_ms":60000}`
		over    = `{"name":"api","key":"b","hits":11,"limit":10,"window_ms":60000}`
		neg     = `{"name":"api","key":"c","limit":-5,"window_ms":60000}`
		nokey   = `{"name":"api","limit":10,"window_ms":60000}`
		alg99   = `{"name":"api","key":"d","limit":10,"window_ms":60000,"algorithm":99}`
		failing = `{"name":"api","key":"fail:e","limit":10,"window_ms":60000}`
	)
	for _, tc := range []struct {
		name    string
		items   []string
		code    int
		decided bool     // the handler was asked to decide
		errs    []string // per item: a substring of its error, "" for none
	}{
		{"all allowed", []string{ok, ok}, 200, true, []string{"", ""}},
		{"one over", []string{ok, over}, 429, true, []string{"", ""}},
		{"negative limit", []string{neg}, 400, false, []string{"limit is -5"}},
		{"missing key", []string{ok, nokey}, 400, false, []string{"not checked: item 1", "key is empty"}},
		{"algorithm 99 lists the algorithms", []string{alg99}, 400, false, []string{"unknown algorithm 99 (want"}},
		{"invalid beside over", []string{over, neg, ok}, 400, false, []string{"not checked: item 1", "limit is -5", "not checked: item 1"}},
		{"undecided", []string{ok, failing}, 503, true, []string{"", "cannot decide"}},
		{"undecided beside over", []string{failing, over}, 429, true, []string{"cannot decide", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &failingHandler{}
			s := startServer(t, h)
			r := do(t, "POST", "http://"+s.HTTPAddr()+"/v1/check", `{"requests":[`+strings.Join(tc.items, ",")+`]}`)
			if r.code != tc.code {
				t.Fatalf("answered %d, want %d: %s", r.code, tc.code, r.body)
			}
			if got := h.calls.Load() > 0; got != tc.decided {
				t.Errorf("handler asked to decide: %v, want %v", got, tc.decided)
			}
			a := parseAnswer(t, r)
			if len(a.Responses) != len(tc.items) {
				t.Fatalf("%d answers for %d items: %s", len(a.Responses), len(tc.items), r.body)
			}
			for i, want := range tc.errs {
				o := a.Responses[i]
				switch {
				case want == "" && o.Error != "":
					t.Errorf("item %d: error %q, want none", i, o.Error)
				case want != "" && !strings.Contains(o.Error, want):
					t.Errorf("item %d: error %q, want it to contain %q", i, o.Error, want)
				case want != "" && o.Status != "STATUS_UNSPECIFIED":
					t.Errorf("item %d: status %s with an error, want STATUS_UNSPECIFIED", i, o.Status)
				}
			}
			if tc.code == 400 && (r.header.Get("RateLimit") != "" || r.header.Get("Retry-After") != "") {
				t.Errorf("a 400 carries rate-limit headers: %v", r.header)
			}
			if tc.code == 429 && r.header.Get("Retry-After") == "" {
				t.Errorf("a 429 without Retry-After: %v", r.header)
			}
		})
	}
}

// A Handler that is a CheckValidator has the last word on validity: a
// check with no limit and no rule is invalid, and nothing is decided.
func TestHTTPCheckAsksTheValidator(t *testing.T) {
	t.Parallel()
	h := &validatingHandler{}
	s := startServer(t, h)
	url := "http://" + s.HTTPAddr() + "/v1/check"
	r := do(t, "POST", url, `{"requests":[{"name":"api","key":"a","limit":10,"window_ms":1000},{"name":"norule","key":"a"}]}`)
	if r.code != 400 {
		t.Fatalf("answered %d, want 400: %s", r.code, r.body)
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("handler decided %d calls with an invalid item in the batch", n)
	}
	a := parseAnswer(t, r)
	if len(a.Responses) != 2 || !strings.Contains(a.Responses[1].Error, `no rule for name "norule"`) || !strings.Contains(a.Responses[0].Error, "not checked") {
		t.Errorf("answers: %s", r.body)
	}
	if n := h.validated.Load(); n != 2 {
		t.Errorf("validator asked %d times, want 2", n)
	}
	r = do(t, "POST", url, `{"requests":[{"name":"rule","key":"a"}]}`)
	if r.code != 200 || h.calls.Load() != 1 {
		t.Errorf("a check by rule: %d (calls %d) %s", r.code, h.calls.Load(), r.body)
	}
}

// failingHandler is a fakeHandler that cannot decide keys starting with
// "fail:" (as a node that is joining, or whose owner does not answer).
type failingHandler struct{ fakeHandler }

func (h *failingHandler) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	h.fakeHandler.Check(ctx, reqs, out)
	for i := range reqs {
		if strings.HasPrefix(reqs[i].Key, "fail:") {
			out[i] = check.Outcome{Err: "cannot decide now", Owner: "a"}
		}
	}
}

// validatingHandler is a fakeHandler with rules: the name "rule" has a
// limit of 10 a second; any other name needs its own limit.
type validatingHandler struct {
	fakeHandler
	validated atomic.Int64
}

var _ CheckValidator = (*validatingHandler)(nil)

func (h *validatingHandler) ValidateCheck(r *check.Request) error {
	h.validated.Add(1)
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Limit.Limit == 0 && len(r.More) == 0 && r.Name != "rule" {
		return errors.New(`no limit given and no rule for name "` + r.Name + `"`)
	}
	return nil
}

func (h *validatingHandler) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	for i := range reqs {
		if reqs[i].Name == "rule" {
			reqs[i].Limit = bucket.Limit{Limit: 10, WindowMS: 1000}
		}
	}
	h.fakeHandler.Check(ctx, reqs, out)
}

// Enum fields take the names of the command line and rules files as well
// as the proto names and numbers; an unknown name is refused with the
// valid ones listed, and where it was.
func TestHTTPCheckEnumNames(t *testing.T) {
	t.Parallel()
	h := &fakeHandler{}
	s := startServer(t, h)
	url := "http://" + s.HTTPAddr() + "/v1/check"
	r := do(t, "POST", url, `{"requests":[
		{"name":"a","key":"k","limit":10,"window_ms":1000,"algorithm":"token_bucket","mode":"soft","soft_percent":10},
		{"name":"a","key":"k","limit":10,"window_ms":1000,"algorithm":"ALGORITHM_GCRA","mode":"MODE_HARD"},
		{"name":"a","key":"k","limit":10,"window_ms":1000,"algorithm":4},
		{"name":"a","key":"k","limits":[{"limit":5,"window_ms":1,"algorithm":"fixed_window","calendar":"day"},
			{"limit":5,"windowMs":1000,"algorithm":"sliding_log","mode":"elastic","elastic_ceiling":9,"elastic_load_percent":50}]}]}`)
	if r.code != 200 {
		t.Fatalf("answered %d: %s", r.code, r.body)
	}
	h.mu.Lock()
	got := append([]check.Request(nil), h.last...)
	h.mu.Unlock()
	if len(got) != 4 {
		t.Fatalf("%d requests arrived", len(got))
	}
	for i, c := range []struct {
		got, want any
	}{
		{got[0].Algorithm, bucket.TokenBucket}, {got[0].Mode, bucket.ModeSoft},
		{got[1].Algorithm, bucket.GCRA}, {got[1].Mode, bucket.ModeHard},
		{got[2].Algorithm, bucket.LeakyBucket},
		{got[3].More[0].Algorithm, bucket.FixedWindow}, {got[3].More[0].Calendar, bucket.CalendarDay},
		{got[3].More[1].Algorithm, bucket.SlidingLog}, {got[3].More[1].Mode, bucket.ModeElastic},
	} {
		if c.got != c.want {
			t.Errorf("field %d arrived as %v, want %v", i, c.got, c.want)
		}
	}
	calls := h.calls.Load()
	for _, tc := range []struct{ body, want string }{
		{`{"requests":[{"name":"a","key":"k","algorithm":"tokenbucket"}]}`,
			`requests[0].algorithm: unknown algorithm "tokenbucket" (want sliding_window, sliding_log, token_bucket, leaky_bucket, fixed_window or gcra`},
		{`{"requests":[{"name":"a","key":"k"},{"name":"a","key":"k","limits":[{},{"calendar":"year"}]}]}`,
			`requests[1].limits[1].calendar: unknown calendar "year" (want day, week, month or none`},
		{`{"requests":[{"name":"a","key":"k","mode":"Soft"}]}`, `requests[0].mode: unknown mode "Soft" (want hard, soft or elastic`},
		{`{"requests":[{"name":"a","key":"k","algorithm":"ALGORITHM_MAGIC"}]}`, "ALGORITHM_TOKEN_BUCKET"},
		{`{"requests":[{"name":"a","key":"k","algorithm":true}]}`, "requests[0].algorithm"},
	} {
		r := do(t, "POST", url, tc.body)
		a := parseAnswer(t, r)
		if r.code != 400 || !strings.Contains(a.Error, tc.want) {
			t.Errorf("%s: %d %q, want 400 with %q", tc.body, r.code, a.Error, tc.want)
		}
	}
	if n := h.calls.Load(); n != calls {
		t.Errorf("%d calls decided for bodies with unknown names", n-calls)
	}
}
