package transport

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

const hostile = `<script>alert("x")</script>`

// pageStatus is a three-member view from node-a: the hostile member and
// node-a are alive, node-c is dead; only node-a's own figures (and
// version) are known.
type pageStatus struct{}

func (pageStatus) Status(context.Context) (*sluicev1.StatusResponse, error) {
	return &sluicev1.StatusResponse{
		Node: "node-a", Version: "0.9.0-test", Keys: 7, ChecksPerSecond: 12.5, Unreplicated: 3, RulesHash: "aaaa", Rules: 2, Partitions: 271, ReplicationFactor: 2,
		Members: []*sluicev1.Member{
			{Name: hostile, GrpcAddr: "127.0.0.1:2", State: "alive", Share: 0.5, Keys: -1},
			{Name: "node-a", GrpcAddr: "127.0.0.1:1", State: "alive", Share: 0.5, Keys: 7, RulesHash: "aaaa", ChecksPerSecond: 12.5, Unreplicated: 3, Version: "0.9.0-test"},
			{Name: "node-c", GrpcAddr: "127.0.0.1:3", State: "dead", Keys: -1},
		},
		Events: []*sluicev1.MemberEvent{
			{UnixMs: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli(), Member: hostile, Kind: "joined"},
			{UnixMs: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC).UnixMilli(), Member: "node-c", Kind: "failed"},
		},
	}, nil
}

// pageMembers answers for the hostile member with other rules and no
// version (a release from before versions were reported); anything else
// (node-c, dead, must not be asked) fails the test.
type pageMembers struct {
	t       *testing.T
	block   bool   // wait for the deadline instead of answering
	version string // the version the member says it runs
}

func (m pageMembers) Status(ctx context.Context, addr string) (*sluicev1.StatusResponse, error) {
	if addr != "127.0.0.1:2" {
		m.t.Errorf("status page asked %s, which is not an alive member with unknown figures", addr)
		return nil, errors.New("not asked")
	}
	if m.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &sluicev1.StatusResponse{Node: hostile, Keys: 40, ChecksPerSecond: 99, Unreplicated: 5, RulesHash: "bbbb", Version: m.version}, nil
}

func getPage(t *testing.T, h http.Handler, target, accept string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", target, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s (Accept %q) = %d %s", target, accept, rec.Code, rec.Body)
	}
	return rec
}

func pageServer(t *testing.T, members MemberStatus) http.Handler {
	t.Helper()
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Handler: &fakeHandler{}, Status: pageStatus{}, Members: members})
	if err != nil {
		t.Fatal(err)
	}
	return s.httpHandler()
}

const browserAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"

