package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/writeback"
)

// countingHandler counts the calls it answers.
type countingHandler struct{ replicated int }

func (h *countingHandler) CheckForwarded(context.Context, string, []check.Request, []check.Outcome, []string) {
}
func (h *countingHandler) CheckStandIn(context.Context, string, []check.Request, []string, []check.Outcome, []string) {
}
func (h *countingHandler) Replicate(_ context.Context, _ string, _ bool, c []bucket.Counter) (int, int) {
	h.replicated += len(c)
	return len(c), 0
}
func (h *countingHandler) Pull(context.Context, string, string, []bucket.Counter, bool, time.Duration, []keymove.PullAnswer) {
}

// TestMemNetworkCrashSilencesTheOldIncarnation: after Crash, calls to the
// address fail until a node registers there again, and the crashed node's
// Peers stays dead even then, while the restarted node's Peers works.
func TestMemNetworkCrashSilencesTheOldIncarnation(t *testing.T) {
	t.Parallel()
	m := NewMemNetwork()
	a, b := &countingHandler{}, &countingHandler{}
	m.Register("a", a)
	m.Register("b", b)
	old := m.Peers("a")
	ctx := context.Background()
	one := []bucket.Counter{{Name: "n", Key: "k"}}
	if _, _, err := old.Replicate(ctx, "b", false, one); err != nil {
		t.Fatalf("before the crash: %v", err)
	}
	m.Crash("a")
	if _, _, err := m.Peers("b").Replicate(ctx, "a", false, one); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("call to the crashed node: err %v, want ErrUnreachable", err)
	}
	m.Register("a", a) // restarted at the same address
	if _, _, err := old.Replicate(ctx, "b", false, one); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("call from the crashed incarnation after the restart: err %v, want ErrUnreachable", err)
	}
	if _, _, err := m.Peers("a").Replicate(ctx, "b", false, one); err != nil {
		t.Fatalf("call from the restarted node: %v", err)
	}
	if _, _, err := m.Peers("b").Replicate(ctx, "a", false, one); err != nil {
		t.Fatalf("call to the restarted node: %v", err)
	}
	if b.replicated != 2 || a.replicated != 1 {
		t.Fatalf("b received %d, a %d counters; want 2 and 1", b.replicated, a.replicated)
	}
}

// arrivals records the sender of each replicate call it receives, and
// when (the bubble's clock).
type arrivals struct {
	countingHandler
	mu   sync.Mutex
	from []string
	at   []time.Time
}

func (h *arrivals) Replicate(_ context.Context, from string, _ bool, c []bucket.Counter) (int, int) {
	h.mu.Lock()
	h.from, h.at = append(h.from, from), append(h.at, time.Now())
	h.mu.Unlock()
	return len(c), 0
}

// Seeded delivery: calls sent at the same moment reach their receiver one
// after another, in an order the seed fixes, whatever order the senders'
// goroutines ran in; another seed may give another order.
func TestSeededDeliveryOrdersSimultaneousCalls(t *testing.T) {
	t.Parallel()
	const senders, runs = 5, 20
	order := func(seed uint64) string {
		var got string
		synctest.Test(t, func(t *testing.T) {
			m := NewMemNetwork()
			m.SeedDelivery(seed, time.Millisecond)
			h := &arrivals{}
			m.Register("r", h)
			start := time.Now()
			var wg sync.WaitGroup
			for i := range senders {
				from := fmt.Sprint("s", i)
				wg.Go(func() {
					if _, _, err := m.Peers(from).Replicate(context.Background(), "r", false, []bucket.Counter{{Name: "n", Key: from}}); err != nil {
						t.Errorf("%s: %v", from, err)
					}
				})
			}
			wg.Wait()
			for i, at := range h.at {
				if d := at.Sub(start); d < 0 || d >= time.Millisecond || (i > 0 && !at.After(h.at[i-1])) {
					t.Errorf("arrival %d at +%v after %v: want each within the spread, one after another", i, d, h.at)
				}
			}
			got = strings.Join(h.from, " ")
		})
		return got
	}
	orders := map[string]bool{}
	for seed := uint64(1); seed <= runs; seed++ {
		want := order(seed)
		for range 3 {
			if got := order(seed); got != want {
				t.Fatalf("seed %d: arrivals %s, then %s", seed, want, got)
			}
		}
		orders[want] = true
	}
	if len(orders) < 2 {
		t.Fatalf("%d seeds gave one order of arrival: %v", runs, orders)
	}
	t.Logf("%d seeds, %d orders of %d simultaneous calls", runs, len(orders), senders)
}

// TestConfigStoreReplacesDataDir: with a Store, no DataDir is needed and
// the node uses the store given.
func TestConfigStoreReplacesDataDir(t *testing.T) {
	t.Parallel()
	cfg := NodeConfig(t, "n1", "mem-1")
	cfg.DataDir = ""
	if err := cfg.Validate(); err == nil {
		t.Fatal("no data dir and no store: Validate accepted it")
	}
	st := writeback.NewMemStore()
	cfg.Store = st
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a store and no data dir: %v", err)
	}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := writeback.Key{Name: "n", Key: "k"}
	if _, err := n.Cache().Decide(1, k, bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 5, WindowMS: 60_000}, 1, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Clone().Len() != 1 {
		t.Fatalf("the store given holds %d records after shutdown, want 1", st.Clone().Len())
	}
}
