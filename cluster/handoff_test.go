package cluster

// Tests of handoffs: a graceful leave or a join hands every counter on, an
// incomplete handoff is reported, 100k keys move; and the helpers the
// handoff and pull tests share. (A reclaim waiting for the push of the key
// it takes back, and a released key not handed off: cluster/clustertest's
// handoff_test.go.)

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// keysOwnedBy returns k keys of name "api" whose owner (in n's ring) is
// owner.
func keysOwnedBy(n *Node, owner string, k int) []string {
	var keys []string
	for i := 0; len(keys) < k; i++ {
		key := fmt.Sprint("user:", i)
		if o, _ := n.Ring().Owner(ring.Hash("api", key)); o.Name == owner {
			keys = append(keys, key)
		}
	}
	return keys
}

func admit(t *testing.T, n *Node, key string, hits int, limit int64) int {
	t.Helper()
	ok := 0
	for range hits {
		o := check1(n, req("api", key, 1, limit))
		if o.Err != "" {
			t.Fatalf("check %s at %s: %s", key, n.Name(), o.Err)
		}
		if o.Allowed() {
			ok++
		}
	}
	return ok
}

// stallHandoffs holds every handoff push until its context ends, as a new
// owner that stopped answering would; replication copies go through.
type stallHandoffs struct {
	Peers
	once    sync.Once
	entered chan struct{} // closed when the first push arrives
}

func (s *stallHandoffs) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if !handoff {
		return s.Peers.Replicate(ctx, addr, handoff, cs)
	}
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	return 0, 0, ctx.Err()
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}

// attrs returns the attributes of every record logged at level or above.
func (l *logRecorder) attrs(level slog.Level) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.recs {
		if r.Level < level {
			continue
		}
		m := map[string]slog.Value{"msg": slog.StringValue(r.Message)}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.Resolve()
			return true
		})
		out = append(out, m)
	}
	return out
}

