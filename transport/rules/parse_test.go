package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

const goodFile = `# the example of docs/rules.md
rules:
  - name: login
    limits:
      - {limit: 5, window: 1m}
      - {limit: 20, window: 1h, algorithm: token_bucket, burst: 5}
    mode: hard
  - name: api.daily
    limits:
      - {limit: 10000, calendar: day}
      - {limit: 600, window: 1h, sub_windows: 60}
      - {limit: 10, window: 1s, algorithm: leaky_bucket, shaping: true}
  - name: search
    mode: soft
    soft_percent: 10
    count_refused: true
    limits:
      - limit: 100
        window: 1m
      - limit: 1000
        window: 1h
        mode: elastic
        elastic_ceiling: 1500
        elastic_load_percent: 70
        count_refused: false
  - name: upload
    limits:
      - {limit: 50, window: 7d, algorithm: gcra}
      - {limit: 3, window: 1d12h, algorithm: sliding_log}
      - {limit: 1, window: 500ms, algorithm: fixed_window}
      - {limit: 100, window: 1d, calendar: month, algorithm: fixed_window}
      - {limit: 0, window: 1m}
`

func TestParseGood(t *testing.T) {
	t.Parallel()
	s, err := Parse("rules.yaml", []byte(goodFile))
	if err != nil {
		t.Fatal(err)
	}
	const (
		sec  = int64(1000)
		min  = 60 * sec
		hour = 60 * min
		day  = 24 * hour
	)
	want := map[string][]bucket.Limit{
		"login": {
			{Algorithm: bucket.SlidingWindow, Limit: 5, WindowMS: min},
			{Algorithm: bucket.TokenBucket, Limit: 20, WindowMS: hour, Burst: 5},
		},
		"api.daily": {
			{Algorithm: bucket.FixedWindow, Limit: 10000, WindowMS: day, Calendar: bucket.CalendarDay},
			{Algorithm: bucket.SlidingWindow, Limit: 600, WindowMS: hour, SubWindows: 60},
			{Algorithm: bucket.LeakyBucket, Limit: 10, WindowMS: sec, Shaping: true},
		},
		"search": {
			{Algorithm: bucket.SlidingWindow, Limit: 100, WindowMS: min, Mode: bucket.ModeSoft, SoftPercent: 10, CountRefused: true},
			{Algorithm: bucket.SlidingWindow, Limit: 1000, WindowMS: hour, Mode: bucket.ModeElastic, ElasticCeiling: 1500, ElasticLoadPercent: 70},
		},
		"upload": {
			{Algorithm: bucket.GCRA, Limit: 50, WindowMS: 7 * day},
			{Algorithm: bucket.SlidingLog, Limit: 3, WindowMS: day + 12*hour},
			{Algorithm: bucket.FixedWindow, Limit: 1, WindowMS: 500},
			{Algorithm: bucket.FixedWindow, Limit: 100, WindowMS: day, Calendar: bucket.CalendarMonth},
			{Algorithm: bucket.SlidingWindow, Limit: 0, WindowMS: min},
		},
	}
	if s.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(want))
	}
	for name, w := range want {
		got, ok := s.Lookup(name)
		if !ok {
			t.Fatalf("no rule %q", name)
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, w)
		}
		for i, l := range got {
			if err := l.Validate(); err != nil {
				t.Errorf("%s[%d]: %v", name, i, err)
			}
		}
	}
	if _, ok := s.Lookup("nope"); ok {
		t.Error("Lookup of a missing name succeeded")
	}
	if got := strings.Join(s.Names(), ","); got != "api.daily,login,search,upload" {
		t.Errorf("Names = %s", got)
	}
}

