package transport

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// DefaultForwardAuthDenyStatus is the status of a forward-auth refusal
// when ServerConfig.ForwardAuthDenyStatus is 0.
const DefaultForwardAuthDenyStatus = http.StatusTooManyRequests

// DefaultForwardAuthKeyHeader is the header a forward-auth check takes its
// key from when the request does not name one.
const DefaultForwardAuthKeyHeader = "X-Forwarded-For"

// serveForwardAuth is GET|POST /v1/forward-auth, for the forward-auth hooks
// of reverse proxies (nginx auth_request, Traefik forwardAuth, Caddy
// forward_auth, HAProxy): one check whose name comes from the query and
// whose key comes from a header of the request the proxy forwards.
//
// Query parameters:
//   - name (required): the check's name; its limits come from the rules
//     unless limit and window are given.
//   - key_header (default X-Forwarded-For): the header that holds the key.
//     X-Forwarded-For gives its first address, Forwarded its first for=
//     address, Authorization the hex SHA-256 of its value (never the
//     credential itself), any other header its value as sent.
//   - hits (default 1), limit, window (a Go duration) and algorithm: as in
//     a native check.
//   - deny_status: the status of a refusal for this call, 400..499
//     (default ServerConfig.ForwardAuthDenyStatus, 429; nginx's
//     auth_request passes only 401 and 403 on).
//
// The answer is 200 when allowed and deny_status when over the limit, both
// with RateLimit-Policy and RateLimit, a refusal with Retry-After too; 400
// for a bad query or a missing key header (the body says which), 503 when
// the check could not be decided. The body is one line of text.
func (s *Server) serveForwardAuth(w http.ResponseWriter, r *http.Request) {
	start, res := time.Now(), ResultError // a refusal unless decided below
	defer func() {
		var c Counts
		c[res]++
		s.obs.ObserveCall(APIForwardAuth, c, time.Since(start))
	}()
	fail := func(code int, format string, args ...any) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		fmt.Fprintf(w, format+"\n", args...)
	}
	deny := s.cfg.ForwardAuthDenyStatus
	if deny == 0 {
		deny = DefaultForwardAuthDenyStatus
	}
	req, deny, err := forwardAuthRequest(r.URL.Query(), r.Header, deny)
	if err != nil {
		fail(http.StatusBadRequest, "%v", err)
		return
	}
	// The proxy's body (POST) is not used; drain a little of it so the
	// connection can be reused.
	io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10))

	resp := s.decide(r.Context(), []*sluicev1.RateLimitRequest{req})
	o := resp.Responses[0]
	res = responseResult(o)
	if req.Limit == 0 {
		s.obs.ObserveRule(req.Name, res)
	}
	if o.Error != "" {
		code := http.StatusServiceUnavailable
		if strings.HasPrefix(o.Error, "no limit given") {
			code = http.StatusBadRequest // no such rule: the proxy's configuration
		}
		fail(code, "%s", o.Error)
		return
	}
	h := w.Header()
	s.setRateLimitHeaders(h, req, o)
	if o.Status == sluicev1.Status_STATUS_OVER_LIMIT {
		h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(o.RetryAfterMs), 1), 10))
		fail(deny, "over the limit")
		return
	}
	fail(http.StatusOK, "allowed")
}

// forwardAuthRequest reads a forward-auth call's check from its query q and
// the request's headers h, and the status of a refusal: deny unless the
// query sets deny_status. The error says what is wrong with the call.
func forwardAuthRequest(q url.Values, h http.Header, deny int) (*sluicev1.RateLimitRequest, int, error) {
	if v := q.Get("deny_status"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 400 || n > 499 {
			return nil, 0, fmt.Errorf("deny_status %q: want a status in 400..499", v)
		}
		deny = n
	}
	req := &sluicev1.RateLimitRequest{Name: q.Get("name")}
	if req.Name == "" {
		return nil, 0, errors.New("the query needs name=<rule name>")
	}
	header := q.Get("key_header")
	if header == "" {
		header = DefaultForwardAuthKeyHeader
	}
	key, err := forwardAuthKey(h, header)
	if err != nil {
		return nil, 0, err
	}
	req.Key = key
	hits := int64(1)
	if v := q.Get("hits"); v != "" {
		if hits, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, 0, fmt.Errorf("hits %q is not an integer", v)
		}
	}
	req.Hits = &hits
	if v := q.Get("limit"); v != "" {
		if req.Limit, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, 0, fmt.Errorf("limit %q is not an integer", v)
		}
	}
	if v := q.Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, 0, fmt.Errorf("window %q is not a duration (like 1m, 1h)", v)
		}
		req.WindowMs = d.Milliseconds()
	}
	if v := q.Get("algorithm"); v != "" {
		a, err := bucket.ParseAlgorithm(v)
		if err != nil {
			return nil, 0, err
		}
		req.Algorithm = sluicev1.Algorithm(a)
	}
	if b := peer.RequestFromProto(req); b.Validate() != nil {
		return nil, 0, b.Validate()
	}
	return req, deny, nil
}

// forwardAuthKey takes the key from the named header of h.
func forwardAuthKey(h http.Header, name string) (string, error) {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	v := strings.TrimSpace(h.Get(canon))
	if v == "" {
		return "", fmt.Errorf("no key: the request has no %s header", canon)
	}
	switch canon {
	case "X-Forwarded-For":
		first, _, _ := strings.Cut(v, ",")
		v = strings.TrimSpace(first)
	case "Forwarded":
		v = forwardedFor(v)
	case "Authorization", "Proxy-Authorization", "Cookie":
		sum := sha256.Sum256([]byte(v))
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
	if v == "" {
		return "", fmt.Errorf("no key: the %s header has no address", canon)
	}
	if len(v) > bucket.MaxKeyLen {
		return "", fmt.Errorf("the %s header is %d bytes, more than %d", canon, len(v), bucket.MaxKeyLen)
	}
	return v, nil
}

// forwardedFor is the first for= address of an RFC 7239 Forwarded header,
// without quotes, brackets or port; "" when there is none.
func forwardedFor(v string) string {
	first, _, _ := strings.Cut(v, ",")
	for param := range strings.SplitSeq(first, ";") {
		k, val, ok := strings.Cut(strings.TrimSpace(param), "=")
		if !ok || !strings.EqualFold(k, "for") {
			continue
		}
		val = strings.Trim(val, `"`)
		if host, _, err := net.SplitHostPort(val); err == nil {
			return host
		}
		return strings.Trim(val, "[]")
	}
	return ""
}
