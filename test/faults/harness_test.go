//go:build faults && linux

package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/test/testsupport"
	"github.com/sluicehq/sluice/transport"
)

// Ports every node listens on: each node has an address of its own.
const (
	grpcPort   = 8081
	httpPort   = 8080
	gossipPort = 7946
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
	return testsupport.SluiceBinary(t, "sluice-faults-")
}

// Cluster is N hosts, each a network namespace with one veth on a bridge
// that lives in a namespace of its own (the test's vantage point).
type Cluster struct {
	t      *testing.T
	id     string // unique: "f<pid>-<hex>"
	subnet string // "10.213.<x>."
	brNS   string // the bridge's namespace; the test dials from here
	brFD   int    // open handle on brNS, for setns
	Hosts  []*Host
	http   *http.Client

	// Extra are flags every node gets after the harness's own.
	Extra []string
}

// Host is one node: a namespace, an address and a `sluice serve` process.
type Host struct {
	c       *Cluster
	Index   int
	Name    string // node name, n0 … n<N-1>
	NS      string
	IP      string
	DataDir string
	Env     []string // added to the process's environment (KEY=value) at each start
	// throttled: Throttle put tbf on this host's link (tests change it from
	// the test goroutine only).
	throttled bool
	client    *transport.Client
	disk      *disk // its data dir's own filesystem (disk_test.go), nil when none

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	log    *logBuf
}

func (h *Host) GRPCAddr() string   { return net.JoinHostPort(h.IP, strconv.Itoa(grpcPort)) }
func (h *Host) HTTPAddr() string   { return net.JoinHostPort(h.IP, strconv.Itoa(httpPort)) }
func (h *Host) GossipAddr() string { return net.JoinHostPort(h.IP, strconv.Itoa(gossipPort)) }

// run runs a command, failing the test with its output when it fails.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := runErr(nil, name, args...); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func runErr(stdin []byte, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return cmd.CombinedOutput()
}

// staleName matches the namespaces of this harness: sluice-f<pid>-<hex>-….
var staleName = regexp.MustCompile(`^sluice-f(\d+)-[0-9a-f]+-`)

// sweepStale deletes the namespaces a killed earlier run left behind (its
// PID no longer exists). The processes in them died with that run
// (Pdeathsig).
func sweepStale(t *testing.T) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		m := staleName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			continue // its run is alive
		}
		if out, err := runErr(nil, "ip", "netns", "del", e.Name()); err != nil {
			t.Logf("removing stale namespace %s: %v %s", e.Name(), err, out)
		} else {
			t.Logf("removed stale namespace %s", e.Name())
		}
	}
}

// New creates n hosts (namespaces, veths, bridge, addresses, iptables
// chains) without starting any process. It skips the test when the
// machine cannot: not root, or no network namespaces.
func New(t *testing.T, n int) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fault tests need root (network namespaces, iptables)")
	}
	for _, tool := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("fault tests need %s: %v", tool, err)
		}
	}
	if n < 1 || n > 200 {
		t.Fatalf("hosts: %d", n)
	}
	sweepStale(t)
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{
		t:      t,
		id:     fmt.Sprintf("f%d-%s", os.Getpid(), hex.EncodeToString(rnd[:2])),
		subnet: fmt.Sprintf("10.213.%d.", rnd[2]),
		brFD:   -1,
	}
	c.brNS = "sluice-" + c.id + "-br"

	// The probe: can this machine make a namespace at all?
	if out, err := runErr(nil, "ip", "netns", "add", c.brNS); err != nil {
		t.Skipf("ip netns add fails here (%v: %s): no fault tests", err, bytes.TrimSpace(out))
	}
	var created []string
	created = append(created, c.brNS)
	// Registered first, so it runs last: after every process is gone.
	t.Cleanup(func() {
		if c.brFD >= 0 {
			syscall.Close(c.brFD)
		}
		for _, ns := range created {
			if out, err := runErr(nil, "ip", "netns", "del", ns); err != nil {
				t.Errorf("ip netns del %s: %v %s", ns, err, out)
			}
		}
	})

	inBr := func(args ...string) { run(t, "ip", append([]string{"-n", c.brNS}, args...)...) }
	inBr("link", "set", "lo", "up")
	inBr("link", "add", "br0", "type", "bridge")
	inBr("addr", "add", c.subnet+"254/24", "dev", "br0")
	inBr("link", "set", "br0", "up")

	for i := range n {
		h := &Host{c: c, Index: i, Name: fmt.Sprintf("n%d", i),
			NS: fmt.Sprintf("sluice-%s-%d", c.id, i), IP: fmt.Sprintf("%s%d", c.subnet, i+1),
			DataDir: t.TempDir(), log: &logBuf{}}
		run(t, "ip", "netns", "add", h.NS)
		created = append(created, h.NS)
		veth := fmt.Sprintf("v%d", i)
		// Both ends are made inside the namespaces: no name in the host's.
		inBr("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
		inBr("link", "set", veth, "master", "br0")
		inBr("link", "set", veth, "up")
		inNS := func(args ...string) { run(t, "ip", append([]string{"-n", h.NS}, args...)...) }
		inNS("link", "set", "lo", "up")
		inNS("addr", "add", h.IP+"/24", "dev", "eth0")
		inNS("link", "set", "eth0", "up")
		// Faults go into the FAULTS chain, which sees every packet in and
		// out of eth0 (not loopback); Heal empties it.
		h.iptablesRestore(t, "*filter\n:FAULTS - [0:0]\n-A INPUT ! -i lo -j FAULTS\n-A OUTPUT ! -o lo -j FAULTS\nCOMMIT\n", false)
		c.Hosts = append(c.Hosts, h)
	}

	fd, err := syscall.Open("/run/netns/"+c.brNS, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open the bridge namespace: %v", err)
	}
	c.brFD = fd
	c.http = &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: c.dialContext, DisableKeepAlives: true}}
	t.Logf("cluster %s: %d hosts on %s0/24 (bridge in %s)", c.id, n, c.subnet, c.brNS)
	return c
}

