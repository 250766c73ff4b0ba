package test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Rolling deploy at scale (make deploy-scale): SLUICE_DEPLOY_NODES real
// nodes on this machine's loopback, an outside load over every one of them,
// then the two shapes of a Kubernetes rolling update, each graceful
// (SIGTERM, wait for the exit, start again on the same data directory and
// addresses, wait for /readyz 200 — the readiness probe — before going on):
//
//	A: 25 nodes one after another (maxUnavailable 1);
//	B: 25 nodes in 5 bursts of 5 at once (maxSurge 5).
//
// A node about to stop is first taken out of the load's targets (the
// Service drops a terminating pod from its endpoints), and put back once it
// is ready again. Graceful changes promise exactness (architecture.md):
// every phase must end with 0 hits over a limit, 0 admitted hits lost and 0
// failed calls; each phase logs one line with its calls and their p50, p99
// and max latency while it ran.
//
// Node i (1-based) listens on DEPLOY_NET.i with the default ports (gRPC
// 8081, HTTP 8080, gossip 7946): ports below the ephemeral range, which the
// nodes' own outgoing connections take from (on 100 nodes, free ports
// picked there collide with them).
//
// Environment:
//
//	SLUICE_DEPLOY_NODES      the number of nodes, 8..254; unset, the test skips
//	SLUICE_DEPLOY_NET        DEPLOY_NET, the first three octets of the node
//	                         addresses (default 127.0.4; test/scale.sh uses 127.0.3)
//	SLUICE_DEPLOY_GATE       readyz (default): the next restart waits for the
//	                         restarted nodes' /readyz 200; members: also for
//	                         every node to see every node alive
//	SLUICE_DEPLOY_LOG_LEVEL  the nodes' --log-level (default the harness's, debug)
//	SLUICE_DEPLOY_LOGS       a directory: every node's whole log, one file each
//	SLUICE_DEPLOY_RATE       checks a second of the load (default 200, spread
//	                         over its callers); 0: each caller calls back to
//	                         back, which on one machine saturates it (the
//	                         nodes then starve, which is the overload test's
//	                         subject, not a deploy's)
//
// The phase's line is logged also when a phase fails; a count below what
// was admitted is then traced through up to 20 nodes (diagnoseLost), and
// a membership that does not settle within 2 minutes ends the test after
// its phase's counts are checked. Each phase logs the load average and
// any other `sluice serve` processes on the machine (another run starves
// these nodes). 3 minutes before go test's -timeout a watchdog kills every
// node, so that the test still ends through its cleanups.
const (
	deployRestarts  = 25                     // nodes restarted per phase
	deployBurst     = 5                      // nodes at once in phase B
	deployStagger   = 150 * time.Millisecond // between node starts
	deployWorkers   = 8                      // callers of the load (as the other load tests)
	deployMaxCalls  = 20_000_000             // the load's bound in calls, per phase
	deployMaxTime   = 12 * time.Minute       // and in time, per phase
	deploySteadyFor = 10 * time.Second       // the baseline phase, no change
)

