//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// regionCall is one check of the regions test: when it was sent and
// answered (wall clock), through which region, and its answer.
type regionCall struct {
	start, end time.Time
	region     int // 0: a, 1: b
	key        int
	admitted   bool
	err        string
}

// TestRegionsThroughADelayingProxy: two regions of three real nodes, each
// node in its own network namespace; the regions cannot reach each other
// directly (iptables), only through a delaying proxy on the bridge that
// holds every piece of data for 80 ms in each direction (this kernel has
// no netem): --region-join names the proxy's addresses. Closed-loop
// callers check four keys of a global fixed window of 300 a second
// through all six nodes. It prints the figures of docs/regions.md and
// asserts:
//
//   - joined, every window admits at most the limit per key across both
//     regions, and a region decides a check without waiting on the other:
//     the median check is answered faster than one trip through the proxy
//     and back (160 ms). It prints each region's checks per second through
//     the proxy without its delay and with it;
//   - cut (the proxy closed), every window admits at most the limit plus
//     the cut-off region's fallback share (half the limit), and the
//     regions go on answering every check;
//   - healed (the proxy back), the windows from 2 s after are at most at
//     the limit again.
//
// A call is counted in a window only when it was sent and answered in it;
// the few that straddle an edge are printed, not counted, so every count
// asserted is at most the window's true one.
func TestRegionsThroughADelayingProxy(t *testing.T) {
	c := New(t, 6)
	a, b := c.Hosts[:3], c.Hosts[3:]
	c.Partition(a, b) // no direct path between the regions
	const delay = 80 * time.Millisecond
	br := c.subnet + "254"
	ports := []int{21000, 21001, 21002, 21003, 21004, 21005}
	var proxy *Delayer
	openProxy := func(d time.Duration) {
		proxy = NewDelayer(c.inBridge)
		proxy.SetDelay(d, 0)
		for i, h := range c.Hosts {
			if _, err := proxy.TCP(fmt.Sprintf("%s:%d", br, ports[i]), h.GRPCAddr()); err != nil {
				t.Fatalf("proxy for %s: %v", h.Name, err)
			}
		}
	}
	openProxy(0) // the first phase measures the regions without the delay
	t.Cleanup(func() { proxy.Close() })
	join := func(region string, hs []*Host) string {
		var s []string
		for _, h := range hs {
			s = append(s, fmt.Sprintf("%s@%s:%d", region, br, ports[h.Index]))
		}
		return strings.Join(s, ",")
	}
	for _, h := range a {
		h.Env = []string{"SLUICE_REGION=a", "SLUICE_REGION_JOIN=" + join("b", b)}
	}
	for _, h := range b {
		h.Env = []string{"SLUICE_REGION=b", "SLUICE_REGION_JOIN=" + join("a", a)}
	}
	for _, hs := range [][]*Host{a, b} {
		hs[0].Start()
		hs[1].Start(hs[0])
		hs[2].Start(hs[0])
	}
	waitFor(t, 30*time.Second, "each region's three nodes see each other", func() bool {
		for _, h := range c.Hosts {
			st, err := h.Client().Status(context.Background())
			if err != nil || st.GetRegion() == "" {
				return false
			}
			alive := 0
			for _, m := range st.GetMembers() {
				if m.GetState() == "alive" {
					alive++
				}
			}
			if alive != 3 {
				return false
			}
		}
		return true
	})

	const limit, keys = 300, 4
	var (
		mu    sync.Mutex
		calls []regionCall
	)
	// load runs 2 closed-loop callers per node for d and returns the
	// calls made.
	load := func(d time.Duration) []regionCall {
		mu.Lock()
		from := len(calls)
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		var wg sync.WaitGroup
		for i, h := range c.Hosts {
			for w := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; ctx.Err() == nil && n < 100_000; n++ {
						k := (n + w) % keys
						req := &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
							Name: "api", Key: fmt.Sprint("tenant:", k), Hits: proto.Int64(1), Limit: limit, WindowMs: 1000,
							Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, Global: true}}}
						cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
						rc := regionCall{start: time.Now(), region: i / 3, key: k}
						resp, err := h.Client().Check(cctx, req)
						ccancel()
						rc.end = time.Now()
						switch {
						case err != nil:
							rc.err = err.Error()
						case resp.Responses[0].GetError() != "":
							rc.err = resp.Responses[0].GetError()
						default:
							rc.admitted = resp.Responses[0].GetStatus() == sluicev1.Status_STATUS_UNDER_LIMIT
						}
						mu.Lock()
						calls = append(calls, rc)
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls[from:])
	}
	// windows counts admitted calls per (key, window start) per region,
	// only those sent and answered in one window; straddling is the
	// number left out.
	type count struct{ a, b int }
	windows := func(cs []regionCall) (m map[[2]int64]*count, straddling int) {
		m = map[[2]int64]*count{}
		for _, rc := range cs {
			if !rc.admitted {
				continue
			}
			w := rc.start.UnixMilli() / 1000
			if rc.end.UnixMilli()/1000 != w {
				straddling++
				continue
			}
			k := [2]int64{int64(rc.key), w}
			if m[k] == nil {
				m[k] = &count{}
			}
			if rc.region == 0 {
				m[k].a++
			} else {
				m[k].b++
			}
		}
		return m, straddling
	}
	summary := func(phase string, cs []regionCall, d time.Duration) (perSecond [2]float64) {
		var lat [2][]time.Duration
		var n, errs [2]int
		for _, rc := range cs {
			n[rc.region]++
			if rc.err != "" {
				errs[rc.region]++
				continue
			}
			lat[rc.region] = append(lat[rc.region], rc.end.Sub(rc.start))
		}
		for r := range 2 {
			slices.Sort(lat[r])
			p := func(q float64) time.Duration {
				if len(lat[r]) == 0 {
					return 0
				}
				return lat[r][int(q*float64(len(lat[r])-1))]
			}
			perSecond[r] = float64(n[r]) / d.Seconds()
			t.Logf("%s: region %c: %d checks (%.0f/s), %d errors, p50 %v, p99 %v", phase, 'a'+r, n[r], perSecond[r], errs[r], p(0.5), p(0.99))
		}
		return perSecond
	}
	median := func(cs []regionCall, region int) time.Duration {
		var l []time.Duration
		for _, rc := range cs {
			if rc.region == region && rc.err == "" {
				l = append(l, rc.end.Sub(rc.start))
			}
		}
		slices.Sort(l)
		if len(l) == 0 {
			return 0
		}
		return l[len(l)/2]
	}
	check := func(phase string, cs []regionCall, bound int, from time.Time) {
		m, straddling := windows(cs)
		var lines []string
		for k, ct := range m {
			if time.Unix(k[1], 0).Before(from) {
				continue
			}
			lines = append(lines, fmt.Sprintf("key %d at %d: %d+%d", k[0], k[1]%100, ct.a, ct.b))
			if ct.a+ct.b > bound {
				t.Errorf("%s: key %d, window at %d s: admitted %d in a + %d in b = %d, more than %d", phase, k[0], k[1], ct.a, ct.b, ct.a+ct.b, bound)
			}
		}
		slices.Sort(lines)
		t.Logf("%s: admitted per key and window (a+b; %d straddling an edge not counted), bound %d: %s", phase, straddling, bound, strings.Join(lines, ", "))
	}

	// Joined: a warm-up through the proxy without its delay, then rounds
	// without and with it, alternated so that the machine's drift falls
	// on both alike: each region's checks per second should not change.
	// The warm-up's first second is not counted: the first checks in the
	// region away from a key's home wait for its first slice.
	start := time.Now()
	cs := load(3 * time.Second)
	summary("warm-up", cs, 3*time.Second)
	check("warm-up", cs, limit, start.Add(time.Second).Truncate(time.Second).Add(time.Second))
	const round, phase = 3 * time.Second, 6 * time.Second
	var sums [2][2]float64 // [delayed][region]
	var delayed []regionCall
	for i := range 4 {
		d := time.Duration(i%2) * delay
		proxy.SetDelay(d, 0) // the calls already open get it from their next piece of data
		start = time.Now()
		cs = load(round)
		ps := summary(fmt.Sprintf("joined, round %d, proxy delay %v each way", i+1, d), cs, round)
		check(fmt.Sprintf("joined, round %d", i+1), cs, limit, start.Truncate(time.Second).Add(time.Second))
		for r := range 2 {
			sums[i%2][r] += ps[r]
		}
		if d > 0 {
			delayed = append(delayed, cs...)
		}
	}
	t.Logf("checks per second with the delay / without, over two rounds of each (same load, same machine, alternated): region a %.2f, region b %.2f",
		sums[1][0]/sums[0][0], sums[1][1]/sums[0][1])
	cs = delayed
	for r := range 2 {
		if m := median(cs, r); m >= 2*delay {
			t.Errorf("joined: region %c's median check took %v, at least a trip through the proxy and back (%v): checks wait on the other region", 'a'+r, m, 2*delay)
		}
	}
	var bAdmitted, aAdmitted int
	for _, rc := range cs {
		if rc.admitted && rc.region == 1 {
			bAdmitted++
		} else if rc.admitted {
			aAdmitted++
		}
	}
	if aAdmitted == 0 || bAdmitted == 0 {
		t.Fatalf("joined: region a admitted %d, b %d: want both some (each key's home lends to the other)", aAdmitted, bAdmitted)
	}

	// Cut: the proxy closed, and nothing else between the regions.
	proxy.Close()
	cutAt := time.Now()
	share := limit / 2
	cs = load(phase)
	summary("cut", cs, phase)
	check("cut", cs, limit+share, cutAt)
	var errs int
	for _, rc := range cs {
		if rc.err != "" {
			errs++
		}
	}
	if errs > 0 {
		t.Errorf("cut: %d checks failed: every check gets a decision", errs)
	}
	var fallback float64
	for _, h := range c.Hosts {
		fallback += h.metricSum("sluice_region_fallback_checks_total")
	}
	if fallback == 0 {
		t.Errorf("cut: no check was decided from a fallback share")
	}
	t.Logf("cut: %.0f checks decided from a fallback share", fallback)

	// Healed.
	openProxy(delay)
	healAt := time.Now()
	cs = load(phase)
	summary("healed", cs, phase)
	check("healed (the heal's windows)", cs, limit+share, healAt)
	check("healed", cs, limit, healAt.Add(2*time.Second).Truncate(time.Second).Add(time.Second))
}