func TestParseModes(t *testing.T) {
	t.Parallel()
	s, err := Parse("m.yaml", []byte(`
rules:
  - name: soft
    mode: soft
    soft_percent: 25
    limits:
      - {limit: 10, window: 1s}                   # inherits soft 25
      - {limit: 10, window: 1m, soft_percent: 50} # overrides the percent
      - {limit: 10, window: 1h, mode: hard}       # hard: inherits nothing of soft
  - name: elastic
    mode: elastic
    elastic_ceiling: 50
    elastic_load_percent: 70
    limits:
      - {limit: 10, window: 1s}
      - {limit: 20, window: 1m, elastic_ceiling: 40}
      - {limit: 5, window: 1h, mode: soft, soft_percent: 5, count_refused: true}
  - name: calendars
    limits:
      - {limit: 1, calendar: day}
      - {limit: 2, calendar: week}
      - {limit: 3, calendar: month}
      - {limit: 4, calendar: none, window: 1m}
      - {limit: 5, calendar: day, calendar_tz: Europe/Berlin}
`))
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, i int, want bucket.Limit) {
		t.Helper()
		got, _ := s.Lookup(name)
		if got[i] != want {
			t.Errorf("%s[%d] = %+v, want %+v", name, i, got[i], want)
		}
	}
	sw := bucket.SlidingWindow
	check("soft", 0, bucket.Limit{Algorithm: sw, Limit: 10, WindowMS: 1000, Mode: bucket.ModeSoft, SoftPercent: 25})
	check("soft", 1, bucket.Limit{Algorithm: sw, Limit: 10, WindowMS: 60000, Mode: bucket.ModeSoft, SoftPercent: 50})
	check("soft", 2, bucket.Limit{Algorithm: sw, Limit: 10, WindowMS: 3600000})
	check("elastic", 0, bucket.Limit{Algorithm: sw, Limit: 10, WindowMS: 1000, Mode: bucket.ModeElastic, ElasticCeiling: 50, ElasticLoadPercent: 70})
	check("elastic", 1, bucket.Limit{Algorithm: sw, Limit: 20, WindowMS: 60000, Mode: bucket.ModeElastic, ElasticCeiling: 40, ElasticLoadPercent: 70})
	check("elastic", 2, bucket.Limit{Algorithm: sw, Limit: 5, WindowMS: 3600000, Mode: bucket.ModeSoft, SoftPercent: 5, CountRefused: true})
	fw := bucket.FixedWindow
	check("calendars", 0, bucket.Limit{Algorithm: fw, Limit: 1, WindowMS: 86400000, Calendar: bucket.CalendarDay})
	check("calendars", 1, bucket.Limit{Algorithm: fw, Limit: 2, WindowMS: 7 * 86400000, Calendar: bucket.CalendarWeek})
	check("calendars", 2, bucket.Limit{Algorithm: fw, Limit: 3, WindowMS: 31 * 86400000, Calendar: bucket.CalendarMonth})
	check("calendars", 3, bucket.Limit{Algorithm: sw, Limit: 4, WindowMS: 60000})
	check("calendars", 4, bucket.Limit{Algorithm: fw, Limit: 5, WindowMS: 86400000, Calendar: bucket.CalendarDay, CalendarTZ: "Europe/Berlin"})
}

func TestParseEmpty(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "# nothing\n", "---\n", "rules:\n", "rules: []\n", "~\n"} {
		s, err := Parse("e.yaml", []byte(in))
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if s.Len() != 0 || s.Hash() != emptyHash {
			t.Errorf("%q: %d rules, hash %s", in, s.Len(), s.Hash())
		}
	}
}

