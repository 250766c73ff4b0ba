package test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Long on purpose: one story (rules, a bad edit, a good edit), read top to bottom.
func TestRulesFileThroughServeAndCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(perHour int) {
		t.Helper()
		replace(t, path, "rules:\n  - name: login\n    limits:\n      - {limit: "+strconv.Itoa(perHour)+", window: 1h}\n      - {limit: 5, window: 1d}\n")
	}
	write(3)
	ps := make([]*proc, 2)
	for i := range ps {
		ps[i] = newProc(t, i, "127.0.0.30")
		ps[i].extra = []string{"--rules", path, "--rules-interval", "50ms"}
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)

	check := func(addr, name string) int {
		_, code := runCLI(t, "check", "--addr", addr, "--name", name, "--key", "u1")
		return code
	}
	// The rule's limits apply to checks without a limit: 3 per hour.
	for i, want := range []int{0, 0, 0, 1} {
		if got := check(ps[i%2].grpc, "login"); got != want {
			t.Fatalf("check %d exited %d, want %d", i, got, want)
		}
	}
	if got := check(ps[0].grpc, "no-such-rule"); got != 2 {
		t.Fatalf("a check with no limit and no rule exited %d, want 2", got)
	}
	// Over HTTP, an answer decided by the rule names the rule's window of
	// the limit it reports (the hourly 3: fewer remaining than the daily 5).
	resp, err := http.Post("http://"+ps[1].http+"/v1/check", "application/json",
		strings.NewReader(`{"requests":[{"name":"login","key":"u2"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("RateLimit-Policy"); resp.StatusCode != http.StatusOK || got != `"login";q=3;w=3600` {
		t.Fatalf("rules-based /v1/check: %d, RateLimit-Policy %q, want 200 and \"login\";q=3;w=3600", resp.StatusCode, got)
	}

	hashes := func() []string {
		var hs []string
		for _, p := range ps {
			out, code := runCLI(t, "status", "--addr", p.grpc, "--json")
			if code != 0 {
				t.Fatalf("status: %s", out)
			}
			var st struct {
				RulesHash string `json:"rules_hash"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatal(err)
			}
			hs = append(hs, st.RulesHash)
		}
		return hs
	}
	before := hashes()
	if before[0] == "" || before[0] != before[1] {
		t.Fatalf("rules hashes %v: want one non-empty hash on both nodes", before)
	}

	// A bad edit is refused whole; the rules in force stay. Both watchers
	// must have read it before the check means anything: the edit is one
	// atomic replace (a watcher never reads a half-written file, which
	// would be another edit), and each node must count a refused reload
	// and log the refusal of this content (its field) after the write.
	failures := func(p *proc) float64 { return metric(t, p, "sluice_rules_reload_failures_total") }
	refusedBefore := []float64{failures(ps[0]), failures(ps[1])}
	logFrom := []int{len(ps[0].log.String()), len(ps[1].log.String())}
	replace(t, path, "rules:\n  - name: login\n    limits: [{limit: 3, window: 0s}]\n")
	refused := func(i int) bool {
		l := ps[i].log.String()[logFrom[i]:]
		return failures(ps[i]) > refusedBefore[i] &&
			strings.Contains(l, "rules reload refused") && strings.Contains(l, "rules[0].limits[0].window")
	}
	waitFor(t, 10*time.Second, "both nodes refuse the bad edit (metric and log line)", func() bool {
		return refused(0) && refused(1)
	})
	if h := hashes(); h[0] != before[0] || h[1] != before[1] {
		t.Fatalf("after a refused edit the rules hashes are %v, want %v", h, before)
	}
	if got := check(ps[1].grpc, "login"); got != 1 {
		t.Fatalf("after a bad edit a check exited %d, want 1 (old rules, limit reached)", got)
	}
	// A good edit raises the hourly limit to 4; the daily limit of 5 still
	// counts the 3 admitted hits: one more is admitted, then refused.
	write(4)
	waitFor(t, 10*time.Second, "both nodes reload the rules", func() bool {
		h := hashes()
		return h[0] != before[0] && h[0] == h[1]
	})
	for i, want := range []int{0, 1} {
		if got := check(ps[i%2].grpc, "login"); got != want {
			t.Fatalf("after reload, check %d exited %d, want %d", i, got, want)
		}
	}
}

// replace writes body to path with one atomic rename, as editors and
// ConfigMaps do, so a watcher reads either the old content or body.
func replace(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestMultiLimitCheckIsAtomic(t *testing.T) {
	t.Parallel()
	ps := startCluster(t, 2)
	base := []string{"check", "--addr", ps[0].grpc, "--name", "multi", "--key", "k",
		"--limit", "2", "--window", "8760h", "--also", "limit=3,window=8760h"}
	for i, want := range []int{0, 0, 1, 1} {
		if _, got := runCLI(t, base...); got != want {
			t.Fatalf("check %d exited %d, want %d", i, got, want)
		}
	}
	// The refused checks consumed nothing from the second limit: a check
	// against it alone (same limits, hits 1, but the first raised) admits one.
	raised := []string{"check", "--addr", ps[1].grpc, "--name", "multi", "--key", "k",
		"--limit", "10", "--window", "8760h", "--also", "limit=3,window=8760h"}
	for i, want := range []int{0, 1} {
		if _, got := runCLI(t, raised...); got != want {
			t.Fatalf("raised check %d exited %d, want %d", i, got, want)
		}
	}
}
