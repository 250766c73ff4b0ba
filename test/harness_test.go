package test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// sluiceBinary builds cmd/sluice once per test binary run.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "sluice")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is one `sluice serve` process.
type proc struct {
	name               string
	grpc, http, gossip string
	dataDir            string
	cmd                *exec.Cmd
	log                *bytes.Buffer
	exited             chan struct{}
	err                error
	join               []string
	extra              []string
}

// freePort returns a port free for TCP (and UDP when udp) on ip.
func freePort(t *testing.T, ip string, udp bool) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		if udp {
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				l.Close()
				continue
			}
			u.Close()
		}
		l.Close()
		return addr
	}
	t.Fatal("no free port")
	return ""
}

// newProc prepares (does not start) a node on its own loopback address.
func newProc(t *testing.T, i int, ip string) *proc {
	return &proc{
		name:    fmt.Sprintf("node-%d", i),
		grpc:    freePort(t, ip, false),
		http:    freePort(t, ip, false),
		gossip:  freePort(t, ip, true),
		dataDir: t.TempDir(),
	}
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	args := []string{"serve", "--node-name", p.name, "--grpc-addr", p.grpc, "--http-addr", p.http,
		"--gossip-addr", p.gossip, "--data-dir", p.dataDir, "--log-level", "debug",
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
	p.cmd = exec.Command(sluiceBinary(t), args...)
	if p.log == nil {
		p.log = &bytes.Buffer{}
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

func dial(t *testing.T, addr string) *transport.Client {
	t.Helper()
	c, err := transport.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
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

// waitMembers waits until every process sees exactly the given processes
// alive and in the ring (a joining node owns nothing until it has joined).
func waitMembers(t *testing.T, ps []*proc) {
	t.Helper()
	clients := make([]*transport.Client, len(ps))
	for i, p := range ps {
		clients[i] = dial(t, p.grpc)
	}
	waitFor(t, 30*time.Second, "every node sees every node alive", func() bool {
		for _, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx)
			cancel()
			if err != nil {
				return false
			}
			alive := 0
			for _, m := range st.Members {
				if m.State == "alive" && m.Share > 0 {
					alive++
				}
				if m.State == "suspect" {
					// Still a member (and in the ring) until declared
					// dead: the membership has not settled.
					return false
				}
			}
			if alive != len(ps) {
				return false
			}
		}
		return true
	})
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

func checkReq(name, key string, hits, limit, windowMS int64) *sluicev1.CheckRequest {
	return &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
		Name: name, Key: key, Hits: hits, Limit: limit, WindowMs: windowMS,
	}}}
}
