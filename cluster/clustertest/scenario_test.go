package clustertest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

var (
	scenarioFile = flag.String("scenario", "", "TestScenarios: run this scenario file instead of testdata/*.txt")
	rewrite      = flag.Bool("rewrite", false, "TestScenarios: write each step's output into its scenario file instead of comparing")
)

// TestScenarios runs every testdata/*.txt scenario in its own bubble and
// compares each step's output with the one written below it (scenario.go);
// -rewrite writes the outputs instead.
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
			var out map[int]string
			synctest.Test(t, func(t *testing.T) {
				r := NewRunner(New(t, Options{}))
				err := r.Run(steps)
				out = r.Out
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
			if *rewrite {
				if err := os.WriteFile(f, []byte(Rewrite(string(b), steps, out)), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if diff := outputDiff(steps, out); diff != "" {
				t.Errorf("%s: outputs differ (go test -run TestScenarios ./cluster/clustertest/ -rewrite writes them):\n%s", f, diff)
			}
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
		{"add n1\n\n----\nadmitted 1", "f.txt:3: ---- without a step above it"},
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

// outputDiff lists the steps whose output differs from the one written
// below them ("" when none): a step with output and no block, or a block
// under a step without output, differs too. Steps after a skip have none.
func outputDiff(steps []Step, out map[int]string) string {
	var b strings.Builder
	for _, st := range steps {
		got, ran := out[st.Line]
		if got == st.Want && ran == st.Block {
			continue
		}
		if !ran && !st.Block {
			continue
		}
		fmt.Fprintf(&b, "line %d (%s):\n  got:  %q\n  want: %q\n", st.Line, st, got, st.Want)
	}
	return b.String()
}

// A step's output block is read into Want and written back by Rewrite,
// which keeps every other line, replaces a block, adds a missing one and
// drops one under a step without output.
func TestScenarioOutputBlocks(t *testing.T) {
	t.Parallel()
	text := "# c\nadd n1\n----\nstale\n\ncheck n1 k 2\nsettle\ncheck n1 k 1\n----\nadmitted 1, refused 0\n"
	steps, err := ParseScenario("f.txt", text)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 4 || !steps[0].Block || steps[0].Want != "stale" || steps[1].Block || steps[3].Want != "admitted 1, refused 0" {
		t.Fatalf("steps %+v", steps)
	}
	out := map[int]string{6: "admitted 2, refused 0", 8: "admitted 1, refused 0"}
	if d := outputDiff(steps, out); !strings.Contains(d, "line 2 (add n1)") || !strings.Contains(d, "line 6 (check n1 k 2)") || strings.Contains(d, "line 8") {
		t.Errorf("diff:\n%s", d)
	}
	got := Rewrite(text, steps, out)
	want := "# c\nadd n1\n\ncheck n1 k 2\n----\nadmitted 2, refused 0\n\nsettle\ncheck n1 k 1\n----\nadmitted 1, refused 0\n"
	if got != want {
		t.Errorf("rewritten:\n%q\nwant\n%q", got, want)
	}
	again, err := ParseScenario("f.txt", got)
	if err != nil || len(again) != 4 || again[0].Block || again[1].Want != out[6] || again[3].Want != out[8] {
		t.Errorf("the rewritten text reads back as %+v, %v", again, err)
	}
}
