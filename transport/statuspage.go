package transport

import (
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The status page (GET /) asks the StatusSource within statusPageTimeout,
// then each alive member it has no figures for (ServerConfig.Members), at
// most statusPageMaxAsked of them, concurrently, within
// statusPageMemberTimeout; a member that does not answer in time shows "-".
const (
	statusPageTimeout       = 2 * time.Second
	statusPageMemberTimeout = 500 * time.Millisecond
	statusPageMaxAsked      = 64
	// statusPageRefresh is how often the HTML page reloads itself, seconds.
	statusPageRefresh = 5
)

//go:embed statuspage.html
var statusPageHTML string

var statusPageTmpl = template.Must(template.New("status").Parse(statusPageHTML))

// memberColors are the members' colors on the ring and in the tables, by
// position in the (name-sorted) member list; they repeat after ten.
var memberColors = [...]string{
	"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
	"#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
}

// serveStatusPage is GET /: the node's view of the cluster, as HTML for a
// browser (an Accept that names text/html before text/plain, or
// ?format=html) and as plain text otherwise (curl, scripts, ?format=text).
func (s *Server) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	st, err := s.pageStatus(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Vary", "Accept")
	top := s.pageTopKeys(r.Context())
	if !wantsHTML(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, s.statusText(st, err)+top.text())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	// The page runs no script and loads nothing: its style is inline and
	// its drawing inline SVG.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	var b strings.Builder
	page := s.pageData(st, err, s.pageOwners(r.Context()))
	page.Top = top
	if err := statusPageTmpl.Execute(&b, page); err != nil {
		s.log.Error("rendering the status page", "err", err)
		http.Error(w, "rendering the status page failed", http.StatusInternalServerError)
		return
	}
	io.WriteString(w, b.String())
}

// wantsHTML reports whether r asks for the HTML page: ?format= decides
// when given, else the first of text/html and text/plain in Accept, else
// plain text (curl sends */*).
func wantsHTML(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "html":
		return true
	case "text":
		return false
	}
	accept := r.Header.Get("Accept")
	h, p := strings.Index(accept, "text/html"), strings.Index(accept, "text/plain")
	return h >= 0 && (p < 0 || h < p)
}

// pageStatus asks the StatusSource, then fills in what the alive members
// say of themselves (fillMembers). It returns nil, nil without a
// StatusSource.
func (s *Server) pageStatus(ctx context.Context) (*sluicev1.StatusResponse, error) {
	if s.cfg.Status == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusPageTimeout)
	defer cancel()
	st, err := s.cfg.Status.Status(ctx)
	if err != nil || st == nil {
		return nil, err
	}
	st = proto.CloneOf(st) // the source's answer is not ours to change
	if s.cfg.Members != nil {
		fillMembers(ctx, s.cfg.Members, st)
	}
	return st, nil
}

// fillMembers asks every alive member other than st.Node whose keys are
// unknown for its own keys, rules hash, rate, lag and version; members
// that do not answer within statusPageMemberTimeout keep what st says.
func fillMembers(ctx context.Context, ms MemberStatus, st *sluicev1.StatusResponse) {
	ctx, cancel := context.WithTimeout(ctx, statusPageMemberTimeout)
	defer cancel()
	var wg sync.WaitGroup
	asked := 0
	for _, m := range st.Members {
		if m.State != "alive" || m.Keys >= 0 || m.GrpcAddr == "" || m.Name == st.Node || asked == statusPageMaxAsked {
			continue
		}
		asked++
		wg.Go(func() {
			own, err := ms.Status(ctx, m.GrpcAddr)
			if err != nil || own == nil || own.Node != m.Name {
				return // no answer, or another node now has that address
			}
			m.Keys, m.RulesHash = own.Keys, own.RulesHash
			m.ChecksPerSecond, m.Unreplicated = own.ChecksPerSecond, own.Unreplicated
			m.Version = own.Version
		})
	}
	wg.Wait()
}

