package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/rules"
)

const (
	alertsFile    = "../../deploy/prometheus/alerts.yaml"
	dashboardFile = "../../deploy/grafana/sluice.json"
)

// TestAlertRules runs `promtool check rules` on the alert rules (Debian's
// prometheus package has promtool); skipped where it is not installed.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (apt-get install prometheus)")
	}
	out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool says:\n%s", out)
	}
	// The unit tests: the alerts fire on series as the chart's
	// ServiceMonitor and other scrape jobs label them.
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = filepath.Dir(alertsFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestAlertsHaveRunbooks: every alert links a section of
// docs/operations.md that exists, and every alert but the one on `up`
// works under any job name.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var alerts struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &alerts); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for line := range strings.Lines(string(ops)) {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[githubAnchor(strings.TrimSpace(h))] = true
		}
	}
	const prefix = "https://github.com/sluicehq/sluice/blob/main/docs/operations.md#"
	n := 0
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			n++
			u := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(u, prefix)
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is not a section of docs/operations.md (### %s)", r.Alert, u, r.Alert)
			}
			if strings.Contains(r.Expr, "job=") && !strings.HasPrefix(strings.TrimSpace(r.Expr), "up{") {
				t.Errorf("alert %s matches a job name: %s", r.Alert, r.Expr)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d alerts", n)
	}
}

// githubAnchor is the fragment GitHub gives a heading: lower case, spaces
// to hyphens, punctuation other than hyphens and underscores dropped.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// metricName finds the metric names of our own, the Go and the process
// collectors' in a PromQL expression.
var metricName = regexp.MustCompile(`\b(?:sluice|go|process)_[a-z0-9_]+\b`)

// TestDashboardAndAlertsUseExposedNames: every metric name an expression
// of the Grafana dashboard or of the alert rules uses is one the node
// exposes (a histogram's _bucket, _sum and _count included).
func TestDashboardAndAlertsUseExposedNames(t *testing.T) {
	t.Parallel()
	exposed := exposedNames(t)

	var exprs []string
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has a target without expr", p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	// The operator's questions the dashboard must answer: are hot keys
	// served from leases, and do nodes pause?
	for _, metric := range []string{"sluice_lease_decisions_total", "sluice_pause_causes_total"} {
		if !strings.Contains(strings.Join(exprs, "\n"), metric) {
			t.Errorf("no dashboard panel shows %s", metric)
		}
	}
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions in the dashboard", len(exprs))
	}

	raw, err = os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var alerts struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &alerts); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	nAlerts := 0
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			nAlerts++
		}
	}
	if nAlerts < 6 {
		t.Fatalf("only %d alert rules", nAlerts)
	}

	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			if !exposed[name] {
				t.Errorf("%q uses %s, which the node does not expose", e, name)
			}
		}
	}
}

// exposedNames are the sample names a node exposes: those a running node
// serves once it has answered a check, and those of series that exist only
// once something happened (a peer called, a rule checked, a flush).
func exposedNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	addFamily := func(name, kind string) {
		names[name] = true
		if kind == "histogram" || kind == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}

	n := startServe(t, "--rules", writeRules(t))
	c, err := client.Dial(n.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Check(t.Context(), &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{Name: "x", Key: "k", Limit: 10, WindowMs: 60_000}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + n.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(body)) {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			addFamily(f[2], f[3])
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(nativeRules), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := rules.NewWatcher(dir, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	m := newNodeMetrics(w)
	m.peers.observe(rpcForward, "127.0.0.1:1", time.Now(), errors.New("x"))
	m.ObserveRule("login", transport.ResultOver)
	m.ObserveEnvoyRule("edge", "edge.remote_address", transport.ResultOver)
	m.observeFlush(1, time.Millisecond, nil)
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		addFamily(f.GetName(), strings.ToLower(f.GetType().String()))
	}
	for _, must := range []string{"sluice_checks_total", "sluice_check_duration_seconds_bucket", "sluice_peer_rpc_errors_total", "go_goroutines"} {
		if !names[must] {
			t.Fatalf("exposedNames misses %s: %v", must, names)
		}
	}
	return names
}
