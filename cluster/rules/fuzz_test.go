package rules

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// FuzzParse: the parser never panics; every error is an *Error naming the
// file; an accepted input holds only valid rules and parses again to the
// same rules.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		goodFile, ruleA, ruleB, ruleC, "", "rules: []", "rules:\n- name: a\n  limits: &x [{limit: 1, window: 1s}]\n- name: b\n  limits: *x\n",
		"rules:\n- name: a\n  mode: elastic\n  elastic_ceiling: 9\n  elastic_load_percent: 50\n  limits: [{limit: 1, window: 1d1ms, count_refused: true}]\n",
		"rules:\n- name: a\n  limits: [{limit: 1, window: 0s}]\n", "rules: [", "a: &a [*a]", "rules:\n- {name: x, limits: [{limit: 0x10, window: 1h, sub_windows: 0o7}]}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("f.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" {
				t.Fatalf("error %T %v is not an *Error for f.yaml", err, err)
			}
			return
		}
		for _, name := range s.Names() {
			if err := bucket.ValidateKey(name, "x"); err != nil {
				t.Fatalf("accepted name %q: %v", name, err)
			}
			lims, _ := s.Lookup(name)
			if len(lims) < 1 || len(lims) > MaxLimitsPerRule {
				t.Fatalf("rule %q has %d limits", name, len(lims))
			}
			for i, l := range lims {
				if err := l.Validate(); err != nil {
					t.Fatalf("accepted %s[%d] = %+v: %v", name, i, l, err)
				}
				if l.Algorithm == bucket.AlgorithmUnspecified {
					t.Fatalf("accepted %s[%d] without an algorithm", name, i)
				}
			}
		}
		again, err := Parse("g.yaml", data)
		if err != nil || again.Hash() != s.Hash() || fmt.Sprint(again.limits) != fmt.Sprint(s.limits) {
			t.Fatalf("parsing again: %v, hash %s vs %s", err, again.Hash(), s.Hash())
		}
	})
}
