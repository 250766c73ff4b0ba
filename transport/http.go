package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The JSON forms of the API: requests accept proto field names and
// lowerCamel names (protojson's default) and refuse unknown fields; responses
// use proto field names and carry every field.
var (
	jsonIn  = protojson.UnmarshalOptions{}
	jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
)

// statusPageTimeout bounds the StatusSource call behind GET /.
const statusPageTimeout = 2 * time.Second

// httpHandler is the HTTP API on the server's own mux (never
// http.DefaultServeMux). Method patterns make the mux answer 405 (with Allow)
// for a known path and a wrong method.
func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", s.serveCheck)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.HandleFunc("GET /{$}", s.serveStatusPage)
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready\n")
		return
	}
	io.WriteString(w, "ready\n")
}

// httpError writes {"error": msg} with code.
func httpError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

// serveCheck is POST /v1/check: a CheckRequest as JSON in, a CheckResponse as
// JSON out; 200 when every item is allowed or invalid, 429 when any is over
// its limit, 400 for bad JSON or too many items, 413 for a body over the
// message limit.
func (s *Server) serveCheck(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("panic in HTTP check", "panic", p, "stack", string(debug.Stack()))
			httpError(w, http.StatusInternalServerError, "internal error")
		}
	}()
	if r.ContentLength > int64(s.maxRecv) {
		httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is %d bytes, more than %d", r.ContentLength, s.maxRecv))
		return
	}
	buf := s.getBody()
	defer s.putBody(buf)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, int64(s.maxRecv))); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is more than %d bytes", mbe.Limit))
			return
		}
		httpError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	var req sluicev1.CheckRequest
	if err := jsonIn.Unmarshal(buf.Bytes(), &req); err != nil {
		httpError(w, http.StatusBadRequest, "malformed CheckRequest JSON: "+err.Error())
		return
	}
	if n := len(req.Requests); n > bucket.MaxBatchSize {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("batch has %d requests, more than %d", n, bucket.MaxBatchSize))
		return
	}
	resp := s.decide(r.Context(), req.Requests, false, "")
	out, err := jsonOut.Marshal(resp)
	if err != nil { // cannot happen for these messages
		httpError(w, http.StatusInternalServerError, "encoding response: "+err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	for i, o := range resp.Responses {
		if o.Status == sluicev1.Status_STATUS_OVER_LIMIT {
			code = http.StatusTooManyRequests
			writeRateLimitHeaders(h, req.Requests[i], o)
			break
		}
	}
	w.WriteHeader(code)
	w.Write(append(out, '\n'))
}

func (s *Server) getBody() *bytes.Buffer {
	if b, ok := s.bodies.Get().(*bytes.Buffer); ok {
		return b
	}
	return new(bytes.Buffer)
}

func (s *Server) putBody(b *bytes.Buffer) {
	if b.Cap() > 64<<10 { // keep the pool from pinning big bodies
		return
	}
	b.Reset()
	s.bodies.Put(b)
}

// ceilSeconds rounds milliseconds up to whole seconds.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// writeRateLimitHeaders sets Retry-After and the IETF RateLimit-Policy and
// RateLimit headers (draft-ietf-httpapi-ratelimit-headers) for one over-limit
// item. The policy is named after the limit's name when that is a plain
// printable-ASCII string, "default" otherwise. q is the combined answer's
// limit (for several limits, the most restrictive one: bucket.Combine); w
// (window) is given when the request carried the window of that limit (see
// policyWindow).
func writeRateLimitHeaders(h http.Header, req *sluicev1.RateLimitRequest, o *sluicev1.RateLimitResponse) {
	retry := max(ceilSeconds(o.RetryAfterMs), 1) // never "retry now" on a refusal
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	name := policyName(req.GetName())
	policy := name + ";q=" + strconv.FormatInt(max(o.Limit, 0), 10)
	if w := policyWindow(req, o.Limit); w > 0 {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", name+";r="+strconv.FormatInt(max(o.Remaining, 0), 10)+
		";t="+strconv.FormatInt(ceilSeconds(o.ResetAfterMs), 10))
}

// policyWindow returns the window, in whole seconds rounded up, of the
// limit of req that the answer's limit names. A request with no limits has
// one candidate, its inline limit; otherwise the candidates are the inline
// limit (unless limit is 0 and window_ms unset: limits alone) and those of
// limits, and the ones that count are those whose limit field equals limit.
// It returns 0 (no w parameter) when no candidate counts, when those that
// count disagree on their window, or when a window has no fixed length
// (calendar month) or is unset (the limit came from the rules).
func policyWindow(req *sluicev1.RateLimitRequest, limit int64) int64 {
	more := req.GetLimits()
	if len(more) == 0 {
		return windowSeconds(req.GetWindowMs(), req.GetCalendar())
	}
	var w int64
	seen := false
	count := func(l, windowMS int64, cal sluicev1.Calendar) bool {
		if l != limit {
			return true
		}
		s := windowSeconds(windowMS, cal)
		if s <= 0 || (seen && s != w) {
			return false
		}
		w, seen = s, true
		return true
	}
	if (req.GetLimit() != 0 || req.GetWindowMs() != 0) && !count(req.GetLimit(), req.GetWindowMs(), req.GetCalendar()) {
		return 0
	}
	for _, l := range more {
		if !count(l.GetLimit(), l.GetWindowMs(), l.GetCalendar()) {
			return 0
		}
	}
	return w
}

// windowSeconds is the length of a window in whole seconds, rounded up; 0
// for a calendar month (28-31 days) or an unknown calendar.
func windowSeconds(windowMS int64, cal sluicev1.Calendar) int64 {
	switch cal {
	case sluicev1.Calendar_CALENDAR_NONE:
		return ceilSeconds(windowMS)
	case sluicev1.Calendar_CALENDAR_DAY:
		return 24 * 60 * 60
	case sluicev1.Calendar_CALENDAR_WEEK:
		return 7 * 24 * 60 * 60
	}
	return 0
}

// policyName is name as a structured-field string (RFC 8941 §3.3.3), or
// "default" when name has characters a header string cannot carry.
func policyName(name string) string {
	if name == "" || len(name) > bucket.MaxNameLen {
		return `"default"`
	}
	var b strings.Builder
	b.Grow(len(name) + 4)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e {
			return `"default"`
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}

// serveStatusPage is GET /: a short plain-text page from the StatusSource.
func (s *Server) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	var b strings.Builder
	b.WriteString("sluice\n\n")
	ready := "not ready"
	if s.ready.Load() {
		ready = "ready"
	}
	fmt.Fprintf(&b, "state:    %s\n", ready)
	if s.cfg.Status == nil {
		b.WriteString("status:   not available\n")
	} else {
		ctx, cancel := context.WithTimeout(r.Context(), statusPageTimeout)
		st, err := s.cfg.Status.Status(ctx)
		cancel()
		switch {
		case err != nil:
			fmt.Fprintf(&b, "status:   error: %v\n", err)
		case st != nil:
			fmt.Fprintf(&b, "node:     %s\nkeys:     %d\nchecks/s: %.1f\nreplication factor: %d\npartitions: %d\n\nmembers:\n",
				st.Node, st.Keys, st.ChecksPerSecond, st.ReplicationFactor, st.Partitions)
			for _, m := range st.Members {
				fmt.Fprintf(&b, "  %-24s %-22s %-8s share %5.1f%%  keys %d\n", m.Name, m.GrpcAddr, m.State, 100*m.Share, m.Keys)
			}
		}
	}
	b.WriteString("\nendpoints: POST /v1/check, GET /healthz, GET /readyz, /debug/pprof/\n")
	io.WriteString(w, b.String())
}
