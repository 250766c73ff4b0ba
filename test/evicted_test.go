package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// A node holding more keys than its cache keeps the rest only in its
// store. When a node joins, those keys move to it with their counts, like
// the keys in memory: with a move window too short for any first-touch
// pull, only the handoff brings them. (The handoff read only memory, and
// the new owner decided the stored keys from nothing.)
func TestJoinMovesTheKeysBeyondTheCache(t *testing.T) {
	t.Parallel()
	const ip = "127.0.0.38"
	flags := []string{"--cache-size", "64", "--cache-copies", "64", "--move-window", "1ms"}
	ps := startClusterAt(t, ip, 3, flags...)
	const keys, limit, hits = 400, 5, 3
	batch := func(h int64) *sluicev1.CheckRequest {
		req := &sluicev1.CheckRequest{}
		for i := range keys {
			req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{
				Name: "evicted", Key: fmt.Sprint("k", i), Hits: proto.Int64(h), Limit: limit, WindowMs: time.Hour.Milliseconds()})
		}
		return req
	}
	c0 := dial(t, ps[0].grpc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c0.Check(ctx, batch(hits))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Responses {
		if r.Error != "" || r.Status != sluicev1.Status_STATUS_UNDER_LIMIT {
			t.Fatalf("key k%d: %v", i, r)
		}
	}

	// The keys evicted from memory are written, so that only the store
	// holds them.
	for _, q := range ps {
		waitFor(t, 30*time.Second, q.name+"'s keys on disk", func() bool { return metric(t, q, "sluice_unflushed_keys") == 0 })
		if ev := metric(t, q, "sluice_cache_evictions_total"); ev == 0 {
			t.Fatalf("%s evicted no key: the test wants most keys only in the stores", q.name)
		}
	}
	p := newProc(t, 3, ip)
	p.extra, p.join = flags, []string{ps[0].gossip}
	p.start(t)
	ps = append(ps, p)
	waitMembers(t, ps)

	// Every key's count reaches its owner: a check of 0 hits through any
	// node sees 2 remaining.
	var short []string
	t.Cleanup(func() {
		if t.Failed() && len(short) > 0 {
			t.Logf("%d of %d keys not at their count, e.g. %s", len(short), keys, short[0])
		}
	})
	c3 := dial(t, p.grpc)
	waitFor(t, 30*time.Second, "every key's count at its owner after the join", func() bool {
		resp, err := c3.Check(ctx, batch(0))
		if err != nil {
			return false
		}
		short = short[:0]
		for i, r := range resp.Responses {
			if r.Error != "" || r.Remaining != limit-hits {
				short = append(short, fmt.Sprintf("k%d: remaining %d, owner %s %s", i, r.Remaining, r.Owner, r.Error))
			}
		}
		return len(short) == 0
	})
	// And they admit what is left of the limit, no more.
	admittedNow := map[int]int{}
	for range limit {
		resp, err := c3.Check(ctx, batch(1))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range resp.Responses {
			if r.Status == sluicev1.Status_STATUS_UNDER_LIMIT {
				admittedNow[i]++
			}
		}
	}
	for i := range keys {
		if admittedNow[i] != limit-hits {
			t.Errorf("key k%d: %d admitted after the join, want %d", i, admittedNow[i], limit-hits)
		}
	}
}
