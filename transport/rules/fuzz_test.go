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

// FuzzParseEnvoy: the envoy-format loader never panics; every error is an
// *Error naming the file; every rule it accepts has a valid limit (or is
// unlimited); matching any descriptor against what it accepted never
// panics, and parsing again gives the same hash.
func FuzzParseEnvoy(f *testing.F) {
	for _, seed := range []string{
		envoyFile, "domain: a\n", "domain: a\ndescriptors:\n  - {key: k, value: 'a*b*', share_threshold: true, rate_limit: {unit: second, requests_per_unit: 3}}\n",
		"domain: a\ndescriptors:\n  - key: k\n    descriptors: [{key: j, rate_limit: {unlimited: true}}]\n",
		"domain: a\ndescriptors: &x [{key: k, descriptors: *x}]\n", "domain: [", "domain: 1\ndescriptors: [{key: 2, value: 3}]\n",
	} {
		f.Add([]byte(seed), "k", "v", "j", "x")
	}
	f.Fuzz(func(t *testing.T, data []byte, k1, v1, k2, v2 string) {
		s, err := Parse("f.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" {
				t.Fatalf("error %T %v is not an *Error for f.yaml", err, err)
			}
			return
		}
		for _, d := range s.EnvoyDomains() {
			checkEnvoyNode(t, &s.envoy[d].root, 1)
			for _, es := range [][]EnvoyEntry{{{k1, v1}}, {{k1, v1}, {k2, v2}}} {
				r, name, known := s.MatchEnvoy(d, es)
				if !known || bucket.ValidateKey(name, "k") != nil {
					t.Fatalf("domain %q: name %q, known %v", d, name, known)
				}
				if r != nil && r.Shared != nil && len(r.Shared) != len(es) {
					t.Fatalf("rule %s has %d shared levels for %d entries", r.Path, len(r.Shared), len(es))
				}
			}
		}
		again, err := Parse("g.yaml", data)
		if err != nil || again.Hash() != s.Hash() {
			t.Fatalf("parsing again: %v, hash %s vs %s", err, again.Hash(), s.Hash())
		}
	})
}

func checkEnvoyNode(t *testing.T, n *envoyNode, depth int) {
	t.Helper()
	if depth > MaxEnvoyDepth+1 {
		t.Fatalf("accepted a tree deeper than %d", MaxEnvoyDepth)
	}
	if r := n.rule; r != nil {
		switch {
		case r.Unlimited && r.Limit != (bucket.Limit{}):
			t.Fatalf("unlimited rule %s has a limit %+v", r.Path, r.Limit)
		case !r.Unlimited && r.Limit.Validate() != nil:
			t.Fatalf("rule %s: %v", r.Path, r.Limit.Validate())
		case !r.Unlimited && r.Limit.WindowMS != r.Unit.Seconds()*1000:
			t.Fatalf("rule %s: window %d ms for unit %s", r.Path, r.Limit.WindowMS, r.Unit)
		}
	}
	for _, c := range n.exact {
		checkEnvoyNode(t, c, depth+1)
	}
	for _, w := range n.wild {
		checkEnvoyNode(t, w.node, depth+1)
	}
	for _, c := range n.byKey {
		checkEnvoyNode(t, c, depth+1)
	}
}
