package test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/test/testsupport"
)

// TestMain runs the tests, then removes the binary sluiceBinary built,
// whatever the tests' outcome.
func TestMain(m *testing.M) {
	code := m.Run()
	testsupport.RemoveBinary()
	os.Exit(code)
}

// sluiceBinary builds cmd/sluice once per test binary run; TestMain
// removes it at the end.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	return testsupport.SluiceBinary(t, "sluice-e2e-")
}

// proc is one `sluice serve` process.
type proc struct {
	name               string
	grpc, http, gossip string
	dataDir            string
	cmd                *exec.Cmd
	log                *logBuf
	exited             chan struct{}
	err                error
	join               []string
	extra              []string
	bin                string // the sluice binary to run; sluiceBinary's when empty
}

// freePort returns a port free for TCP (and UDP when udp) on ip.
func freePort(t *testing.T, ip string, udp bool) string {
	t.Helper()
	return pickPort(t, ip, udp, 50, func() int { return 0 })
}

// lowPort returns a port below 32768 (outside Linux's ephemeral range, so
// that the nodes' own outgoing connections never take it), free on TCP and
// UDP when udp, on ip.
func lowPort(t *testing.T, ip string, udp bool) string {
	t.Helper()
	return pickPort(t, ip, udp, 200, func() int { return 20000 + rand.IntN(12000) })
}

// pickPort listens on ip at port() (0: any), up to tries times, and
// returns the first address that was free on TCP and, when udp, on UDP,
// and that no other pick of this test binary returned.
func pickPort(t *testing.T, ip string, udp bool, tries int, port func() int) string {
	t.Helper()
	addr, err := pickAddr(ip, udp, tries, port)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// handedOut holds every address pickAddr returned in this test binary.
// Tests running in parallel share loopback addresses: an address is free
// when picked, but its node binds it later, so two picks that returned the
// same port on the same address would let one test's node take another's
// (a node of TestJoinMovesTheKeysBeyondTheCache failed to start that way
// in CI, "bind: address already in use").
var handedOut struct {
	sync.Mutex
	addrs map[string]bool
}

func pickAddr(ip string, udp bool, tries int, port func() int) (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range tries {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port())))
		if err != nil {
			continue
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
		if handedOut.addrs[addr] {
			l.Close()
			continue
		}
		if udp {
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				l.Close()
				continue
			}
			u.Close()
		}
		l.Close()
		if handedOut.addrs == nil {
			handedOut.addrs = map[string]bool{}
		}
		handedOut.addrs[addr] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free port on %s in %d tries", ip, tries)
}

// newProc prepares (does not start) a node on its own loopback address,
// on ports below 32768 (lowPort): a port from the ephemeral range, free
// when picked, can be taken by any process's outgoing connection before
// the node binds it or between two of its starts (a node of
// TestMultiLimitCheckIsAtomic failed to start that way in CI, "bind:
// address already in use").
func newProc(t *testing.T, i int, ip string) *proc {
	return newProcOn(t, i, ip, lowPort)
}

func newProcOn(t *testing.T, i int, ip string, port func(*testing.T, string, bool) string) *proc {
	return &proc{
		name:    fmt.Sprintf("node-%d", i),
		grpc:    port(t, ip, false),
		http:    port(t, ip, false),
		gossip:  port(t, ip, true),
		dataDir: t.TempDir(),
	}
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	args := []string{"serve", "--node-name", p.name, "--grpc-addr", p.grpc, "--http-addr", p.http,
		"--gossip-addr", p.gossip, "--data-dir", p.dataDir, "--log-level", "debug",
		// The figures in docs/guarantees.md and these tests' deadlines
		// were measured with fast failure detection (a crash agreed on
		// within about 3 s); the default, lan, is for larger clusters
		// (make scale, make deploy-scale).
		"--failure-detection", "fast",
		// Tests run in parallel on the same loopback addresses: a node that
		// reconnects to a dead member's address must never reach another
		// test's cluster.
		"--cluster-name", t.Name(),
		// A forward that times out after the owner decided is decided again
		// by the replica: generous on a busy test machine.
		"--forward-timeout", "1s"}
	for _, j := range p.join {
		args = append(args, "--join", j)
	}
	args = append(args, p.extra...)
	bin := p.bin
	if bin == "" {
		bin = sluiceBinary(t)
	}
	p.cmd = exec.Command(bin, args...)
	if p.log == nil {
		p.log = &logBuf{}
	}
	fmt.Fprintf(p.log, "=== start %s\n", p.name)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.exited = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd, exited := p.cmd, p.exited
	go func() { p.err = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("log of %s:\n%s", p.name, p.log.String())
		}
	})
}