func TestRollingDeployAtScale(t *testing.T) {
	env := os.Getenv("SLUICE_DEPLOY_NODES")
	if env == "" {
		t.Skip("set SLUICE_DEPLOY_NODES (e.g. 100; make deploy-scale) to run the rolling deploy at scale")
	}
	if runtime.GOOS != "linux" {
		t.Skipf("needs the whole 127.0.0.0/8 on loopback (Linux); this is %s", runtime.GOOS)
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < deployBurst+3 || n > 254 {
		t.Fatalf("SLUICE_DEPLOY_NODES=%q: want %d..254 nodes", env, deployBurst+3)
	}
	netPrefix := os.Getenv("SLUICE_DEPLOY_NET")
	if netPrefix == "" {
		netPrefix = "127.0.4"
	}
	if ip := net.ParseIP(netPrefix + ".1"); ip == nil || !ip.IsLoopback() || strings.Count(netPrefix, ".") != 2 {
		t.Fatalf("SLUICE_DEPLOY_NET=%q: want the first three octets of a loopback address, 127.X.Y", netPrefix)
	}
	// The gate between restarts: the restarted nodes' /readyz (the
	// readiness probe a rolling update waits for), or with
	// SLUICE_DEPLOY_GATE=members also every node seeing every node alive.
	gate := cmp.Or(os.Getenv("SLUICE_DEPLOY_GATE"), "readyz")
	if gate != "readyz" && gate != "members" {
		t.Fatalf("SLUICE_DEPLOY_GATE=%q: want readyz or members", gate)
	}
	gateMembers := gate == "members"
	t.Logf("before the start: %s", machineLoad(nil))
	begin := time.Now()

	// --- start: node 1, then the others deployStagger apart, joining 1 and 2.
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = newFixedProc(t, fmt.Sprintf("deploy-%d", i+1), fmt.Sprintf("%s.%d", netPrefix, i+1))
		switch {
		case i == 1:
			ps[i].join = []string{ps[0].gossip}
		case i > 1:
			ps[i].join = []string{ps[0].gossip, ps[1].gossip}
		}
	}
	if dir := os.Getenv("SLUICE_DEPLOY_LOGS"); dir != "" {
		// Every node's whole log (all its starts), one file each, once
		// the processes are gone: registered before their cleanups, it
		// runs after them.
		t.Cleanup(func() {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Errorf("SLUICE_DEPLOY_LOGS: %v", err)
				return
			}
			for _, p := range ps {
				if err := os.WriteFile(filepath.Join(dir, p.name+".log"), []byte(p.log.String()), 0o644); err != nil {
					t.Errorf("SLUICE_DEPLOY_LOGS: %v", err)
				}
			}
			t.Logf("node logs in %s", dir)
		})
	}
	// The watchdog: 3 minutes before go test's -timeout, whose panic runs
	// no cleanup (the nodes and their data directories would outlive the
	// test), every node is killed: what waits on them fails, and the test
	// ends through its cleanups. procMu orders its reads of p.cmd with the
	// starts.
	var procMu sync.Mutex
	startProc := func(p *proc) {
		t.Helper()
		procMu.Lock()
		defer procMu.Unlock()
		p.start(t)
	}
	if dl, ok := t.Deadline(); ok {
		var fired atomic.Bool
		watchdog := time.AfterFunc(time.Until(dl)-3*time.Minute, func() {
			fired.Store(true)
			procMu.Lock()
			defer procMu.Unlock()
			for _, p := range ps {
				if p.cmd != nil && p.cmd.Process != nil {
					p.cmd.Process.Kill()
				}
			}
		})
		t.Cleanup(func() {
			watchdog.Stop()
			if fired.Load() {
				t.Errorf("go test's -timeout (%v) was 3 minutes away: every node was killed, so that the test ends through its cleanups", dl.Format(time.TimeOnly))
			}
		})
	}
	for i, p := range ps {
		startProc(p)
		if i == 0 {
			waitHTTP(t, p, "/healthz", 30*time.Second)
		} else if i < n-1 {
			time.Sleep(deployStagger)
		}
	}
	started := time.Since(begin)
	formed := waitAllAlive(t, ps, 3*time.Minute, "formation")
	t.Logf("%d nodes on %s.1..%d started in %v; every node saw %d alive and was ready %v after the last start",
		n, netPrefix, n, started.Round(time.Millisecond), n, formed.Round(time.Millisecond))

	// --- the load: every running node is a target; latencies by call.
	rec := &callRecorder{inflight: make([]atomic.Int64, n)}
	clients := make([]*client.Node, n)
	for i, p := range ps {
		clients[i] = dial(t, p.grpc, grpc.WithUnaryInterceptor(rec.intercept(i)))
	}
	up := make([]bool, n)
	for i := range up {
		up[i] = true
	}
	l := newLoad(max(100, 10*n))
	rate := 200
	if v := os.Getenv("SLUICE_DEPLOY_RATE"); v != "" {
		if rate, err = strconv.Atoi(v); err != nil || rate < 0 {
			t.Fatalf("SLUICE_DEPLOY_RATE=%q: want checks a second, 0 or more", v)
		}
	}
	if rate > 0 {
		l.every = time.Duration(deployWorkers) * time.Second / time.Duration(rate)
	}
	retarget := func() {
		var cs []*client.Node
		for i, c := range clients {
			if up[i] {
				cs = append(cs, c)
			}
		}
		l.setTargets(cs...)
	}
	retarget()
	verifier := dial(t, ps[0].grpc) // node 1 is never restarted
	t.Logf("gate between restarts: %s", map[bool]string{false: "/readyz 200 of the restarted nodes", true: "every node sees every node alive and is ready"}[gateMembers])
	pace := "back to back"
	if rate > 0 {
		pace = fmt.Sprintf("%d checks a second in all", rate)
	}
	t.Logf("load: %d callers over every running node (%s), %d tight keys (limit %d) and %d loose keys, window %d ms",
		deployWorkers, pace, len(l.tight), l.tightLimit, len(l.loose), longWindow)

	// restart stops group gracefully, waits for every process to exit,
	// starts each again on its data directory and addresses, and waits
	// until each answers /readyz 200. It returns how long the stop and the
	// return to ready took (the slowest of the group).
	restart := func(group []int) (stopped, ready time.Duration) {
		t.Helper()
		for _, i := range group {
			up[i] = false
		}
		retarget()
		// Calls already sent to them are answered before they stop.
		waitFor(t, 10*time.Second, "no call in flight to the nodes about to stop", func() bool {
			for _, i := range group {
				if rec.inflight[i].Load() != 0 {
					return false
				}
			}
			return true
		})
		for _, i := range group {
			l.noteStopping(t, ps[i])
		}
		t0 := time.Now()
		for _, i := range group {
			ps[i].signal(t, syscall.SIGTERM)
		}
		for _, i := range group {
			if err := ps[i].wait(t, syscall.SIGTERM, 60*time.Second); err != nil {
				t.Fatalf("%s exited with %v after SIGTERM", ps[i].name, err)
			}
		}
		stopped = time.Since(t0)
		t1 := time.Now()
		for _, i := range group {
			startProc(ps[i])
		}
		for _, i := range group {
			waitHTTP(t, ps[i], "/readyz", 2*time.Minute)
		}
		ready = time.Since(t1)
		if gateMembers {
			waitAllAlive(t, ps, 2*time.Minute, "after "+ps[group[0]].name+"'s restart")
		}
		for _, i := range group {
			// A new connection: the old one's state (closed by the
			// stopped process) plays no part.
			clients[i] = dial(t, ps[i].grpc, grpc.WithUnaryInterceptor(rec.intercept(i)))
			up[i] = true
		}
		retarget()
		return stopped, ready
	}

	// The nodes restarted: 3, 4, ... (never node 1, the seed, nor 2),
	// round the ring of nodes 3..N when there are fewer than 50.
	next := 0
	nextNode := func() int {
		i := 2 + next%(n-2)
		next++
		return i
	}

	var totalLost int64
	// phase runs the load while change runs, then waits until every node
	// sees every node alive, stops the load and checks the counts.
	phase := func(name, what string, change func() string) {
		t.Helper()
		over0, slow0, lost0 := l.tightOver(), l.slow.Load(), totalLost
		fails0, pauses0 := metric(t, ps[0], failsMetric), metric(t, ps[0], "sluice_pauses_total")
		// Each phase's own calls and call errors (noCallErrors).
		l.calls.Store(0)
		l.callErrors.Store(0)
		l.firstErr.Store(nil)
		stop, done := make(chan struct{}), make(chan struct{})
		stopLoad := sync.OnceFunc(func() { close(stop) })
		go func() { l.run(t, deployWorkers, deployMaxCalls, deployMaxTime, stop); close(done) }()
		t.Cleanup(func() { stopLoad(); <-done }) // also when the test fails before the end
		waitCalls(t, l, 1000)
		t.Logf("%s begins: %s", name, machineLoad(ps))
		from := time.Now()
		detail := change()
		to := time.Now()
		t.Logf("%s done: %s", name, machineLoad(ps))
		// Not converged: the counts are still checked and the phase's line
		// logged, then the test ends.
		converged, agreed := awaitAllAlive(t, ps, 2*time.Minute, name)
		select {
		case <-done:
			t.Errorf("%s: the load reached its bound (%d calls or %v) before the phase ended", name, int64(deployMaxCalls), deployMaxTime)
		default:
		}
		stopLoad()
		<-done
		st := rec.stats(from, to)
		if !agreed {
			// verify may fail on a peek that times out: the load's
			// figures first.
			t.Logf("%s (%s): %v, then %v and the nodes still did not all see %d alive; %d calls during it, p50 %v, p99 %v, max %v, %d over 1 s; call errors %d; tight keys over so far %d",
				name, what, to.Sub(from).Round(time.Millisecond), converged.Round(time.Millisecond), n,
				st.calls, st.p50, st.p99, st.max, l.slow.Load()-slow0, l.callErrors.Load(), l.tightOver()-over0)
		}
		lost := l.verify(t, verifier, ps, exact)
		if lost > totalLost {
			diagnoseLost(t, l, ps, verifier)
		}
		over := l.tightOver() - over0
		totalLost = lost
		fails, pauses := metric(t, ps[0], failsMetric)-fails0, metric(t, ps[0], "sluice_pauses_total")-pauses0
		settled := fmt.Sprintf("then %v until every node saw %d alive", converged.Round(time.Millisecond), n)
		if !agreed {
			settled = fmt.Sprintf("then %v and the nodes still did not all see %d alive", converged.Round(time.Millisecond), n)
		}
		t.Logf("%s (%s): %v, %s; %d calls during it, p50 %v, p99 %v, max %v, %d over 1 s; over %d, lost %d, call errors %d; node 1 saw %v members declared dead and paused %v times%s",
			name, what, to.Sub(from).Round(time.Millisecond), settled,
			st.calls, st.p50, st.p99, st.max, l.slow.Load()-slow0, over, lost-lost0, l.callErrors.Load(), fails, pauses, detail)
		l.noCallErrors(t, name)
		if !agreed {
			t.Fatalf("%s: the nodes never agreed on the membership; the phases after it are not run", name)
		}
	}

	phase("steady", "no change, the baseline", func() string {
		time.Sleep(deploySteadyFor)
		return ""
	})
	phase("phase A", fmt.Sprintf("%d nodes restarted one after another, maxUnavailable 1", deployRestarts), func() string {
		var stops, readies []time.Duration
		for range deployRestarts {
			i := nextNode()
			s, r := restart([]int{i})
			stops, readies = append(stops, s), append(readies, r)
			t.Logf("  %s: stopped in %v, ready %v after its start", ps[i].name, s.Round(time.Millisecond), r.Round(time.Millisecond))
		}
		return restartSummary(stops, readies)
	})
	phase("phase B", fmt.Sprintf("%d bursts of %d nodes at once, maxSurge %d", deployRestarts/deployBurst, deployBurst, deployBurst), func() string {
		var stops, readies []time.Duration
		for range deployRestarts / deployBurst {
			group := make([]int, deployBurst)
			var names []string
			for j := range group {
				group[j] = nextNode()
				names = append(names, ps[group[j]].name)
			}
			s, r := restart(group)
			stops, readies = append(stops, s), append(readies, r)
			t.Logf("  %s: all stopped in %v, all ready %v after their start", strings.Join(names, ","), s.Round(time.Millisecond), r.Round(time.Millisecond))
		}
		return restartSummary(stops, readies)
	})
	t.Logf("%d nodes: %v in all", n, time.Since(begin).Round(time.Second))
}

