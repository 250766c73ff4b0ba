package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

const (
	// maxHelloPlain is the most a hello-world program using the client may
	// weigh built with go build's defaults: 15 MiB, what `ls -lh` and
	// `du -h` show as 15M. (grpc alone weighs 15.3–15.5 million bytes so
	// built; no grpc client is under 15 million.)
	maxHelloPlain = 15 << 20
	// maxHelloSize is the most a hello-world program using the client may
	// weigh, in bytes, built as releases are (no symbol table, no DWARF).
	maxHelloSize = 15 * 1000 * 1000
	// maxClientWeight is the most the client may add to a program that
	// makes the same call with grpc alone, in bytes, built with go build's
	// defaults.
	maxClientWeight = 1000 * 1000
)

// TestHelloWorldBinarySize builds testdata/hello, a program that makes a
// Client and checks once, and fails when it is heavier than the limits
// above: the client must not drag the node's libraries (storage, gossip,
// metrics, tracing, Envoy) into applications.
//
// With go build's defaults grpc alone weighs over 15 MB (its x/net/trace
// and DWARF; testdata/baregrpc measures it), so the absolute limit is on
// the release build, -trimpath -ldflags='-s -w' as deploy/docker builds
// sluice, and the default build is held to grpc's own weight plus
// maxClientWeight.
func TestHelloWorldBinarySize(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	build := func(pkg string, flags ...string) int64 {
		t.Helper()
		bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
		args := append(append([]string{"build"}, flags...), "-o", bin, pkg)
		if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
		fi, err := os.Stat(bin)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	hello := build("./testdata/hello")
	bare := build("./testdata/baregrpc")
	release := build("./testdata/hello", "-trimpath", "-ldflags=-s -w")
	t.Logf("hello-world with the client: %d bytes (%.2f MB, %.2f MiB); the same call with grpc alone: %d bytes (%.2f MB); hello-world built for release: %d bytes (%.2f MB)",
		hello, float64(hello)/1e6, float64(hello)/(1<<20), bare, float64(bare)/1e6, release, float64(release)/1e6)
	if hello > maxHelloPlain {
		t.Errorf("a hello-world program using the client is %d bytes (%.2f MiB), over 15 MiB", hello, float64(hello)/(1<<20))
	}
	if release > maxHelloSize {
		t.Errorf("a hello-world program using the client, built for release, is %d bytes, over %d", release, maxHelloSize)
	}
	if hello-bare > maxClientWeight {
		t.Errorf("the client adds %d bytes to a program calling the node with grpc alone (%d → %d), over %d", hello-bare, bare, hello, maxClientWeight)
	}
}