// statusText is the plain-text page.
func (s *Server) statusText(st *sluicev1.StatusResponse, err error) string {
	var b strings.Builder
	b.WriteString("sluice\n\n")
	fmt.Fprintf(&b, "state:    %s\n", s.readyWord())
	switch {
	case err != nil:
		fmt.Fprintf(&b, "status:   error: %v\n", err)
	case st == nil:
		b.WriteString("status:   not available\n")
	default:
		fmt.Fprintf(&b, "node:     %s\nversion:  %s\nkeys:     %d\nchecks/s: %.1f\nunreplicated: %d\nreplication factor: %d\npartitions: %d\nrules:    %d (hash %s)\n\nmembers:\n",
			st.Node, orUnknown(st.Version), st.Keys, st.ChecksPerSecond, st.Unreplicated, st.ReplicationFactor, st.Partitions, st.Rules, orDash(st.RulesHash))
		mismatch := rulesMismatch(st)
		for _, m := range st.Members {
			keys, rate, lag, hash := "-", "-", "-", "-"
			if m.Keys >= 0 {
				keys, rate, lag, hash = strconv.FormatInt(m.Keys, 10), strconv.FormatFloat(m.ChecksPerSecond, 'f', 1, 64),
					strconv.FormatInt(m.Unreplicated, 10), orDash(m.RulesHash)
				if mismatch[m.Name] {
					hash += " (differs)"
				}
			}
			fmt.Fprintf(&b, "  %-24s %-22s %-8s share %5.1f%%  keys %s  checks/s %s  unreplicated %s  rules %s  version %s  %s\n",
				m.Name, m.GrpcAddr, m.State, 100*m.Share, keys, rate, lag, hash, MemberVersion(m), SecuritySummary(m))
		}
		if len(st.Events) > 0 {
			b.WriteString("\nrecent membership events:\n")
			for _, e := range st.Events {
				fmt.Fprintf(&b, "  %s  %-24s %s\n", time.UnixMilli(e.UnixMs).UTC().Format(time.RFC3339), e.Member, e.Kind)
			}
		}
	}
	b.WriteString("\nendpoints: " + s.endpoints() + "\n")
	return b.String()
}

func (s *Server) readyWord() string {
	if s.ready.Load() {
		return "ready"
	}
	return "not ready"
}

