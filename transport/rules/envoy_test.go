package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// envoyFile is in envoyproxy/ratelimit's format, with every feature.
const envoyFile = `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: MINUTE
      requests_per_unit: 50
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: path
    value: "*"
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 8}
  - key: path
    rate_limit: {unit: week, requests_per_unit: 9}
  - key: remote_address
    descriptors:
      - key: user
        rate_limit: {unit: month, requests_per_unit: 10, name: per_user}
      - key: user
        value: root
        rate_limit: {unlimited: true}
    rate_limit: {unit: year, requests_per_unit: 11, replaces: [{name: per_user}]}
  - key: shadow
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    metadata: {owner: team-a, tags: [x, y]}
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: algo
    rate_limit:
      unit: minute
      requests_per_unit: 5
      sluice: {algorithm: token_bucket, burst: 2, count_refused: false}
`

func mustParse(t *testing.T, data string) *Set {
	t.Helper()
	s, err := Parse("e.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func entries(kv ...string) []EnvoyEntry {
	var es []EnvoyEntry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, EnvoyEntry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestEnvoyMatch(t *testing.T) {
	s := mustParse(t, envoyFile)
	cases := []struct {
		name    string
		domain  string
		entries []EnvoyEntry
		path    string // "" for no rule
	}{
		{"exact value", "mongo_cps", entries("database", "users"), "mongo_cps.database_users"},
		{"exact value, upper-case unit", "mongo_cps", entries("database", "default"), "mongo_cps.database_default"},
		{"no key-only rule for database", "mongo_cps", entries("database", "other"), ""},
		{"wildcard before the catch-all wildcard", "mongo_cps", entries("path", "/api/v1"), "mongo_cps.path_/api/*"},
		{"wildcard matches the empty rest", "mongo_cps", entries("path", "/api/"), "mongo_cps.path_/api/*"},
		{"catch-all wildcard before key only", "mongo_cps", entries("path", "/other"), "mongo_cps.path_*"},
		{"catch-all wildcard matches the empty value", "mongo_cps", entries("path", ""), "mongo_cps.path_*"},
		{"depth 1 on a parent with a limit", "mongo_cps", entries("remote_address", "10.0.0.1"), "mongo_cps.remote_address"},
		{"nested key only", "mongo_cps", entries("remote_address", "10.0.0.1", "user", "bob"), "mongo_cps.remote_address.user"},
		{"nested exact before key only", "mongo_cps", entries("remote_address", "10.0.0.1", "user", "root"), "mongo_cps.remote_address.user_root"},
		{"deeper than the config", "mongo_cps", entries("database", "users", "x", "y"), ""},
		{"deeper than the config below a nested rule", "mongo_cps", entries("remote_address", "a", "user", "b", "c", "d"), ""},
		{"unknown key", "mongo_cps", entries("nope", "x"), ""},
		{"key compared exactly, not as key_value", "mongo_cps", entries("database_users", ""), ""},
		{"unknown domain", "other", entries("database", "users"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, name, known := s.MatchEnvoy(c.domain, c.entries)
			if known != (c.domain == "mongo_cps") {
				t.Fatalf("known = %v", known)
			}
			if known && name != "envoy:mongo_cps" {
				t.Fatalf("name = %q", name)
			}
			got := ""
			if r != nil {
				got = r.Path
			}
			if got != c.path {
				t.Fatalf("matched %q, want %q", got, c.path)
			}
		})
	}
}

func TestEnvoyRuleFields(t *testing.T) {
	s := mustParse(t, envoyFile)
	get := func(kv ...string) *EnvoyRule {
		t.Helper()
		r, _, _ := s.MatchEnvoy("mongo_cps", entries(kv...))
		if r == nil {
			t.Fatalf("%v matched nothing", kv)
		}
		return r
	}
	want := bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 500, WindowMS: 1000, CountRefused: true}
	if r := get("database", "users"); r.Limit != want || r.Unit != UnitSecond || r.CountRefusedSet {
		t.Fatalf("database=users: %+v", r)
	}
	for unit, ms := range map[EnvoyUnit]int64{UnitMinute: 60e3, UnitHour: 3600e3, UnitDay: 86400e3, UnitWeek: 7 * 86400e3, UnitMonth: 30 * 86400e3, UnitYear: 365 * 86400e3} {
		if unit.Seconds()*1000 != ms {
			t.Fatalf("%s is %d s", unit, unit.Seconds())
		}
	}
	if r := get("path", "x"); r.Limit.WindowMS != 86400e3 || len(r.Shared) != 1 || r.Shared[0] != "*" {
		t.Fatalf("shared wildcard: %+v", r)
	}
	if r := get("path", "/api/x"); r.Shared != nil {
		t.Fatalf("a wildcard without share_threshold shares: %+v", r)
	}
	if r := get("remote_address", "a", "user", "b"); r.Name != "per_user" || r.Unit != UnitMonth {
		t.Fatalf("per_user: %+v", r)
	}
	if r := get("remote_address", "a"); len(r.Replaces) != 1 || r.Replaces[0] != "per_user" || r.Unit != UnitYear {
		t.Fatalf("replaces: %+v", r)
	}
	if r := get("remote_address", "a", "user", "root"); !r.Unlimited || r.Limit != (bucket.Limit{}) {
		t.Fatalf("unlimited: %+v", r)
	}
	if r := get("shadow", "x"); !r.ShadowMode || !r.QuotaMode || r.Limit.Limit != 0 {
		t.Fatalf("shadow: %+v", r)
	}
	if r := get("algo", "x"); r.Limit.Algorithm != bucket.TokenBucket || r.Limit.Burst != 2 || r.Limit.CountRefused || !r.CountRefusedSet {
		t.Fatalf("sluice extension: %+v", r)
	}
	if s.Len() != 10 {
		t.Fatalf("Len = %d, want 10 rate limits", s.Len())
	}
}

func TestEnvoyMatchAllocatesNothing(t *testing.T) {
	s := mustParse(t, envoyFile)
	es := entries("remote_address", "10.0.0.1", "user", "bob")
	if n := testing.AllocsPerRun(100, func() { s.MatchEnvoy("mongo_cps", es) }); n != 0 {
		t.Fatalf("%v allocations per match", n)
	}
}

func TestWildcardMatch(t *testing.T) {
	cases := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true}, {"*", "abc", true}, {"a*", "a", true}, {"a*", "ab", true}, {"a*", "ba", false},
		{"*a", "ba", true}, {"*a", "ab", false}, {"a*c", "abc", true}, {"a*c", "ac", true}, {"a*c", "a", false},
		{"a*b*c", "axbyc", true}, {"a*b*c", "axyc", false}, {"a*a", "a", false}, {"a*a", "aa", true},
		{"**", "x", true}, {"a**b", "ab", true}, {"abc", "abc", true}, {"abc", "abd", false},
	}
	for _, c := range cases {
		if got := wildcardMatch(strings.Split(c.pattern, "*"), c.value); got != c.want {
			t.Errorf("%q matches %q: %v, want %v", c.pattern, c.value, got, c.want)
		}
	}
}

