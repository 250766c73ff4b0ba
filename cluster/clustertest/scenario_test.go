package clustertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

// TestScenarios runs every testdata/*.txt scenario in its own bubble.
// One: go test -run 'TestScenarios/crash$' ./cluster/clustertest/
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenario in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			steps, err := ParseScenario(f, string(b))
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				r := NewRunner(New(t, Options{}))
				if err := r.Run(steps); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
			})
		})
	}
}
