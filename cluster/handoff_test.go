package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/ownership"
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

func TestReplicasHoldTheOwnersCounts(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, nil)
	key := keysOwnedBy(nodes[0], "n0", 1)[0]
	if got := admit(t, nodes[1], key, 7, 100); got != 7 {
		t.Fatalf("admitted %d", got)
	}
	if err := nodes[0].ReplicateNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := ring.Hash("api", key)
	reps := nodes[0].Ring().Replicas(h, nil)
	if len(reps) != 2 || reps[0].Name != "n0" {
		t.Fatalf("replicas %v", reps)
	}
	for _, n := range nodes {
		rec, ok, err := n.Cache().Get(h, writeback.Key{Name: "api", Key: key}, t0.UnixNano())
		isReplica := n.Name() == reps[1].Name || n.Name() == "n0"
		if err != nil || ok != isReplica || (ok && rec.State.Count != 7) {
			t.Fatalf("%s (replica %v) holds %+v ok=%v err=%v", n.Name(), isReplica, rec, ok, err)
		}
	}
}

func TestFailoverToReplicaBeforeDetection(t *testing.T) {
	t.Parallel()
	for _, fault := range []Fault{Refuse, Blackhole} {
		t.Run(fmt.Sprint(fault), func(t *testing.T) {
			t.Parallel()
			// A refused forward fails at once, so the generous default
			// timeout costs nothing there; a blackholed one waits it out
			// on every check, so that case gets a short one and fewer
			// keys. (A stand-in that answers after the sender's deadline
			// has counted a hit the sender then decides again.)
			nkeys, mutate := 20, func(*Config) {}
			if fault == Blackhole {
				nkeys, mutate = 5, func(c *Config) { c.ForwardTimeout = 200 * time.Millisecond }
			}
			nodes, net := memCluster(t, 3, mutate)
			keys := keysOwnedBy(nodes[0], "n0", nkeys)
			for _, k := range keys {
				if got := admit(t, nodes[1], k, 6, 10); got != 6 {
					t.Fatalf("admitted %d", got)
				}
			}
			if err := nodes[0].ReplicateNow(context.Background()); err != nil {
				t.Fatal(err)
			}
			// n0 stops answering; memberlist has not noticed yet.
			net.Cut(memAddr(1), memAddr(0), fault)
			net.Cut(memAddr(2), memAddr(0), fault)
			for _, k := range keys {
				got := 0
				for i := range 10 {
					start := time.Now()
					o := check1(nodes[1+i%2], req("api", k, 1, 10))
					if took := time.Since(start); took > 2*time.Second {
						t.Fatalf("check took %v", took)
					}
					if o.Err != "" || o.Owner == "n0" {
						t.Fatalf("answer %+v", o)
					}
					if o.Allowed() {
						got++
					}
				}
				if got != 4 {
					t.Fatalf("key %s: %d more admitted after the owner failed, want exactly 4 (6 replicated of 10)", k, got)
				}
			}
			if nodes[1].Status().Failovers+nodes[2].Status().Failovers == 0 {
				t.Fatal("no failover counted")
			}
		})
	}
}

