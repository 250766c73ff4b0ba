package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pythonWithGRPC returns a python3 that imports grpc and google.protobuf:
// the one on PATH, else Debian's /usr/bin/python3 (python3-grpcio and
// python3-protobuf install there, and a python3 of pyenv or a virtualenv
// earlier on PATH does not see them). It skips the test when there is none.
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		bin, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		out, err := exec.Command(bin, "-c", "import grpc, google.protobuf").CombinedOutput()
		if err == nil {
			return bin
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		tried = append(tried, bin+": "+lines[len(lines)-1])
	}
	if len(tried) == 0 {
		t.Skip("python3 is not installed (apt-get install python3-grpcio python3-protobuf)")
	}
	t.Skipf("no python3 with the grpc and protobuf modules (apt-get install python3-grpcio python3-protobuf); tried %s", strings.Join(tried, "; "))
	return ""
}

// pyDecision is what examples/python/check.py prints.
type pyDecision struct {
	Allowed      bool   `json:"allowed"`
	Status       string `json:"status"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Error        string `json:"error"`
	Owner        string `json:"owner"`
}

// TestPythonClient generates the Python stubs of the public API with
// examples/python/generate.sh (protoc and grpc_python_plugin) and runs
// examples/python/check.py against a real node: three checks under a limit
// of 3 exit 0, the fourth exits 1, each printing the node's decision as
// JSON; a peek (hits 0, a proto3 optional field) consumes nothing; bad
// input and an unreachable node exit 2 with the reason. status.py prints
// the node's Admin.Status. It skips where the Debian packages are missing
// (.ci/run installs them).
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := pythonWithGRPC(t)
	for _, tool := range []struct{ bin, pkg string }{
		{"protoc", "protobuf-compiler"},
		{"grpc_python_plugin", "protobuf-compiler-grpc"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			t.Skipf("%s is not installed (apt-get install %s)", tool.bin, tool.pkg)
		}
	}

	stubs := t.TempDir()
	if out, err := exec.Command("bash", "../examples/python/generate.sh", stubs).CombinedOutput(); err != nil {
		t.Fatalf("examples/python/generate.sh %s: %v\n%s", stubs, err, out)
	}
	for _, f := range []string{"sluice_pb2.py", "sluice_pb2_grpc.py"} {
		if _, err := os.Stat(filepath.Join(stubs, "sluice", "v1", f)); err != nil {
			t.Fatalf("generate.sh wrote no %s: %v", f, err)
		}
	}

	node := startCluster(t, 1)[0]

	// script runs examples/python/<name> and returns its stdout, stderr and
	// exit code.
	script := func(name string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, python, append([]string{"../examples/python/" + name, "--stubs", stubs}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return stdout.String(), stderr.String(), 0
		case errors.As(err, &ee) && ctx.Err() == nil:
			return stdout.String(), stderr.String(), ee.ExitCode()
		}
		t.Fatalf("%s %v: %v\nstdout: %s\nstderr: %s", name, args, err, stdout.String(), stderr.String())
		return "", "", -1
	}
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return script("check.py", args...)
	}
	decision := func(what, stdout string) pyDecision {
		t.Helper()
		var d pyDecision
		dec := json.NewDecoder(strings.NewReader(stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: stdout is not check.py's JSON: %v\n%s", what, err, stdout)
		}
		return d
	}
	check := func(key string, more ...string) []string {
		return append([]string{"--addr", node.grpc, "--name", "py.check", "--key", key}, more...)
	}

	// The sliding log, exact: a sliding-window counter's estimate right
	// after an epoch-aligned window boundary weighs the previous window's
	// hit at just under 1, which rounds down, so two checks on either side
	// of a minute boundary answered remaining 2 twice (CI, 2026-11-28).
	for i, want := range []struct {
		code      int
		allowed   bool
		status    string
		remaining int64
	}{
		{0, true, "STATUS_UNDER_LIMIT", 2},
		{0, true, "STATUS_UNDER_LIMIT", 1},
		{0, true, "STATUS_UNDER_LIMIT", 0},
		{1, false, "STATUS_OVER_LIMIT", 0},
	} {
		stdout, stderr, code := run(check("user:1", "--limit", "3", "--window-ms", "60000", "--algorithm", "sliding_log")...)
		what := fmt.Sprintf("check %d", i+1)
		if code != want.code {
			t.Fatalf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, code, want.code, stdout, stderr)
		}
		d := decision(what, stdout)
		if d.Allowed != want.allowed || d.Status != want.status || d.Remaining != want.remaining ||
			d.Limit != 3 || d.Error != "" || d.Owner != node.name {
			t.Errorf("%s: %+v, want allowed %v, %s, remaining %d of 3, decided by %s",
				what, d, want.allowed, want.status, want.remaining, node.name)
		}
		if (d.RetryAfterMS > 0) == want.allowed {
			t.Errorf("%s: retry_after_ms %d with allowed %v", what, d.RetryAfterMS, d.Allowed)
		}
	}

	// hits 0 peeks: sent as present (proto3 optional), it consumes nothing;
	// were it dropped, the node would count the default of 1.
	for i := range 2 {
		stdout, stderr, code := run(check("user:2", "--limit", "3", "--hits", "0", "--algorithm", "token_bucket")...)
		if code != 0 {
			t.Fatalf("peek %d: exit %d, want 0\nstdout: %s\nstderr: %s", i+1, code, stdout, stderr)
		}
		if d := decision("peek", stdout); !d.Allowed || d.Remaining != 3 {
			t.Errorf("peek %d: %+v, want allowed with 3 of 3 remaining", i+1, d)
		}
	}

	// Bad input: the node refuses the item and says why; check.py prints
	// the answer and the reason and exits 2.
	stdout, stderr, code := run(check("user:3", "--limit", "-5")...)
	if code != 2 {
		t.Fatalf("--limit -5: exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	d := decision("--limit -5", stdout)
	if d.Allowed || d.Status != "STATUS_UNSPECIFIED" || !strings.Contains(d.Error, "-5") {
		t.Errorf("--limit -5: %+v, want not allowed, STATUS_UNSPECIFIED and an error about -5", d)
	}
	if d.Error == "" || !strings.Contains(stderr, d.Error) {
		t.Errorf("--limit -5: stderr %q does not carry the node's error %q", stderr, d.Error)
	}

	// An unknown algorithm never reaches the node: the valid names are listed.
	stdout, stderr, code = run(check("user:3", "--limit", "3", "--algorithm", "fastest")...)
	if code != 2 || stdout != "" || !strings.Contains(stderr, "fastest") || !strings.Contains(stderr, "token_bucket") {
		t.Errorf("--algorithm fastest: exit %d, stdout %q, stderr %q; want exit 2 and the valid names", code, stdout, stderr)
	}

	// No node at the address: exit 2 with gRPC's reason.
	stdout, stderr, code = run("--addr", freePort(t, "127.0.0.1", false), "--name", "py.check", "--key", "user:4",
		"--limit", "3", "--timeout", "2")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "UNAVAILABLE") {
		t.Errorf("unreachable node: exit %d, stdout %q, stderr %q; want exit 2 and UNAVAILABLE", code, stdout, stderr)
	}

	// status.py prints the node's Admin.Status as protobuf JSON.
	stdout, stderr, code = script("status.py", "--addr", node.grpc)
	if code != 0 {
		t.Fatalf("status.py: exit %d, want 0\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	var st struct {
		Node    string `json:"node"`
		Members []struct {
			Name     string  `json:"name"`
			GRPCAddr string  `json:"grpc_addr"`
			State    string  `json:"state"`
			Share    float64 `json:"share"`
		} `json:"members"`
		Keys string `json:"keys"` // int64: a string in protobuf JSON
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status.py: stdout is not JSON: %v\n%s", err, stdout)
	}
	if st.Node != node.name || len(st.Members) != 1 || st.Members[0].Name != node.name ||
		st.Members[0].GRPCAddr != node.grpc || st.Members[0].State != "alive" || st.Members[0].Share != 1 || st.Keys == "" {
		t.Errorf("status.py: %+v, want node %s alone, alive at %s with the whole ring, and keys present", st, node.name, node.grpc)
	}
	stdout, stderr, code = script("status.py", "--addr", freePort(t, "127.0.0.1", false), "--timeout", "2")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "UNAVAILABLE") {
		t.Errorf("status.py, unreachable node: exit %d, stdout %q, stderr %q; want exit 2 and UNAVAILABLE", code, stdout, stderr)
	}
}
