//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Shared steps of the scenarios: a load in the background, per-key
// judgement of a history against a bound, the hosts' agreement after a
// fault, and metrics summed over hosts.

// running is a load in the background.
type running struct {
	stop context.CancelFunc
	done chan struct{}
}

// startLoad runs l in the background (bounded by maxCalls); the test's
// cleanup stops it.
func startLoad(t *testing.T, l *Load, workers int, perWorker float64, maxCalls int) *running {
	ctx, stop := context.WithCancel(context.Background())
	r := &running{stop: stop, done: make(chan struct{})}
	go func() { l.Run(ctx, workers, perWorker, maxCalls); close(r.done) }()
	t.Cleanup(func() { r.stop(); <-r.done })
	return r
}

// Stop ends the load and waits for the answer of every call in flight.
// Each call has callDeadline, so the load ends within that time; a load
// that does not is a call that hangs past its deadline.
func (r *running) Stop(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case <-r.done:
	case <-time.After(2 * callDeadline):
		t.Fatalf("the load did not end within %v of its stop: a call hangs past its %v deadline", 2*callDeadline, callDeadline)
	}
}

// hold keeps a fault in place for d from since (the fault's length is the
// scenario, not a synchronisation); it fails when the load ran out first.
func hold(t *testing.T, l *Load, r *running, since, d time.Duration) {
	t.Helper()
	select {
	case <-time.After(d - (l.Since() - since)):
	case <-r.done:
		t.Fatal("the load ended during the fault (call budget too small)")
	}
}

// moreCalls waits until n more calls have their answer.
func moreCalls(t *testing.T, l *Load, n int) {
	t.Helper()
	want := l.Calls() + n
	waitFor(t, 60*time.Second, fmt.Sprintf("%d more calls", n), func() bool { return l.Calls() >= want })
}

// owners asks h which node owns each key (a peek decides nothing).
func owners(t *testing.T, l *Load, h *Host) []string {
	t.Helper()
	o := make([]string, l.Keys)
	for k := range l.Keys {
		_, owner, err := l.Peek(h, k)
		if err != nil {
			t.Fatalf("peek key %d through %s: %v", k, h.Name, err)
		}
		o[k] = owner
	}
	return o
}

// admittedPerKey counts the admitted checks of each key.
func admittedPerKey(h []Answer, keys int) []int {
	n := make([]int, keys)
	for _, a := range h {
		if a.Admitted {
			n[a.Key]++
		}
	}
	return n
}

// judge checks every key's admissions over the whole history against
// bound(k), printing each key past it with its trace; it returns the most
// admitted on one key and the number of keys past their bound.
func judge(t *testing.T, h []Answer, keys int, bound func(k int) int) (most, over int) {
	t.Helper()
	for k, n := range admittedPerKey(h, keys) {
		most = max(most, n)
		if n > bound(k) {
			over++
			t.Errorf("key %d: %d admitted, bound %d; its admissions (time, entry→decider): %s", k, n, bound(k), trace(h, k))
		}
	}
	return most, over
}

// noHangs fails the test for every call that got no decision, and checks
// that no answer came later than the deadline.
func noHangs(t *testing.T, h []Answer) {
	t.Helper()
	s := statsOf(h)
	if s.Errors > 0 {
		logErrors(t, h)
		t.Errorf("%d of %d checks got no decision (deadline %v)", s.Errors, s.Calls, callDeadline)
	}
	if s.Max > callDeadline {
		t.Errorf("a call took %v, past its %v deadline", s.Max, callDeadline)
	}
}

// agree peeks every key through every host and fails the test for each
// key the hosts answer differently (remaining or deciding owner). It
// returns each key's remaining as the first host answers it.
func agree(t *testing.T, c *Cluster, l *Load) []int64 {
	t.Helper()
	rem := make([]int64, l.Keys)
	disagree := 0
	for k := range l.Keys {
		var seen []string
		first, same := "", true
		for i, hst := range c.Hosts {
			r, owner, err := l.Peek(hst, k)
			if err != nil {
				t.Fatalf("peek key %d through %s: %v", k, hst.Name, err)
			}
			v := fmt.Sprintf("%d by %s", r, owner)
			seen = append(seen, hst.Name+": "+v)
			if i == 0 {
				first, rem[k] = v, r
			}
			same = same && v == first
		}
		if !same {
			disagree++
			t.Errorf("key %d: hosts disagree: %s", k, strings.Join(seen, ", "))
		}
	}
	t.Logf("after the fault: %d of %d keys answered alike (remaining and owner) through every host", l.Keys-disagree, l.Keys)
	return rem
}

