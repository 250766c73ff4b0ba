package test

import (
	"os/exec"
	"strings"
	"testing"
)

// module is this repository's module path.
const module = "github.com/sluicehq/sluice"

// layer is one row of docs/architecture.md's package table: what a package
// may import directly (besides the standard library), and what it must
// never depend on, even indirectly.
type layer struct {
	pkg     string   // relative to the module
	may     []string // allowed non-standard imports (module-relative for ours, or a path prefix)
	mustNot []string // forbidden anywhere in its dependencies
}

var layers = []layer{
	{pkg: "bucket"},
	{pkg: "ring", may: []string{"github.com/buraksezer/consistent", "github.com/cespare/xxhash/v2"}},
	// The words of a key moving between nodes, shared by the ownership
	// protocol and the peer protocol (cluster and transport/peer, which may
	// not import each other): a leaf.
	{pkg: "cluster/keymove", mustNot: []string{"bucket", "ring", "writeback", "cluster", "transport", "proto/sluice/v1"}},
	{pkg: "writeback", may: []string{"bucket", "writeback/key", "github.com/hashicorp/golang-lru/v2", "github.com/cockroachdb/pebble"}},
	// The name of a counter, shared by the store and the ownership
	// records: a leaf.
	{pkg: "writeback/key", mustNot: []string{"bucket", "ring", "writeback$", "cluster", "transport", "proto/sluice/v1"}},
	// The words of a check between the public API, the peer protocol and
	// the node (Request, Outcome, leases, region asks): bucket only.
	{pkg: "cluster/check", may: []string{"bucket"},
		mustNot: []string{"ring", "writeback", "cluster$", "cluster/ownership", "cluster/lease", "transport", "proto/sluice/v1", "google.golang.org/grpc"}},
	{pkg: "cluster", may: []string{"cluster/check", "cluster/ownership", "cluster/lease", "cluster/hitters", "cluster/overrides", "ring", "cluster/keymove", "writeback", "bucket", "github.com/hashicorp/memberlist"},
		mustNot: []string{"transport", "proto/sluice/v1", "google.golang.org/grpc", "go.opentelemetry.io/otel/sdk"}},
	// The key-ownership protocol: records and a pure step function, no
	// I/O — no memberlist, no gRPC, nothing of the node.
	{pkg: "cluster/ownership", may: []string{"ring", "cluster/keymove", "writeback/key"},
		mustNot: []string{"cluster$", "cluster/lease", "cluster/clustertest", "transport", "writeback$", "github.com/cockroachdb/pebble", "github.com/hashicorp/memberlist", "google.golang.org/grpc"}},
	// Quota leases: records and arithmetic, no I/O, like ownership.
	{pkg: "cluster/lease", may: []string{"bucket", "cluster/check"},
		mustNot: []string{"cluster$", "cluster/ownership", "cluster/clustertest", "ring", "writeback", "transport", "github.com/hashicorp/memberlist", "google.golang.org/grpc"}},
	// The heaviest keys: a summary, no I/O, standard library only.
	{pkg: "cluster/hitters", may: []string{},
		mustNot: []string{"cluster$", "ring", "writeback", "bucket", "transport", "google.golang.org/grpc"}},
	// The runtime overrides: a last-writer-wins table and its encoding;
	// no network, nothing of the node.
	{pkg: "cluster/overrides", may: []string{"bucket", "cluster/check"},
		mustNot: []string{"cluster$", "cluster/ownership", "ring", "writeback", "transport", "github.com/hashicorp/memberlist", "google.golang.org/grpc"}},
	// The in-process cluster of the tests: nodes over memory networks.
	{pkg: "cluster/clustertest", may: []string{"cluster", "ring", "writeback", "bucket", "github.com/hashicorp/memberlist"},
		mustNot: []string{"transport", "proto/sluice/v1", "google.golang.org/grpc", "go.opentelemetry.io/otel/sdk"}},
	// The rules files, which the public API resolves: bucket and YAML only.
	{pkg: "transport/rules", may: []string{"bucket", "go.yaml.in/yaml/v3"},
		mustNot: []string{"transport$", "proto/sluice/v1", "cluster"}},
	// What secures the wire: TLS material, the proofs of gossip-key
	// holders and who may call the internal RPCs. Nothing of Sluice's: the
	// public API and the peer protocol both build on it.
	{pkg: "transport/security", may: []string{"google.golang.org/grpc", "google.golang.org/protobuf"},
		mustNot: []string{"bucket", "ring", "writeback", "cluster", "client", "transport$", "transport/peer", "transport/rules", "proto/sluice/v1", "github.com/prometheus"}},
	// The peer protocol, both sides of sluice.v1.Peer: the client and the
	// server with the interfaces it calls. Never the public API's package,
	// which registers its server, nor the node, nor the public client.
	{pkg: "transport/peer", may: []string{"bucket", "cluster/check", "cluster/keymove", "proto/sluice/v1", "transport/security", "google.golang.org/grpc", "google.golang.org/protobuf",
		"google.golang.org/genproto/googleapis/rpc",
		"go.opentelemetry.io/otel", "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"},
		mustNot: []string{"transport$", "transport/rules", "cluster$", "cluster/ownership", "cluster/lease", "cluster/clustertest", "writeback", "client", "ring",
			"github.com/envoyproxy/go-control-plane", "github.com/prometheus", "go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters"}},
	// The public API: the servers of a node, which register the peer
	// protocol's service and are guarded by transport/security. The rules
	// file's Envoy rule is one type: the Envoy service answers with
	// rules.EnvoyRule, from the rules package.
	{pkg: "transport", may: []string{"bucket", "cluster/check", "cluster/keymove", "transport/peer", "transport/security", "transport/rules", "proto/sluice/v1", "google.golang.org/grpc", "google.golang.org/protobuf",
		"google.golang.org/genproto/googleapis/rpc", // gRPC's standard status details (RetryInfo)
		"github.com/envoyproxy/go-control-plane/envoy",
		// Tracing: the OpenTelemetry API and otelgrpc; the SDK and the
		// exporters are cmd/sluice's choice.
		"go.opentelemetry.io/otel", "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc",
		"github.com/cespare/xxhash/v2"}, // the status page places partitions on its ring drawing as ring does
		// Not the ring itself (its implementation, consistent, comes with
		// it), nor the public client: cluster/keymove is a leaf.
		mustNot: []string{"cluster$", "cluster/ownership", "cluster/lease", "cluster/clustertest", "writeback", "client", "github.com/buraksezer/consistent", "go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters"}},
	// What the transport tests share (only they import it): check words,
	// the Go client, the standard library.
	{pkg: "transport/internal/wiretest", may: []string{"bucket", "cluster/check", "client"},
		mustNot: []string{"cluster$", "writeback", "transport$", "transport/peer"}},
	// The public Go client: gRPC, protobuf and the generated package, and
	// nothing of the node (client's own deps test names the libraries).
	{pkg: "client", may: []string{"proto/sluice/v1", "google.golang.org/grpc", "google.golang.org/protobuf"},
		mustNot: []string{"bucket", "ring", "writeback", "cluster", "transport", "github.com/cespare/xxhash/v2"}},
	// The examples use the Go client as an application would: client and
	// gRPC, never the node's insides.
	{pkg: "examples/check", may: []string{"client"}, mustNot: examplesMustNot},
	{pkg: "examples/httpmiddleware", may: []string{"client"}, mustNot: examplesMustNot},
	{pkg: "examples/grpcinterceptor", may: []string{"client", "google.golang.org/grpc"}, mustNot: examplesMustNot},
	// Shared by tests of several packages (writeback's included): it
	// builds the binary with the go tool, it imports none of ours.
	{pkg: "test/testsupport", mustNot: []string{"bucket", "ring", "writeback", "cluster", "transport", "proto/sluice/v1"}},
	// The grpc-go floor of the side-by-side harness: a Check server that
	// does nothing, so nothing of a node's work may reach it.
	{pkg: "test/grpcfloor", may: []string{"transport", "proto/sluice/v1", "google.golang.org/grpc"},
		mustNot: []string{"cluster$", "cluster/ownership", "cluster/lease", "writeback", "github.com/hashicorp/memberlist", "github.com/cockroachdb/pebble"}},
}