// TestParseErrors checks that each kind of error says where (file, line,
// column, field) and why.
// One table of cases; long on purpose: each case reads alone.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	seventeen := "rules:\n  - name: many\n    limits:\n" + strings.Repeat("      - {limit: 1, window: 1s}\n", 17)
	tests := []struct {
		name, in, want string
	}{
		{"window zero", "rules:\n  - name: a\n    limits:\n      - {limit: 1, window: 1s}\n  - name: b\n    limits:\n      - {limit: 1, window: 0s}\n",
			`r.yaml:7:28: rules[1].limits[0].window: "0s" is not 1ms..366d`},
		{"window too long", "rules:\n- name: a\n  limits: [{limit: 1, window: 367d}]\n",
			`r.yaml:3:31: rules[0].limits[0].window: "367d" is not 1ms..366d`},
		{"window not whole ms", "rules:\n- name: a\n  limits: [{limit: 1, window: 1500us}]\n",
			`r.yaml:3:31: rules[0].limits[0].window: "1500us" is not a whole number of milliseconds`},
		{"window garbage", "rules:\n- name: a\n  limits: [{limit: 1, window: soon}]\n",
			`r.yaml:3:31: rules[0].limits[0].window: "soon" is not a duration`},
		{"window without unit", "rules:\n- name: a\n  limits: [{limit: 1, window: 60}]\n",
			`r.yaml:3:31: rules[0].limits[0].window: must be a duration with a unit`},
		{"window missing", "rules:\n- name: a\n  limits: [{limit: 1}]\n",
			`r.yaml:3:12: rules[0].limits[0]: window is required`},
		{"limit missing", "rules:\n- name: a\n  limits: [{window: 1s}]\n",
			`r.yaml:3:12: rules[0].limits[0]: limit is required`},
		{"limit negative", "rules:\n- name: a\n  limits: [{limit: -1, window: 1s}]\n",
			`r.yaml:3:20: rules[0].limits[0].limit: -1 is not in 0..1099511627776`},
		{"limit too large", "rules:\n- name: a\n  limits: [{limit: 1099511627777, window: 1s}]\n",
			`rules[0].limits[0].limit: 1099511627777 is not in 0..1099511627776`},
		{"limit overflows", "rules:\n- name: a\n  limits: [{limit: 99999999999999999999, window: 1s}]\n",
			`r.yaml:3:20: rules[0].limits[0].limit: must be an integer, not "99999999999999999999"`},
		{"limit a float", "rules:\n- name: a\n  limits: [{limit: 5.5, window: 1s}]\n",
			`r.yaml:3:20: rules[0].limits[0].limit: must be an integer, not "5.5"`},
		{"limit a string", "rules:\n- name: a\n  limits: [{limit: five, window: 1s}]\n",
			`rules[0].limits[0].limit: must be an integer, not "five"`},
		{"burst negative", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, burst: -2}]\n",
			`rules[0].limits[0].burst: -2 is not in 0..`},
		{"sub_windows too many", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, sub_windows: 1001}]\n",
			`rules[0].limits[0].sub_windows: 1001 is not in 0..1000`},
		{"unknown algorithm", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, algorithm: magic}]\n",
			`r.yaml:3:46: rules[0].limits[0].algorithm: unknown algorithm "magic"`},
		{"unknown mode", "rules:\n- name: a\n  mode: harsh\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:3:9: rules[0].mode: unknown mode "harsh"`},
		{"unknown calendar", "rules:\n- name: a\n  limits: [{limit: 1, calendar: year}]\n",
			`rules[0].limits[0].calendar: unknown calendar "year"`},
		{"unknown time zone", "rules:\n- name: a\n  limits: [{limit: 1, calendar: day, calendar_tz: Mars/Olympus}]\n",
			`r.yaml:3:51: rules[0].limits[0].calendar_tz: calendar_tz "Mars/Olympus": not a time zone of the tz database`},
		{"Local time zone", "rules:\n- name: a\n  limits: [{limit: 1, calendar: day, calendar_tz: Local}]\n",
			`rules[0].limits[0].calendar_tz: calendar_tz "Local" is the deciding node's own zone`},
		{"time zone without calendar", "rules:\n- name: a\n  limits: [{limit: 1, window: 1h, calendar_tz: Europe/Berlin}]\n",
			`r.yaml:3:12: rules[0].limits[0]: calendar_tz "Europe/Berlin" applies only to calendar windows`},
		{"shaping not bool", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, algorithm: leaky_bucket, shaping: yes}]\n",
			`rules[0].limits[0].shaping: must be true or false, not "yes"`},
		{"unknown top field", "rule:\n- name: a\n",
			`r.yaml:1:1: rule: unknown field (want rules (Sluice's format) or domain`},
		{"unknown rule field", "rules:\n- name: a\n  limit: 5\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:3:3: rules[0].limit: unknown field (want name, limits,`},
		{"unknown limit field", "rules:\n- name: a\n  limits:\n  - limit: 1\n    window: 1s\n    windows: 2\n",
			`r.yaml:6:5: rules[0].limits[0].windows: unknown field (want limit, window,`},
		{"repeated field", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, limit: 2}]\n",
			`r.yaml:3:35: rules[0].limits[0].limit: repeated (first at line 3)`},
		{"merge key", "base: &b {limit: 1}\n",
			`r.yaml:1:1: base: unknown field`},
		{"merge key in limit", "rules:\n- name: a\n  limits: [{<<: {limit: 1}, window: 1s}]\n",
			`rules[0].limits[0]: field names must be plain strings, not the merge key <<`},
		{"name missing", "rules:\n- limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:2:3: rules[0]: name is required`},
		{"name empty", "rules:\n- name: ''\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:2:9: rules[0].name: name is empty`},
		{"name too long", "rules:\n- name: " + strings.Repeat("n", 129) + "\n  limits: [{limit: 1, window: 1s}]\n",
			`rules[0].name: name is 129 bytes, more than 128`},
		{"name with NUL", "rules:\n- name: \"a\\0b\"\n  limits: [{limit: 1, window: 1s}]\n",
			`rules[0].name: name contains a NUL byte at offset 1`},
		{"name a list", "rules:\n- name: [a]\n  limits: [{limit: 1, window: 1s}]\n",
			`rules[0].name: must be a string, not a list`},
		{"name twice", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s}]\n- name: a\n  limits: [{limit: 2, window: 1s}]\n",
			`r.yaml:4:9: rules[1].name: "a" is already defined at r.yaml:2:9`},
		{"limits missing", "rules:\n- name: a\n",
			`r.yaml:2:3: rules[0]: limits is required`},
		{"limits empty", "rules:\n- name: a\n  limits: []\n",
			`r.yaml:3:11: rules[0].limits: a rule needs at least one limit`},
		{"limits not a list", "rules:\n- name: a\n  limits: {limit: 1}\n",
			`rules[0].limits: must be a list of limits, not a mapping`},
		{"seventeen limits", seventeen,
			`r.yaml:4:7: rules[0].limits: 17 limits, more than 16`},
		{"rules not a list", "rules: {name: a}\n",
			`r.yaml:1:8: rules: must be a list of rules, not a mapping`},
		{"rule not a mapping", "rules:\n- login\n",
			`r.yaml:2:3: rules[0]: a rule must be a mapping of fields, not "login"`},
		{"file not a mapping", "- a\n",
			`r.yaml:1:1: the file must be a mapping of fields, not a list`},
		{"sub_windows with token bucket", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, algorithm: token_bucket, sub_windows: 10}]\n",
			`r.yaml:3:12: rules[0].limits[0]: sub_windows applies only to sliding_window, not token_bucket`},
		{"shaping with gcra", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, algorithm: gcra, shaping: true}]\n",
			`rules[0].limits[0]: shaping applies only to leaky_bucket, not gcra`},
		{"calendar with sliding window", "rules:\n- name: a\n  limits: [{limit: 1, calendar: day, algorithm: sliding_window}]\n",
			`rules[0].limits[0]: calendar windows apply only to fixed_window, not sliding_window`},
		{"sliding log cap", "rules:\n- name: a\n  limits: [{limit: 20000, window: 1s, algorithm: sliding_log}]\n",
			`rules[0].limits[0]: sliding_log keeps one timestamp per hit`},
		{"soft without percent", "rules:\n- name: a\n  mode: soft\n  limits: [{limit: 1, window: 1s}]\n",
			`rules[0].limits[0]: mode soft needs soft_percent in 1..1000, not 0`},
		{"soft percent zero", "rules:\n- name: a\n  mode: soft\n  soft_percent: 0\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:4:17: rules[0].soft_percent: 0 is not in 1..1000`},
		{"soft percent in hard rule", "rules:\n- name: a\n  soft_percent: 10\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:3:17: rules[0].soft_percent: applies only to mode soft, not hard`},
		{"elastic field in soft rule", "rules:\n- name: a\n  mode: soft\n  soft_percent: 5\n  elastic_ceiling: 9\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:5:20: rules[0].elastic_ceiling: applies only to mode elastic, not soft`},
		{"soft percent in hard limit", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, soft_percent: 10}]\n",
			`rules[0].limits[0]: soft_percent applies only to mode soft, not hard`},
		{"elastic ceiling not above limit", "rules:\n- name: a\n  mode: elastic\n  elastic_ceiling: 50\n  elastic_load_percent: 70\n  limits: [{limit: 50, window: 1s}]\n",
			`rules[0].limits[0]: mode elastic needs elastic_ceiling above the limit 50`},
		{"elastic load percent", "rules:\n- name: a\n  limits: [{limit: 1, window: 1s, mode: elastic, elastic_ceiling: 5, elastic_load_percent: 101}]\n",
			`rules[0].limits[0].elastic_load_percent: 101 is not in 1..100`},
		{"count_refused not bool", "rules:\n- name: a\n  count_refused: 1\n  limits: [{limit: 1, window: 1s}]\n",
			`r.yaml:3:18: rules[0].count_refused: must be true or false, not "1"`},
		{"syntax", "rules:\n- name: a\n  limits: 5\n  x: : y\n",
			`r.yaml:4: YAML: mapping values are not allowed in this context`},
		{"tab indent", "rules:\n\t- name: a\n",
			`r.yaml:2: YAML: found character that cannot start any token`},
		{"two documents", "rules: []\n---\nrules: []\n",
			`r.yaml:2:1: more than one YAML document`},
		{"custom tag", "rules:\n- name: a\n  limits: [{limit: !big 5, window: 1s}]\n",
			`rules[0].limits[0].limit: must be an integer, not "5"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse("r.yaml", []byte(tc.in))
			if err == nil {
				t.Fatalf("accepted:\n%s\n%d rules", tc.in, s.Len())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n %s\nwant it to contain\n %s", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "r.yaml:") {
				t.Errorf("error %q does not start with the file", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "r.yaml" {
				t.Errorf("error %T %v is not an *Error for r.yaml", err, err)
			}
		})
	}
}

func TestParseAliases(t *testing.T) {
	t.Parallel()
	s, err := Parse("a.yaml", []byte(`
rules:
  - name: a
    limits: &std
      - {limit: 5, window: 1m}
      - {limit: 100, window: 1h}
  - name: b
    limits: *std
`))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Lookup("a")
	b, _ := s.Lookup("b")
	if len(b) != 2 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("a = %v, b = %v", a, b)
	}
}

func TestParseWindow(t *testing.T) {
	t.Parallel()
	good := map[string]int64{
		"1ms": 1, "1s": 1000, "1.5s": 1500, "1m": 60000, "1h30m": 5400000,
		"1d": 86400000, "7d": 604800000, "1d12h": 129600000, "366d": 366 * 86400000,
		"365d23h59m59.999s": 366*86400000 - 1, "1000000us": 1000, "0d1ms": 1,
	}
	for in, want := range good {
		got, err := ParseWindow(in)
		if err != nil || got != want {
			t.Errorf("ParseWindow(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "0", "0s", "0d", "-1s", "1", "d", "1.5d", "+1d", "-1d", "1d-1h", "1d+1h", "1h1d",
		"367d", "366d1ms", "999999999d", "1500us", "1ns", "9999999999h", "1y", " 1s",
	} {
		if got, err := ParseWindow(in); err == nil {
			t.Errorf("ParseWindow(%q) = %d, want an error", in, got)
		}
	}
}