// metricSum is the sum of every sample of a metric on h, labelled or not.
func (h *Host) metricSum(name string) float64 {
	code, body, err := h.Get("/metrics")
	if err != nil || code != 200 {
		h.c.t.Fatalf("%s /metrics: %d %v", h.Name, code, err)
	}
	sum := 0.0
	for l := range strings.Lines(body) {
		f := strings.Fields(l)
		if len(f) != 2 || (f[0] != name && !strings.HasPrefix(f[0], name+"{")) {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// clusterSum is metricSum over every host.
func (c *Cluster) clusterSum(name string) float64 {
	sum := 0.0
	for _, h := range c.Hosts {
		sum += h.metricSum(name)
	}
	return sum
}

// counters are the cluster-wide counters a scenario reports.
type counters struct{ forwardErrors, failovers, membership, rejoins float64 }

func (c *Cluster) counters() counters {
	return counters{
		forwardErrors: c.clusterSum("sluice_forward_errors_total"),
		failovers:     c.clusterSum("sluice_failovers_total"),
		membership:    c.clusterSum("sluice_membership_changes_total"),
		rejoins:       c.clusterSum("sluice_rejoins_total"),
	}
}

func (a counters) since(b counters) counters {
	return counters{a.forwardErrors - b.forwardErrors, a.failovers - b.failovers, a.membership - b.membership, a.rejoins - b.rejoins}
}

func (a counters) String() string {
	return fmt.Sprintf("forwards failed or timed out %v, failovers to a replica %v, membership events %v, rejoins %v",
		a.forwardErrors, a.failovers, a.membership, a.rejoins)
}

// phases splits a history by when each answer came: before from, during
// [from, to), after.
func phases(h []Answer, from, to time.Duration) (before, during, after []Answer) {
	for _, a := range h {
		switch {
		case a.End < from:
			before = append(before, a)
		case a.End < to:
			during = append(during, a)
		default:
			after = append(after, a)
		}
	}
	return
}

// settleBound is how soon after a heal (and the views' convergence) every
// host must answer every key alike: a peer connection that failed
// reconnects within transport's reconnect backoff cap (1 s), and a check
// then needs at most a forward timeout and a stand-in's (250 ms each),
// with 500 ms to spare for the peeks themselves on a busy 2-core machine.
const settleBound = 2 * time.Second

// settle peeks every key through every host, all at once, until they all
// answer alike, and returns how long that took (within, and false, when
// they never did).
func settle(t *testing.T, c *Cluster, l *Load, within time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		var wg sync.WaitGroup
		same := make([]bool, l.Keys)
		for k := range l.Keys {
			wg.Go(func() {
				first := ""
				same[k] = true
				for i, hst := range c.Hosts {
					r, owner, err := l.Peek(hst, k)
					v := fmt.Sprintf("%d by %s %v", r, owner, err)
					if i == 0 {
						first = v
					}
					same[k] = same[k] && err == nil && v == first
				}
			})
		}
		wg.Wait()
		if !slices.Contains(same, false) {
			return time.Since(start), true
		}
	}
	return within, false
}

// settleAfter waits for the hosts to answer every key alike after a heal at
// healAt (the load stopped), prints how long after the heal that came and
// the checks decided after the heal by another node than the key's owner
// (owner: before the fault), and fails the test when it came later than
// settleBound after the load stopped.
func settleAfter(t *testing.T, c *Cluster, l *Load, healAt time.Duration, owner []string) {
	t.Helper()
	stopped := l.Since()
	took, ok := settle(t, c, l, 60*time.Second)
	strays, strayKeys := 0, map[int]bool{}
	first := -1
	for _, a := range l.History() {
		if a.Start > healAt && a.Decider != "" && a.Decider != owner[a.Key] {
			strays++
			strayKeys[a.Key] = true
			if first < 0 {
				first = a.Key
			}
		}
	}
	t.Logf("after the heal: %d checks on %d keys decided by another node than the key's owner; every host answers every key alike %v after the heal (the load stopped %v after it; bound: then + %v)",
		strays, len(strayKeys), (stopped + took - healAt).Round(time.Millisecond), (stopped - healAt).Round(time.Millisecond), settleBound)
	if first >= 0 {
		t.Logf("key %d (owner %s), its decisions after the heal (start, entry→decider, admitted): %s", first, owner[first], traceAfter(l.History(), first, healAt))
	}
	if !ok || took > settleBound {
		t.Errorf("the hosts did not answer every key alike within %v of the load's stop (%v after the heal): decisions stay split after the heal", settleBound, (stopped + took - healAt).Round(time.Millisecond))
	}
}

// traceAfter lists key k's answers that started after from.
func traceAfter(h []Answer, k int, from time.Duration) string {
	var b strings.Builder
	for _, a := range h {
		if a.Key == k && a.Start > from {
			fmt.Fprintf(&b, "%v n%d→%s %v; ", a.Start.Round(time.Millisecond), a.Entry, a.Decider, a.Admitted)
		}
	}
	return b.String()
}

// sockets lists h's TCP connections to o's gRPC port with the kernel's
// view of them (ss -tni: retransmissions, backoff, rto).
func (h *Host) sockets(o *Host) string {
	out, err := runErr(nil, "ip", "netns", "exec", h.NS, "ss", "-tni", "dst", o.GRPCAddr())
	if err != nil {
		return fmt.Sprintf("ss: %v %s", err, out)
	}
	return string(out)
}

// bound is the crash bound of a history around the loss of host x at
// time at and its return at back: per key, the hits x admitted since its
// last replication (unreplicated: the hits it admitted before at, less the
// count the first answer decided without it saw), the admissions after at
// by stand-ins, nodes that own the key neither before (owner) nor while x
// is declared dead (next), and the admissions after back by another node
// than the owner once the owner has decided the key again (strays: a
// stand-in's decision while a forward to the returned owner fails); and
// before at, the admissions by another node than the owner (early: a
// replica standing in when a forward timed out). Each stand-in, stray or
// early admission is one the owner's count may miss
// (docs/guarantees.md: stand-in decisions are not merged back).
type bound struct {
	unreplicated, standIn, strays, early     []int
	sumUnrep, sumStandIn, sumStray, sumEarly int
	owned                                    int
	noAnswer                                 []int // keys of x with no answer decided without it
	admittedBefore                           []int
}

// setReplicated sets key k's replicated count when no answer showed it.
func (b *bound) setReplicated(k, replicated int) {
	u := max(0, b.admittedBefore[k]-replicated)
	b.sumUnrep += u - b.unreplicated[k]
	b.unreplicated[k] = u
}

func (b bound) of(k int) int { return b.unreplicated[k] + b.standIn[k] + b.strays[k] + b.early[k] }

func crashBound(h []Answer, owner, next []string, x *Host, at, back time.Duration, limit int64) bound {
	keys := len(owner)
	b := bound{unreplicated: make([]int, keys), standIn: make([]int, keys), strays: make([]int, keys), early: make([]int, keys)}
	admittedBefore := make([]int, keys)
	b.admittedBefore = admittedBefore
	replicated := make([]int, keys)
	ownerBack := make([]time.Duration, keys) // when the owner first decided the key after back
	for k := range replicated {
		replicated[k], ownerBack[k] = -1, -1
	}
	for _, a := range h {
		if a.Start >= back && a.Decider == owner[a.Key] && (ownerBack[a.Key] < 0 || a.End < ownerBack[a.Key]) {
			ownerBack[a.Key] = a.End
		}
	}
	for _, a := range h {
		if a.Admitted && a.Start < at && a.Decider != "" && a.Decider != owner[a.Key] {
			b.early[a.Key]++
			b.sumEarly++
		}
		if a.Admitted && a.Start >= at && a.Decider != "" && a.Decider != owner[a.Key] {
			switch {
			case ownerBack[a.Key] >= 0 && a.Start > ownerBack[a.Key]:
				b.strays[a.Key]++
				b.sumStray++
			case a.Decider != next[a.Key]:
				b.standIn[a.Key]++
				b.sumStandIn++
			}
		}
		if owner[a.Key] != x.Name || a.Decider == "" {
			continue
		}
		switch {
		case a.Start < at && a.Admitted && a.Decider == x.Name:
			admittedBefore[a.Key]++
		case a.Start > at && a.Decider != x.Name && replicated[a.Key] < 0:
			if a.Admitted {
				replicated[a.Key] = int(limit - a.Remaining - 1)
			} else {
				replicated[a.Key] = int(limit) // refused: the copy was at the limit
			}
		}
	}
	for k := range keys {
		if owner[k] != x.Name {
			continue
		}
		b.owned++
		if replicated[k] < 0 {
			b.noAnswer = append(b.noAnswer, k)
			continue
		}
		b.unreplicated[k] = max(0, admittedBefore[k]-replicated[k])
		b.sumUnrep += b.unreplicated[k]
	}
	return b
}
