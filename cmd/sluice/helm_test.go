package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const chartDir = "../../deploy/helm/sluice"

// helmBinary returns the helm command, skipping the test where it is not
// installed (`make tools` installs it) unless SLUICE_TEST_REQUIRE_HELM is
// set, as `make helm-check` does for CI.
func helmBinary(t *testing.T) string {
	t.Helper()
	helm, err := exec.LookPath("helm")
	if err != nil {
		if os.Getenv("SLUICE_TEST_REQUIRE_HELM") != "" {
			t.Fatal("helm is not installed (make tools)")
		}
		t.Skip("helm is not installed (make tools)")
	}
	return helm
}

// helmTemplate renders the chart as release "sluice" with the given --set
// values.
func helmTemplate(t *testing.T, helm string, sets ...string) []object {
	t.Helper()
	return helmTemplateRelease(t, helm, "sluice", sets...)
}

// helmTemplateRelease renders the chart as the release named.
func helmTemplateRelease(t *testing.T, helm, release string, sets ...string) []object {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", "rate"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return decodeObjects(t, "helm template "+strings.Join(sets, " "), bytes.NewReader(out))
}

// TestHelmChart renders the chart with its defaults and with every option
// on, and checks each rendering as the plain manifests are checked; the
// options add what they say (secrets mounted, exec probes with a client
// CA, a ServiceMonitor), and a grace period too short is refused.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)

	def := helmTemplate(t, helm)
	checkSluiceObjects(t, def, "sluice", "sluice-headless")
	for _, o := range def {
		if o.str("kind") == "ServiceMonitor" {
			t.Error("the default rendering has a ServiceMonitor (it needs the prometheus operator's CRD)")
		}
	}

	all := helmTemplate(t, helm, "tls.enabled=true", "tls.clientCA.enabled=true", "gossipKey.enabled=true",
		"serviceMonitor.enabled=true", "replicaCount=5", "extraEnv.SLUICE_FLUSH_INTERVAL=2s")
	checkSluiceObjectsExceptProbes(t, all)
	kinds := map[string]object{}
	for _, o := range all {
		kinds[o.str("kind")] = o
	}
	if kinds["ServiceMonitor"] == nil || kinds["ServiceMonitor"].str("spec", "endpoints", 0, "scheme") != "https" {
		t.Errorf("with serviceMonitor and TLS enabled: ServiceMonitor %v", kinds["ServiceMonitor"])
	}
	sts := kinds["StatefulSet"]
	if r, _ := sts.at("spec", "replicas").(int); r != 5 {
		t.Errorf("replicas %v, want 5", sts.at("spec", "replicas"))
	}
	c := sts.list("spec", "template", "spec", "containers")[0]
	env := map[string]string{}
	for _, e := range c.list("env") {
		env[e.str("name")] = e.str("value")
	}
	for k, v := range map[string]string{"SLUICE_TLS_CERT": "/tls/tls.crt", "SLUICE_TLS_CA": "/tls/ca.crt",
		"SLUICE_CLIENT_CA": "/client-ca/ca.crt", "SLUICE_GOSSIP_KEY_FILE": "/gossip/key", "SLUICE_FLUSH_INTERVAL": "2s",
		"SLUICE_JOIN": "sluice-headless.$(POD_NAMESPACE).svc:7946"} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	mounts := map[string]bool{}
	for _, m := range c.list("volumeMounts") {
		mounts[m.str("mountPath")] = true
	}
	for _, p := range []string{"/tls", "/client-ca", "/gossip", "/data", "/etc/sluice/rules"} {
		if !mounts[p] {
			t.Errorf("nothing mounted at %s", p)
		}
	}
	if cmd := c.at("readinessProbe", "exec", "command"); cmd == nil {
		t.Errorf("with a client CA the readiness probe is %v, want `sluice health --ready`", c.at("readinessProbe"))
	}

	cmd := exec.Command(helm, "template", "sluice", chartDir, "--set", "terminationGracePeriodSeconds=20")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "must exceed") {
		t.Errorf("a grace period of 20 s with a 20 s shutdown timeout rendered: %v\n%s", err, out)
	}
}

// checkSluiceObjectsExceptProbes runs checkSluiceObjects on a rendering
// whose probes are exec probes, by giving it the HTTP paths they stand for.
func checkSluiceObjectsExceptProbes(t *testing.T, objs []object) {
	t.Helper()
	for _, o := range objs {
		if o.str("kind") != "StatefulSet" {
			continue
		}
		c := o.list("spec", "template", "spec", "containers")[0]
		for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
			p, _ := c.at(probe).(map[string]any)
			if p["exec"] != nil {
				p["httpGet"] = map[string]any{"path": path}
			}
		}
	}
	checkSluiceObjects(t, objs, "sluice", "sluice-headless")
}

// TestHelmChartSafeDefaults: under a release of any name the
// ServiceMonitor's job is "sluice", the name the alert rules match; the
// nodes spread over zones by default; the NetworkPolicy, when enabled, lets
// the nodes reach each other and the listed clients only the API ports.
func TestHelmChartSafeDefaults(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)
	objs := helmTemplateRelease(t, helm, "rl", "serviceMonitor.enabled=true", "networkPolicy.enabled=true",
		"networkPolicy.clients[0].podSelector.matchLabels.app=checkout")
	kinds := map[string]object{}
	for _, o := range objs {
		kinds[o.str("kind")] = o
	}
	sm, svc := kinds["ServiceMonitor"], kinds["Service"]
	if sm == nil || svc == nil {
		t.Fatalf("no ServiceMonitor or Service in %v", kinds)
	}
	jobLabel := sm.str("spec", "jobLabel")
	if job := svc.str("metadata", "labels", jobLabel); job != "sluice" {
		t.Errorf("release rl: the ServiceMonitor's job is the Service's label %q = %q, want \"sluice\" (deploy/prometheus/alerts.yaml)", jobLabel, job)
	}
	sts := kinds["StatefulSet"]
	spread := sts.list("spec", "template", "spec", "topologySpreadConstraints")
	if len(spread) != 1 || spread[0].str("topologyKey") != "topology.kubernetes.io/zone" ||
		spread[0].str("labelSelector", "matchLabels", "app.kubernetes.io/instance") != "rl" {
		t.Errorf("topologySpreadConstraints %v, want one over topology.kubernetes.io/zone selecting this release's pods", spread)
	}
	np := kinds["NetworkPolicy"]
	if np == nil {
		t.Fatal("networkPolicy.enabled=true rendered no NetworkPolicy")
	}
	in := np.list("spec", "ingress")
	if len(in) != 2 {
		t.Fatalf("NetworkPolicy ingress %v, want the nodes and the clients", in)
	}
	if in[0].list("from")[0].str("podSelector", "matchLabels", "app.kubernetes.io/instance") != "rl" || in[0].at("ports") != nil {
		t.Errorf("first rule %v: want every port from this release's pods", in[0])
	}
	if in[1].list("from")[0].str("podSelector", "matchLabels", "app") != "checkout" || len(in[1].list("ports")) != 2 {
		t.Errorf("second rule %v: want the gRPC and HTTP ports from the checkout pods", in[1])
	}
	for _, o := range helmTemplate(t, helm) {
		if o.str("kind") == "NetworkPolicy" {
			t.Error("the default rendering has a NetworkPolicy")
		}
	}
}
