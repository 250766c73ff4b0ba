package clustertest

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
)

var (
	modelSeed = flag.Uint64("seed", 0, "TestModel: run only this seed (printed by a failure), verbosely")
	modelRuns = flag.Int("runs", 1000, "TestModel: how many seeds to run (1..runs)")
)

// modelLimit is the limit of every check of the model runs: small, so that
// runs reach it.
const modelLimit = 5

// modelKeys are the keys the model runs check.
var modelKeys = []string{"a", "b", "c"}

// TestModel runs random interleavings of joins, leaves, crashes, restarts,
// partitions and checks, one seed each, and holds every run to the model:
// every check answered, and per key and window at most the limit admitted
// in a run without a crash or partition, at most the bound of
// docs/guarantees.md otherwise (modelBound). A failure prints the seed, the
// bound's terms and the run as a scenario (paste it into testdata/);
// rerun one seed with -seed.
func TestModel(t *testing.T) {
	if *modelSeed != 0 {
		runModel(t, *modelSeed, true)
		return
	}
	runs := *modelRuns
	if testing.Short() || raceEnabled {
		runs = min(runs, 100)
	}
	start := time.Now()
	for seed := uint64(1); seed <= uint64(runs); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runModel(t, seed, false)
		})
	}
	t.Cleanup(func() { t.Logf("%d runs in %v", runs, time.Since(start).Round(time.Millisecond)) })
}

// runModel generates the run of seed, runs it in a bubble and checks it.
func runModel(t *testing.T, seed uint64, verbose bool) {
	steps := genModel(seed)
	text := scenarioText(steps)
	if verbose {
		t.Logf("seed %d:\n%s", seed, text)
	}
	synctest.Test(t, func(t *testing.T) {
		c := New(t, Options{})
		r := NewRunner(c)
		r.Limit = modelLimit
		if err := r.Run(steps); err != nil {
			t.Fatalf("seed %d (rerun: go test -run TestModel ./cluster/clustertest/ -seed %d): %v\nrun:\n%s", seed, seed, err, text)
		}
		for _, v := range checkModel(r, c.ForwardErrors()) {
			t.Errorf("seed %d (rerun: go test -run TestModel ./cluster/clustertest/ -seed %d): %s", seed, seed, v)
		}
		if t.Failed() {
			t.Logf("run:\n%s", text)
		}
	})
}

// scenarioText writes steps as a scenario, one per line.
func scenarioText(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// modelGen is the state of a run being generated: which members are up,
// settled, down, and whether a partition is in force.
type modelGen struct {
	rnd         *rand.Rand
	steps       []Step
	up, settled []string
	down        []string // left or crashed: may restart
	next        int      // number of the next new member
	partitioned bool
	// clean: nothing changed since the last settle (a leave hands off to
	// the members its node sees, so it needs settled views).
	clean bool
}

func (g *modelGen) emit(op string, args ...string) {
	switch op {
	case "settle":
		g.clean = true
	case "check", "advance", "limit":
	default:
		g.clean = false
	}
	g.steps = append(g.steps, Step{Line: len(g.steps) + 1, Op: op, Args: args})
}

func (g *modelGen) pick(names []string) string { return names[g.rnd.IntN(len(names))] }

func remove(names []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == name })
}

// settle emits a settle: every member up is then settled.
func (g *modelGen) settle() {
	g.emit("settle")
	g.settled = slices.Clone(g.up)
}

// genModel returns the steps of seed's run: three members, then about 30
// random steps, then a heal, a settle and a check of every key.
func genModel(seed uint64) []Step {
	g := &modelGen{rnd: rand.New(rand.NewPCG(seed, 0x5eed))}
	g.emit("limit", fmt.Sprint(modelLimit))
	g.emit("add", "n1", "n2", "n3")
	g.up, g.next = []string{"n1", "n2", "n3"}, 4
	g.settle()
	for range 20 + g.rnd.IntN(20) {
		g.step()
	}
	if g.partitioned {
		g.emit("heal")
	}
	g.settle()
	for _, k := range modelKeys {
		g.emit("check", "*", k, fmt.Sprint(modelLimit))
	}
	return g.steps
}

