package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// docker runs the docker CLI and returns its combined output and exit code.
func docker(t *testing.T, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	return string(out) + err.Error(), -1
}

// TestContainersFormAClusterAndEnforceALimit builds the scratch image from
// deploy/docker, runs three nodes on a private Docker network, and checks
// through the CLI inside the containers that they form one cluster, admit
// exactly the limit across nodes, and stop gracefully. It skips where no
// Docker engine answers.
func TestContainersFormAClusterAndEnforceALimit(t *testing.T) {
	if testing.Short() {
		t.Skip("container test")
	}
	if _, code := docker(t, 10*time.Second, "info", "--format", "{{.ServerVersion}}"); code != 0 {
		t.Skip("no Docker engine answers")
	}
	t.Parallel()
	id := fmt.Sprintf("%08x", rand.Uint32())
	tag, network := "sluice-test:"+id, "sluice-test-"+id
	_, file, _, _ := runtime.Caller(0)
	build := filepath.Join(filepath.Dir(file), "..", "deploy", "docker", "build.sh")
	if out, err := exec.Command("bash", build, tag).CombinedOutput(); err != nil {
		t.Fatalf("building the image: %v\n%s", err, out)
	}
	t.Cleanup(func() { docker(t, time.Minute, "image", "rm", "-f", tag) })
	if out, code := docker(t, time.Minute, "network", "create", network); code != 0 {
		t.Fatalf("network create: %s", out)
	}
	t.Cleanup(func() { docker(t, time.Minute, "network", "rm", network) })

	names := []string{"n1-" + id, "n2-" + id, "n3-" + id}
	for i, n := range names {
		args := []string{"run", "-d", "--name", n, "--hostname", n, "--network", network,
			"-e", "SLUICE_NODE_NAME=" + n}
		if i > 0 {
			args = append(args, "-e", "SLUICE_JOIN="+names[0]+":7946")
		}
		if out, code := docker(t, time.Minute, append(args, tag)...); code != 0 {
			t.Fatalf("run %s: %s", n, out)
		}
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := docker(t, time.Minute, "logs", "--tail", "50", n)
				t.Logf("logs of %s:\n%s", n, out)
			}
			docker(t, time.Minute, "rm", "-f", n)
		})
	}
	sluice := func(node string, args ...string) (string, int) {
		return docker(t, 30*time.Second, append([]string{"exec", node, "/sluice"}, args...)...)
	}
	waitFor(t, 60*time.Second, "three containers see each other alive", func() bool {
		out, code := sluice(names[0], "status", "--addr", "127.0.0.1:8081", "--json")
		if code != 0 {
			return false
		}
		var st struct {
			Members []struct{ State string } `json:"members"`
		}
		if json.Unmarshal([]byte(out), &st) != nil {
			return false
		}
		alive := 0
		for _, m := range st.Members {
			if m.State == "alive" {
				alive++
			}
		}
		return alive == 3
	})
	for i, want := range []int{0, 0, 0, 0, 0, 1, 1} {
		out, code := sluice(names[i%3], "check", "--addr", "127.0.0.1:8081", "--name", "ctr", "--key", "k",
			"--limit", "5", "--window", "8760h")
		if code != want {
			t.Fatalf("check %d in %s exited %d, want %d: %s", i, names[i%3], code, want, out)
		}
	}
	// A graceful stop (SIGTERM) exits 0.
	if out, code := docker(t, time.Minute, "stop", "--time", "30", names[2]); code != 0 {
		t.Fatalf("stop: %s", out)
	}
	out, _ := docker(t, 30*time.Second, "inspect", "--format", "{{.State.ExitCode}}", names[2])
	if strings.TrimSpace(out) != "0" {
		t.Fatalf("%s exited with %q after SIGTERM, want 0", names[2], strings.TrimSpace(out))
	}
	// The survivors keep the count.
	if out, code := sluice(names[1], "check", "--addr", "127.0.0.1:8081", "--name", "ctr", "--key", "k",
		"--limit", "5", "--window", "8760h"); code != 1 {
		t.Fatalf("after the stop a check exited %d, want 1 (limit reached): %s", code, out)
	}
}