// The examples are applications: the node's packages, and the ring's
// implementation (consistent) standing for the ring, stay out of their
// dependencies.
var examplesMustNot = []string{"cluster", "writeback", "transport", "bucket", "github.com/buraksezer/consistent", "cmd"}

// TestLayering keeps the package graph of docs/architecture.md true: it
// lists every package's imports and dependencies with `go list` and fails
// on an import the table does not allow.
func TestLayering(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{join .Deps \",\"}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type pkg struct{ imports, deps []string }
	pkgs := map[string]pkg{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list line %q", line)
		}
		pkgs[strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")] = pkg{imports: split(f[1]), deps: split(f[2])}
	}
	inTable := map[string]bool{}
	for _, l := range layers {
		inTable[l.pkg] = true
	}
	for p := range pkgs {
		if strings.HasPrefix(p, "examples/") && !inTable[p] {
			t.Errorf("%s is not in the layering table: add it (examples may import client and gRPC only)", p)
		}
	}
	for _, l := range layers {
		p, ok := pkgs[l.pkg]
		if !ok {
			t.Errorf("package %s is in the table but not in the module", l.pkg)
			continue
		}
		for _, imp := range p.imports {
			if standard(imp) || allowed(imp, l.may) {
				continue
			}
			t.Errorf("%s imports %s, which docs/architecture.md does not allow", l.pkg, imp)
		}
		for _, dep := range p.deps {
			for _, bad := range l.mustNot {
				if matches(dep, bad) {
					t.Errorf("%s depends on %s (must not depend on %s)", l.pkg, dep, bad)
				}
			}
		}
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// standard reports whether path is in the standard library (no dot in its
// first element).
func standard(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func allowed(imp string, may []string) bool {
	for _, m := range may {
		if matches(imp, m) {
			return true
		}
	}
	return false
}

// matches reports whether import path imp is pattern (module-relative when
// it has no dot in its first element) or a package below it; a pattern
// ending in "$" matches that package only.
func matches(imp, pattern string) bool {
	pattern, exact := strings.CutSuffix(pattern, "$")
	if standard(pattern) {
		pattern = module + "/" + pattern
	}
	return imp == pattern || !exact && strings.HasPrefix(imp, pattern+"/")
}
