//go:build faults && linux

package faults

// The harness: a Cluster of Hosts, each a `sluice serve` process in its own
// network namespace, built by New, with clients and HTTP calls to a host.

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

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/test/testsupport"
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
	client    *client.Node
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
func (h *Host) Client() *client.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client == nil {
		cl, err := client.Dial(h.GRPCAddr(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
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

// logBuf is testsupport.LogBuffer: a process's or a logger's output, safe
// to read while it is written.
type logBuf = testsupport.LogBuffer