// A graceful leave whose handoff is cut short, by HandoffTimeout or by the
// caller's context, must say so: Leave returns an error and logs how many
// counters were not handed off and where they remain. (It returned nil and
// only warned, so Shutdown returned nil and `sluice serve` exited 0 with
// the handoff undone: CI saw TestHandoffOf100kKeys pass Shutdown with
// 27,391 of 100,000 counters handed off.) The counters not handed off
// stay in the node's store and on their replicas: the next owner keeps
// counting from them.
// Long on purpose: one story per way of cutting the handoff short, read top to bottom.
func TestIncompleteHandoffIsReported(t *testing.T) {
	t.Parallel()
	for _, cut := range []string{"HandoffTimeout", "context"} {
		t.Run(cut, func(t *testing.T) {
			t.Parallel()
			net := NewMemNetwork()
			logs := &logRecorder{}
			stall := &stallHandoffs{Peers: net.Peers(memAddr(1)), entered: make(chan struct{})}
			cfgs := make([]Config, 2)
			for i := range cfgs {
				cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
				cfgs[i].Now = FixedClock(t0)
			}
			cfgs[1].Log = slog.New(logs)
			if cut == "HandoffTimeout" {
				cfgs[1].HandoffTimeout = 200 * time.Millisecond
			}
			nodes := StartNodes(t, cfgs, func(i int) Peers {
				if i == 1 {
					return stall
				}
				return net.Peers(memAddr(i))
			})
			for i, n := range nodes {
				net.Register(memAddr(i), n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			keys := keysOwnedBy(nodes[1], "n1", 40)
			for _, k := range keys {
				if got := admit(t, nodes[0], k, 3, 10); got != 3 {
					t.Fatalf("admitted %d", got)
				}
			}
			// n0, the keys' other replica, holds every count.
			if err := nodes[1].ReplicateNow(ctx); err != nil {
				t.Fatal(err)
			}

			lctx, want := ctx, error(context.DeadlineExceeded)
			if cut == "context" {
				var stop context.CancelFunc
				lctx, stop = context.WithCancel(ctx)
				defer stop()
				want = context.Canceled
				go func() {
					select {
					case <-stall.entered: // the push is out: the caller gives up
						stop()
					case <-lctx.Done():
					}
				}()
			}
			err := nodes[1].Leave(lctx)
			if err == nil {
				t.Fatalf("Leave returned nil; handed off %d of %d counters", nodes[1].Status().HandedOff, len(keys))
			}
			if !errors.Is(err, want) || !strings.Contains(err.Error(), fmt.Sprintf("%d of %d counters", len(keys), len(keys))) {
				t.Fatalf("Leave: %v; want an error that says %d of %d counters were not handed off, wrapping %v", err, len(keys), len(keys), want)
			}
			if st := nodes[1].Status(); st.HandedOff != 0 || st.HandoffErrors != uint64(len(keys)) {
				t.Fatalf("handed off %d, handoff errors %d; want 0 and %d", st.HandedOff, st.HandoffErrors, len(keys))
			}
			logged := false
			for _, a := range logs.attrs(slog.LevelWarn) {
				if a["not_handed_off"].String() == fmt.Sprint(len(keys)) && a["data_dir"].String() == cfgs[1].DataDir {
					logged = true
				}
			}
			if !logged {
				t.Fatalf("no warning or error with not_handed_off=%d and data_dir=%s; logged %v", len(keys), cfgs[1].DataDir, logs.attrs(slog.LevelWarn))
			}
			// Leave reported it once; the rest of the stop is clean.
			if err := nodes[1].Shutdown(ctx); err != nil {
				t.Fatal(err)
			}

			// Where the log line says: in n1's store, loaded when it starts
			// again ...
			store, err := writeback.OpenStore(cfgs[1].DataDir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				rec, ok, err := store.Load(writeback.Key{Name: "api", Key: k})
				if err != nil || !ok || rec.State.Count != 3 {
					t.Errorf("key %s in n1's store: %+v ok=%v err=%v, want a count of 3", k, rec, ok, err)
				}
			}
			if err := store.Close(); err != nil {
				t.Fatal(err)
			}
			// ... and on the replica, now the owner, which goes on counting.
			WaitRings(t, nodes[:1])
			for _, k := range keys {
				if got := admit(t, nodes[0], k, 10, 10); got != 7 {
					t.Fatalf("key %s: %d admitted after n1 left, want 7 (3 of 10 admitted before)", k, got)
				}
			}
		})
	}
}

// TestHandoffOf100kKeys measures a graceful leave that hands 100k counters
// to the next owner, and checks that every one arrives. Its deadline comes
// from this machine's speed, measured on the same work, not from a fixed
// figure: on a loaded machine it takes longer, it does not fail (docs/performance.md:
// speed is measured by benchmarks, never asserted).
func TestHandoffOf100kKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("100k-key handoff measurement")
	}
	if raceEnabled {
		// Several times slower and measuring nothing; the handoff itself
		// runs under the race detector in TestIncompleteHandoffIsReported, and in
		// clustertest (TestGracefulLeaveHandsEveryCounterOn).
		t.Skip("a speed measurement: skipped under the race detector")
	}
	t.Parallel()
	// The context below bounds the drain, not HandoffTimeout.
	nodes, _ := memCluster(t, 2, func(c *Config) { c.HandoffTimeout = time.Hour })
	const k = 100_000
	var counters []bucket.Counter
	for i := 0; len(counters) < k; i++ {
		key := fmt.Sprint("h:", i)
		if o, _ := nodes[1].Ring().Owner(ring.Hash("api", key)); o.Name != "n1" {
			continue
		}
		st := bucket.State{}
		bucket.Decide(&st, bucket.Limit{Limit: 100, WindowMS: 3_600_000}, 3, t0.UnixNano())
		counters = append(counters, bucket.Counter{Name: "api", Key: key, State: st, Version: uint64(t0.UnixNano())})
	}
	start := time.Now()
	if in, _ := nodes[1].Replicate(context.Background(), "test", true, counters); in != k {
		t.Fatalf("installed %d of %d", in, k)
	}
	install := time.Since(start)
	// The drain installs the same counters on the new owner after a flush
	// and a store scan: on an idle machine about as long as the install
	// above, besides the leave propagation. Twenty times, and at least a
	// minute, lets a loaded machine slow the measurement without failing
	// it; a drain that hangs or gives up still fails.
	budget := DefaultConfig().LeavePropagation + max(time.Minute, 20*install)
	start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := nodes[1].Shutdown(ctx); err != nil {
		t.Fatalf("shutdown after %v (deadline %v): %v", time.Since(start).Round(time.Millisecond), budget.Round(time.Millisecond), err)
	}
	took := time.Since(start)
	if st := nodes[1].Status(); st.HandedOff != k {
		t.Fatalf("handed off %d of %d (handoff errors %d)", st.HandedOff, k, st.HandoffErrors)
	}
	for _, c := range counters[:1000] {
		rec, ok, err := nodes[0].Cache().Get(ring.Hash(c.Name, c.Key), writeback.Key{Name: c.Name, Key: c.Key}, t0.UnixNano())
		if err != nil || !ok || rec.State.Count != 3 {
			t.Fatalf("key %s on the new owner: %+v %v %v", c.Key, rec, ok, err)
		}
	}
	t.Logf("graceful leave handed %d counters to the next owner in %v (flush, store scan, push, includes %v of leave propagation); installing them on the leaving node took %v",
		k, took.Round(time.Millisecond), DefaultConfig().LeavePropagation, install.Round(time.Millisecond))
}
