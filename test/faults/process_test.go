//go:build faults && linux

package faults

// The hosts' processes: start (on a locked thread, for the network
// namespace), pause and resume (SIGSTOP, SIGCONT), kill -9, restart, and
// their state.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Start starts h's `sluice serve` inside its namespace, joining the given
// hosts (none: it is the first).
func (h *Host) Start(join ...*Host) {
	t := h.c.t
	t.Helper()
	args := []string{"netns", "exec", h.NS, sluiceBinary(t), "serve",
		"--node-name", h.Name,
		"--grpc-addr", h.GRPCAddr(), "--http-addr", h.HTTPAddr(), "--gossip-addr", h.GossipAddr(),
		"--data-dir", h.DataDir, "--cluster-name", "faults-" + h.c.id, "--log-level", "debug",
		// docs/guarantees.md's fault figures are fast failure detection's.
		"--failure-detection", "fast"}
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
