package test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Caddy and Traefik in front of a Sluice cluster, each run with the
// configuration docs/proxies.md shows: the tests take the snippet from the
// document and change only its addresses.

// docSnippet returns the first fenced block of language lang in the section
// of docs/proxies.md under heading ("## Caddy").
func docSnippet(t *testing.T, heading, lang string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/proxies.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/proxies.md has no %q section", heading)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, block, ok := strings.Cut(section, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("docs/proxies.md %q has no ```%s block", heading, lang)
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatalf("docs/proxies.md %q: the ```%s block is not closed", heading, lang)
	}
	return block + "\n"
}

// fill replaces each old of the old, new pairs in s, failing the test when
// s lacks one: the document's placeholders and the test must agree.
func fill(t *testing.T, s string, oldnew ...string) string {
	t.Helper()
	for i := 0; i < len(oldnew); i += 2 {
		if !strings.Contains(s, oldnew[i]) {
			t.Fatalf("the documented snippet has no %q:\n%s", oldnew[i], s)
		}
		s = strings.ReplaceAll(s, oldnew[i], oldnew[i+1])
	}
	return s
}

// frontProc is a reverse proxy process started by a test.
type frontProc struct {
	name   string
	cmd    *exec.Cmd
	log    logBuf
	exited chan struct{}
}

// startFront starts cmd and stops it by its PID when the test ends (the
// proxies run here are one process each). extra, when not nil, is more of
// its output (a log file) to show when the test failed.
func startFront(t *testing.T, name string, cmd *exec.Cmd, extra func() string) *frontProc {
	t.Helper()
	f := &frontProc{name: name, cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &f.log, &f.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(f.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-f.exited
		if t.Failed() {
			more := ""
			if extra != nil {
				more = extra()
			}
			t.Logf("%s (pid %d) output:\n%s%s", name, cmd.Process.Pid, f.log.String(), more)
		}
	})
	return f
}

// waitReady waits until cond holds, failing at once if the process exits.
func (f *frontProc) waitReady(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, 20*time.Second, f.name+" "+what, func() bool {
		select {
		case <-f.exited:
			t.Fatalf("%s exited: %v\n%s", f.name, f.cmd.ProcessState, f.log.String())
		default:
		}
		return cond()
	})
}

// listening reports whether addr accepts TCP connections.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// lookProxy returns the path of the named program, skipping the test when
// it is not installed.
func lookProxy(t *testing.T, name, install string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (%s)", name, install)
	}
	return bin
}

// proxyCluster is what the Caddy and Traefik tests share: three Sluice
// nodes whose rules limit "edge" to 3 an hour, and an upstream that
// records the RateLimit headers the proxy copied onto its requests.
type proxyCluster struct {
	nodes    []*proc
	upstream string // host:port

	mu  sync.Mutex
	got []string // "RateLimit-Policy|RateLimit" of each request upstream
}

func newProxyCluster(t *testing.T, firstIP int) *proxyCluster {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeAtomic(t, rules, "rules:\n  - name: edge\n    limits: [{limit: 3, window: 1h}]\n")
	pc := &proxyCluster{nodes: make([]*proc, 3)}
	for i := range pc.nodes {
		pc.nodes[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", firstIP+i))
		pc.nodes[i].extra = []string{"--rules", rules}
		if i > 0 {
			pc.nodes[i].join = []string{pc.nodes[0].gossip}
		}
		pc.nodes[i].start(t)
	}
	waitMembers(t, pc.nodes)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pc.mu.Lock()
		pc.got = append(pc.got, r.Header.Get("RateLimit-Policy")+"|"+r.Header.Get("RateLimit"))
		pc.mu.Unlock()
		io.WriteString(w, "upstream\n")
	}))
	t.Cleanup(up.Close)
	pc.upstream = up.Listener.Addr().String()
	return pc
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip: the proxies key the limit by the client's address.
func clientFrom(t *testing.T, ip string) *http.Client {
	tr := &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)},
		Timeout:   5 * time.Second,
	}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

var (
	rateLimitRE = regexp.MustCompile(`^"edge";r=(\d+);t=(\d+)$`)
	policy      = `"edge";q=3;w=3600`
)