// TestStatusPageHTML: a browser gets the HTML page, with every name
// escaped, the members' own figures, the odd rules hash highlighted, one
// ring arc per member with a share, and the events.
func TestStatusPageHTML(t *testing.T) {
	t.Parallel()
	rec := getPage(t, pageServer(t, pageMembers{t: t}), "/", browserAccept)
	body := rec.Body.String()
	if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if strings.Contains(body, "<script") {
		t.Fatalf("the hostile member name reached the page unescaped:\n%s", body)
	}
	esc := `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`
	if n := strings.Count(body, esc); n < 5 { // arc, legend, row attribute and cell, event
		t.Errorf("escaped hostile name appears %d times, want at least 5:\n%s", n, body)
	}
	for _, want := range []string{"node-a", "node-c", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3",
		`state-alive">alive<`, `state-dead">dead<`, "12.5", "99.0", "271", "2026-01-02 03:04:05Z", "failed", `http-equiv="refresh"`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// The hostile member runs other rules than node-a; with a tie the
	// reference is this node's hash, so its cell is the highlighted one.
	if !strings.Contains(body, `<td class="mono mismatch">bbbb</td>`) || strings.Contains(body, `mismatch">aaaa`) {
		t.Errorf("rules hash bbbb should be highlighted and aaaa not:\n%s", body)
	}
	if !strings.Contains(body, `id="rules-mismatch"`) {
		t.Error("no mismatch warning")
	}
	// node-c (dead, unknown) shows "-" for its own figures and version.
	row := regexp.MustCompile(`(?s)<tr class="member" data-member="node-c">.*?</tr>`).FindString(body)
	if strings.Count(row, `<td class="num">-</td>`) != 3 || strings.Count(row, `<td class="mono">-</td>`) != 2 {
		t.Errorf("node-c's row should show - for keys, rate, lag, hash and version: %s", row)
	}
	// Versions: this node's, and "unknown" for a member that answered
	// without one.
	if !strings.Contains(body, `id="version">0.9.0-test<`) {
		t.Error("the page does not say this node's version")
	}
	rowA := regexp.MustCompile(`(?s)<tr class="member self" data-member="node-a">.*?</tr>`).FindString(body)
	rowH := regexp.MustCompile(`(?s)<tr class="member" data-member="&lt;script.*?</tr>`).FindString(body)
	if !strings.Contains(rowA, `<td class="mono">0.9.0-test</td>`) || !strings.Contains(rowH, `<td class="mono">unknown</td>`) {
		t.Errorf("versions: node-a's row should say 0.9.0-test, the old member's unknown:\n%s\n%s", rowA, rowH)
	}
	// Two members with half the ring each: two arcs, each a half sector.
	arcs := regexp.MustCompile(`<path class="arc" data-member="([^"]*)" d="([^"]*)" fill="(#[0-9a-f]{6})"`).FindAllStringSubmatch(body, -1)
	if len(arcs) != 2 || arcs[0][1] != esc || arcs[1][1] != "node-a" || arcs[0][3] == arcs[1][3] {
		t.Fatalf("arcs %q", arcs)
	}
	if arcs[0][2] != arcPath(0, 0.5) || arcs[1][2] != arcPath(0.5, 1) {
		t.Errorf("arc paths %q, %q", arcs[0][2], arcs[1][2])
	}
}

// TestStatusPageText: curl (*/*), Accept: text/plain and ?format=text get
// plain text; ?format=html wins over Accept.
func TestStatusPageText(t *testing.T) {
	t.Parallel()
	h := pageServer(t, pageMembers{t: t})
	for _, c := range []struct{ target, accept string }{{"/", ""}, {"/", "*/*"}, {"/", "text/plain"}, {"/?format=text", browserAccept}} {
		rec := getPage(t, h, c.target, c.accept)
		body := rec.Body.String()
		if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Errorf("%s (Accept %q): Content-Type %q", c.target, c.accept, ct)
		}
		for _, want := range []string{"node:     node-a", "version:  0.9.0-test", hostile, "keys 40", "rules bbbb (differs)  version unknown", "rules aaaa  version 0.9.0-test", "node-c", "failed"} {
			if !strings.Contains(body, want) {
				t.Errorf("%s (Accept %q): text lacks %q:\n%s", c.target, c.accept, want, body)
			}
		}
	}
	if ct := getPage(t, h, "/?format=html", "text/plain").Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("?format=html: Content-Type %q", ct)
	}
}

// TestStatusPageMemberVersion: a member's version is what it says of
// itself.
func TestStatusPageMemberVersion(t *testing.T) {
	t.Parallel()
	body := getPage(t, pageServer(t, pageMembers{t: t, version: "0.10.0"}), "/", "text/plain").Body.String()
	if !strings.Contains(body, "rules bbbb (differs)  version 0.10.0") {
		t.Errorf("the member's own version is not shown:\n%s", body)
	}
}

// TestStatusPageSlowMember: a member that does not answer costs the page
// at most statusPageMemberTimeout and shows "-".
func TestStatusPageSlowMember(t *testing.T) {
	t.Parallel()
	start := time.Now()
	body := getPage(t, pageServer(t, pageMembers{t: t, block: true}), "/", "text/plain").Body.String()
	if d := time.Since(start); d > statusPageTimeout {
		t.Errorf("page took %v", d)
	}
	if !strings.Contains(body, "keys -  checks/s -") || !strings.Contains(body, "rules -  version -") || strings.Contains(body, "differs") {
		t.Errorf("a silent member should show -:\n%s", body)
	}
}

// TestArcPath: sectors start at the top and go clockwise; a whole ring is
// two half sectors.
func TestArcPath(t *testing.T) {
	t.Parallel()
	if got, want := arcPath(0, 0.25), "M130.00 10.00A120 120 0 0 1 250.00 130.00L208.00 130.00A78 78 0 0 0 130.00 52.00Z"; got != want {
		t.Errorf("quarter: %s, want %s", got, want)
	}
	if got := arcPath(0, 1); got != arcPath(0, 0.5)+" "+arcPath(0.5, 1) {
		t.Errorf("whole ring: %s", got)
	}
	if !strings.Contains(arcPath(0, 0.75), " 0 1 1 ") {
		t.Errorf("three quarters needs the large-arc flag: %s", arcPath(0, 0.75))
	}
}
