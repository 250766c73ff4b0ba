package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/transport/rules"
)

const kubernetesDir = "../../deploy/kubernetes"

// object is one decoded Kubernetes object.
type object map[string]any

// at walks keys (strings for maps, ints for lists) and returns what is
// there, or nil.
func (o object) at(path ...any) any {
	var v any = map[string]any(o)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func (o object) str(path ...any) string { s, _ := o.at(path...).(string); return s }
func (o object) list(path ...any) []object {
	var out []object
	l, _ := o.at(path...).([]any)
	for _, e := range l {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// decodeObjects decodes every YAML document of r, skipping empty ones.
func decodeObjects(t *testing.T, what string, r io.Reader) []object {
	t.Helper()
	var objs []object
	dec := yaml.NewDecoder(r)
	for {
		var m map[string]any // not object: yaml.v3 would decode nested maps as object too
		err := dec.Decode(&m)
		o := object(m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if o == nil {
			continue
		}
		if o.str("kind") == "" || o.str("apiVersion") == "" {
			t.Fatalf("%s: a document without kind or apiVersion: %v", what, o)
		}
		objs = append(objs, o)
	}
}

// TestKubernetesManifests decodes every document of deploy/kubernetes and
// checks what a working Sluice cluster on Kubernetes needs.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeObjects(t, f, bytes.NewReader(b))...)
	}
	var resources []string
	for _, o := range objs {
		if o.str("kind") == "Kustomization" {
			for _, r := range o.at("resources").([]any) {
				resources = append(resources, r.(string))
			}
		}
	}
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(resources, b) {
			t.Errorf("kustomization.yaml does not list %s", b)
		}
	}
	checkSluiceObjects(t, objs, "sluice", "sluice-headless")
}

// checkSluiceObjects checks a rendering of Sluice's objects (the plain
// manifests or the chart's): a StatefulSet with stable names, data volume,
// probes and a long enough grace, its headless Service for gossip, a client
// Service, a PodDisruptionBudget, and a rules ConfigMap that parses.
// Long on purpose: one checklist over the objects, read top to bottom.
func checkSluiceObjects(t *testing.T, objs []object, clientSvc, headlessSvc string) {
	t.Helper()
	byKind := map[string][]object{}
	for _, o := range objs {
		byKind[o.str("kind")] = append(byKind[o.str("kind")], o)
	}
	for _, k := range []string{"StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap"} {
		if len(byKind[k]) == 0 {
			t.Fatalf("no %s among %d objects", k, len(objs))
		}
	}
	sts := byKind["StatefulSet"][0]
	pod := object(sts.at("spec", "template").(map[string]any))
	podLabels, _ := pod.at("metadata", "labels").(map[string]any)
	selects := func(what string, sel any) {
		m, _ := sel.(map[string]any)
		if len(m) == 0 {
			t.Errorf("%s has no selector", what)
		}
		for k, v := range m {
			if podLabels[k] != v {
				t.Errorf("%s selects %s=%v, which the pods do not carry (%v)", what, k, v, podLabels)
			}
		}
	}
	selects("the StatefulSet", sts.at("spec", "selector", "matchLabels"))

	services := map[string]object{}
	for _, s := range byKind["Service"] {
		services[s.str("metadata", "name")] = s
		selects("Service "+s.str("metadata", "name"), s.at("spec", "selector"))
	}
	headless, client := services[headlessSvc], services[clientSvc]
	if headless == nil || client == nil {
		t.Fatalf("services %v; want %s and %s", slices.Collect(mapsKeys(services)), clientSvc, headlessSvc)
	}
	if headless.str("spec", "clusterIP") != "None" || headless.at("spec", "publishNotReadyAddresses") != true {
		t.Errorf("%s: clusterIP %q, publishNotReadyAddresses %v; want None and true",
			headlessSvc, headless.str("spec", "clusterIP"), headless.at("spec", "publishNotReadyAddresses"))
	}
	if sts.str("spec", "serviceName") != headlessSvc {
		t.Errorf("serviceName %q, want %s", sts.str("spec", "serviceName"), headlessSvc)
	}
	svcPorts := func(s object) map[string]bool {
		ps := map[string]bool{}
		for _, p := range s.list("spec", "ports") {
			ps[fmt.Sprintf("%v/%s", p.at("port"), p.str("protocol"))] = true
		}
		return ps
	}
	if hp := svcPorts(headless); !hp["7946/TCP"] || !hp["7946/UDP"] {
		t.Errorf("%s ports %v; gossip wants 7946 on TCP and UDP", headlessSvc, hp)
	}
	if cp := svcPorts(client); !cp["8081/TCP"] || !cp["8080/TCP"] {
		t.Errorf("%s ports %v; want gRPC 8081 and HTTP 8080", clientSvc, cp)
	}

	ctrs := pod.list("spec", "containers")
	if len(ctrs) != 1 {
		t.Fatalf("%d containers, want 1", len(ctrs))
	}
	c := ctrs[0]
	portNames := map[string]bool{}
	for _, p := range c.list("ports") {
		portNames[p.str("name")] = true
	}
	for _, s := range []object{headless, client} {
		for _, p := range s.list("spec", "ports") {
			if tp, ok := p.at("targetPort").(string); ok && !portNames[tp] {
				t.Errorf("Service %s targets port %q, which the container does not name", s.str("metadata", "name"), tp)
			}
		}
	}

	// Every SLUICE_ variable is a flag of serve, and the ones that make a
	// StatefulSet member are there.
	flags := newServeFlagSet(&serveFlags{})
	env := map[string]object{}
	for _, e := range c.list("env") {
		name := e.str("name")
		env[name] = e
		if f, ok := strings.CutPrefix(name, "SLUICE_"); ok {
			if flags.Lookup(strings.ToLower(strings.ReplaceAll(f, "_", "-"))) == nil {
				t.Errorf("%s names no flag of sluice serve", name)
			}
		}
	}
	fieldRef := func(name string) string { return env[name].str("valueFrom", "fieldRef", "fieldPath") }
	if fieldRef("SLUICE_NODE_NAME") != "metadata.name" {
		t.Errorf("SLUICE_NODE_NAME comes from %q, want the pod name", fieldRef("SLUICE_NODE_NAME"))
	}
	if fieldRef("SLUICE_ADVERTISE_ADDR") != "status.podIP" {
		t.Errorf("SLUICE_ADVERTISE_ADDR comes from %q, want the pod IP", fieldRef("SLUICE_ADVERTISE_ADDR"))
	}
	if j := env["SLUICE_JOIN"].str("value"); !strings.HasPrefix(j, headlessSvc+".") || !strings.HasSuffix(j, ":7946") {
		t.Errorf("SLUICE_JOIN = %q, want the headless service's name and the gossip port", j)
	}

	// The data volume is a claim template mounted at the data dir.
	dataDir := env["SLUICE_DATA_DIR"].str("value")
	claims := map[string]bool{}
	for _, vc := range sts.list("spec", "volumeClaimTemplates") {
		claims[vc.str("metadata", "name")] = true
	}
	mounted := false
	for _, m := range c.list("volumeMounts") {
		if m.str("mountPath") == dataDir && claims[m.str("name")] {
			mounted = true
		}
	}
	if dataDir == "" || !mounted {
		t.Errorf("the data dir %q is not a volumeClaimTemplate's mount (claims %v)", dataDir, claims)
	}

	if p := c.str("livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe path %q, want /healthz", p)
	}
	if p := c.str("readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness probe path %q, want /readyz", p)
	}

	// The grace covers preStop and the whole graceful stop.
	shutdown := 20 * time.Second
	if v := env["SLUICE_SHUTDOWN_TIMEOUT"].str("value"); v != "" {
		var err error
		if shutdown, err = time.ParseDuration(v); err != nil {
			t.Errorf("SLUICE_SHUTDOWN_TIMEOUT %q: %v", v, err)
		}
	}
	preStop, _ := c.at("lifecycle", "preStop", "sleep", "seconds").(int)
	grace, _ := pod.at("spec", "terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second <= shutdown+time.Duration(preStop)*time.Second {
		t.Errorf("terminationGracePeriodSeconds %d is not longer than preStop %ds + shutdown timeout %v", grace, preStop, shutdown)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.at("resources", "requests", r) == nil {
			t.Errorf("no %s request", r)
		}
	}

	pdb := byKind["PodDisruptionBudget"][0]
	selects("the PodDisruptionBudget", pdb.at("spec", "selector", "matchLabels"))

	// The rules the pods mount parse.
	for _, cm := range byKind["ConfigMap"] {
		data, _ := cm.at("data").(map[string]any)
		for name, body := range data {
			if _, err := rules.Parse(name, []byte(body.(string))); err != nil {
				t.Errorf("ConfigMap %s: %v", cm.str("metadata", "name"), err)
			}
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
