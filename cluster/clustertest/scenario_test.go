package clustertest

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

var scenarioFile = flag.String("scenario", "", "TestScenarios: run this scenario file instead of testdata/*.txt")

// TestScenarios runs every testdata/*.txt scenario in its own bubble.
// One: go test -run 'TestScenarios/crash$' ./cluster/clustertest/; a file
// elsewhere: go test -run TestScenarios ./cluster/clustertest/ -scenario F
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if *scenarioFile != "" {
		files = []string{*scenarioFile}
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
			var skip *SkipError
			synctest.Test(t, func(t *testing.T) {
				r := NewRunner(New(t, Options{}))
				err := r.Run(steps)
				if errors.As(err, &skip) {
					return // skipped outside the bubble, whose t does not report it
				}
				if err != nil {
					for _, a := range r.Answers {
						t.Logf("line %d via %s key %s: admitted %v by %s at %v", a.Line, a.Via, a.Key, a.Admitted, a.Owner, a.At.Format("15:04:05.000"))
					}
					t.Fatalf("%s: %v", f, err)
				}
			})
			if skip != nil {
				t.Skipf("%s: %s", f, skip.Reason)
			}
		})
	}
}

// TestParseScenarioErrors: a bad line is refused with the file, the line
// and what is wrong.
func TestParseScenarioErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ text, want string }{
		{"add n1\nfrobnicate n1", `f.txt:2: unknown step "frobnicate"`},
		{"settle now", "f.txt:1: settle takes 0 arguments, got 1"},
		{"# c\n\ncheck n1", "f.txt:3: check takes 2 to 3 arguments, got 1"},
		{"add", "f.txt:1: add takes at least 1 arguments, got 0"},
	} {
		_, err := ParseScenario("f.txt", tc.text)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: err %v, want %q", tc.text, err, tc.want)
		}
	}
	steps, err := ParseScenario("f.txt", "add n1 # start\n  check * k 3  \n")
	if err != nil || len(steps) != 2 || steps[1].Line != 2 || steps[1].String() != "check * k 3" {
		t.Fatalf("steps %v, err %v", steps, err)
	}
}