// failsMetric counts the members a node has declared dead (failed, not
// left): none in a graceful deploy.
const failsMetric = `sluice_membership_changes_total{event="fail"}`

// restartSummary is the stop and ready times of a phase's restarts, for its
// line.
func restartSummary(stops, readies []time.Duration) string {
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[(len(s)-1)/2].Round(time.Millisecond)
	}
	return fmt.Sprintf("; %d restarts: stop (SIGTERM to exit) median %v max %v, start to /readyz 200 median %v max %v",
		len(stops), med(stops), slices.Max(stops).Round(time.Millisecond), med(readies), slices.Max(readies).Round(time.Millisecond))
}

// newFixedProc prepares (does not start) a node on ip with the default
// ports: for many nodes, whose outgoing connections take ports from the
// ephemeral range freePort picks from.
func newFixedProc(t *testing.T, name, ip string) *proc {
	t.Helper()
	p := &proc{
		name:    name,
		grpc:    net.JoinHostPort(ip, "8081"),
		http:    net.JoinHostPort(ip, "8080"),
		gossip:  net.JoinHostPort(ip, "7946"),
		dataDir: t.TempDir(),
		log:     &logBuf{},
		// The default failure detection, not the harness's fast one: a
		// deploy at scale is what lan is the default for.
		extra: []string{"--failure-detection", "lan"},
	}
	// The harness's debug level by default (every handoff, pull and settle
	// of a key: what a lost count is traced with; a few MB a node at 100);
	// SLUICE_DEPLOY_LOG_LEVEL=info for less.
	if lv := os.Getenv("SLUICE_DEPLOY_LOG_LEVEL"); lv != "" {
		p.extra = append(p.extra, "--log-level", lv)
	}
	for _, a := range []string{p.grpc, p.http, p.gossip} {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s: %v (another run? SLUICE_DEPLOY_NET picks other addresses)", a, err)
		}
		l.Close()
	}
	u, err := net.ListenPacket("udp", p.gossip)
	if err != nil {
		t.Fatalf("%s/udp: %v (another run? SLUICE_DEPLOY_NET picks other addresses)", p.gossip, err)
	}
	u.Close()
	return p
}

