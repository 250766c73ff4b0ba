package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestVersionCommandPrintsVersionRevisionAndGo(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version", "-version"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{arg}, &out, &errb); code != 0 {
			t.Fatalf("sluice %s: exit %d, stderr %q", arg, code, errb.String())
		}
		b := currentBuild()
		want := "sluice " + releaseVersion + "\nrevision: " + b.Revision + "\ngo: " + runtime.Version() + "\n"
		if out.String() != want {
			t.Errorf("sluice %s printed %q, want %q", arg, out.String(), want)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"version", "extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `"extra"`) || out.Len() != 0 {
		t.Errorf("sluice version extra: exit %d, stdout %q, stderr %q; want exit 2 naming the argument", code, out.String(), errb.String())
	}
}

func TestBuildRevision(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		linked string
		s      vcsStamp
		want   string
	}{
		{"", vcsStamp{}, "unknown"},
		{"", vcsStamp{modified: true}, "unknown"},
		{"", vcsStamp{revision: "350c224b0123456789abcdef0123456789abcdef"}, "350c224b0123"},
		{"", vcsStamp{revision: "350c224b0123456789abcdef0123456789abcdef", modified: true}, "350c224b0123-dirty"},
		{"", vcsStamp{revision: "abc"}, "abc"},
		{"1a2b3c4", vcsStamp{revision: "ffff", modified: true}, "1a2b3c4"},
	} {
		if got := buildRevision(c.linked, c.s); got != c.want {
			t.Errorf("buildRevision(%q, %+v) = %q, want %q", c.linked, c.s, got, c.want)
		}
	}
}

// TestLinkerSetsVersionAndRevision builds the binary as a release build
// does, with -ldflags -X, and as CI does, without a VCS stamp.
func TestLinkerSetsVersionAndRevision(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary twice")
	}
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-ldflags", "-X main.version=1.2.3-rc.1 -X main.revision=deadbee"}, "sluice 1.2.3-rc.1\nrevision: deadbee\n"},
		{[]string{"-buildvcs=false"}, "sluice " + releaseVersion + "\nrevision: unknown\n"},
	} {
		bin := filepath.Join(dir, "sluice")
		build := exec.Command("go", append(append([]string{"build", "-o", bin}, c.args...), ".")...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", c.args, err, out)
		}
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			t.Fatalf("sluice --version: %v", err)
		}
		if !strings.HasPrefix(string(out), c.want) {
			t.Errorf("built with %v, sluice --version printed %q, want it to start %q", c.args, out, c.want)
		}
	}
}

func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	m := newNodeMetrics(nil)
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	b := currentBuild()
	for _, f := range fams {
		if f.GetName() != "sluice_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("sluice_build_info has %d series, want 1", len(f.GetMetric()))
		}
		mt := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range mt.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		want := map[string]string{"version": releaseVersion, "revision": b.Revision, "goversion": runtime.Version()}
		if len(labels) != len(want) || labels["version"] != want["version"] || labels["revision"] != want["revision"] || labels["goversion"] != want["goversion"] {
			t.Errorf("sluice_build_info labels %v, want %v", labels, want)
		}
		if v := mt.GetGauge().GetValue(); v != 1 {
			t.Errorf("sluice_build_info is %v, want 1", v)
		}
		return
	}
	t.Fatal("no sluice_build_info")
}

// TestChartVersionIsTheSourceVersion: the chart's appVersion and default
// image tag are the release this source is.
func TestChartVersionIsTheSourceVersion(t *testing.T) {
	t.Parallel()
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	var values struct {
		Image struct {
			Tag string `yaml:"tag"`
		} `yaml:"image"`
	}
	for _, f := range []struct {
		path string
		into any
	}{{"Chart.yaml", &chart}, {"values.yaml", &values}} {
		b, err := os.ReadFile(filepath.Join(chartDir, f.path))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, f.into); err != nil {
			t.Fatalf("%s: %v", f.path, err)
		}
	}
	if chart.AppVersion != releaseVersion {
		t.Errorf("deploy/helm/sluice/Chart.yaml appVersion %q, want %q (cmd/sluice/version.go)", chart.AppVersion, releaseVersion)
	}
	if values.Image.Tag != releaseVersion {
		t.Errorf("deploy/helm/sluice/values.yaml image.tag %q, want %q (cmd/sluice/version.go)", values.Image.Tag, releaseVersion)
	}
}
