package transport

// Concurrency limits over the API: RateLimiter/Acquire, Renew and Release,
// and POST /v1/acquire, /v1/renew and /v1/release with the same messages
// as JSON. The node (a Holder) routes each operation to the key's owner.

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Holder carries out the operations of concurrency limits at the key's
// owner (check.Request.Op); cluster.Node is one. A Handler that is a
// Holder serves RateLimiter/Acquire, Renew and Release.
type Holder interface {
	Hold(ctx context.Context, r check.Request) check.Outcome
}

// leaseID reads a lease id as the API gives it: the decimal the acquire
// answered.
func leaseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, status.Errorf(codes.InvalidArgument, "lease_id %q is not one Acquire answered", s)
	}
	return id, nil
}

// hold validates r and has the node carry it out: InvalidArgument for a
// bad field, Unavailable when the key could not be decided.
func (s *Server) hold(ctx context.Context, r check.Request) (check.Outcome, error) {
	h, ok := s.cfg.Handler.(Holder)
	if !ok {
		return check.Outcome{}, status.Error(codes.Unimplemented, "concurrency limits are not available on this server")
	}
	if err := r.Validate(); err != nil {
		return check.Outcome{}, status.Error(codes.InvalidArgument, err.Error())
	}
	o := h.Hold(ctx, r)
	if o.Err != "" {
		return o, status.Error(codes.Unavailable, o.Err)
	}
	return o, nil
}

func leaseResponse(o check.Outcome) *sluicev1.LeaseResponse {
	m := &sluicev1.LeaseResponse{Held: o.LeaseID != 0, Holders: max(o.Limit-o.Remaining, 0), Limit: o.Limit, Owner: o.Owner}
	if m.Held {
		m.LeaseId, m.ExpiresInMs = strconv.FormatInt(o.LeaseID, 10), o.ResetAfterMS
	} else {
		m.RetryAfterMs = o.RetryAfterMS
	}
	return m
}

func (g rateLimiterServer) Acquire(ctx context.Context, req *sluicev1.AcquireRequest) (*sluicev1.LeaseResponse, error) {
	o, err := g.s.hold(ctx, check.Request{Name: req.GetName(), Key: req.GetKey(), Op: check.OpAcquire,
		Limit: bucket.Limit{Limit: req.GetLimit(), WindowMS: req.GetTtlMs()}})
	if err != nil {
		return nil, err
	}
	return leaseResponse(o), nil
}

func (g rateLimiterServer) Renew(ctx context.Context, req *sluicev1.RenewRequest) (*sluicev1.LeaseResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	o, err := g.s.hold(ctx, check.Request{Name: req.GetName(), Key: req.GetKey(), Op: check.OpRenew, LeaseID: id,
		Limit: bucket.Limit{Limit: req.GetLimit(), WindowMS: req.GetTtlMs()}})
	if err != nil {
		return nil, err
	}
	return leaseResponse(o), nil
}

func (g rateLimiterServer) Release(ctx context.Context, req *sluicev1.ReleaseRequest) (*sluicev1.ReleaseResponse, error) {
	id, err := leaseID(req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	o, err := g.s.hold(ctx, check.Request{Name: req.GetName(), Key: req.GetKey(), Op: check.OpRelease, LeaseID: id})
	if err != nil {
		return nil, err
	}
	return &sluicev1.ReleaseResponse{Released: o.LeaseID != 0, Holders: max(o.Limit-o.Remaining, 0), Owner: o.Owner}, nil
}

// serveHold is POST /v1/acquire, /v1/renew and /v1/release: the gRPC
// call's request as JSON in, its answer as JSON out. The status: 200 when
// the lease is held (or released); 429 with Retry-After when an acquire is
// refused; 409 when a renew finds the lease not held; 400 for a malformed
// body or a bad field; 503 when the key could not be decided.
func (s *Server) serveHold(op check.LeaseOp) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			httpError(w, http.StatusBadRequest, "reading body: "+err.Error())
			return
		}
		g := rateLimiterServer{s: s}
		var resp proto.Message
		var held bool
		var retry int64
		switch op {
		case check.OpAcquire:
			var req sluicev1.AcquireRequest
			if err := jsonIn.Unmarshal(body, &req); err != nil {
				httpError(w, http.StatusBadRequest, "malformed AcquireRequest JSON: "+err.Error())
				return
			}
			lr, e := g.Acquire(r.Context(), &req)
			resp, err, held, retry = lr, e, lr.GetHeld(), lr.GetRetryAfterMs()
		case check.OpRenew:
			var req sluicev1.RenewRequest
			if err := jsonIn.Unmarshal(body, &req); err != nil {
				httpError(w, http.StatusBadRequest, "malformed RenewRequest JSON: "+err.Error())
				return
			}
			lr, e := g.Renew(r.Context(), &req)
			resp, err, held = lr, e, lr.GetHeld()
		default:
			var req sluicev1.ReleaseRequest
			if err := jsonIn.Unmarshal(body, &req); err != nil {
				httpError(w, http.StatusBadRequest, "malformed ReleaseRequest JSON: "+err.Error())
				return
			}
			rr, e := g.Release(r.Context(), &req)
			resp, err, held = rr, e, true
		}
		if err != nil {
			code := http.StatusServiceUnavailable
			if st, _ := status.FromError(err); st.Code() == codes.InvalidArgument {
				code = http.StatusBadRequest
			}
			httpError(w, code, status.Convert(err).Message())
			return
		}
		out, err := jsonOut.Marshal(resp)
		if err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		code := http.StatusOK
		switch {
		case !held && op == check.OpAcquire:
			code = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.FormatInt(max((retry+999)/1000, 1), 10))
		case !held:
			code = http.StatusConflict
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		w.Write(append(out, '\n'))
	}
}

// holdRoutes registers the HTTP forms of the concurrency limit calls.
func (s *Server) holdRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/acquire", s.serveHold(check.OpAcquire))
	mux.HandleFunc("POST /v1/renew", s.serveHold(check.OpRenew))
	mux.HandleFunc("POST /v1/release", s.serveHold(check.OpRelease))
}