// deployHTTP is the client of the polls: short deadlines, so that a node
// that does not answer holds no poll up.
var deployHTTP = &http.Client{Timeout: 5 * time.Second}

// waitHTTP waits until p answers path with 200, failing the test (with the
// tail of its log) when it exits first or does not within d.
func waitHTTP(t *testing.T, p *proc, path string, d time.Duration) {
	t.Helper()
	exited := false
	ok := waitUntil(d, func() bool {
		select {
		case <-p.exited:
			exited = true
			return true
		default:
		}
		resp, err := deployHTTP.Get("http://" + p.http + path)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	switch {
	case exited:
		t.Fatalf("%s exited (%v) before %s answered 200; its log ends:\n%s", p.name, p.err, path, logTail(p, 40))
	case !ok:
		t.Fatalf("%s: %s did not answer 200 within %v; its log ends:\n%s", p.name, path, d, logTail(p, 40))
	}
}

// logTail is the last k lines of p's log.
func logTail(p *proc, k int) string {
	lines := strings.Split(strings.TrimRight(p.log.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-k):], "\n")
}

// waitAllAlive waits until every node reports, on GET /metrics, all of ps
// alive (sluice_members_alive) and itself ready (sluice_ready), failing the
// test when they do not within d. It returns how long that took.
func waitAllAlive(t *testing.T, ps []*proc, d time.Duration, what string) time.Duration {
	t.Helper()
	took, ok := awaitAllAlive(t, ps, d, what)
	if !ok {
		t.FailNow()
	}
	return took
}

// awaitAllAlive is waitAllAlive that, when the nodes do not agree within
// d, marks the test failed, says what they see, and returns false: one
// scrape per node and poll, 16 at a time, every max(0.2 s, N/50 s). Not
// `sluice status` (waitMembers): each Status asks every alive member for
// its figures, N² calls a poll.
func awaitAllAlive(t *testing.T, ps []*proc, d time.Duration, what string) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	interval := max(200*time.Millisecond, time.Duration(len(ps))*20*time.Millisecond)
	var last []string
	var lagging []int // the nodes of the last poll that did not see all alive
	for {
		round := time.Now()
		last, lagging = last[:0], lagging[:0]
		seen := make([]string, len(ps))
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i, p := range ps {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				m, err := scrapeSome(p.http, "sluice_members_alive", "sluice_ready")
				switch {
				case err != nil:
					seen[i] = fmt.Sprintf("%s: %v", p.name, err)
				case int(m["sluice_members_alive"]) != len(ps) || m["sluice_ready"] != 1:
					seen[i] = fmt.Sprintf("%s: %v alive, ready %v", p.name, m["sluice_members_alive"], m["sluice_ready"])
				}
			})
		}
		wg.Wait()
		for i, s := range seen {
			if s != "" {
				last, lagging = append(last, s), append(lagging, i)
			}
		}
		if len(last) == 0 {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			break
		}
		time.Sleep(time.Until(round.Add(interval)))
	}
	for _, p := range ps {
		select {
		case <-p.exited:
			t.Logf("%s has exited (%v); its log ends:\n%s", p.name, p.err, logTail(p, 40))
		default:
		}
	}
	if len(last) > 20 {
		last = append(last[:20], fmt.Sprintf("and %d more", len(last)-20))
	}
	t.Errorf("%s: not every node saw %d alive and was ready within %v: %s", what, len(ps), d, strings.Join(last, "; "))
	// Whom the first few lagging nodes (node 1 when none lags: it was not
	// ready) do not see alive, and as what: one Status each, which asks
	// every member the node sees alive once.
	if len(lagging) == 0 {
		lagging = []int{0}
	}
	for _, i := range lagging[:min(len(lagging), 5)] {
		t.Logf("%s sees not alive: %s", ps[i].name, notAlive(ps[i]))
	}
	return time.Since(start), false
}