func TestGracefulLeaveHandsEveryCounterOn(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, nil)
	keys := keysOwnedBy(nodes[0], "n2", 50)
	for _, k := range keys {
		if got := admit(t, nodes[0], k, 6, 10); got != 6 {
			t.Fatalf("admitted %d", got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[2].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	WaitRings(t, nodes[:2])
	if h := nodes[2].Status().HandedOff; h != uint64(len(keys)) {
		t.Fatalf("handed off %d counters, want %d", h, len(keys))
	}
	for i, k := range keys {
		if got := admit(t, nodes[i%2], k, 10, 10); got != 4 {
			t.Fatalf("key %s: %d admitted after n2 left, want 4", k, got)
		}
	}
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

func TestJoinMovesCountersToTheNewOwner(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	var nodes []*Node
	for i := range 3 {
		cfg := NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
		cfg.Now = FixedClock(t0)
		seed := ""
		if i > 0 {
			seed = nodes[0].GossipAddr()
		}
		n := StartNode(t, cfg, net.Peers(memAddr(i)), seed)
		net.Register(memAddr(i), n)
		nodes = append(nodes, n)
		if i == 1 {
			WaitRings(t, nodes)
			// Load counters into the two-node cluster.
			for k := range 200 {
				if got := admit(t, nodes[k%2], fmt.Sprint("user:", k), 6, 10); got != 6 {
					t.Fatalf("admitted %d", got)
				}
			}
		}
	}
	WaitRings(t, nodes)
	moved := 0
	for k := range 200 {
		key := fmt.Sprint("user:", k)
		if o, _ := nodes[2].Ring().Owner(ring.Hash("api", key)); o.Name == "n2" {
			moved++
		}
		if got := admit(t, nodes[k%3], key, 10, 10); got != 4 {
			t.Fatalf("key %s: %d admitted after n2 joined, want 4", key, got)
		}
	}
	if moved == 0 {
		t.Fatal("no key moved to the new node")
	}
	t.Logf("%d of 200 keys moved to the new node; pulls %d, handed off %d", moved,
		nodes[2].Status().Pulls, nodes[0].Status().HandedOff+nodes[1].Status().HandedOff)
}

func TestPullReleasesAndTheOwnerTakesItBack(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 2, nil)
	key := keysOwnedBy(nodes[0], "n0", 1)[0]
	admit(t, nodes[0], key, 3, 10)
	keys := []bucket.Counter{{Name: "api", Key: key}}
	nodes[0].Pull(context.Background(), "n1", keys, true, time.Minute)
	if keys[0].Version == 0 || keys[0].State.Count != 3 {
		t.Fatalf("pulled %+v", keys[0])
	}
	h := ring.Hash("api", key)
	k := writeback.Key{Name: "api", Key: key}
	if !nodes[0].Cache().Released(h, k, t0.UnixNano()) {
		t.Fatal("a pull with release did not release the key")
	}
	// n1 decides two hits with what it pulled.
	nodes[1].Cache().Adopt(h, writeback.Record{Key: k, State: keys[0].State, Version: keys[0].Version})
	out := make([]bucket.Outcome, 1)
	nodes[1].CheckStandIn(context.Background(), "x", []bucket.Request{req("api", key, 2, 10)}, out)
	if !out[0].Allowed() || out[0].Remaining != 5 {
		t.Fatalf("n1 answered %+v", out[0])
	}
	// n0 still owns the key in its view: a check there takes it back from
	// n1, with n1's count, instead of deciding from its stale copy.
	nodes[0].CheckForwarded(context.Background(), "x", []bucket.Request{req("api", key, 1, 10)}, out)
	if out[0].MovedTo != "" || out[0].Owner != "n0" || out[0].Remaining != 4 {
		t.Fatalf("n0 answered %+v, want a decision on 5 earlier hits (remaining 4)", out[0])
	}
	if !nodes[1].Cache().Released(h, k, t0.UnixNano()) {
		t.Fatal("taking the key back did not release it on n1")
	}
}

// TestHandoffOf100kKeys measures a graceful leave that hands 100k counters
// to the next owner, and checks that every one arrives. Its deadline comes
// from this machine's speed, measured on the same work, not from a fixed
// figure: on a loaded machine it takes longer, it does not fail (DESIGN §6:
// speed is measured, never asserted).
func TestHandoffOf100kKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("100k-key handoff measurement")
	}
	if raceEnabled {
		// Several times slower and measuring nothing; the handoff itself
		// runs under the race detector in TestGracefulLeaveHandsEveryCounterOn
		// and TestIncompleteHandoffIsReported.
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

// A batch of keys that a join moved to the new node is settled with one
// Pull per node asked, not one per key: key by key, a 100-item forward
// after a membership change took 100 round trips or more on the owner, ran
// past the sender's forward deadline, and the sender had the batch decided
// again by a replica — every item counted twice.
func TestBatchAfterJoinSettlesInOneRoundOfPulls(t *testing.T) {
	t.Parallel()
	nodes, net := memCluster(t, 3, func(c *Config) { c.ForwardTimeout = time.Second })
	// Every call takes 20 ms: 100 keys settled one by one would take
	// seconds, past the forward deadline.
	net.SetDelay(20 * time.Millisecond)
	keys := keysOwnedBy(nodes[2], "n2", 100)
	reqs := make([]bucket.Request, len(keys))
	for i, k := range keys {
		reqs[i] = req("api", k, 1, 10)
	}
	before := net.Pulls(memAddr(2))
	out := make([]bucket.Outcome, len(reqs))
	nodes[0].Check(context.Background(), reqs, out)
	for i, o := range out {
		if o.Err != "" || o.Owner != "n2" || !o.Allowed() || o.Remaining != 9 {
			t.Fatalf("item %d (%s): %+v, want decided once by n2 (remaining 9)", i, keys[i], o)
		}
	}
	if pulls := net.Pulls(memAddr(2)) - before; pulls > 4 {
		t.Fatalf("n2 made %d Pull calls to settle one batch of %d moved keys, want at most 4 (one per node and release flag)", pulls, len(keys))
	}
	if st := nodes[0].Status(); st.ForwardErrors != 0 || st.Failovers != 0 {
		t.Fatalf("forward errors %d, failovers %d", st.ForwardErrors, st.Failovers)
	}
	if st := nodes[2].Status(); st.Pulls < uint64(len(keys)) {
		t.Fatalf("n2 pulled %d keys, want every one of the %d moved keys asked for", st.Pulls, len(keys))
	}
}

// A draining node settles nothing: a pull releases the key at its holder,
// which then sends the key's checks to the leaving node, after it has
// handed its counters on.
func TestDrainingNodePullsNothing(t *testing.T) {
	t.Parallel()
	nodes, net := memCluster(t, 3, nil)
	keys := keysOwnedBy(nodes[2], "n2", 10)
	reqs := make([]bucket.Request, len(keys))
	for i, k := range keys {
		reqs[i] = req("api", k, 1, 10)
	}
	// Draining began after the batch's table was read (that table still
	// has n2 own the keys): the batch settle must see it.
	for _, p := range []phase{phaseLeaving, phaseDraining} {
		if from, ok := nodes[2].life.to(p); !ok {
			t.Fatalf("n2 cannot go from %s to %s", from, p)
		}
	}
	before := net.Pulls(memAddr(2))
	nodes[2].presettle(context.Background(), reqs, false, t0.UnixNano(), func(uint64) bool { return true })
	if pulls := net.Pulls(memAddr(2)) - before; pulls != 0 {
		t.Fatalf("a draining node made %d Pull calls", pulls)
	}
	for _, k := range keys {
		for _, n := range nodes[:2] {
			if n.Cache().Released(ring.Hash("api", k), writeback.Key{Name: "api", Key: k}, t0.UnixNano()) {
				t.Fatalf("%s released %s to a draining node", n.Name(), k)
			}
		}
	}
}

// A check that reads a new table the moment it becomes current, before
// anything else happens, must already see the move: a node that gained the
// key pulls it before deciding. (The table used to become current before
// the move was registered; a check in between decided the key from
// nothing, and its clock-based version then beat the pulled record: in
// about one rolling restart in four, a key lost its count.)
func TestCheckRightAfterTheTableChangesPullsTheKey(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	nodes, _ := memCluster(t, 3, func(c *Config) {
		c.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	})
	hour := func(k string, hits int64) bucket.Request {
		return bucket.Request{Name: "api", Key: k, Hits: hits, Limit: bucket.Limit{Limit: 100, WindowMS: 3_600_000}}
	}
	keys := keysOwnedBy(nodes[0], "n0", 40)
	for _, k := range keys {
		if o := check1(nodes[0], hour(k, 5)); !o.Allowed() {
			t.Fatalf("%s: %+v", k, o)
		}
	}
	// Past the move window of the joins that formed the cluster: only the
	// change below can tell the others where n0's keys were.
	clock.Add(int64(DefaultConfig().MoveWindow) + int64(time.Second))
	type seen struct {
		node, key string
		out       bucket.Outcome
	}
	got := make(chan seen, 64)
	for _, n := range nodes[1:] {
		hook := func(tbl *ring.Table) {
			if ownership.HasMember(tbl, "n0") {
				return
			}
			for _, k := range keys {
				if o, _ := tbl.Owner(ring.Hash("api", k)); o.Name == n.Name() {
					got <- seen{n.Name(), k, check1(n, hour(k, 1))}
					return
				}
			}
		}
		n.published.Store(&hook)
	}
	go nodes[0].Leave(context.Background())
	select {
	case s := <-got:
		if s.out.Err != "" || s.out.Remaining != 100-6 {
			t.Fatalf("%s decided %s at once after the change: %+v, want its 5 earlier hits counted (remaining 94)", s.node, s.key, s.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no node took over n0's keys within 10 s")
	}
}

// A node that has announced its leave keeps deciding only the keys nobody
// has pulled from it. A key the new owner pulled is redirected there; the
// leaving node must not pull it back because it still owns the key in its
// own (frozen) view. (It did: the two nodes then decided the key from the
// same count, and a rolling restart lost a hit in about one run in 50.)
func TestLeavingNodeDoesNotTakeBackAPulledKey(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, func(c *Config) { c.LeavePropagation = 5 * time.Second })
	key := keysOwnedBy(nodes[0], "n0", 1)[0]
	h := ring.Hash("api", key)
	admit(t, nodes[0], key, 5, 100)
	go nodes[0].Leave(context.Background())
	var next *Node
	WaitFor(t, 10*time.Second, "another node takes n0's key", func() bool {
		for _, n := range nodes[1:] {
			if o, _ := n.Ring().Owner(h); o.Name == n.Name() {
				next = n
				return true
			}
		}
		return false
	})
	if o := check1(next, req("api", key, 1, 100)); o.Owner != next.Name() || o.Remaining != 100-6 {
		t.Fatalf("%s after the pull: %+v, want remaining 94", next.Name(), o)
	}
	// A sender that has not heard of the leave yet forwards the key to n0.
	out := make([]bucket.Outcome, 1)
	nodes[0].CheckForwarded(context.Background(), "n2", []bucket.Request{req("api", key, 1, 100)}, out)
	if out[0].MovedTo != memAddr(int(next.Name()[1]-'0')) {
		t.Fatalf("the leaving node answered %+v, want moved_to %s", out[0], next.Name())
	}
	if o := check1(next, req("api", key, 1, 100)); o.Owner != next.Name() || o.Remaining != 100-7 {
		t.Fatalf("%s: %+v, want remaining 93 (the key still there, every hit counted once)", next.Name(), o)
	}
}

// gatedReplicate holds the first Replicate call once armed until gate
// closes (or the call's context ends).
type gatedReplicate struct {
	Peers
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedReplicate) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	return g.Peers.Replicate(ctx, addr, handoff, cs)
}

// ReplicateNow called while the periodic round is sending must not report
// success before that round's copies are on the replicas: the round took
// the changes, so ReplicateNow alone finds nothing left to send.
func TestReplicateNowWaitsForTheRoundInFlight(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	g := &gatedReplicate{Peers: net.Peers(memAddr(0)), entered: make(chan struct{}), gate: make(chan struct{})}
	cfgs := make([]Config, 3)
	for i := range cfgs {
		cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
		cfgs[i].Now = FixedClock(t0)
	}
	// The periodic round's send outlasts the first ReplicateNow below.
	cfgs[0].ReplicationInterval = 500 * time.Millisecond
	nodes := StartNodes(t, cfgs, func(i int) Peers {
		if i == 0 {
			return g
		}
		return net.Peers(memAddr(i))
	})
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	key := keysOwnedBy(nodes[0], "n0", 1)[0]
	h := ring.Hash("api", key)
	reps := nodes[0].Ring().Replicas(h, nil)
	if len(reps) != 2 {
		t.Fatalf("replicas %v", reps)
	}
	var replica *Node
	for _, n := range nodes {
		if n.Name() == reps[1].Name {
			replica = n
		}
	}
	g.armed.Store(true)
	if got := admit(t, nodes[1], key, 7, 100); got != 7 {
		t.Fatalf("admitted %d", got)
	}
	holds := func() bool {
		rec, ok, err := replica.Cache().Get(h, writeback.Key{Name: "api", Key: key}, t0.UnixNano())
		return err == nil && ok && rec.State.Count == 7
	}
	select {
	case <-g.entered: // the periodic round took the changes and is sending
	case <-time.After(20 * time.Second):
		t.Fatal("no periodic replication round started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := nodes[0].ReplicateNow(ctx)
	cancel()
	if err == nil && !holds() {
		t.Fatal("ReplicateNow reported success while the replica does not hold the count")
	}
	close(g.gate)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[0].ReplicateNow(ctx); err != nil {
		t.Fatal(err)
	}
	if !holds() {
		t.Fatal("the replica does not hold the count after ReplicateNow")
	}
}

// TestMergeCopiesOfAPull: a pull that gets several copies of a key (the
// sides of a healed partition each decided it) keeps their merge where the
// algorithm has a rule — the larger fixed-window count even when it has
// the older version — with the larger version; the newer version
// otherwise; and a missing copy (version 0) never wins.
func TestMergeCopiesOfAPull(t *testing.T) {
	t.Parallel()
	fw := func(count int64, v uint64) bucket.Counter {
		return bucket.Counter{Name: "n", Key: "k", Version: v,
			State: bucket.State{Algorithm: bucket.FixedWindow, Start: 1000, Count: count, Expires: 2000}}
	}
	tb := func(count int64, v uint64) bucket.Counter {
		return bucket.Counter{Name: "n", Key: "k", Version: v,
			State: bucket.State{Algorithm: bucket.TokenBucket, Start: 1000, Count: count, Expires: 2000}}
	}
	none := bucket.Counter{Name: "n", Key: "k"}
	for _, tc := range []struct {
		name      string
		a, b      bucket.Counter
		wantCount int64
		wantV     uint64
	}{
		{"larger count, older version, first", fw(9, 5), fw(3, 8), 9, 8},
		{"larger count, older version, second", fw(3, 8), fw(9, 5), 9, 8},
		{"no rule: the newer version", tb(9, 5), tb(3, 8), 3, 8},
		{"no rule, newer first", tb(3, 8), tb(9, 5), 3, 8},
		{"a missing copy never wins", fw(4, 2), none, 4, 2},
		{"a missing copy first", none, fw(4, 2), 4, 2},
	} {
		got := mergeCopies(tc.a, tc.b)
		if got.State.Count != tc.wantCount || got.Version != tc.wantV {
			t.Errorf("%s: count %d version %d, want %d and %d", tc.name, got.State.Count, got.Version, tc.wantCount, tc.wantV)
		}
	}
}

// TestReleasedToIsPruned: every key another node pulls with release is
// recorded with where it went (ownership.Book.NoteReleased), but the record matters only
// while the release is in force. Releasing many keys one after another,
// each release over before the next, must keep the records within the
// sweep threshold plus twice the releases in force, not one per key ever
// moved; a release still in force keeps its record.
func TestReleasedToIsPruned(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	nodes, _ := memCluster(t, 2, func(c *Config) {
		c.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	})
	n := nodes[0]
	ctx := context.Background()
	live := []bucket.Counter{{Name: "api", Key: "still-moving"}}
	n.Pull(ctx, nodes[1].Name(), live, true, time.Hour)
	const keys = 5 * ownership.MinReleasedSweep
	for i := range keys {
		clock.Add(int64(2 * time.Millisecond)) // the previous release is over
		n.Pull(ctx, nodes[1].Name(), []bucket.Counter{{Name: "api", Key: fmt.Sprint("k", i)}}, true, time.Millisecond)
	}
	records := n.book.ReleasedRecords()
	bound := ownership.MinReleasedSweep + 2*2 // the threshold, and twice the two releases in force
	t.Logf("%d keys released one after another: %d records kept (bound %d)", keys, records, bound)
	if records > bound {
		t.Errorf("%d records of released keys kept, want at most %d", records, bound)
	}
	k := writeback.Key{Name: "api", Key: "still-moving"}
	if to, _ := n.book.ReleasedTo(k); to != nodes[1].cfg.GRPCAddr {
		t.Errorf("the release still in force points to %q, want %q", to, nodes[1].cfg.GRPCAddr)
	}
}
