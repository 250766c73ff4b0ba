package clustertest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// simNodesEnv sets TestThousandMembers' number of members (make sim-scale).
const simNodesEnv = "SLUICE_SIM_NODES"

// simPartitionsEnv and simLoadEnv set the ring's partitions and load
// factor in TestThousandMembers (a real node's --ring-partitions and
// --ring-load); unset, ring.DefaultConfig's. make sim-scale runs the
// settings docs/scaling.md gives for clusters past 500 nodes.
const (
	simPartitionsEnv = "SLUICE_SIM_PARTITIONS"
	simLoadEnv       = "SLUICE_SIM_LOAD"
)

// simRing returns the ring configuration TestThousandMembers runs with.
func simRing(t *testing.T) ring.Config {
	cfg := ring.DefaultConfig()
	if v := os.Getenv(simPartitionsEnv); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: want a whole number", simPartitionsEnv, v)
		}
		cfg.Partitions = p
	}
	if v := os.Getenv(simLoadEnv); v != "" {
		l, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number", simLoadEnv, v)
		}
		cfg.Load = l
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s, %s: %v", simPartitionsEnv, simLoadEnv, err)
	}
	return cfg
}

// TestThousandMembers runs the scale scenario (runScale) with
// $SLUICE_SIM_NODES members: at 1,000 it takes about 14 minutes and 15 GB
// with GOMEMLIMIT=14GiB and make sim-scale's ring (65521 partitions), 5
// minutes with the default ring (docs/scaling.md has the figures). Skipped unless the variable is set, and with -short.
func TestThousandMembers(t *testing.T) {
	v := os.Getenv(simNodesEnv)
	switch {
	case v == "":
		t.Skipf("set %s (make sim-scale runs 1000); TestFiftyMembers runs the same scenario at 50 members", simNodesEnv)
	case testing.Short():
		t.Skipf("-short (%s=%s)", simNodesEnv, v)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < scaleMinMembers {
		t.Fatalf("%s=%q: want a number of members ≥ %d", simNodesEnv, v, scaleMinMembers)
	}
	runScale(t, n, simRing(t))
}

// TestFiftyMembers is TestThousandMembers' scenario at 50 members, in
// every go test (about 2 s). Skipped with -race: see runScale.
func TestFiftyMembers(t *testing.T) {
	t.Parallel()
	runScale(t, 50, ring.DefaultConfig())
}

// The scenario's events, in order: graceful joins and leaves alternating
// (the exact part), then crashes.
const (
	scaleJoins   = 4
	scaleLeaves  = 4
	scaleCrashes = 3
)

// scaleMinMembers is the fewest members the scenario runs with: it leaves
// and crashes 7 of them and keeps a reference node up.
const scaleMinMembers = scaleLeaves + scaleCrashes + 3

// scaleSeeds is how many members up a new node joins through (the Join
// list of a real node: a few seeds, not the whole cluster).
const scaleSeeds = 3

// scaleBatch is how many nodes start at once while the cluster forms.
const scaleBatch = 100

// scaleSpan is how long (simulated) the checks made during an event are
// spread over, in scaleChunks: a steady load meeting the change while the
// cluster converges, not one burst at its first instant.
const (
	scaleSpan   = 2 * time.Second
	scaleChunks = 100
)

// scaleSeed seeds the choice of leavers, crash victims and the members
// each check goes through.
const scaleSeed = 23

// simKey is a key of the scenario with its limit.
type simKey struct {
	name  string
	hash  uint64
	limit int64
}

// scaleRun is one run of the scenario.
type scaleRun struct {
	t     *testing.T
	c     *Cluster
	r     *Runner
	cfg   ring.Config
	rnd   *rand.Rand
	keys  []simKey
	round int
	// attempted counts the hits sent per key (every check is one hit).
	attempted map[string]int64
	// predict computes the table of a member set as every node must
	// (ring.Build from its own placement, not from any node's).
	predict *ring.Ring
}

// runScale runs the scenario with n members in a bubble:
//
//  1. n nodes start in batches of scaleBatch, each joining scaleSeeds
//     members up, with a real node's ring (cfg: ring.DefaultConfig's 7919
//     partitions, 100 points per member and load 1.05, or what
//     TestThousandMembers is given) and failure detection
//     (cluster.FastFailureDetection, as sluice serve);
//  2. keys (3 per member, 300 to 3000), key i with a limit of 1 + i mod
//     24, get one hit each per round, each through a member picked at
//     random: a round after every event settles, and one spread over
//     scaleSpan while the event happens and the cluster converges;
//  3. joins and graceful leaves alternate (scaleJoins, scaleLeaves). For
//     each: the simulated time until every other node's ring agrees; every
//     ring equal, partition by partition, to the table the placement gives
//     for the members (computed here); the keys and partitions whose owner
//     changed, against 1/N; the joiner's partitions within the load bound;
//     every check after the settle decided by the key's owner in that
//     table. Then, per key, admitted = min(limit, hits sent) and the count
//     the cluster holds equals it (docs/guarantees.md: graceful joins and
//     leaves are exact);
//  4. scaleCrashes crashes, each after the last changes were replicated
//     (300 ms), with checks through the survivors while they detect it;
//     every key's admissions are then held to modelBound (model_test.go),
//     the bound of docs/guarantees.md for a crash, printed.
//
// Not under the race detector: a bubble this long makes the race runtime
// itself crash in 1 or 2 runs in 10 at 20 or 50 members (SIGSEGV in
// ThreadSanitizer's StackDepotBase::Put while the bubble's clock starts
// the goroutine of an AfterFunc timer; no race is reported), which the
// package's shorter bubbles have not shown.
func runScale(t *testing.T, n int, cfg ring.Config) {
	if raceEnabled {
		t.Skip("the race runtime crashes in a bubble this long (runScale)")
	}
	wall := realNow()
	synctest.Test(t, func(t *testing.T) {
		s := newScaleRun(t, n, cfg)
		s.form(n)
		s.checkRound(s.c.Up(), "after formation")
		var joined, left int
		for joined < scaleJoins || left < scaleLeaves {
			if joined <= left && joined < scaleJoins {
				joined++
				// Named as the others: of the messages it has sent
				// equally often, memberlist sends the longest first, so
				// a joiner with a shorter name would send its ready flag
				// after the news of every member it learned on joining
				// (about 2 s later at 1,000 members).
				s.join(memberName(n + joined))
			} else {
				left++
				s.leave()
			}
		}
		s.checkExact()
		for range scaleCrashes {
			s.crash()
		}
		s.checkCrashBound()
		s.teardown()
	})
	t.Logf("%d members: the whole run took %v of wall time", n, realNow().Sub(wall).Round(time.Millisecond))
}

func newScaleRun(t *testing.T, n int, cfg ring.Config) *scaleRun {
	predict, err := ring.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := New(t, Options{Configure: func(nc *cluster.Config) {
		// A real node's ring: clustertest's smaller one has fewer
		// partitions (127) than a thousand members.
		nc.Ring = cfg
		nc.Join = seeds(nc.Config.Name, nc.Join)
	}, InstantGossip: true})
	s := &scaleRun{t: t, c: c, r: NewRunner(c), cfg: cfg, rnd: rand.New(rand.NewPCG(scaleSeed, uint64(n))),
		attempted: map[string]int64{}, predict: predict}
	k := min(max(3*n, 300), 3000)
	for i := range k {
		name := fmt.Sprintf("k%04d", i)
		s.keys = append(s.keys, simKey{name: name, hash: ring.Hash(LimitName, name), limit: 1 + int64(i%24)})
	}
	return s
}

// seeds narrows a new node's Join list (every member up, in the order they
// were added) to scaleSeeds of them, picked by its name, so that the nodes
// of a batch do not all dial the same few.
func seeds(name string, join []string) []string {
	if len(join) <= scaleSeeds {
		return join
	}
	i := int(ring.Hash(name, "") % uint64(len(join)))
	out := make([]string, scaleSeeds)
	for k := range out {
		out[k] = join[(i+k)%len(join)]
	}
	return out
}

// memberName is the name of the i-th member started (from 1).
func memberName(i int) string { return fmt.Sprintf("n%04d", i) }

// realNow reads the machine's clock, which the bubble's time.Now does not.
func realNow() time.Time {
	var tv syscall.Timeval
	if err := syscall.Gettimeofday(&tv); err != nil {
		return time.Time{}
	}
	return time.Unix(tv.Sec, tv.Usec*1000)
}

// form starts n nodes and settles them.
func (s *scaleRun) form(n int) {
	t, c := s.t, s.c
	start, wall := time.Now(), realNow()
	for i := 0; i < n; i += scaleBatch {
		var names []string
		for j := i; j < min(i+scaleBatch, n); j++ {
			names = append(names, memberName(j+1))
		}
		if err := c.AddMany(names...); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now()
	if err := s.r.Step(Step{Op: "settle"}); err != nil {
		t.Fatalf("formation: %v", err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("formed: %d members started in batches of %d over %v (simulated), every ring holding all %d %v after the last batch; %v of wall time; heap %d MiB (garbage included), %d goroutines",
		n, scaleBatch, started.Sub(start), n, time.Since(started), realNow().Sub(wall).Round(time.Millisecond), ms.HeapAlloc>>20, runtime.NumGoroutine())
	s.checkTables("formation")
}

// via is a member checks go through.
type via struct {
	name string
	node *cluster.Node
}

func (s *scaleRun) vias(names []string) []via {
	out := make([]via, len(names))
	for i, name := range names {
		out[i] = via{name, s.c.Member(name).Node}
	}
	return out
}

// checkRound checks every key once through the members named, at once,
// once the cluster has settled, and records the answers: every check must
// have been decided by the key's owner in the reference node's table
// (what names the moment in errors).
func (s *scaleRun) checkRound(names []string, what string) {
	t := s.t
	answers, err := s.checks(s.vias(names), 0)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	s.record(answers)
	tbl := s.reference().Ring().Table()
	wrong := 0
	for _, a := range answers {
		if o, _ := tbl.Owner(ring.Hash(LimitName, a.Key)); o.Name != a.Owner {
			if wrong++; wrong <= 5 {
				t.Errorf("%s: %s decided by %s, its owner is %s", what, a.Key, a.Owner, o.Name)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%s: %d of %d checks decided elsewhere than by the key's owner", what, wrong, len(answers))
	}
}

// checks sends one hit on every key, each through a member of vs picked at
// random, in scaleChunks spread over span (0: all at once), and returns
// the answers. It touches only the nodes (safe for concurrent use), so it
// may run beside an event on the bubble's main goroutine.
func (s *scaleRun) checks(vs []via, span time.Duration) ([]Answer, error) {
	pick := make([]int, len(s.keys))
	for i := range pick {
		pick[i] = s.rnd.IntN(len(vs))
	}
	s.round++
	answers := make([]Answer, 0, len(s.keys))
	chunk := len(s.keys)
	if span > 0 {
		chunk = (len(s.keys) + scaleChunks - 1) / scaleChunks
	}
	for i, k := range s.keys {
		if span > 0 && i > 0 && i%chunk == 0 {
			time.Sleep(span / scaleChunks)
		}
		v := vs[pick[i]]
		ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
		out := make([]check.Outcome, 1)
		v.node.Check(ctx, []check.Request{Request(k.name, k.limit, 1)}, out)
		err := ctx.Err()
		cancel()
		switch {
		case out[0].Err != "":
			return answers, fmt.Errorf("round %d: check %s via %s: %s", s.round, k.name, v.name, out[0].Err)
		case err != nil:
			return answers, fmt.Errorf("round %d: check %s via %s: not answered within %v", s.round, k.name, v.name, CheckTimeout)
		}
		answers = append(answers, Answer{At: time.Now(), Via: v.name, Key: k.name, Limit: k.limit, Admitted: out[0].Allowed(), Owner: out[0].Owner})
	}
	return answers, nil
}

// record adds answers to the runner, after its last event.
func (s *scaleRun) record(answers []Answer) {
	r := s.r
	for _, a := range answers {
		r.seq++
		a.Seq = r.seq
		r.Answers = append(r.Answers, a)
		s.attempted[a.Key]++
		if a.Admitted {
			r.Admitted[a.Key]++
		} else {
			r.Refused[a.Key]++
		}
	}
}

// eventTimes is how long an event took to converge.
type eventTimes struct {
	agreed  time.Duration // simulated: until every other ring agreed
	settled time.Duration // simulated: until Settle returned
	wall    time.Duration // of the machine's time, the checks and settle included
}

// event runs the step (a join, leave or crash) on the bubble's main
// goroutine while checks through vs go on beside it for scaleSpan, then
// settles, and measures when every ring of watch (the nodes up but the
// one that comes or goes) agreed with want, from the step's start.
func (s *scaleRun) event(step Step, vs []via, watch []*cluster.Node, want func(*ring.Table) bool) eventTimes {
	t := s.t
	start, wall := time.Now(), realNow()
	agreed := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() {
		agreed <- converge(watch, want, start, stop)
	}()
	type result struct {
		answers []Answer
		err     error
	}
	checked := make(chan result, 1)
	go func() {
		a, err := s.checks(vs, scaleSpan)
		checked <- result{a, err}
	}()
	err := s.r.Step(step)
	res := <-checked
	s.record(res.answers)
	if err == nil && res.err != nil {
		err = fmt.Errorf("checks beside it: %w", res.err)
	}
	if err == nil {
		err = s.r.Step(Step{Op: "settle"})
	}
	close(stop)
	et := eventTimes{agreed: <-agreed, settled: time.Since(start), wall: realNow().Sub(wall)}
	switch {
	case err != nil:
		t.Fatalf("%s: %v", step, err)
	case et.agreed < 0:
		t.Fatalf("%s: settled, but a ring of the others still disagrees", step)
	}
	return et
}

// convergeStep is how often converge looks at the rings.
const convergeStep = 10 * time.Millisecond

// converge returns how long after start every node's ring satisfied want,
// looking every convergeStep, or -1 when stop closes first and they still
// do not.
func converge(nodes []*cluster.Node, want func(*ring.Table) bool, start time.Time, stop <-chan struct{}) time.Duration {
	agree := func() bool {
		for _, n := range nodes {
			if !want(n.Ring().Table()) {
				return false
			}
		}
		return true
	}
	for {
		if agree() {
			return time.Since(start)
		}
		select {
		case <-stop:
			if agree() {
				return time.Since(start)
			}
			return -1
		default:
		}
		time.Sleep(convergeStep)
	}
}

// reference is the node whose table the others are compared with: the
// first member up.
func (s *scaleRun) reference() *cluster.Node { return s.c.Member(s.c.Up()[0]).Node }

// checkTables checks that every node's ring is the table the placement
// gives for the members up, partition by partition.
func (s *scaleRun) checkTables(what string) *ring.Table {
	t, c := s.t, s.c
	up := c.Up()
	ms := make([]ring.Member, len(up))
	for i, name := range up {
		ms[i] = ring.Member{Name: name}
	}
	want, err := s.predict.Build(ms)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range up {
		tbl := c.Member(name).Node.Ring().Table()
		for p := range want.Partitions() {
			w, _ := want.PartitionOwner(p)
			h, _ := tbl.PartitionOwner(p)
			if w.Name != h.Name {
				t.Fatalf("%s: %s's ring gives partition %d to %s, the placement to %s", what, name, p, h.Name, w.Name)
			}
		}
	}
	return want
}

// loadBound is the most partitions a member owns among n: consistent's
// bounded load, ceil(floor(P/n) × Load).
func (s *scaleRun) loadBound(n int) int {
	return int(math.Ceil(float64(s.cfg.Partitions/n) * s.cfg.Load))
}

// moved prints and checks what moved between two tables, when a member
// joined (joiner) or left (leaver).
func (s *scaleRun) moved(what string, before, after *ring.Table, joiner, leaver string, et eventTimes) {
	t := s.t
	parts, toJoiner, fromLeaver := 0, 0, 0
	for p := range after.Partitions() {
		b, _ := before.PartitionOwner(p)
		a, _ := after.PartitionOwner(p)
		if a.Name == b.Name {
			continue
		}
		parts++
		if a.Name == joiner {
			toJoiner++
		}
		if b.Name == leaver {
			fromLeaver++
		}
	}
	keys := 0
	for _, k := range s.keys {
		b, _ := before.Owner(k.hash)
		a, _ := after.Owner(k.hash)
		if a.Name != b.Name {
			keys++
		}
	}
	// 1/N: a join's fair share is the joiner's of the grown cluster, a
	// leave's the leaver's of the cluster it leaves.
	n := max(before.Len(), after.Len())
	P := s.cfg.Partitions
	frac := float64(parts) / float64(P)
	t.Logf("%s: %d → %d members; every other ring agreed %v after it began, all settled after %v (simulated; %v of wall time)",
		what, before.Len(), after.Len(), et.agreed, et.settled, et.wall.Round(time.Millisecond))
	t.Logf("%s: owner changed for %d of %d partitions (%.3f%%) = %.2f × 1/N (1/N = %.3f%%), for %d of %d keys (%.2f%%)",
		what, parts, P, 100*frac, frac*float64(n), 100/float64(n), keys, len(s.keys), 100*float64(keys)/float64(len(s.keys)))
	switch {
	case joiner != "":
		// The bounded-load guarantee: no member owns more than
		// ceil(floor(P/N) × Load) partitions, so a join hands the
		// joiner at most that, about Load/N of the keys. The rest went
		// between members that were there before: the cascade of the
		// bounded-load walk, which the placement does not bound.
		bound := s.loadBound(after.Len())
		t.Logf("%s: %d partitions to %s, bound ceil(floor(%d/%d) × %v) = %d = %.2f × 1/N (asserted); %d between members already there (the bounded-load walk's cascade: no bound derived, printed only)",
			what, toJoiner, joiner, P, after.Len(), s.cfg.Load, bound, float64(bound)*float64(n)/float64(P), parts-toJoiner)
		if toJoiner > bound {
			t.Errorf("%s: %s got %d partitions, over the load bound %d", what, joiner, toJoiner, bound)
		}
	case leaver != "":
		t.Logf("%s: %d partitions from %s (it owned at most ceil(floor(%d/%d) × %v) = %d), %d between the members that stay (printed only)",
			what, fromLeaver, leaver, P, before.Len(), s.cfg.Load, s.loadBound(before.Len()), parts-fromLeaver)
	}
}

// join adds a node while checks go on, and checks what moved.
func (s *scaleRun) join(name string) {
	up := s.c.Up()
	before := s.reference().Ring().Table()
	watch := s.nodes(up)
	et := s.event(Step{Op: "add", Args: []string{name}}, s.vias(up), watch, func(tbl *ring.Table) bool {
		return tbl.Len() == len(up)+1 && tbl.Has(name)
	})
	after := s.checkTables("join " + name)
	s.moved("join "+name, before, after, name, "", et)
	s.checkRound(s.c.Up(), "after join "+name)
}

// leave makes a member picked at random (not the reference) leave
// gracefully while checks go on through the others.
func (s *scaleRun) leave() {
	up := s.c.Up()
	name := up[1+s.rnd.IntN(len(up)-1)]
	before := s.reference().Ring().Table()
	stay := slices.DeleteFunc(slices.Clone(up), func(o string) bool { return o == name })
	et := s.event(Step{Op: "leave", Args: []string{name}}, s.vias(stay), s.nodes(stay), func(tbl *ring.Table) bool {
		return tbl.Len() == len(stay) && !tbl.Has(name)
	})
	after := s.checkTables("leave " + name)
	s.moved("leave "+name, before, after, "", name, et)
	s.checkRound(s.c.Up(), "after leave "+name)
}

// nodes returns the nodes of names.
func (s *scaleRun) nodes(names []string) []*cluster.Node {
	out := make([]*cluster.Node, len(names))
	for i, name := range names {
		out[i] = s.c.Member(name).Node
	}
	return out
}

// checkExact holds every key to what docs/guarantees.md promises of
// graceful joins and leaves: admitted = min(limit, hits sent), and the
// count the cluster holds (a check of 0 hits) equal to it.
func (s *scaleRun) checkExact() {
	t, c := s.t, s.c
	up := c.Up()
	var sent, admitted, wrong, heldWrong int64
	for i, k := range s.keys {
		want := min(k.limit, s.attempted[k.name])
		got := s.r.Admitted[k.name]
		sent += s.attempted[k.name]
		admitted += got
		if got != want {
			if wrong++; wrong <= 10 {
				t.Errorf("graceful joins and leaves: %s admitted %d of %d hits, limit %d: want %d", k.name, got, s.attempted[k.name], k.limit, want)
			}
		}
		o, err := c.Check(up[i%len(up)], k.name, k.limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		if held := k.limit - o.Remaining; held != want {
			if heldWrong++; heldWrong <= 10 {
				t.Errorf("graceful joins and leaves: the cluster holds %d for %s, want %d (admitted %d)", held, k.name, want, got)
			}
		}
	}
	t.Logf("graceful joins and leaves: %d keys, %d hits sent, %d admitted; admitted = min(limit, sent) for %d of %d keys, the count held equal to it for %d",
		len(s.keys), sent, admitted, int64(len(s.keys))-wrong, len(s.keys), int64(len(s.keys))-heldWrong)
}

// crash crashes a member picked at random (not the reference) once the
// last changes were replicated, with checks through the survivors while
// they detect it.
func (s *scaleRun) crash() {
	t := s.t
	// What a crash may lose is what changed on the node in the last
	// replication interval: let that interval pass without a check, so
	// that the bound is the tightest docs/guarantees.md gives.
	if err := s.r.Step(Step{Op: "advance", Args: []string{"300ms"}}); err != nil {
		t.Fatal(err)
	}
	up := s.c.Up()
	name := up[1+s.rnd.IntN(len(up)-1)]
	before := s.reference().Ring().Table()
	stay := slices.DeleteFunc(slices.Clone(up), func(o string) bool { return o == name })
	et := s.event(Step{Op: "crash", Args: []string{name}}, s.vias(stay), s.nodes(stay), func(tbl *ring.Table) bool {
		return tbl.Len() == len(stay) && !tbl.Has(name)
	})
	after := s.checkTables("crash " + name)
	s.moved("crash "+name, before, after, "", name, et)
	s.checkRound(s.c.Up(), "after crash "+name)
}

// checkCrashBound holds every key to modelBound, the bound of
// docs/guarantees.md for a crash, over the whole run, and prints it.
func (s *scaleRun) checkCrashBound() {
	t := s.t
	m := replayModel(s.r, s.c.FailedForwards)
	var allowed, loss, standIns, maxExtra, over, overHits, exact int64
	for _, k := range m.order {
		b := m.bounds[k]
		extra := b.total() - b.limit*b.sides
		if extra > 0 {
			allowed++
		}
		loss += b.crashLoss
		standIns += b.standIns
		maxExtra = max(maxExtra, extra)
		if a := m.admitted[k]; a > b.limit {
			over++
			overHits += a - b.limit
		}
	}
	for _, k := range s.keys {
		if s.r.Admitted[k.name] == min(k.limit, s.attempted[k.name]) {
			exact++
		}
	}
	t.Logf("crashes: bound per key = limit + what the crashes may have lost + the key's failed forwards (docs/guarantees.md; modelBound): %d of %d keys allowed more than their limit, by %d in all (crash loss %d, failed forwards %d), at most %d for one key; %d keys admitted more than their limit, %d hits over in all; admitted = min(limit, sent) for %d of %d keys",
		allowed, len(m.order), loss+standIns, loss, standIns, maxExtra, over, overHits, exact, len(s.keys))
	for _, v := range checkModelRun(m) {
		t.Errorf("crashes: %s", v)
	}
}

// teardown crashes every node left: a graceful stop of the whole cluster
// (Close) makes each node hand its keys to the others, which rebuild
// their rings for every member that goes, a cost that grows with the
// square of the cluster's size and tells nothing more.
func (s *scaleRun) teardown() {
	wall := realNow()
	up := s.c.Up()
	for _, name := range up {
		if err := s.c.Crash(name); err != nil {
			s.t.Fatal(err)
		}
	}
	s.c.zombies.Wait()
	s.t.Logf("teardown: %d nodes stopped in %v of wall time", len(up), realNow().Sub(wall).Round(time.Millisecond))
}