// dialContext dials from the bridge's namespace: a goroutine locks its
// thread, moves the thread there and makes the socket, which stays in that
// namespace. The thread is never unlocked, so it ends with the goroutine and
// no other goroutine ever runs in that namespace.
func (c *Cluster) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(c.brFD, unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %v", c.brNS, err)}
			return
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}

// Client is the gRPC client of h, dialled from the bridge's namespace; it
// reconnects across restarts.
func (h *Host) Client() *transport.Client {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client == nil {
		cl, err := transport.Dial(h.GRPCAddr(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return h.c.dialContext(ctx, "tcp", addr)
		}))
		if err != nil {
			h.c.t.Fatal(err)
		}
		h.client = cl
		h.c.t.Cleanup(func() { cl.Close() })
	}
	return h.client
}

// Get fetches path from h's HTTP port.
func (h *Host) Get(path string) (int, string, error) {
	resp, err := h.c.http.Get("http://" + h.HTTPAddr() + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// Start starts h's `sluice serve` inside its namespace, joining the given
// hosts (none: it is the first).
func (h *Host) Start(join ...*Host) {
	t := h.c.t
	t.Helper()
	args := []string{"netns", "exec", h.NS, sluiceBinary(t), "serve",
		"--node-name", h.Name,
		"--grpc-addr", h.GRPCAddr(), "--http-addr", h.HTTPAddr(), "--gossip-addr", h.GossipAddr(),
		"--data-dir", h.DataDir, "--cluster-name", "faults-" + h.c.id, "--log-level", "debug"}
	var seeds []string
	for _, j := range join {
		seeds = append(seeds, j.GossipAddr())
	}
	if len(seeds) > 0 {
		args = append(args, "--join", strings.Join(seeds, ","))
	}
	args = append(args, h.c.Extra...)
	// `ip netns exec` enters the namespace and execs the binary: the PID
	// is sluice's own.
	cmd := exec.Command("ip", args...)
	fmt.Fprintf(h.log, "=== start %s in %s\n", h.Name, h.NS)
	cmd.Stdout, cmd.Stderr = h.log, h.log
	if len(h.Env) > 0 {
		cmd.Env = append(os.Environ(), h.Env...)
	}
	// If the test binary dies, the node dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	if err := startOnLockedThread(cmd); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.cmd, h.exited = cmd, exited
	h.mu.Unlock()
	go func() {
		err := cmd.Wait()
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
		close(exited)
	}()
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			// SIGKILL also ends a stopped process.
			syscall.Kill(pid, syscall.SIGKILL)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				t.Errorf("%s (pid %d) did not exit after SIGKILL", h.Name, pid)
			}
		}
		if t.Failed() {
			h.mu.Lock()
			err := h.err
			h.mu.Unlock()
			t.Logf("log of %s (exit: %v):\n%s", h.Name, err, h.log.String())
		}
	})
	// The process must become sluice itself (not a shell around it), or
	// signals would miss it.
	bin := sluiceBinary(t)
	waitFor(t, 10*time.Second, h.Name+" runs as pid "+strconv.Itoa(pid), func() bool {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return err == nil && exe == bin || h.Exited()
	})
	if h.Exited() {
		t.Fatalf("%s exited at once: %v\n%s", h.Name, h.err, h.log.String())
	}
}

