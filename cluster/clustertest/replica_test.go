package clustertest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// gatedReplicate holds every Replicate call that hold picks until gate
// closes (or the call's context ends), closes entered at the first, and
// notes how long the first was held (read it once that call returned).
type gatedReplicate struct {
	cluster.Peers
	hold    func(addr string, handoff bool) bool
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
	held    time.Duration
}

func newGatedReplicate(hold func(addr string, handoff bool) bool) *gatedReplicate {
	return &gatedReplicate{hold: hold, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (g *gatedReplicate) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if g.hold(addr, handoff) {
		first := false
		g.once.Do(func() { first = true; close(g.entered) })
		start := time.Now()
		select {
		case <-g.gate:
		case <-ctx.Done():
		}
		if first {
			g.held = time.Since(start)
		}
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
	}
	return g.Peers.Replicate(ctx, addr, handoff, cs)
}

// ReplicateNow called while the periodic round is sending must not report
// success before that round's copies are on the replicas: the round took
// the changes, so ReplicateNow alone finds nothing left to send.
func TestReplicateNowWaitsForTheRoundInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Once armed, the first call is held.
		var armed atomic.Bool
		g := newGatedReplicate(func(string, bool) bool { return armed.CompareAndSwap(true, false) })
		c := Formed(t, Options{
			Configure: func(cfg *cluster.Config) {
				if cfg.Config.Name == "n0" {
					// The periodic round's send outlasts the first
					// ReplicateNow below.
					cfg.ReplicationInterval = 500 * time.Millisecond
				}
			},
			Peers: peersOf("n0", func(p cluster.Peers) cluster.Peers { g.Peers = p; return g }),
		}, "n0", "n1", "n2")
		n0 := c.Member("n0").Node
		key := OwnedBy(c, "n0", "n0", "replicated:", 1)[0]
		h := ring.Hash(LimitName, key)
		reps := n0.Ring().Replicas(h, nil)
		if len(reps) != 2 {
			t.Fatalf("replicas %v", reps)
		}
		replica := c.Member(reps[1].Name).Node
		armed.Store(true)
		if got := admitted(t, c, "n1", key, 100, 7); got != 7 {
			t.Fatalf("admitted %d", got)
		}
		holds := func() bool {
			rec, ok, err := replica.Cache().Get(h, writeback.Key{Name: LimitName, Key: key}, time.Now().UnixNano())
			return err == nil && ok && rec.State.Count == 7
		}
		select {
		case <-g.entered: // the periodic round took the changes and is sending
		case <-time.After(20 * time.Second):
			t.Fatal("no periodic replication round started within 20 s of the bubble's time")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := n0.ReplicateNow(ctx)
		cancel()
		if err == nil && !holds() {
			t.Fatal("ReplicateNow reported success while the replica does not hold the count")
		}
		close(g.gate)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n0.ReplicateNow(ctx); err != nil {
			t.Fatal(err)
		}
		if !holds() {
			t.Fatal("the replica does not hold the count after ReplicateNow")
		}
	})
}

