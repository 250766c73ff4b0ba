package peer

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The values an enum number outside 0..255 becomes: values
// bucket.Limit.Validate refuses, so a large number on the wire never wraps
// into a valid algorithm, mode or calendar.
const (
	invalidAlgorithm = bucket.Algorithm(255)
	invalidMode      = bucket.Mode(255)
	invalidCalendar  = bucket.Calendar(255)
)

// maxConvertedLimits is the most entries of RateLimitRequest.limits that
// RequestFromProto converts: one more than a valid request can carry, so
// that Validate still refuses the request while a hostile one cannot make
// the conversion allocate in proportion to its (up to 4 MiB) message.
const maxConvertedLimits = bucket.MaxLimitsPerRequest + 1

// RequestFromProto converts one wire request. It does not validate: the
// Handler does. A nil r gives the zero Request (which Validate refuses); a
// nil entry of r.Limits gives a zero Limit (which Validate refuses too).
// Entries of r.Limits beyond MaxLimitsPerRequest+1 are dropped: such a
// request is invalid with or without them.
func RequestFromProto(r *sluicev1.RateLimitRequest) check.Request {
	if r == nil {
		return check.Request{}
	}
	req := check.Request{
		Name: r.Name,
		Key:  r.Key,
		Hits: HitsFromProto(r),
		Limit: bucket.Limit{
			Algorithm:          algorithmFromProto(r.Algorithm),
			Limit:              r.Limit,
			WindowMS:           r.WindowMs,
			Burst:              r.Burst,
			SubWindows:         r.SubWindows,
			Shaping:            r.Shaping,
			Mode:               modeFromProto(r.Mode),
			SoftPercent:        r.SoftPercent,
			ElasticCeiling:     r.ElasticCeiling,
			ElasticLoadPercent: r.ElasticLoadPercent,
			CountRefused:       r.CountRefused,
			Calendar:           calendarFromProto(r.Calendar),
			CalendarTZ:         r.CalendarTz,
			Global:             r.Global,
		},
		Reset:         r.ResetKey,
		ReserveTTLMS:  r.ReserveTtlMs,
		ReservationID: r.ReservationId,
		Actual:        r.Actual,
		Op:            leaseOpFromProto(r.LeaseOp),
		LeaseID:       r.LeaseId,
	}
	if n := min(len(r.Limits), maxConvertedLimits); n > 0 {
		req.More = make([]bucket.Limit, n)
		for i := range req.More {
			req.More[i] = LimitFromProto(r.Limits[i])
		}
	}
	return req
}

// LimitFromProto converts one wire limit without validating it. A nil m
// gives the zero Limit (which Validate refuses).
func LimitFromProto(m *sluicev1.Limit) bucket.Limit {
	if m == nil {
		return bucket.Limit{}
	}
	return bucket.Limit{
		Algorithm:          algorithmFromProto(m.Algorithm),
		Limit:              m.Limit,
		WindowMS:           m.WindowMs,
		Burst:              m.Burst,
		SubWindows:         m.SubWindows,
		Shaping:            m.Shaping,
		Mode:               modeFromProto(m.Mode),
		SoftPercent:        m.SoftPercent,
		ElasticCeiling:     m.ElasticCeiling,
		ElasticLoadPercent: m.ElasticLoadPercent,
		CountRefused:       m.CountRefused,
		Calendar:           calendarFromProto(m.Calendar),
		CalendarTZ:         m.CalendarTz,
		Global:             m.Global,
	}
}

// LimitToProto converts one limit for the wire.
func LimitToProto(l bucket.Limit) *sluicev1.Limit {
	return &sluicev1.Limit{
		Limit:              l.Limit,
		WindowMs:           l.WindowMS,
		Algorithm:          sluicev1.Algorithm(l.Algorithm),
		Burst:              l.Burst,
		SubWindows:         l.SubWindows,
		Shaping:            l.Shaping,
		Mode:               sluicev1.Mode(l.Mode),
		SoftPercent:        l.SoftPercent,
		ElasticCeiling:     l.ElasticCeiling,
		ElasticLoadPercent: l.ElasticLoadPercent,
		CountRefused:       l.CountRefused,
		Calendar:           sluicev1.Calendar(l.Calendar),
		CalendarTz:         l.CalendarTZ,
		Global:             l.Global,
	}
}

func algorithmFromProto(a sluicev1.Algorithm) bucket.Algorithm {
	if a < 0 || a > 255 {
		return invalidAlgorithm
	}
	return bucket.Algorithm(a)
}

func modeFromProto(m sluicev1.Mode) bucket.Mode {
	if m < 0 || m > 255 {
		return invalidMode
	}
	return bucket.Mode(m)
}

func calendarFromProto(c sluicev1.Calendar) bucket.Calendar {
	if c < 0 || c > 255 {
		return invalidCalendar
	}
	return bucket.Calendar(c)
}

