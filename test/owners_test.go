package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// ownerLoad drives single checks through an owner-routing client and keeps
// what it saw admitted per tight key (limit ownerTightLimit).
type ownerLoad struct {
	c        *client.Client
	tight    []string
	admitted map[string]*atomic.Int64
	calls    atomic.Int64
	errors   atomic.Int64
	firstErr atomic.Pointer[string]
}

const ownerTightLimit = 20

func newOwnerLoad(c *client.Client) *ownerLoad {
	l := &ownerLoad{c: c, admitted: map[string]*atomic.Int64{}}
	for i := range 50 {
		k := fmt.Sprint("tight:", i)
		l.tight = append(l.tight, k)
		l.admitted[k] = new(atomic.Int64)
	}
	return l
}

// run sends checks from 8 workers, half on tight keys, half on loose ones,
// until stop closes, at most maxCalls and maxTime. Every call must end in
// a decision or an error within its 2 s deadline.
func (l *ownerLoad) run(maxCalls int64, maxTime time.Duration, stop <-chan struct{}) {
	deadline := time.Now().Add(maxTime)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for time.Now().Before(deadline) && l.calls.Add(1) <= maxCalls {
				select {
				case <-stop:
					return
				default:
				}
				key, limit := fmt.Sprint("loose:", rng.IntN(1000)), int64(1<<30)
				if rng.IntN(2) == 0 {
					key, limit = l.tight[rng.IntN(len(l.tight))], ownerTightLimit
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				resp, err := l.c.CheckProto(ctx, checkReq("owners", key, 1, limit, longWindow))
				cancel()
				if err == nil && resp.Responses[0].Error != "" {
					err = fmt.Errorf("item error: %s", resp.Responses[0].Error)
				}
				if err != nil {
					l.errors.Add(1)
					msg := err.Error()
					l.firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				if a := l.admitted[key]; a != nil && resp.Responses[0].Status == sluicev1.Status_STATUS_UNDER_LIMIT {
					a.Add(1)
				}
			}
		}()
	}
	wg.Wait()
}

// over returns the hits admitted beyond the limit over all tight keys.
func (l *ownerLoad) over() (n int64) {
	for _, a := range l.admitted {
		n += max(a.Load()-ownerTightLimit, 0)
	}
	return n
}

// forwards sums sluice_forwarded_total over the processes.
func forwards(t *testing.T, ps []*proc) (n float64) {
	t.Helper()
	for _, p := range ps {
		n += metric(t, p, "sluice_forwarded_total")
	}
	return n
}

// steadyForwards sends n single checks on fresh keys through c and returns
// how many the nodes forwarded meanwhile.
func steadyForwards(t *testing.T, c *client.Client, ps []*proc, prefix string, n int) float64 {
	t.Helper()
	before := forwards(t, ps)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		resp, err := c.CheckProto(ctx, checkReq("owners", fmt.Sprint(prefix, i), 1, 100, longWindow))
		if err != nil || resp.Responses[0].Error != "" {
			t.Fatalf("check %d: %v %v", i, err, resp)
		}
	}
	return forwards(t, ps) - before
}

