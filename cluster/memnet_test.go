package cluster

import (
	"context"
	"errors"
	"testing"
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