// HitsFromProto is the cost of a wire request: its hits, 1 when the field
// is absent (an explicit 0 peeks). A nil r gives 1.
func HitsFromProto(r *sluicev1.RateLimitRequest) int64 {
	if r == nil || r.Hits == nil {
		return 1
	}
	return *r.Hits
}

// leaseOpFromProto converts a lease_op; a number this release does not know
// becomes one Validate refuses, never another operation.
func leaseOpFromProto(op sluicev1.LeaseOp) check.LeaseOp {
	if op < 0 || op > sluicev1.LeaseOp_LEASE_OP_RELEASE {
		return check.OpRelease + 1
	}
	return check.LeaseOp(op)
}

// RequestToProto converts one request for the wire. Hits is always sent,
// 0 included.
func RequestToProto(r check.Request) *sluicev1.RateLimitRequest {
	m := &sluicev1.RateLimitRequest{}
	fillRequest(m, &r, new(int64))
	return m
}

// fillRequest sets every field of m from r (m may be a reused message);
// hits is where m.Hits points, so that hits is always explicit on the wire
// without an allocation per message. It allocates only for r.More.
func fillRequest(m *sluicev1.RateLimitRequest, r *check.Request, hits *int64) {
	m.Name = r.Name
	m.Key = r.Key
	*hits = r.Hits
	m.Hits = hits
	m.Limit = r.Limit.Limit
	m.WindowMs = r.WindowMS
	m.Algorithm = sluicev1.Algorithm(r.Algorithm)
	m.Burst = r.Burst
	m.SubWindows = r.SubWindows
	m.Shaping = r.Shaping
	m.Mode = sluicev1.Mode(r.Mode)
	m.SoftPercent = r.SoftPercent
	m.ElasticCeiling = r.ElasticCeiling
	m.ElasticLoadPercent = r.ElasticLoadPercent
	m.CountRefused = r.CountRefused
	m.Calendar = sluicev1.Calendar(r.Calendar)
	m.CalendarTz = r.CalendarTZ
	m.Global = r.Global
	m.ResetKey = r.Reset
	m.ReserveTtlMs = r.ReserveTTLMS
	m.ReservationId = r.ReservationID
	m.Actual = r.Actual
	m.LeaseOp = sluicev1.LeaseOp(r.Op)
	m.LeaseId = r.LeaseID
	m.Limits = nil
	if len(r.More) > 0 {
		m.Limits = make([]*sluicev1.Limit, len(r.More))
		for i := range r.More {
			m.Limits[i] = LimitToProto(r.More[i])
		}
	}
}

// ResponseToProto converts one outcome for the wire.
func ResponseToProto(o check.Outcome) *sluicev1.RateLimitResponse {
	m := &sluicev1.RateLimitResponse{}
	fillResponse(m, &o)
	return m
}

// AppendResponses appends the wire form of outs to dst, allocating one
// backing array for all the messages instead of one per item.
func AppendResponses(dst []*sluicev1.RateLimitResponse, outs []check.Outcome) []*sluicev1.RateLimitResponse {
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

func fillResponse(m *sluicev1.RateLimitResponse, o *check.Outcome) {
	m.Status = sluicev1.Status(o.Status)
	m.Limit = o.Decision.Limit
	m.Remaining = o.Remaining
	m.ResetAfterMs = o.ResetAfterMS
	m.RetryAfterMs = o.RetryAfterMS
	m.Error = o.Err
	m.Owner = o.Owner
	m.ReservationId, m.Returned, m.Charged = nil, nil, nil
	if o.Reservation != "" {
		m.ReservationId = proto.String(o.Reservation)
	}
	m.LeaseId = nil
	if o.LeaseID != 0 {
		m.LeaseId = proto.Int64(o.LeaseID)
	}
	if o.Settled {
		m.Returned, m.Charged = proto.Int64(o.Returned), proto.Int64(o.Charged)
	}
}

// OutcomeFromProto converts one wire response. A status this release does not
// know becomes StatusUnspecified with an error, never a verdict.
func OutcomeFromProto(m *sluicev1.RateLimitResponse) check.Outcome {
	if m == nil {
		return check.Outcome{Err: "missing response"}
	}
	o := check.Outcome{
		Decision: bucket.Decision{
			Limit:        m.Limit,
			Remaining:    m.Remaining,
			ResetAfterMS: m.ResetAfterMs,
			RetryAfterMS: m.RetryAfterMs,
		},
		Owner:       m.Owner,
		Err:         m.Error,
		Reservation: m.GetReservationId(),
		Settled:     m.Returned != nil,
		LeaseID:     m.GetLeaseId(),
		Returned:    m.GetReturned(),
		Charged:     m.GetCharged(),
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
	if err := bucket.ValidateCounterKey(m.Name, m.Key); err != nil {
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