func TestEnvoyParseErrors(t *testing.T) {
	cases := []struct{ name, data, want string }{
		{"empty domain", "domain: ''\n", `e.yaml:1:9: domain: must not be empty`},
		{"unknown top field", "domain: a\nfoo: 1\n", `e.yaml:2:1: foo: unknown field (want domain, descriptors)`},
		{"both formats", "domain: a\nrules: []\n", `e.yaml:2:1: rules: a file is either`},
		{"no key", "domain: a\ndescriptors:\n  - value: x\n", `e.yaml:3:5: descriptors[0].key: a descriptor needs a non-empty key`},
		{"bad unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`e.yaml:4:24: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"no unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
			`descriptors[0].rate_limit: unit is required`},
		{"unlimited with unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			`descriptors[0].rate_limit.unit: an unlimited rate limit takes no unit`},
		{"negative rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`descriptors[0].rate_limit.requests_per_unit: -1 is not in 0..4294967295`},
		{"duplicate", "domain: a\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
			`e.yaml:4:5: descriptors[1]: descriptor "k" = "v" is defined twice`},
		{"duplicate key only", "domain: a\ndescriptors:\n  - {key: k}\n  - {key: k}\n", `descriptors[1]: descriptor key "k" without a value is defined twice`},
		{"duplicate wildcard", "domain: a\ndescriptors:\n  - {key: k, value: 'a*'}\n  - {key: k, value: 'a*'}\n", `defined twice`},
		{"share without wildcard", "domain: a\ndescriptors:\n  - {key: k, value: v, share_threshold: true}\n",
			`descriptors[0].share_threshold: applies only to a value with a '*' wildcard`},
		{"empty replaces", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n",
			`replaces needs a non-empty name`},
		{"replaces itself", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
			`cannot replace its own name "n"`},
		{"unknown descriptor field", "domain: a\ndescriptors:\n  - {key: k, limit: 1}\n", `descriptors[0].limit: unknown field`},
		{"unknown extension field", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, sluice: {window: 1s}}\n",
			`descriptors[0].rate_limit.sluice.window: unknown field (want algorithm, burst, count_refused)`},
		{"bad algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, sluice: {algorithm: magic}}\n",
			`unknown algorithm "magic"`},
		{"sliding log too big", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 20000, sluice: {algorithm: sliding_log}}\n",
			`descriptors[0].rate_limit: sliding_log keeps one timestamp per hit`},
		{"nested error", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {unit: nope}\n",
			`e.yaml:6:28: descriptors[0].descriptors[0].rate_limit.unit: unknown unit "nope"`},
		{"descriptors not a list", "domain: a\ndescriptors: {key: k}\n", `descriptors: must be a list of descriptors`},
		{"shadow not bool", "domain: a\ndescriptors:\n  - {key: k, shadow_mode: yes}\n", `descriptors[0].shadow_mode: must be true or false`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("e.yaml", []byte(c.data))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want an *Error", err, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error\n %v\nwant it to contain\n %s", err, c.want)
			}
		})
	}
}

func TestEnvoyDepthLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: a\n")
	indent := ""
	for range MaxEnvoyDepth + 1 {
		b.WriteString(indent + "descriptors:\n" + indent + "  - key: k\n")
		indent += "    "
	}
	if _, err := Parse("e.yaml", []byte(b.String())); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Fatalf("error %v, want one about nesting", err)
	}
}

func TestEnvoyMissingRequestsPerUnitBlocks(t *testing.T) {
	s := mustParse(t, "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")
	if r, _, _ := s.MatchEnvoy("a", entries("k", "v")); r == nil || r.Limit.Limit != 0 || r.Limit.WindowMS != 1000 {
		t.Fatalf("rule %+v, want a limit of 0 per second", r)
	}
}

func TestEnvoyDirectoryBothFormats(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "rules:\n- name: login\n  limits: [{limit: 1, window: 1s}]\n")
	write("b.yaml", envoyFile)
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Lookup("login"); !ok {
		t.Fatal("native rule missing")
	}
	if r, _, _ := s.MatchEnvoy("mongo_cps", entries("database", "users")); r == nil {
		t.Fatal("envoy rule missing")
	}
	if got := s.EnvoyDomains(); len(got) != 1 || got[0] != "mongo_cps" {
		t.Fatalf("domains %v", got)
	}
	native, _ := Parse("a.yaml", []byte("rules:\n- name: login\n  limits: [{limit: 1, window: 1s}]\n"))
	if s.Hash() == native.Hash() {
		t.Fatal("the envoy domain does not change the hash")
	}

	// One domain in two files is refused whole, naming both places.
	write("c.yaml", "# again\ndomain: mongo_cps\n")
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:2:9: domain: domain "mongo_cps" is already defined at `+filepath.Join(dir, "b.yaml")) {
		t.Fatalf("error %v", err)
	}
}

func TestEnvoyHash(t *testing.T) {
	base := mustParse(t, envoyFile).Hash()
	// Reordering exact and key-only siblings changes nothing.
	reordered := strings.Replace(envoyFile, `  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: MINUTE
      requests_per_unit: 50
