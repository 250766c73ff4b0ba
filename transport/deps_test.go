package transport

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTransportImportsNoMetricsLibraryNorCluster keeps the package graph
// of docs/architecture.md for the packages of the wire (transport and the
// packages beneath it, which it imports): transport reports to an Observer
// it declares, and none of them imports client_golang, cluster (the leaves
// it shares with the node aside: the words of a check, cluster/check, and
// of a moving key, cluster/keymove) or the public Go client (client), which
// applications import without the node.
func TestTransportImportsNoMetricsLibraryNorCluster(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	for _, pkg := range wirePackages {
		out, err := exec.Command(goBin, "list", "-deps", "github.com/sluicehq/sluice/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for dep := range strings.Lines(string(out)) {
			dep = strings.TrimSpace(dep)
			if strings.HasPrefix(dep, "github.com/prometheus/") || (strings.HasPrefix(dep, "github.com/sluicehq/sluice/cluster") && dep != "github.com/sluicehq/sluice/cluster/keymove" && dep != "github.com/sluicehq/sluice/cluster/check") || dep == "github.com/sluicehq/sluice/client" {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}

// wirePackages are the packages TestTransportImportsNoMetricsLibraryNorCluster
// keeps free of the metrics library, the node and the public client.
var wirePackages = []string{"transport", "transport/peer", "transport/security"}
