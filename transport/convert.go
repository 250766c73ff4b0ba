package transport

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// invalidAlgorithm is what an enum value outside 0..255 becomes: a value
// bucket.Limit.Validate refuses, so a large number on the wire never wraps
// into a valid algorithm.
const invalidAlgorithm = bucket.Algorithm(255)

// RequestFromProto converts one wire request. It does not validate: the
// Handler does. A nil r gives the zero Request (which Validate refuses).
func RequestFromProto(r *sluicev1.RateLimitRequest) bucket.Request {
	if r == nil {
		return bucket.Request{}
	}
	return bucket.Request{
		Name: r.Name,
		Key:  r.Key,
		Hits: r.Hits,
		Limit: bucket.Limit{
			Algorithm: algorithmFromProto(r.Algorithm),
			Limit:     r.Limit,
			WindowMS:  r.WindowMs,
			Burst:     r.Burst,
		},
	}
}

func algorithmFromProto(a sluicev1.Algorithm) bucket.Algorithm {
	if a < 0 || a > 255 {
		return invalidAlgorithm
	}
	return bucket.Algorithm(a)
}

// RequestToProto converts one request for the wire.
func RequestToProto(r bucket.Request) *sluicev1.RateLimitRequest {
	m := &sluicev1.RateLimitRequest{}
	fillRequest(m, &r)
	return m
}

// fillRequest sets every field of m from r (m may be a reused message).
func fillRequest(m *sluicev1.RateLimitRequest, r *bucket.Request) {
	m.Name = r.Name
	m.Key = r.Key
	m.Hits = r.Hits
	m.Limit = r.Limit.Limit
	m.WindowMs = r.WindowMS
	m.Algorithm = sluicev1.Algorithm(r.Algorithm)
	m.Burst = r.Burst
}

// ResponseToProto converts one outcome for the wire.
func ResponseToProto(o bucket.Outcome) *sluicev1.RateLimitResponse {
	m := &sluicev1.RateLimitResponse{}
	fillResponse(m, &o)
	return m
}

// AppendResponses appends the wire form of outs to dst, allocating one
// backing array for all the messages instead of one per item.
func AppendResponses(dst []*sluicev1.RateLimitResponse, outs []bucket.Outcome) []*sluicev1.RateLimitResponse {
	if len(outs) == 0 {
		return dst
	}
	msgs := make([]sluicev1.RateLimitResponse, len(outs))
	for i := range outs {
		fillResponse(&msgs[i], &outs[i])
		dst = append(dst, &msgs[i])
	}
	return dst
}

func fillResponse(m *sluicev1.RateLimitResponse, o *bucket.Outcome) {
	m.Status = sluicev1.Status(o.Status)
	m.Limit = o.Decision.Limit
	m.Remaining = o.Remaining
	m.ResetAfterMs = o.ResetAfterMS
	m.RetryAfterMs = o.RetryAfterMS
	m.Error = o.Err
	m.Owner = o.Owner
}

// OutcomeFromProto converts one wire response. A status this release does not
// know becomes StatusUnspecified with an error, never a verdict.
func OutcomeFromProto(m *sluicev1.RateLimitResponse) bucket.Outcome {
	if m == nil {
		return bucket.Outcome{Err: "missing response"}
	}
	o := bucket.Outcome{
		Decision: bucket.Decision{
			Limit:        m.Limit,
			Remaining:    m.Remaining,
			ResetAfterMS: m.ResetAfterMs,
			RetryAfterMS: m.RetryAfterMs,
		},
		Owner: m.Owner,
		Err:   m.Error,
	}
	switch m.Status {
	case sluicev1.Status_STATUS_UNSPECIFIED, sluicev1.Status_STATUS_UNDER_LIMIT, sluicev1.Status_STATUS_OVER_LIMIT:
		o.Status = bucket.Status(m.Status)
	default:
		o.Status = bucket.StatusUnspecified
		if o.Err == "" {
			o.Err = "unknown status " + m.Status.String()
		}
	}
	return o
}

// CounterToProto converts one counter for the wire. A Version of 0 means "no
// counter": its state is not sent (state bytes empty).
func CounterToProto(c bucket.Counter) *sluicev1.Counter {
	m := &sluicev1.Counter{Name: c.Name, Key: c.Key, Version: c.Version}
	if c.Version != 0 {
		m.State, _ = c.State.MarshalBinary() // never fails
	}
	return m
}

// CounterFromProto converts and validates one wire counter: name and key as
// bucket.ValidateKey wants them, and either Version 0 with an empty state (no
// counter) or a Version above 0 with a state bucket.State.UnmarshalBinary
// accepts. The error says what is wrong.
func CounterFromProto(m *sluicev1.Counter) (bucket.Counter, error) {
	if m == nil {
		return bucket.Counter{}, errors.New("missing counter")
	}
	if err := bucket.ValidateKey(m.Name, m.Key); err != nil {
		return bucket.Counter{}, err
	}
	c := bucket.Counter{Name: m.Name, Key: m.Key, Version: m.Version}
	switch {
	case m.Version == 0 && len(m.State) != 0:
		return bucket.Counter{}, fmt.Errorf("version 0 with a state of %d bytes", len(m.State))
	case m.Version == 0:
		return c, nil
	}
	if err := c.State.UnmarshalBinary(m.State); err != nil {
		return bucket.Counter{}, err
	}
	return c, nil
}