// stop sends sig and waits for the process to exit, returning its error.
func (p *proc) stop(t *testing.T, sig syscall.Signal, within time.Duration) error {
	t.Helper()
	p.signal(t, sig)
	return p.wait(t, sig, within)
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// wait waits for the process to exit after sig, returning its error.
func (p *proc) wait(t *testing.T, sig syscall.Signal, within time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v of %v", p.name, within, sig)
		return nil
	}
}

// logBuf is testsupport.LogBuffer: a process's or a logger's output, safe
// to read while it is written.
type logBuf = testsupport.LogBuffer

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *client.Node {
	t.Helper()
	c, err := client.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitUntil(d, cond) {
		t.Fatalf("timed out after %v waiting until %s", d, what)
	}
}

// waitUntil polls cond until it holds or d has passed, and reports whether
// it held: for a caller that says more than waitFor when it did not.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// waitMembers waits until every process sees exactly the given processes
// alive and in the ring (a joining node owns nothing until it has joined).
func waitMembers(t *testing.T, ps []*proc, opts ...grpc.DialOption) {
	t.Helper()
	clients := make([]*client.Node, len(ps))
	for i, p := range ps {
		clients[i] = dial(t, p.grpc, opts...)
	}
	var last string // what the last poll saw, for the failure message
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		var seen []string
		for _, p := range ps {
			select {
			case <-p.exited:
				t.Fatalf("%s exited while the cluster formed: %v", p.name, p.err)
			default:
			}
		}
		for i, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx)
			cancel()
			if err != nil {
				ok = false
				seen = append(seen, fmt.Sprintf("node %d: %v", i, err))
				continue
			}
			alive := 0
			var ms []string
			for _, m := range st.Members {
				ms = append(ms, fmt.Sprintf("%s=%s/%.2f", m.Name, m.State, m.Share))
				if m.State == "alive" && m.Share > 0 {
					alive++
				}
				if m.State == "suspect" {
					// Still a member (and in the ring) until declared
					// dead: the membership has not settled.
					ok = false
				}
			}
			if alive != len(ps) {
				ok = false
			}
			seen = append(seen, fmt.Sprintf("node %d sees %v", i, ms))
		}
		if ok {
			return
		}
		last = strings.Join(seen, "; ")
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting until every node sees every node alive; last seen: %s", last)
		}
		<-tick.C
	}
}

// startCluster starts k nodes on 127.0.0.x addresses, each joining the
// first, and waits until they all see each other.
func startCluster(t *testing.T, k int) []*proc {
	t.Helper()
	ps := make([]*proc, k)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", 10+i))
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)
	return ps
}

// startClusterAt starts k nodes on ip, each with the extra flags, the
// others joining the first, and waits until every node sees every node.
func startClusterAt(t *testing.T, ip string, k int, extra ...string) []*proc {
	t.Helper()
	ps := make([]*proc, k)
	for i := range ps {
		ps[i] = newProc(t, i, ip)
		ps[i].extra = extra
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)
	return ps
}

// checkOne sends one check to c and returns its answer; a failed call or
// an item error fails the test.
func checkOne(t *testing.T, c *client.Node, req *sluicev1.RateLimitRequest) *sluicev1.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{req}})
	if err != nil || resp.Responses[0].Error != "" {
		t.Fatalf("check %s/%s: %v %v", req.Name, req.Key, err, resp)
	}
	return resp.Responses[0]
}

func checkReq(name, key string, hits, limit, windowMS int64) *sluicev1.CheckRequest {
	return &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
		Name: name, Key: key, Hits: proto.Int64(hits), Limit: limit, WindowMs: windowMS,
	}}}
}

// scrape returns the value of every unlabelled sample at url (/metrics).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	return scrapeWith(t, http.DefaultClient, url)
}

// scrapeWith is scrape through c (for a node with TLS).
func scrapeWith(t *testing.T, c *http.Client, url string) map[string]float64 {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for l := range strings.Lines(string(body)) {
		f := strings.Fields(l)
		if len(f) == 2 && !strings.HasPrefix(l, "#") {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			m[f[0]] = v
		}
	}
	return m
}

// metric returns one sample of /metrics, failing the test when it is absent.
func metric(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	v, ok := scrape(t, "http://"+p.http+"/metrics")[name]
	if !ok {
		t.Fatalf("%s has no metric %s", p.name, name)
	}
	return v
}