// notAlive returns the members p sees in another state than alive, from
// its Status, or why it could not tell.
func notAlive(p *proc) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(p.grpc)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return "status: " + err.Error()
	}
	var not []string
	for _, m := range st.Members {
		if m.State != "alive" {
			not = append(not, m.Name+"="+m.State)
		}
	}
	return fmt.Sprintf("%v of %d members", not, len(st.Members))
}

// scrapeSome returns the named unlabelled samples of GET /metrics at addr,
// without the test's t: for the polls' goroutines.
func scrapeSome(addr string, names ...string) (map[string]float64, error) {
	resp, err := deployHTTP.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	for l := range strings.Lines(string(body)) {
		f := strings.Fields(l)
		if len(f) == 2 && slices.Contains(names, f[0]) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("metric line %q: %v", l, err)
			}
			m[f[0]] = v
		}
	}
	for _, name := range names {
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("no metric %s", name)
		}
	}
	return m, nil
}

// callRecorder sees every Check of the load (a client interceptor): its
// start and latency, and the calls in flight per node.
type callRecorder struct {
	inflight []atomic.Int64 // by node index

	mu    sync.Mutex
	calls []recordedCall
}

type recordedCall struct {
	at   time.Time
	took time.Duration
}

func (r *callRecorder) intercept(node int) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != sluicev1.RateLimiter_Check_FullMethodName {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		r.inflight[node].Add(1)
		defer r.inflight[node].Add(-1)
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		took := time.Since(start)
		r.mu.Lock()
		r.calls = append(r.calls, recordedCall{at: start, took: took})
		r.mu.Unlock()
		return err
	}
}