// A key's replica that becomes its owner when the owner leaves sends the
// key to its own new replica: at the table change, every key in memory of
// the partitions it takes over goes to the next replication round. The
// owner's last copy may reach it only after that (here it is held until
// then), and the owner's handoff then brings that same record, which
// changes nothing in the cache. The new owner must still send it to its
// replica: it did not, and a crash of the new owner later lost the key's
// whole count (model seed 47399).
func TestHandedKeyReachesTheNewReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// n3's replica copies (not its handoffs) to n1 are held.
		var n1Addr string
		g := newGatedReplicate(func(addr string, handoff bool) bool { return !handoff && addr == n1Addr })
		var left sync.Once
		dropped := make(chan struct{})
		c := Formed(t, Options{
			Peers: peersOf("n3", func(p cluster.Peers) cluster.Peers { g.Peers = p; return g }),
			Configure: func(cfg *cluster.Config) {
				if cfg.Config.Name == "n1" {
					cfg.TableChanged = func(tbl *ring.Table) {
						if !tbl.Has("n3") {
							left.Do(func() { close(dropped) })
						}
					}
				}
			},
		}, "n1", "n2", "n3")
		r := NewRunner(c)
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		n1Addr = c.Member("n1").PeerAddr
		keys := replicaTakesOver(t, c, "n3", "n1", 5)
		const limit, hits = 10, 4
		for _, k := range keys {
			if got := admitted(t, c, "n2", k, limit, hits); got != hits {
				t.Fatalf("key %s: %d of %d admitted", k, got, hits)
			}
		}
		<-g.entered // n3's round is sending the copies to n1, held
		leave := make(chan error, 1)
		go func() { leave <- c.Leave("n3") }()
		<-dropped
		// n1 has carried out the table change (its keys of the partitions
		// it takes over marked for its next round) before the copies
		// arrive.
		synctest.Wait()
		close(g.gate)
		if err := <-leave; err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		n1, n2 := c.Member("n1").Node, c.Member("n2").Node
		if err := n1.ReplicateNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			h := ring.Hash(LimitName, k)
			if reps := n1.Ring().Replicas(h, nil); len(reps) != 2 || reps[0].Name != "n1" || reps[1].Name != "n2" {
				t.Fatalf("key %s: replicas %v, want n1 then n2", k, reps)
			}
			rec, ok, err := n2.Cache().Get(h, writeback.Key{Name: LimitName, Key: k}, time.Now().UnixNano())
			if err != nil || !ok || rec.State.Count != hits {
				t.Errorf("key %s: its new replica n2 holds count %d (held %v, err %v), want %d", k, rec.State.Count, ok, err, hits)
			}
		}
	})
}

// replicateLog records the replication rounds' calls (not handoffs) that
// pass through it: when each was made and the keys it carried.
type replicateLog struct {
	cluster.Peers
	mu    sync.Mutex
	calls []replicateCall
}

type replicateCall struct {
	at   time.Time
	addr string
	keys []string
}

func (l *replicateLog) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if !handoff {
		call := replicateCall{at: time.Now(), addr: addr}
		for _, c := range cs {
			call.keys = append(call.keys, c.Key)
		}
		l.mu.Lock()
		l.calls = append(l.calls, call)
		l.mu.Unlock()
	}
	return l.Peers.Replicate(ctx, addr, handoff, cs)
}

func (l *replicateLog) take() []replicateCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	calls := l.calls
	l.calls = nil
	return calls
}

// Changes made at one moment on an idle node, one after another (a
// caller's checks of keys the node decides), go to the replicas in one
// round, after that moment. A round that started at the moment of the
// first change would race the others: which of them it carried would
// depend on the order the goroutines ran in, and a seed's simulated run
// would not replay.
func TestChangesOfOneMomentGoInOneRound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		log := &replicateLog{}
		c := Formed(t, Options{Peers: peersOf("n0", func(p cluster.Peers) cluster.Peers { log.Peers = p; return log })},
			"n0", "n1", "n2")
		every := cluster.DefaultConfig().ReplicationInterval
		keys := OwnedBy(c, "n0", "n0", "moment-", 4)
		time.Sleep(3 * every) // idle: the last round is long past
		synctest.Wait()
		log.take()

		at := time.Now()
		for _, k := range keys {
			checkVia(t, c, "n0", Request(k, 10, 1))
		}
		if !time.Now().Equal(at) {
			t.Fatalf("the checks took %v; they must be decided at one moment", time.Since(at))
		}
		time.Sleep(2 * every)
		synctest.Wait()

		calls := log.take()
		sent := map[string]int{}
		for _, call := range calls {
			t.Logf("round at +%v to %s: %v", call.at.Sub(at), call.addr, call.keys)
			if !call.at.After(at) || call.at.Sub(at) > every {
				t.Errorf("a round to %s started %v after the changes; want after them, within one interval (%v)", call.addr, call.at.Sub(at), every)
			}
			for _, k := range call.keys {
				sent[k]++
			}
		}
		if len(calls) == 0 {
			t.Fatal("no replication round sent the changes")
		}
		for _, k := range keys {
			if sent[k] != 1 {
				t.Errorf("key %s went to its replicas in %d calls, want 1 round", k, sent[k])
			}
		}
		rounds := map[time.Time]bool{}
		for _, call := range calls {
			rounds[call.at] = true
		}
		if len(rounds) != 1 {
			t.Errorf("the changes went out in %d rounds, want 1", len(rounds))
		}
	})
}
