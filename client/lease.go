package client

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// ErrNotAcquired is Acquire's error when limit leases of the key are held.
// RetryAfter on the *NotAcquired says when the first ends.
var ErrNotAcquired = errors.New("sluice: concurrency limit reached")

// NotAcquired is the error of an Acquire refused because limit leases of
// the key are held; errors.Is(err, ErrNotAcquired) holds for it.
type NotAcquired struct {
	Holders, Limit int64
	RetryAfter     time.Duration
}

func (e *NotAcquired) Error() string {
	return "sluice: concurrency limit reached: " + strconv.FormatInt(e.Holders, 10) + " of " + strconv.FormatInt(e.Limit, 10) + " held"
}

func (e *NotAcquired) Is(target error) bool { return target == ErrNotAcquired }

// Lease is a held slot of a concurrency limit (Client.Acquire). It renews
// itself every third of its TTL until Release, or until a renew finds it
// no longer held (Lost). Safe for concurrent use.
type Lease struct {
	c          *Client
	name, key  string
	limit, ttl int64
	id         string
	stop       chan struct{}
	lost       chan struct{}
	once       sync.Once
	done       chan struct{}
}

// ID is the lease's id, as the nodes know it.
func (l *Lease) ID() string { return l.id }

// Lost is closed when a renew found the lease no longer held (its TTL
// passed before a renew reached the key's owner): the slot may be another
// holder's, and the work it guarded is no longer limited by it.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Acquire takes a lease of the concurrency limit of limit holders of
// (name, key), cluster-wide, for ttl (renewed automatically until
// Release). When limit leases are held it returns a *NotAcquired
// (errors.Is(err, ErrNotAcquired)); other errors are the call's. A crashed
// process never keeps a slot past ttl.
func (c *Client) Acquire(ctx context.Context, name, key string, limit int64, ttl time.Duration) (*Lease, error) {
	var resp *sluicev1.LeaseResponse
	err := c.each(ctx, func(ctx context.Context, n *Node) (err error) {
		resp, err = n.Acquire(ctx, &sluicev1.AcquireRequest{Name: name, Key: key, Limit: limit, TtlMs: ttl.Milliseconds()})
		return err
	})
	if err != nil {
		return nil, err
	}
	if !resp.Held {
		return nil, &NotAcquired{Holders: resp.Holders, Limit: resp.Limit, RetryAfter: time.Duration(resp.RetryAfterMs) * time.Millisecond}
	}
	l := &Lease{c: c, name: name, key: key, limit: limit, ttl: ttl.Milliseconds(), id: resp.LeaseId,
		stop: make(chan struct{}), lost: make(chan struct{}), done: make(chan struct{})}
	go l.renewLoop(ttl)
	return l, nil
}

// renewLoop renews the lease every third of ttl until Release or loss. A
// renew that fails for want of an answer is tried again at the next tick.
func (l *Lease) renewLoop(ttl time.Duration) {
	defer close(l.done)
	t := time.NewTicker(max(ttl/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(ttl/3, time.Second))
		var resp *sluicev1.LeaseResponse
		err := l.c.each(ctx, func(ctx context.Context, n *Node) (err error) {
			resp, err = n.Renew(ctx, &sluicev1.RenewRequest{Name: l.name, Key: l.key, Limit: l.limit, TtlMs: l.ttl, LeaseId: l.id})
			return err
		})
		cancel()
		if err == nil && !resp.Held {
			close(l.lost)
			return
		}
	}
}

// Release ends the lease (and its renewals). A lease already ended is no
// error.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	return l.c.each(ctx, func(ctx context.Context, n *Node) error {
		_, err := n.Release(ctx, &sluicev1.ReleaseRequest{Name: l.name, Key: l.key, LeaseId: l.id})
		return err
	})
}

// each calls f on the nodes in turn, as Check does, until one answers with
// anything but UNAVAILABLE.
func (c *Client) each(ctx context.Context, f func(context.Context, *Node) error) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	n := len(c.nodes)
	start := int((c.next.Add(1) - 1) % uint32(n))
	var err error
	for i := range n {
		err = f(ctx, c.nodes[(start+i)%n])
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// InFlightMiddleware limits the requests in flight per key to limit at
// once, cluster-wide: each request holds a lease (Client.Acquire with ttl,
// the longest a request may take before its slot is renewed) while the
// handler runs, and a request over the limit gets 429 with Retry-After.
// key gives the key of a request ("" for one not limited). When Sluice
// cannot decide, FailOpen (default) serves the request, FailClosed answers
// 503.
func InFlightMiddleware(c *Client, name string, key func(*http.Request) string, limit int64, ttl time.Duration, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	g := newGuard(c, name, opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			l, err := c.Acquire(r.Context(), name, k, limit, ttl)
			var na *NotAcquired
			switch {
			case errors.As(err, &na):
				w.Header().Set("Retry-After", strconv.FormatInt(max(int64((na.RetryAfter+time.Second-1)/time.Second), 1), 10))
				http.Error(w, "too many requests in flight", http.StatusTooManyRequests)
				return
			case err != nil:
				if g.onError != nil {
					g.onError(err)
				}
				if g.policy == FailClosed {
					http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
				defer cancel()
				if err := l.Release(ctx); err != nil && g.onError != nil {
					g.onError(err)
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}