type latencyStats struct {
	calls         int
	p50, p99, max time.Duration
}

// stats is the latency of the calls sent from from to to, failed ones
// included; nearest rank.
func (r *callRecorder) stats(from, to time.Time) latencyStats {
	r.mu.Lock()
	var ds []time.Duration
	for _, c := range r.calls {
		if !c.at.Before(from) && c.at.Before(to) {
			ds = append(ds, c.took)
		}
	}
	r.mu.Unlock()
	if len(ds) == 0 {
		return latencyStats{}
	}
	slices.Sort(ds)
	rank := func(q float64) time.Duration {
		k := int(math.Ceil(q * float64(len(ds))))
		return ds[min(len(ds), max(1, k))-1].Round(10 * time.Microsecond)
	}
	return latencyStats{calls: len(ds), p50: rank(0.50), p99: rank(0.99), max: ds[len(ds)-1].Round(10 * time.Microsecond)}
}

// diagnoseLost says, for the first 10 loose keys whose count is below what
// was admitted, what up to 20 nodes (spread over the cluster) answer for it
// (each asks the owner in its own view of the ring), and what node 1
// answers 5 s later: one ring view and a count that stays low is a count
// lost; differing owners are views that disagree. A minute at most: on a
// cluster whose members keep being declared dead, every peek may take its
// whole deadline.
func diagnoseLost(t *testing.T, l *load, ps []*proc, verifier *client.Node) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	peek := func(c *client.Node, k string) (owner string, counted int64, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := c.Check(ctx, checkReq("load", k, 0, l.looseLimit, longWindow))
		if err != nil {
			return "", 0, err
		}
		r := resp.Responses[0]
		if r.Error != "" {
			return "", 0, fmt.Errorf("%s", r.Error)
		}
		return r.Owner, l.looseLimit - r.Remaining, nil
	}
	var short []string
	for _, k := range l.loose {
		if time.Now().After(deadline) || len(short) == 10 {
			break
		}
		if _, counted, err := peek(verifier, k); err == nil && counted < l.admitted[k].Load() {
			short = append(short, k)
		}
	}
	var entries []*proc
	for i := 0; i < len(ps); i += max(1, len(ps)/20) {
		entries = append(entries, ps[i])
	}
	cs := clientsOf(t, entries)
	for _, k := range short {
		if time.Now().After(deadline) {
			t.Logf("lost counts: out of time for the other keys")
			break
		}
		views := map[string][]string{} // "owner says count" → entry nodes
		for i, c := range cs {
			owner, counted, err := peek(c, k)
			v := fmt.Sprintf("%s says %d", owner, counted)
			if err != nil {
				v = err.Error()
			}
			views[v] = append(views[v], entries[i].name)
		}
		var vs []string
		for v, entries := range views {
			vs = append(vs, fmt.Sprintf("through %d nodes (%s): %s", len(entries), strings.Join(entries[:min(3, len(entries))], ","), v))
		}
		slices.Sort(vs)
		t.Logf("lost on %s: %d admitted; %s", k, l.admitted[k].Load(), strings.Join(vs, "; "))
		for _, d := range doubleCounts(l, k, 5) {
			t.Logf("  %s", d)
		}
	}
	time.Sleep(5 * time.Second)
	for _, k := range short {
		owner, counted, err := peek(verifier, k)
		t.Logf("lost on %s, 5 s later through node 1: %s says %d (%v)", k, owner, counted, err)
	}
}

