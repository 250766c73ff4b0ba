package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Reserve checks r.Hits as an estimate of a cost known only later (the
// tokens of an LLM answer) and, when admitted, returns the reservation's
// id: Settle it within ttl (1 ms..1 h) with the actual cost. A reservation
// never settled counts at its estimate. r must have one limit that can give
// hits back: a token bucket, a fixed window or a sliding window
// (docs/algorithms.md, "Reserve, then settle"). The id is "" when the
// check was refused.
func (c *Client) Reserve(ctx context.Context, r Request, ttl time.Duration) (Result, string, error) {
	m := r.toProto()
	m.ReserveTtlMs = ttl.Milliseconds()
	resp, err := c.one(ctx, m)
	if err != nil {
		return Result{}, "", err
	}
	res := resultFromProto(r, resp)
	return res, resp.GetReservationId(), res.Err
}

// Settled is what a Settle did: the hits given back and charged, and the
// limit after it (as a check of no hits would answer).
type Settled struct {
	Returned, Charged int64
	Result
}

// Settle settles the reservation id, made by Reserve for r's key and
// limit (give r as then; its Hits are not read), at actual hits: the
// difference to the estimate comes back, or is charged. A settle the
// key's owner refuses (the id is unknown to it, settled already, or past
// its TTL: the reservation then counts at its estimate) is an *ItemError
// whose message starts "settle refused:".
func (c *Client) Settle(ctx context.Context, r Request, id string, actual int64) (Settled, error) {
	r.Peek = true
	m := r.toProto()
	m.ReservationId, m.Actual = id, actual
	resp, err := c.one(ctx, m)
	if err != nil {
		return Settled{}, err
	}
	res := resultFromProto(r, resp)
	if res.Err != nil {
		return Settled{}, res.Err
	}
	return Settled{Returned: resp.GetReturned(), Charged: resp.GetCharged(), Result: res}, nil
}

// one sends one item and returns its answer.
func (c *Client) one(ctx context.Context, m *sluicev1.RateLimitRequest) (*sluicev1.RateLimitResponse, error) {
	resp, err := c.CheckProto(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{m}})
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != 1 {
		return nil, status.Errorf(codes.Internal, "sluice: %d answers to 1 check", len(resp.Responses))
	}
	return resp.Responses[0], nil
}