func (s *Server) endpoints() string {
	e := "POST /v1/check, GET|POST /v1/forward-auth, GET /healthz, GET /readyz"
	if s.cfg.Metrics != nil {
		e += ", GET /metrics"
	}
	if s.cfg.Pprof {
		e += ", /debug/pprof/"
	}
	return e
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rulesMismatch returns the members whose rules hash differs from the one
// most members with a known hash (keys >= 0) run; a tie goes to this
// node's hash. It is empty when they all agree.
func rulesMismatch(st *sluicev1.StatusResponse) map[string]bool {
	count := map[string]int{}
	for _, m := range st.Members {
		if m.Keys >= 0 {
			count[m.RulesHash]++
		}
	}
	if len(count) < 2 {
		return nil
	}
	ref, best := st.RulesHash, count[st.RulesHash]
	for h, n := range count {
		if n > best || (n == best && h < ref && ref != st.RulesHash) {
			ref, best = h, n
		}
	}
	out := map[string]bool{}
	for _, m := range st.Members {
		if m.Keys >= 0 && m.RulesHash != ref {
			out[m.Name] = true
		}
	}
	return out
}

// The HTML page's data.
type (
	statusPage struct {
		Refresh       int
		Title         string
		Ready         bool
		ReadyWord     string
		Err           string
		Node          *sluicev1.StatusResponse
		RulesHash     string
		Members       []pageMember
		Arcs          []pageArc
		RingLayout    bool // Arcs are the owner table's arcs, not one share per member
		Events        []pageEvent
		Top           pageTop
		RulesMismatch bool
		Endpoints     string
		Rendered      string
	}
	pageMember struct {
		Name, Addr, State, Share, Keys, Checks, Lag, RulesHash, Version, Security string
		Color                                                                     string
		Self, Mismatch, Known                                                     bool
	}
	pageArc   struct{ Member, Color, D, Share string }
	pageEvent struct{ Time, Ago, Member, Kind string }
)

// pageTop is this node's heaviest keys for the page (Admin.TopKeys):
// pageTopKeys of each kind; Shown is false without a TopKeysSource.
type pageTop struct {
	Shown             bool
	Admitted, Refused []*sluicev1.TopKey
}

// pageTopKeys is how many of the heaviest keys of each kind the page
// shows.
const pageTopKeys = 10

// pageTopKeys asks the TopKeysSource for this node's heaviest keys.
func (s *Server) pageTopKeys(ctx context.Context) pageTop {
	if s.cfg.TopKeys == nil {
		return pageTop{}
	}
	ctx, cancel := context.WithTimeout(ctx, statusPageTimeout)
	defer cancel()
	var t pageTop
	if a, err := s.cfg.TopKeys.TopKeys(ctx, sluicev1.TopBy_TOP_BY_ADMITTED, pageTopKeys); err == nil {
		t.Admitted, t.Shown = a.Keys, true
	}
	if r, err := s.cfg.TopKeys.TopKeys(ctx, sluicev1.TopBy_TOP_BY_REFUSED, pageTopKeys); err == nil {
		t.Refused, t.Shown = r.Keys, true
	}
	return t
}

// text is the plain-text page's section of the heaviest keys.
func (t pageTop) text() string {
	if !t.Shown {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nheaviest keys decided here, last 30 to 60 s (sluice keys top for the cluster):\n")
	for _, l := range []struct {
		by   string
		keys []*sluicev1.TopKey
	}{{"admitted", t.Admitted}, {"refused", t.Refused}} {
		fmt.Fprintf(&b, "  by %s hits:", l.by)
		if len(l.keys) == 0 {
			b.WriteString(" none\n")
			continue
		}
		b.WriteString("\n")
		for _, k := range l.keys {
			fmt.Fprintf(&b, "    %-24q %-24q admitted %d  refused %d\n", k.Name, k.Key, k.Admitted, k.Refused)
		}
	}
	return b.String()
}

// pageOwners is the node's owner table for the ring drawing, or nil
// without an OwnerSource or when it fails (the drawing then shows each
// member's share as one arc).
func (s *Server) pageOwners(ctx context.Context) *sluicev1.OwnersResponse {
	if s.cfg.Owners == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusPageTimeout)
	defer cancel()
	ot, err := s.cfg.Owners.Owners(ctx)
	if err != nil {
		return nil
	}
	return ot
}

// pageData is the HTML page's data; ot, when given, draws the ring as the
// owner table lays it out (ringArcs).
func (s *Server) pageData(st *sluicev1.StatusResponse, err error, ot *sluicev1.OwnersResponse) statusPage {
	now := s.now()
	p := statusPage{
		Refresh: statusPageRefresh, Title: "sluice", Ready: s.ready.Load(), ReadyWord: s.readyWord(),
		Endpoints: s.endpoints(), Rendered: now.UTC().Format(time.RFC3339),
	}
	switch {
	case err != nil:
		p.Err = "status: " + err.Error()
		return p
	case st == nil:
		p.Err = "status is not available on this server"
		return p
	}
	p.Node, p.Title, p.RulesHash = st, "sluice · "+st.Node, orDash(st.RulesHash)
	mismatch := rulesMismatch(st)
	p.RulesMismatch = len(mismatch) > 0
	var total float64
	for _, m := range st.Members {
		total += max(m.Share, 0)
	}
	var at float64 // where the next share arc starts, as a fraction of the ring
	colors := make(map[string]pageArc, len(st.Members))
	for i, m := range st.Members {
		pm := pageMember{
			Name: m.Name, Addr: orDash(m.GrpcAddr), State: m.State, Share: fmt.Sprintf("%.1f%%", 100*m.Share),
			Keys: "-", Checks: "-", Lag: "-", RulesHash: "-", Version: MemberVersion(m), Security: SecuritySummary(m),
			Color: memberColors[i%len(memberColors)], Self: m.Name == st.Node, Mismatch: mismatch[m.Name], Known: m.Keys >= 0,
		}
		if pm.Known {
			pm.Keys = strconv.FormatInt(m.Keys, 10)
			pm.Checks = strconv.FormatFloat(m.ChecksPerSecond, 'f', 1, 64)
			pm.Lag = strconv.FormatInt(m.Unreplicated, 10)
			pm.RulesHash = orDash(m.RulesHash)
		}
		p.Members = append(p.Members, pm)
		colors[m.Name] = pageArc{Color: pm.Color, Share: pm.Share}
		if m.Share > 0 && total > 0 {
			f := m.Share / total
			p.Arcs = append(p.Arcs, pageArc{Member: m.Name, Color: pm.Color, D: arcPath(at, at+f), Share: pm.Share})
			at += f
		}
	}
	if arcs := ringArcs(ot, colors); arcs != nil {
		p.Arcs, p.RingLayout = arcs, true
	}
	for _, e := range st.Events {
		t := time.UnixMilli(e.UnixMs)
		p.Events = append(p.Events, pageEvent{
			Time: t.UTC().Format("2006-01-02 15:04:05Z"), Ago: ago(now.Sub(t)), Member: e.Member, Kind: e.Kind,
		})
	}
	return p
}

// ago is d rounded for "… ago".
func ago(d time.Duration) string {
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

// The ring's geometry in the SVG's user units: a band between two circles
// around (ringC, ringC).
const (
	ringC     = 130.0
	ringOuter = 120.0
	ringInner = 78.0
)

// arcPath is the SVG path of the band's sector from fraction from to
// fraction to of the ring, clockwise from the top. A whole ring is drawn
// as two halves (an SVG arc cannot start and end at one point).
func arcPath(from, to float64) string {
	if to-from >= 0.9999 {
		return arcPath(from, from+0.5) + " " + arcPath(from+0.5, to)
	}
	large := 0
	if to-from > 0.5 {
		large = 1
	}
	pt := func(f, r float64) (float64, float64) {
		a := 2*math.Pi*f - math.Pi/2
		return ringC + r*math.Cos(a), ringC + r*math.Sin(a)
	}
	x0, y0 := pt(from, ringOuter)
	x1, y1 := pt(to, ringOuter)
	x2, y2 := pt(to, ringInner)
	x3, y3 := pt(from, ringInner)
	return fmt.Sprintf("M%.2f %.2fA%g %g 0 %d 1 %.2f %.2fL%.2f %.2fA%g %g 0 %d 0 %.2f %.2fZ",
		x0, y0, ringOuter, ringOuter, large, x1, y1, x2, y2, ringInner, ringInner, large, x3, y3)
}