// check sends requests through the two proxies fronts (each asking a
// different node) with the Host header host, and asserts that they share
// the limit of 3 an hour per client address: the 4th request is refused
// with Sluice's 429, its RateLimit headers and Retry-After, even when the
// client sends an X-Forwarded-For of its choosing; another client address
// has its own count; and the allowed requests reached the upstream with
// the RateLimit headers the proxy copied from the answer.
func (pc *proxyCluster) check(t *testing.T, fronts []string, host string) {
	t.Helper()
	type answer struct {
		code                          int
		body, policy, limit, retryAft string
	}
	send := func(c *http.Client, front, xff string) answer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+front+"/hello", nil)
		req.Host = host
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(body), resp.Header.Get("RateLimit-Policy"),
			resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After")}
	}
	a, b := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")

	// Alternate between the two proxies: the limit of 3 is the cluster's.
	for i := range 3 {
		if got := send(a, fronts[i%2], ""); got.code != http.StatusOK || got.body != "upstream\n" {
			t.Fatalf("request %d through proxy %d: %+v, want 200 from the upstream", i, i%2, got)
		}
	}
	for i, xff := range []string{"", "203.0.113.7"} {
		got := send(a, fronts[(i+1)%2], xff)
		if got.code != http.StatusTooManyRequests || got.body != "over the limit\n" {
			t.Fatalf("request over the limit (X-Forwarded-For %q) through proxy %d: %+v, want Sluice's 429",
				xff, (i+1)%2, got)
		}
		if got.policy != policy {
			t.Errorf("429: RateLimit-Policy %q, want %q", got.policy, policy)
		}
		m := rateLimitRE.FindStringSubmatch(got.limit)
		if m == nil || m[1] != "0" {
			t.Errorf("429: RateLimit %q, want \"edge\";r=0;t=<seconds>", got.limit)
		}
		if s, err := strconv.Atoi(got.retryAft); err != nil || s < 1 || s > 3600 {
			t.Errorf("429: Retry-After %q, want 1..3600 seconds", got.retryAft)
		}
	}
	// Another client address has its own count.
	if got := send(b, fronts[1], ""); got.code != http.StatusOK {
		t.Fatalf("another client: %+v, want 200", got)
	}

	// The four allowed requests reached the upstream with the answer's
	// headers; the refused ones did not reach it.
	pc.mu.Lock()
	got := append([]string(nil), pc.got...)
	pc.mu.Unlock()
	want := []string{"2", "1", "0", "2"} // remaining after each
	if len(got) != len(want) {
		t.Fatalf("the upstream got %d requests (%q), want %d", len(got), got, len(want))
	}
	for i, g := range got {
		p, l, _ := strings.Cut(g, "|")
		m := rateLimitRE.FindStringSubmatch(l)
		if p != policy || m == nil || m[1] != want[i] {
			t.Errorf("upstream request %d: RateLimit-Policy|RateLimit %q, want %s|\"edge\";r=%s;t=<seconds>", i, g, policy, want[i])
		}
	}
}

// caddyGlobal is the Caddyfile's global options block the test puts before
// the documented site: no admin endpoint, plain HTTP/1.1 (no HTTP/3 on a
// UDP port), and every file Caddy writes in the test's directory.
const caddyGlobal = `{
	admin off
	auto_https off
	storage file_system {
		root %s
	}
	servers {
		protocols h1
	}
}

`

// startCaddy runs Caddy with the Caddyfile of docs/proxies.md on a free
// loopback port, in front of upstream, asking the Sluice node sluiceHTTP.
func startCaddy(t *testing.T, bin, upstream, sluiceHTTP string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freePort(t, "127.0.0.1", false)
	site := fill(t, docSnippet(t, "## Caddy", "caddyfile"),
		"app.example.com {", "http://"+addr+" {",
		"sluice:8080", sluiceHTTP,
		"app:8000", upstream)
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(caddyGlobal, filepath.Join(dir, "storage"))+site), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	f := startFront(t, "caddy", cmd, nil)
	// caddy run serves once the whole configuration is in force.
	f.waitReady(t, "listens on "+addr, func() bool { return listening(addr) })
	return addr
}

// TestForwardAuthBehindCaddy puts two real Caddy servers, each asking a
// different Sluice node through forward_auth, in front of one upstream.
func TestForwardAuthBehindCaddy(t *testing.T) {
	t.Parallel()
	bin := lookProxy(t, "caddy", "apt-get install -y caddy")
	pc := newProxyCluster(t, 60)
	fronts := []string{
		startCaddy(t, bin, pc.upstream, pc.nodes[0].http),
		startCaddy(t, bin, pc.upstream, pc.nodes[1].http),
	}
	pc.check(t, fronts, "")
}

// startTraefik runs Traefik with the dynamic configuration of
// docs/proxies.md (file provider) on a free loopback port, in front of
// upstream, asking the Sluice node sluiceHTTP. Its API, on another free
// port, says when the router is in force.
func startTraefik(t *testing.T, bin, upstream, sluiceHTTP string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freePort(t, "127.0.0.1", false)
	api := freePort(t, "127.0.0.1", false)
	dynamic := fill(t, docSnippet(t, "## Traefik", "yaml"),
		"http://sluice:8080/", "http://"+sluiceHTTP+"/",
		"http://app:8000", "http://"+upstream)
	conf := filepath.Join(dir, "dynamic.yaml")
	if err := os.WriteFile(conf, []byte(dynamic), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--entryPoints.web.address="+addr,
		"--entryPoints.traefik.address="+api,
		"--api.insecure=true",
		"--providers.file.filename="+conf,
		"--providers.file.watch=false",
		"--global.checkNewVersion=false",
		"--global.sendAnonymousUsage=false",
		"--log.level=INFO")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir)
	f := startFront(t, "traefik", cmd, nil)
	f.waitReady(t, "serves the router app@file", func() bool {
		if !listening(addr) {
			return false
		}
		resp, err := http.Get("http://" + api + "/api/http/routers/app@file")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"status":"enabled"`)
	})
	return addr
}

// TestForwardAuthBehindTraefik puts two real Traefik servers, each asking
// a different Sluice node through forwardAuth, in front of one upstream.
// Traefik is not packaged by Debian: the test skips unless a traefik
// binary is on PATH (docs/proxies.md says how to build one).
func TestForwardAuthBehindTraefik(t *testing.T) {
	t.Parallel()
	bin := lookProxy(t, "traefik", "docs/proxies.md, Which are tested, says how to build it")
	pc := newProxyCluster(t, 64)
	fronts := []string{
		startTraefik(t, bin, pc.upstream, pc.nodes[0].http),
		startTraefik(t, bin, pc.upstream, pc.nodes[1].http),
	}
	pc.check(t, fronts, "app.example.com")
}
