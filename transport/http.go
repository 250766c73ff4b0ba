package transport

import (
	"bytes"
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
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// The JSON forms of the API: requests accept proto field names and
// lowerCamel names (protojson's default) and refuse unknown fields; responses
// use proto field names and carry every field.
var (
	jsonIn  = protojson.UnmarshalOptions{}
	jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
)

// httpHandler is the HTTP API on the server's own mux (never
// http.DefaultServeMux). Method patterns make the mux answer 405 (with Allow)
// for a known path and a wrong method.
func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	check, forwardAuth := s.serveCheck, s.serveForwardAuth
	if t := s.cfg.Tracing; t != nil {
		check, forwardAuth = t.wrapHTTP("POST /v1/check", check), t.wrapHTTP("/v1/forward-auth", forwardAuth)
	}
	mux.HandleFunc("POST /v1/check", check)
	s.holdRoutes(mux)
	mux.HandleFunc("GET /v1/forward-auth", forwardAuth)
	mux.HandleFunc("POST /v1/forward-auth", forwardAuth)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.Handle("GET /{$}", s.guard.OperatorOnly(http.HandlerFunc(s.serveStatusPage)))
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	if s.cfg.Pprof {
		mux.Handle("/debug/pprof/", s.guard.OperatorOnly(http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/cmdline", s.guard.OperatorOnly(http.HandlerFunc(pprof.Cmdline)))
		mux.Handle("/debug/pprof/profile", s.guard.OperatorOnly(http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/symbol", s.guard.OperatorOnly(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("/debug/pprof/trace", s.guard.OperatorOnly(http.HandlerFunc(pprof.Trace)))
	}
	return mux
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready\n")
		return
	}
	if s.cfg.Degraded != nil {
		if why := s.cfg.Degraded(); why != "" {
			io.WriteString(w, "ready, degraded: "+why+"\n")
			return
		}
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

// serveCheck is POST /v1/check: a CheckRequest as JSON in (enum fields
// also by their command-line names: decodeCheckRequest), a CheckResponse as
// JSON out, one answer per item. The status is the batch's verdict, so
// that a client that reads only it fails closed:
//
//   - 400 when the body is malformed or too many items (the body is
//     {"error": ...}), or when any item is invalid: then no item is decided
//     (bad input changes nothing), the invalid ones carry their error and
//     the others say they were not checked;
//   - 429 when any item is over its limit, with Retry-After and the
//     RateLimit headers of the first such item;
//   - 409 when none is over but some item asks another algorithm than its
//     key's live count (bucket.AlgorithmConflict); the other items were
//     decided and counted;
//   - 503 when none is over or in conflict but some item could not be
//     decided (the node is joining, the key's owner did not answer in
//     time); the items that were decided have been counted;
//   - 200 only when every item was allowed, with the RateLimit headers of
//     the allowed item with the fewest remaining;
//   - 413 for a body over the message limit.
func (s *Server) serveCheck(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
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
		s.observeRefused(APIHTTP, start)
		return
	}
	buf := s.getBody()
	defer s.putBody(buf)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, int64(s.maxRecv))); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is more than %d bytes", mbe.Limit))
			s.observeRefused(APIHTTP, start)
			return
		}
		httpError(w, http.StatusBadRequest, "reading body: "+err.Error())
		s.observeRefused(APIHTTP, start)
		return
	}
	var req sluicev1.CheckRequest
	if err := decodeCheckRequest(buf.Bytes(), &req); err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		s.observeRefused(APIHTTP, start)
		return
	}
	if n := len(req.Requests); n > check.MaxBatchSize {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("batch has %d requests, more than %d", n, check.MaxBatchSize))
		s.observeRefused(APIHTTP, start)
		return
	}
	resp := s.refuseInvalid(req.Requests)
	refused := resp != nil
	if !refused {
		resp = s.decide(r.Context(), req.Requests)
	}
	out, err := jsonOut.Marshal(resp)
	s.observeNative(APIHTTP, start, req.Requests, resp.Responses)
	if err != nil { // cannot happen for these messages
		httpError(w, http.StatusInternalServerError, "encoding response: "+err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	over, nearest := -1, -1 // an allowed answer's headers are those of the item with the fewest remaining
	for i, o := range resp.Responses {
		switch {
		case o.Error != "":
			switch {
			case refused || s.validateCheck(req.Requests[i]) != nil:
				code = http.StatusBadRequest // invalid only now: the rules changed meanwhile
			case strings.HasPrefix(o.Error, bucket.AlgorithmConflictPrefix), strings.HasPrefix(o.Error, check.SettleRefusedPrefix):
				if code == http.StatusOK || code == http.StatusServiceUnavailable {
					code = http.StatusConflict
				}
			case code == http.StatusOK:
				code = http.StatusServiceUnavailable
			}
		case o.Status == sluicev1.Status_STATUS_OVER_LIMIT:
			if over < 0 {
				over = i
			}
		case o.Status == sluicev1.Status_STATUS_UNDER_LIMIT:
			if nearest < 0 || o.Remaining < resp.Responses[nearest].Remaining {
				nearest = i
			}
		default: // no status and no error: cannot happen; not an admission
			if code == http.StatusOK {
				code = http.StatusServiceUnavailable
			}
		}
	}
	switch {
	case code == http.StatusBadRequest:
	case over >= 0:
		code = http.StatusTooManyRequests
		s.writeRateLimitHeaders(h, req.Requests[over], resp.Responses[over])
	case code == http.StatusOK && nearest >= 0:
		s.setRateLimitHeaders(h, req.Requests[nearest], resp.Responses[nearest])
	}
	w.WriteHeader(code)
	w.Write(append(out, '\n'))
}

// validateCheck says whether the Handler would decide r (CheckValidator),
// or, for a Handler that cannot say, whether r is valid at all.
func (s *Server) validateCheck(r *sluicev1.RateLimitRequest) error {
	b := peer.RequestFromProto(r)
	if v, ok := s.cfg.Handler.(CheckValidator); ok {
		return v.ValidateCheck(&b)
	}
	return b.Validate()
}

// refuseInvalid returns nil when every item of reqs is valid; otherwise the
// answer of a batch with an invalid item, which decides nothing: each
// invalid item carries its error, every other one says it was not checked.
func (s *Server) refuseInvalid(reqs []*sluicev1.RateLimitRequest) *sluicev1.CheckResponse {
	var resp *sluicev1.CheckResponse
	first := -1
	for i, r := range reqs {
		err := s.validateCheck(r)
		if err == nil {
			continue
		}
		if resp == nil {
			resp = &sluicev1.CheckResponse{Responses: make([]*sluicev1.RateLimitResponse, len(reqs))}
			first = i
		}
		resp.Responses[i] = &sluicev1.RateLimitResponse{Error: err.Error()}
	}
	if resp == nil {
		return nil
	}
	notChecked := fmt.Sprintf("not checked: item %d of the batch is invalid, and a batch with an invalid item decides nothing", first)
	for i, o := range resp.Responses {
		if o == nil {
			resp.Responses[i] = &sluicev1.RateLimitResponse{Error: notChecked}
		}
	}
	return resp
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
// (window) is given when the request carried the window of that limit, or
// the rule in force for its name has it (see policyWindow).
func (s *Server) writeRateLimitHeaders(h http.Header, req *sluicev1.RateLimitRequest, o *sluicev1.RateLimitResponse) {
	retry := max(ceilSeconds(o.RetryAfterMs), 1) // never "retry now" on a refusal
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	s.setRateLimitHeaders(h, req, o)
}

// setRateLimitHeaders sets the IETF RateLimit-Policy and RateLimit headers
// of one answer, allowed or not (see writeRateLimitHeaders).
func (s *Server) setRateLimitHeaders(h http.Header, req *sluicev1.RateLimitRequest, o *sluicev1.RateLimitResponse) {
	putRateLimitHeaders(h, req.GetName(), o.Limit, policyWindow(req, o.Limit, s.cfg.Rules), o.Remaining, o.ResetAfterMs)
}

// putRateLimitHeaders sets RateLimit-Policy (name, quota limit, window w in
// seconds when above 0) and RateLimit (remaining, reset in seconds rounded
// up from resetMS) on h.
func putRateLimitHeaders(h http.Header, name string, limit, w, remaining, resetMS int64) {
	name = policyName(name)
	policy := name + ";q=" + strconv.FormatInt(max(limit, 0), 10)
	if w > 0 {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", name+";r="+strconv.FormatInt(max(remaining, 0), 10)+
		";t="+strconv.FormatInt(ceilSeconds(resetMS), 10))
}

// policyWindow returns the window, in whole seconds rounded up, of the
// limit of req that the answer's limit names. A request with no limits has
// one candidate, its inline limit; otherwise the candidates are the inline
// limit (unless limit is 0 and window_ms unset: limits alone) and those of
// limits, and the ones that count are those whose limit field equals limit.
// It returns 0 (no w parameter) when no candidate counts, when those that
// count disagree on their window, or when a window has no fixed length
// (calendar month) or is unset (the limit came from the rules).
func policyWindow(req *sluicev1.RateLimitRequest, limit int64, rules RuleLimits) int64 {
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
	more := req.GetLimits()
	if req.GetLimit() == 0 && req.GetWindowMs() == 0 && len(more) == 0 {
		// The limits came from the rule for the name, as the node in
		// force resolved them.
		if rules == nil {
			return 0
		}
		lims, ok := rules.Lookup(req.GetName())
		if !ok {
			return 0
		}
		for i := range lims {
			if !count(lims[i].Limit, lims[i].WindowMS, sluicev1.Calendar(lims[i].Calendar)) {
				return 0
			}
		}
		return w
	}
	if len(more) == 0 {
		return windowSeconds(req.GetWindowMs(), req.GetCalendar())
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