// step emits one random step that the harness can run from the current
// state (checks only through settled members; leaves only when everything
// is settled and whole, since a leave hands off to the members it sees).
func (g *modelGen) step() {
	switch x := g.rnd.IntN(20); {
	case x < 9 && len(g.settled) > 0:
		g.emit("check", g.pick(g.settled), g.pick(modelKeys), fmt.Sprint(1+g.rnd.IntN(3)))
	case x < 11:
		g.settle()
	case x < 12:
		g.emit("advance", fmt.Sprintf("%dms", 50*(1+g.rnd.IntN(40))))
	case x < 14 && !g.partitioned && len(g.down) > 0:
		name := g.pick(g.down)
		g.down = remove(g.down, name)
		g.up = append(g.up, name)
		g.emit("restart", name)
	case x < 15 && !g.partitioned && len(g.up) < 5:
		name := fmt.Sprintf("n%d", g.next)
		g.next++
		g.up = append(g.up, name)
		g.emit("add", name)
	case x < 16 && !g.partitioned && len(g.up) > 1 && g.clean:
		name := g.pick(g.up)
		g.up, g.settled, g.down = remove(g.up, name), remove(g.settled, name), append(g.down, name)
		g.emit("leave", name)
	case x < 17 && len(g.up) > 1:
		name := g.pick(g.up)
		g.up, g.settled, g.down = remove(g.up, name), remove(g.settled, name), append(g.down, name)
		g.emit("crash", name)
	case x < 18 && !g.partitioned && len(g.up) > 1:
		g.partition()
	case x < 20 && g.partitioned:
		g.partitioned = false
		g.emit("heal")
	}
}

// partition emits a split of the members up into two non-empty groups.
func (g *modelGen) partition() {
	names := slices.Clone(g.up)
	g.rnd.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	cut := 1 + g.rnd.IntN(len(names)-1)
	g.emit("partition", strings.Join(names[:cut], ","), strings.Join(names[cut:], ","))
	g.partitioned = true
}

// modelBound is the most a key may admit in one window, from
// docs/guarantees.md and docs/ownership.md ("Where the promise is
// weaker"):
//   - without a crash or a partition in the run, the limit (graceful joins,
//     leaves and restarts are exact);
//   - a partition into s sides: each side decides on its own, s × limit;
//   - a crash loses what changed on the crashed node in the last
//     ReplicationInterval. A node that took a key over (handoff, or a pull
//     on first touch) changed its whole count then, and the model does not
//     see which node holds a key, so when a check of the key was answered
//     in that interval, or the membership had not settled since a change
//     (handoffs in flight), it may lose every hit admitted so far: plus
//     those, per crash;
//   - with a crash or a partition, stand-in decisions are not merged back,
//     each at most one too many: plus the forwards that failed or timed out
//     (a stand-in decides only after one), over the whole cluster.
type modelBound struct {
	limit, sides, crashLoss, standIns int64
}

func (b modelBound) total() int64 { return b.limit*b.sides + b.crashLoss + b.standIns }

func (b modelBound) String() string {
	return fmt.Sprintf("%d = limit %d × sides %d + what crashes may have lost %d + failed forwards %d",
		b.total(), b.limit, b.sides, b.crashLoss, b.standIns)
}

// wk is a key in a window.
type wk struct {
	window int64
	key    string
}

func windowKey(at time.Time, key string) wk { return wk{at.UnixNano() / int64(Window), key} }

// checkModel returns the model's violations in r's run.
func checkModel(r *Runner, forwardErrors uint64) []string {
	sides, crashed := int64(1), false
	for _, e := range r.Events {
		switch e.Step.Op {
		case "crash":
			crashed = true
		case "partition":
			sides = max(sides, int64(len(e.Step.Args)))
		}
	}
	interval := cluster.DefaultConfig().ReplicationInterval
	admitted := map[wk]int64{}
	bounds := map[wk]*modelBound{}
	var order []wk
	bound := func(k wk, limit int64) *modelBound {
		b := bounds[k]
		if b == nil {
			b = &modelBound{limit: limit, sides: sides}
			if crashed || sides > 1 {
				b.standIns = int64(forwardErrors)
			}
			bounds[k] = b
			order = append(order, k)
		}
		return b
	}
	ai, settledSince := 0, true
	for _, e := range r.Events {
		for ; ai < len(r.Answers) && r.Answers[ai].Seq < e.Seq; ai++ {
			a := r.Answers[ai]
			k := windowKey(a.At, a.Key)
			bound(k, a.Limit)
			if a.Admitted {
				admitted[k]++
			}
		}
		switch e.Step.Op {
		case "settle":
			settledSince = true
		case "advance":
		case "crash":
			for k, b := range bounds {
				if k.window == windowKey(e.At, "").window && (!settledSince || answeredIn(r.Answers[:ai], k.key, e.At.Add(-interval), e.At)) {
					b.crashLoss += admitted[k]
				}
			}
			settledSince = false
		default:
			settledSince = false
		}
	}
	for _, a := range r.Answers[ai:] {
		k := windowKey(a.At, a.Key)
		bound(k, a.Limit)
		if a.Admitted {
			admitted[k]++
		}
	}
	var bad []string
	for _, k := range order {
		if b := bounds[k]; admitted[k] > b.total() {
			bad = append(bad, fmt.Sprintf("key %s, window %d: admitted %d, bound %v", k.key, k.window, admitted[k], b))
		}
	}
	return bad
}

// answeredIn reports whether a check of key was answered in [from, to].
func answeredIn(answers []Answer, key string, from, to time.Time) bool {
	for _, a := range answers {
		if a.Key == key && !a.At.Before(from) && !a.At.After(to) {
			return true
		}
	}
	return false
}