`, `  - key: database
    value: default
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
`, 1)
	if reordered == envoyFile {
		t.Fatal("test did not reorder")
	}
	if h := mustParse(t, reordered).Hash(); h != base {
		t.Fatalf("reordered siblings hash %s, want %s", h, base)
	}
	for _, edit := range [][2]string{
		{"requests_per_unit: 500", "requests_per_unit: 501"},
		{"shadow_mode: true", "shadow_mode: false"},
		{"name: per_user", "name: per_userx"},
		{"burst: 2", "burst: 3"},
		{"value: /api/*", "value: /apx/*"},
		{"share_threshold: true", "share_threshold: false"},
	} {
		if h := mustParse(t, strings.Replace(envoyFile, edit[0], edit[1], 1)).Hash(); h == base {
			t.Errorf("%s → %s did not change the hash", edit[0], edit[1])
		}
	}
}

func TestEnvoyName(t *testing.T) {
	if n := EnvoyName("d"); n != "envoy:d" {
		t.Fatal(n)
	}
	long := strings.Repeat("x", bucket.MaxNameLen)
	for _, d := range []string{long, "a\x00b"} {
		n := EnvoyName(d)
		if !strings.HasPrefix(n, "envoy#") || bucket.ValidateKey(n, "k") != nil {
			t.Fatalf("EnvoyName(%q) = %q", d, n)
		}
	}
	if EnvoyName(long) == EnvoyName(long+"y") {
		t.Fatal("two long domains share a name")
	}
}

func TestEnvoyAliasBomb(t *testing.T) {
	// Each level repeats the one below twice: 2^21 descriptors from a few
	// lines. The loader stops at MaxEnvoyDescriptors.
	var b strings.Builder
	b.WriteString("domain: a\ndescriptors:\n  - key: a0\n    descriptors: &l0 [{key: k}]\n")
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&b, "  - key: a%d\n    descriptors: &l%d [{key: k, descriptors: *l%d}, {key: j, descriptors: *l%d}]\n", i, i, i-1, i-1)
	}
	_, err := Parse("e.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "more than 100000 descriptors in one file") {
		t.Fatalf("error %v", err)
	}
}

// The example shipped in deploy/examples/envoy loads, and matches what its
// Envoy bootstrap sends.
func TestEnvoyExampleConfigLoads(t *testing.T) {
	s, err := Load(filepath.Join("..", "..", "deploy", "examples", "envoy", "ratelimit-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		entries []EnvoyEntry
		rpu     int64
	}{
		{entries("remote_address", "203.0.113.9"), 100},
		{entries("remote_address", "203.0.113.9", "user", "bob"), 20},
		{entries("api_key", "partner-7"), 50000},
		{entries("path", "/static/logo.png"), 500},
		{entries("path", "/search?q=x"), 50},
	} {
		r, _, _ := s.MatchEnvoy("edge", c.entries)
		if r == nil || r.Limit.Limit != c.rpu {
			t.Fatalf("%v: rule %+v, want %d per unit", c.entries, r, c.rpu)
		}
	}
	if r, _, _ := s.MatchEnvoy("edge", entries("remote_address", "a", "user", "admin")); r == nil || !r.Unlimited {
		t.Fatalf("admin: %+v", r)
	}
}