// doubleCounts returns, for the loose key k, up to max runs of admitted
// answers that left the count at a value an earlier admitted answer had
// already left it at: each admitted hit raises the key's count by one, so
// two answers with the same count after them are two decisions made on
// the same state, one of them on a copy that did not hold the other's
// hit. Each run says which owner decided first, which decided again,
// when, and how many counts it repeated.
func doubleCounts(l *load, k string, max int) []string {
	l.histMu.Lock()
	defer l.histMu.Unlock()
	type seen struct {
		at    time.Duration
		owner string
	}
	first := map[int64]seen{}
	var out []string
	var run struct {
		n              int
		from, to       int64
		owner1, owner2 string
		at1, at2       time.Duration
	}
	flush := func() {
		if run.n > 0 && len(out) < max {
			out = append(out, fmt.Sprintf("counts %d..%d (%d) decided by %s at %v and again by %s at %v",
				run.from, run.to, run.n, run.owner1, run.at1.Round(time.Millisecond), run.owner2, run.at2.Round(time.Millisecond)))
		}
		run.n = 0
	}
	for _, a := range l.hist[k] {
		if !a.admitted {
			continue
		}
		c := l.looseLimit - a.remaining
		f, ok := first[c]
		if !ok {
			first[c] = seen{a.at, a.owner}
			continue
		}
		if run.n > 0 && (c != run.to+1 || a.owner != run.owner2 || f.owner != run.owner1) {
			flush()
		}
		if run.n == 0 {
			run.from, run.owner1, run.owner2, run.at1, run.at2 = c, f.owner, a.owner, f.at, a.at
		}
		run.to = c
		run.n++
	}
	flush()
	return out
}

// machineLoad is the load average and the `sluice serve` processes on
// this machine that are not ps's: another test's nodes compete for the
// same cores, which starves these.
func machineLoad(ps []*proc) string {
	ours := map[int]bool{}
	for _, p := range ps {
		if p.cmd != nil && p.cmd.Process != nil {
			ours[p.cmd.Process.Pid] = true
		}
	}
	others := 0
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || ours[pid] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && strings.HasPrefix(filepath.Base(args[0]), "sluice") && args[1] == "serve" {
			others++
		}
	}
	avg, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("load average %s; %d other `sluice serve` processes on this machine", strings.Join(strings.Fields(string(avg))[:min(3, len(strings.Fields(string(avg))))], " "), others)
}
