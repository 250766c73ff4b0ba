package transport

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTransportImportsNoMetricsLibraryNorCluster keeps the package graph
// of docs/architecture.md: transport reports to an Observer it declares and
// never imports client_golang, cluster (the words of a moving key of
// cluster/keymove, a leaf, aside) or the public Go client (client), which
// applications import without the node.
func TestTransportImportsNoMetricsLibraryNorCluster(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/sluicehq/sluice/transport").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for dep := range strings.Lines(string(out)) {
		dep = strings.TrimSpace(dep)
		if strings.HasPrefix(dep, "github.com/prometheus/") || (strings.HasPrefix(dep, "github.com/sluicehq/sluice/cluster") && dep != "github.com/sluicehq/sluice/cluster/keymove") || dep == "github.com/sluicehq/sluice/client" {
			t.Errorf("transport depends on %s", dep)
		}
	}
}
