package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientImportsOnlyGRPCAndProtobuf keeps the promise of the package
// doc: a program that uses the client links the standard library, grpc
// (with the golang.org/x and googleapis packages grpc itself needs),
// protobuf and the generated sluicev1 package, nothing of the node.
func TestClientImportsOnlyGRPCAndProtobuf(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/sluicehq/sluice/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, msg := range foreignDeps(deps) {
		t.Error(msg)
	}
	t.Logf("go list -deps: %d packages", len(deps))
}

// TestForeignDepsNamesTheNodesLibraries: the check above fails on the
// node's libraries, by name, and on any other module, and passes grpc's.
func TestForeignDepsNamesTheNodesLibraries(t *testing.T) {
	t.Parallel()
	got := strings.Join(foreignDeps([]string{
		"fmt", "net/http", "google.golang.org/grpc", "google.golang.org/grpc/codes",
		"google.golang.org/protobuf/proto", "golang.org/x/net/http2",
		"google.golang.org/genproto/googleapis/rpc/status", "github.com/sluicehq/sluice/proto/sluice/v1",
		"github.com/cockroachdb/pebble/vfs", "github.com/hashicorp/memberlist",
		"github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3",
		"go.opentelemetry.io/otel/trace", "github.com/prometheus/client_golang/prometheus",
		"github.com/cespare/xxhash/v2", "github.com/sluicehq/sluice/bucket", "google.golang.org/grpcx",
	}), "\n")
	for _, want := range []string{"pebble", "memberlist", "go-control-plane", "OpenTelemetry", "Prometheus", "xxhash", "sluice/bucket", "grpcx"} {
		if !strings.Contains(got, want) {
			t.Errorf("foreignDeps does not name %s; it said:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n") + 1; n != 8 {
		t.Errorf("foreignDeps found %d packages, want 8:\n%s", n, got)
	}
}

// foreignDeps returns a message for each package of deps the client must
// not depend on, naming the node's libraries.
func foreignDeps(deps []string) []string {
	allowed := []string{
		"google.golang.org/grpc/",
		"google.golang.org/protobuf/",
		"google.golang.org/genproto/googleapis/rpc/",
		"golang.org/x/net/",
		"golang.org/x/sys/",
		"golang.org/x/text/",
	}
	exact := map[string]bool{
		"google.golang.org/grpc":                     true,
		"github.com/sluicehq/sluice/proto/sluice/v1": true,
		"github.com/sluicehq/sluice/client":          true,
	}
	named := map[string]string{
		"github.com/cockroachdb/pebble":          "pebble (the node's store)",
		"github.com/hashicorp/memberlist":        "memberlist (the node's gossip)",
		"github.com/envoyproxy/go-control-plane": "go-control-plane (the node's Envoy API)",
		"go.opentelemetry.io/":                   "OpenTelemetry (the node's tracing)",
		"github.com/prometheus/":                 "Prometheus (the node's metrics)",
	}
	var out []string
	for _, dep := range deps {
		if exact[dep] || isStd(dep) || hasAnyPrefix(dep, allowed) {
			continue
		}
		what := "a package outside grpc, protobuf and sluicev1"
		for prefix, name := range named {
			if strings.HasPrefix(dep, prefix) {
				what = name
			}
		}
		out = append(out, "client depends on "+dep+": "+what)
	}
	return out
}

// isStd reports whether an import path is the standard library's: no dot
// in its first element.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