// TestOwnerAwareClient: a client that routes by the owner table sends
// every check straight to its owner (no forwards in a steady cluster),
// keeps every check answered and every tight key within its limit while a
// node joins, falls back to any node when an owner is killed, and after
// each change learns the new table and forwards nothing again.
// Long on purpose: one story (steady, a join, a kill), read top to bottom.
func TestOwnerAwareClient(t *testing.T) {
	// Not parallel: 3–4 processes under load on a 2-core machine.
	ps := startCluster(t, 3)
	addrs := []string{ps[0].grpc, ps[1].grpc, ps[2].grpc}
	c, err := client.New(addrs, client.WithOwnerRouting(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}

	// Steady state: through any node, two thirds of the checks would be
	// forwarded; by owner, none.
	const n = 600
	if f := steadyForwards(t, c, ps, "steady:", n); f != 0 {
		t.Errorf("steady 3-node cluster: %v of %d checks forwarded, want 0", f, n)
	}
	if st := c.OwnerStats(); st.Routed < n || st.Members != 3 {
		t.Errorf("stats %+v: want %d checks routed by a 3-member table", st, n)
	}

	// A node joins under load: a graceful change, so the tight keys admit
	// never more than their limit, and no call fails.
	l := newOwnerLoad(c)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { l.run(200_000, 60*time.Second, stop); close(done) }()
	waitFor(t, 30*time.Second, "1000 calls", func() bool { return l.calls.Load() >= 1000 })
	ps = append(ps, addNode(t, ps, 3))
	waitMembers(t, ps)
	waitFor(t, 30*time.Second, "the client to route by the 4-member table", func() bool { return c.OwnerStats().Members == 4 })
	mark := l.calls.Load()
	waitFor(t, 30*time.Second, "1000 more calls", func() bool { return l.calls.Load() >= mark+1000 })
	close(stop)
	<-done
	t.Logf("join under load: %d calls, %d errors, %d hits over the tight limits; stats %+v", l.calls.Load(), l.errors.Load(), l.over(), c.OwnerStats())
	if e := l.errors.Load(); e > 0 {
		t.Errorf("%d calls failed during the join; first: %s", e, *l.firstErr.Load())
	}
	if o := l.over(); o > 0 {
		t.Errorf("tight keys admitted %d hits over their limit during a graceful join, want 0", o)
	}
	if f := steadyForwards(t, c, ps, "joined:", n); f != 0 {
		t.Errorf("after the join: %v of %d checks forwarded, want 0", f, n)
	}

	// An owner is killed under load: its checks go to any node (the
	// cluster fails over to the replica) until the survivors declare it
	// dead and the client takes their table. A crash may lose the hits
	// its owner admitted since its last replication (100 ms): at most
	// rate × 0.1 s, the bound TestKillOwnerUnderLoad uses.
	l2 := newOwnerLoad(c)
	for k, a := range l.admitted {
		l2.admitted[k].Store(a.Load()) // the same keys: counts carry on
	}
	stop, done = make(chan struct{}), make(chan struct{})
	go func() { l2.run(200_000, 90*time.Second, stop); close(done) }()
	waitFor(t, 30*time.Second, "1000 calls", func() bool { return l2.calls.Load() >= 1000 })
	fallbackBefore := c.OwnerStats().Fallback
	killedAt, start := l2.calls.Load(), time.Now()
	if err := ps[1].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	survivors := []*proc{ps[0], ps[2], ps[3]}
	waitMembers(t, survivors)
	waitFor(t, 30*time.Second, "the client to route by the 3-member table", func() bool { return c.OwnerStats().Members == 3 })
	mark = l2.calls.Load()
	waitFor(t, 30*time.Second, "1000 more calls", func() bool { return l2.calls.Load() >= mark+1000 })
	close(stop)
	<-done
	rate := float64(l2.calls.Load()-killedAt) / time.Since(start).Seconds()
	allowed := int64(rate*0.1) + 1
	st := c.OwnerStats()
	t.Logf("SIGKILL of an owner under load: %d calls, %d errors, %d hits over the tight limits (bound %d); %d checks sent to any node meanwhile; stats %+v",
		l2.calls.Load(), l2.errors.Load(), l2.over(), allowed, st.Fallback-fallbackBefore, st)
	if e := l2.errors.Load(); e > 0 {
		t.Errorf("%d calls failed after the kill; first: %s", e, *l2.firstErr.Load())
	}
	if o := l2.over(); o > allowed {
		t.Errorf("tight keys admitted %d hits over their limit after a crash, bound %d", o, allowed)
	}
	if st.Fallback == fallbackBefore {
		t.Error("no check was sent to any node while the killed owner was in the table")
	}
	if f := steadyForwards(t, c, survivors, "survived:", n); f != 0 {
		t.Errorf("after the crash: %v of %d checks forwarded, want 0", f, n)
	}
}
