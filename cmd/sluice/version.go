package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// releaseVersion is the release this source tree is. The chart's
// appVersion and default image tag (deploy/helm/sluice) say the same
// (TestChartVersionIsTheSourceVersion).
const releaseVersion = "0.9.0"

// version is the version this binary reports: releaseVersion unless the
// build sets another, as a release build may:
//
//	go build -ldflags "-X main.version=1.2.3" ./cmd/sluice
var version = releaseVersion

// revision is the commit this binary was built from, when the build says:
// set with -ldflags "-X main.revision=…" (the Makefile and
// deploy/docker/build.sh pass `git rev-parse --short HEAD`), else read
// from the VCS stamp Go puts in the binary, else "unknown" (a build with
// -buildvcs=false or outside a git checkout).
var revision = ""

// buildInfo is what `sluice version` prints and sluice_build_info exports.
type buildInfo struct {
	Version, Revision, GoVersion string
}

// currentBuild returns this binary's build information.
func currentBuild() buildInfo {
	return buildInfo{Version: version, Revision: buildRevision(revision, readVCS()), GoVersion: runtime.Version()}
}

// vcsStamp is the part of the Go toolchain's VCS stamp that matters here.
type vcsStamp struct {
	revision string
	modified bool
}

func readVCS() vcsStamp {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return vcsStamp{}
	}
	var s vcsStamp
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			s.revision = kv.Value
		case "vcs.modified":
			s.modified = kv.Value == "true"
		}
	}
	return s
}

// buildRevision is the revision to report: the one set at link time,
// else the VCS stamp's (shortened to 12 hex digits, "-dirty" when the
// tree had uncommitted changes), else "unknown".
func buildRevision(linked string, s vcsStamp) string {
	switch {
	case linked != "":
		return linked
	case s.revision == "":
		return "unknown"
	}
	r := s.revision
	if len(r) > 12 {
		r = r[:12]
	}
	if s.modified {
		r += "-dirty"
	}
	return r
}

// printVersion is `sluice version` (and `sluice --version`).
func printVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "sluice version: unexpected argument %q (it takes none)\n", args[0])
		return 2
	}
	b := currentBuild()
	fmt.Fprintf(stdout, "sluice %s\nrevision: %s\ngo: %s\n", b.Version, b.Revision, b.GoVersion)
	return 0
}
