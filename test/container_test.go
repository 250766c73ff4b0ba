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
// Long on purpose: one story (build, run three containers, check, stop).
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
		// A node with neither TLS nor a gossip key listens on loopback
		// unless its addresses are given: on the container's network,
		// as compose and the Kubernetes manifests give them.
		args := []string{"run", "-d", "--name", n, "--hostname", n, "--network", network,
			"-e", "SLUICE_NODE_NAME=" + n, "-e", "SLUICE_GRPC_ADDR=:8081", "-e", "SLUICE_HTTP_ADDR=:8080", "-e", "SLUICE_GOSSIP_ADDR=:7946"}
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

// TestComposeClusterSurvivesAStop brings up deploy/compose's three nodes
// with docker-compose against the real engine (a fresh image and project,
// host ports chosen by the engine), waits until the image's HEALTHCHECK
// (`sluice health`) reports every container healthy, runs checks through
// each node, stops one and checks that the survivors keep the count and
// keep answering. It skips where no Docker engine or docker-compose
// answers.
// Long on purpose: one story (compose up, check, stop a node, check again).
func TestComposeClusterSurvivesAStop(t *testing.T) {
	if testing.Short() {
		t.Skip("container test")
	}
	if _, code := docker(t, 10*time.Second, "info", "--format", "{{.ServerVersion}}"); code != 0 {
		t.Skip("no Docker engine answers")
	}
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose is not installed")
	}
	t.Parallel()
	id := fmt.Sprintf("%08x", rand.Uint32())
	tag, project := "sluice-test:"+id, "sluice-test-"+id
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	if out, err := exec.Command("bash", filepath.Join(root, "deploy", "docker", "build.sh"), tag).CombinedOutput(); err != nil {
		t.Fatalf("building the image: %v\n%s", err, out)
	}
	t.Cleanup(func() { docker(t, time.Minute, "image", "rm", "-f", tag) })
	composeFile := filepath.Join(root, "deploy", "compose", "docker-compose.yml")
	dc := func(timeout time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, compose, append([]string{"-p", project, "-f", composeFile}, args...)...)
		cmd.Env = append(cmd.Environ(), "SLUICE_IMAGE="+tag, "SLUICE_PUBLISH_HTTP=127.0.0.1:", "SLUICE_PUBLISH_GRPC=127.0.0.1:")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := dc(time.Minute, "logs", "--tail", "40")
			t.Logf("logs:\n%s", out)
		}
		if out, err := dc(2*time.Minute, "down", "-v", "--timeout", "30"); err != nil {
			t.Errorf("docker-compose down: %v\n%s", err, out)
		}
	})
	if out, err := dc(3*time.Minute, "up", "-d"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	services := []string{"node-1", "node-2", "node-3"}
	ids := map[string]string{}
	for _, s := range services {
		out, err := dc(time.Minute, "ps", "-q", s)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("docker-compose ps -q %s: %v %s", s, err, out)
		}
		ids[s] = strings.TrimSpace(out)
	}
	waitFor(t, 90*time.Second, "the HEALTHCHECK reports every container healthy", func() bool {
		for _, s := range services {
			out, _ := docker(t, 30*time.Second, "inspect", "--format", "{{.State.Health.Status}}", ids[s])
			if strings.TrimSpace(out) != "healthy" {
				return false
			}
		}
		return true
	})
	sluice := func(s string, args ...string) (string, int) {
		return docker(t, 30*time.Second, append([]string{"exec", ids[s], "/sluice"}, args...)...)
	}
	alive := func(s string) int {
		out, code := sluice(s, "status", "--addr", "127.0.0.1:8081", "--json")
		if code != 0 {
			return -1
		}
		var st struct {
			Members []struct{ State string } `json:"members"`
		}
		if json.Unmarshal([]byte(out), &st) != nil {
			return -1
		}
		n := 0
		for _, m := range st.Members {
			if m.State == "alive" {
				n++
			}
		}
		return n
	}
	waitFor(t, 60*time.Second, "every node sees three alive", func() bool {
		return alive("node-1") == 3 && alive("node-2") == 3 && alive("node-3") == 3
	})
	check := func(s, key string) (string, int) {
		return sluice(s, "check", "--addr", "127.0.0.1:8081", "--name", "compose", "--key", key, "--limit", "4", "--window", "8760h")
	}
	for i, want := range []int{0, 0, 0, 0, 1, 1} {
		if out, code := check(services[i%3], "k"); code != want {
			t.Fatalf("check %d through %s exited %d, want %d: %s", i, services[i%3], code, want, out)
		}
	}
	// The health probe fails where no node answers.
	if out, code := sluice("node-1", "health", "--http-addr", "127.0.0.1:1"); code != 1 {
		t.Fatalf("health of a closed port exited %d, want 1: %s", code, out)
	}
	if out, err := dc(2*time.Minute, "stop", "--timeout", "30", "node-3"); err != nil {
		t.Fatalf("docker-compose stop node-3: %v\n%s", err, out)
	}
	if out, _ := docker(t, 30*time.Second, "inspect", "--format", "{{.State.ExitCode}}", ids["node-3"]); strings.TrimSpace(out) != "0" {
		t.Fatalf("node-3 exited with %q after SIGTERM, want 0", strings.TrimSpace(out))
	}
	waitFor(t, 60*time.Second, "the survivors see two alive", func() bool {
		return alive("node-1") == 2 && alive("node-2") == 2
	})
	for _, s := range services[:2] {
		if out, code := check(s, "k"); code != 1 {
			t.Fatalf("after the stop a check of the spent key through %s exited %d, want 1: %s", s, code, out)
		}
		if out, code := check(s, "fresh-"+s); code != 0 {
			t.Fatalf("after the stop a check of a fresh key through %s exited %d, want 0: %s", s, code, out)
		}
	}
}