// starter is one OS thread, locked for the life of the test binary, that
// starts every node: Pdeathsig fires when the thread that forked a child
// exits, and this one exits only with the process.
var (
	starterOnce sync.Once
	starts      chan startReq
)

type startReq struct {
	cmd  *exec.Cmd
	done chan error
}

func startOnLockedThread(cmd *exec.Cmd) error {
	starterOnce.Do(func() {
		starts = make(chan startReq)
		go func() {
			runtime.LockOSThread()
			for r := range starts {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	starts <- startReq{cmd, done}
	return <-done
}

// PID is the process's id.
func (h *Host) PID() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cmd.Process.Pid
}

// Exited says whether the process has exited.
func (h *Host) Exited() bool {
	h.mu.Lock()
	ch := h.exited
	h.mu.Unlock()
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Pause stops the process (SIGSTOP) and waits until the kernel shows it
// stopped; Resume continues it. A paused host is resumed in the cleanup.
func (h *Host) Pause() {
	t := h.c.t
	t.Helper()
	pid := h.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	waitFor(t, 10*time.Second, h.Name+" is stopped", func() bool { return procState(pid) == 'T' })
}

func (h *Host) Resume() {
	t := h.c.t
	t.Helper()
	pid := h.PID()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, h.Name+" runs again", func() bool { s := procState(pid); return s != 'T' && s != 0 })
}

// Kill9 kills the process with SIGKILL and waits for its exit.
func (h *Host) Kill9() {
	t := h.c.t
	t.Helper()
	if err := syscall.Kill(h.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	ch := h.exited
	h.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit after SIGKILL", h.Name)
	}
}

// Restart starts the host again on the same data directory, joining every
// other host.
func (h *Host) Restart() {
	h.c.t.Helper()
	if !h.Exited() {
		h.c.t.Fatalf("%s is still running", h.Name)
	}
	var others []*Host
	for _, o := range h.c.Hosts {
		if o != h {
			others = append(others, o)
		}
	}
	h.Start(others...)
}

// procState returns the state letter of process pid (R, S, T, …), or 0.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// StartAll starts every host, the first alone and the others joining it,
// and waits until every one sees all of them alive.
func (c *Cluster) StartAll() {
	c.t.Helper()
	for i, h := range c.Hosts {
		if i == 0 {
			h.Start()
		} else {
			h.Start(c.Hosts[0])
		}
	}
	c.WaitViews(60*time.Second, c.Hosts)
}

// iptablesRestore loads rules into h's namespace (noflush: added to what is
// there).
func (h *Host) iptablesRestore(t *testing.T, rules string, noflush bool) {
	t.Helper()
	args := []string{"netns", "exec", h.NS, "iptables-restore", "-w"}
	if noflush {
		args = append(args, "--noflush")
	}
	if out, err := runErr([]byte(rules), "ip", args...); err != nil {
		t.Fatalf("iptables-restore in %s: %v\n%s\nrules:\n%s", h.NS, err, out, rules)
	}
}

// addRules appends rules ("-s 10.213.… -j DROP") to h's FAULTS chain at once.
func (h *Host) addRules(rules []string) {
	if len(rules) == 0 {
		return
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, r := range rules {
		b.WriteString("-A FAULTS " + r + "\n")
	}
	b.WriteString("COMMIT\n")
	h.iptablesRestore(h.c.t, b.String(), true)
}

// Partition cuts every host of one side from every host of the others, in
// both directions; hosts in no side keep their links. The test process (on
// the bridge) still reaches every host, as clients on both sides would.
func (c *Cluster) Partition(sides ...[]*Host) {
	c.t.Helper()
	side := map[*Host]int{}
	for i, s := range sides {
		for _, h := range s {
			side[h] = i + 1
		}
	}
	for h, sh := range side {
		var rules []string
		for o, so := range side {
			if so != sh {
				rules = append(rules, "-s "+o.IP+" -j DROP")
			}
		}
		h.addRules(rules)
	}
}

// DropFrom makes to deaf to from: every packet from from to to is dropped,
// while to's packets still reach from (one-way loss).
func (c *Cluster) DropFrom(to, from *Host) {
	c.t.Helper()
	to.addRules([]string{"-s " + from.IP + " -j DROP"})
}

// Lossy drops a random share (0..1) of the packets in and out of h,
// between hosts and with the test's clients alike.
func (c *Cluster) Lossy(h *Host, share float64) {
	c.t.Helper()
	h.addRules([]string{fmt.Sprintf("-m statistic --mode random --probability %.4f -j DROP", share)})
}

// Heal removes every network fault.
func (c *Cluster) Heal() {
	c.t.Helper()
	for _, h := range c.Hosts {
		h.iptablesRestore(c.t, "*filter\n-F FAULTS\nCOMMIT\n", true)
		c.Unthrottle(h)
	}
}

// throttleLatency is how long tbf lets a packet wait for tokens before it
// drops it.
const throttleLatency = "400ms"

// Throttle limits h's link to rateBits bits per second each way, with tc's
// token bucket filter (tbf) on both ends of its veth: burstBytes may pass at
// line rate, then packets wait for tokens (up to throttleLatency, then they
// are dropped). Unthrottle and Heal remove it. It skips the test where tc
// is missing.
func (c *Cluster) Throttle(h *Host, rateBits int64, burstBytes int) {
	c.t.Helper()
	if _, err := exec.LookPath("tc"); err != nil {
		c.t.Skipf("throttling needs tc: %v", err)
	}
	args := []string{"qdisc", "replace", "dev", "", "root", "tbf",
		"rate", fmt.Sprintf("%dbit", rateBits), "burst", strconv.Itoa(burstBytes), "latency", throttleLatency}
	args[3] = "eth0"
	run(c.t, "tc", append([]string{"-n", h.NS}, args...)...) // what h sends
	args[3] = fmt.Sprintf("v%d", h.Index)
	run(c.t, "tc", append([]string{"-n", c.brNS}, args...)...) // what h receives
	h.throttled = true
}

// Unthrottle removes Throttle's limits from h's link, if any.
func (c *Cluster) Unthrottle(h *Host) {
	c.t.Helper()
	if !h.throttled {
		return
	}
	run(c.t, "tc", "-n", h.NS, "qdisc", "del", "dev", "eth0", "root")
	run(c.t, "tc", "-n", c.brNS, "qdisc", "del", "dev", fmt.Sprintf("v%d", h.Index), "root")
	h.throttled = false
}

// View is what one host sees: each member's state ("alive", "suspect",
// "dead", "left") and whether it owns part of the ring.
type View map[string]string

// View asks h for its membership view.
func (h *Host) View() (View, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := h.Client().Status(ctx)
	if err != nil {
		return nil, err
	}
	v := View{}
	for _, m := range st.Members {
		s := m.State
		if s == "alive" && m.Share == 0 {
			s = "joining"
		}
		v[m.Name] = s
	}
	return v, nil
}

// sees says whether v has exactly the hosts in want alive (in the ring) and
// nobody suspect or joining.
func (v View) sees(want []*Host) bool {
	alive := 0
	for _, s := range v {
		switch s {
		case "alive":
			alive++
		case "suspect", "joining":
			return false
		}
	}
	if alive != len(want) {
		return false
	}
	for _, h := range want {
		if v[h.Name] != "alive" {
			return false
		}
	}
	return true
}

// WaitViews waits until every host of each group sees exactly its group
// alive, and returns how long that took.
func (c *Cluster) WaitViews(within time.Duration, groups ...[]*Host) time.Duration {
	c.t.Helper()
	start := time.Now()
	var last []string
	deadline := start.Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		last = last[:0]
		for _, g := range groups {
			for _, h := range g {
				v, err := h.View()
				if err != nil || !v.sees(g) {
					ok = false
				}
				last = append(last, fmt.Sprintf("%s: %v %v", h.Name, v, err))
			}
		}
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("views did not settle within %v; last seen: %s", within, strings.Join(last, "; "))
		}
		<-tick.C
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		<-tick.C
	}
}

// Metric returns one unlabelled sample of h's /metrics (ok false when absent).
func (h *Host) Metric(name string) (float64, bool) {
	code, body, err := h.Get("/metrics")
	if err != nil || code != 200 {
		return 0, false
	}
	for l := range strings.Lines(body) {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// logBuf is testsupport.LogBuffer: a process's or a logger's output, safe
// to read while it is written.
type logBuf = testsupport.LogBuffer
