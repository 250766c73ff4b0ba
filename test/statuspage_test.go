package test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
)

// TestStatusPageInChromium renders GET / of a 3-node cluster of real
// `sluice serve` processes in headless Chromium (Debian's chromium
// package), checks the DOM the browser built for every member's name,
// state and address, the ring's arcs (each member's, interleaved) and the
// highlighted rules hash of the node that runs other rules, and writes a
// screenshot
// (status-page.png in the test's artifact directory: go test -artifacts
// keeps it). Skipped where chromium is not installed.
// Long on purpose: one story (cluster, load, render, check the DOM).
func TestStatusPageInChromium(t *testing.T) {
	t.Parallel()
	bin := chromiumBinary()
	if bin == "" {
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	dir := t.TempDir()
	rulesFile := func(name string, limit int) string {
		path := filepath.Join(dir, name)
		body := fmt.Sprintf("rules:\n  - name: login\n    limits:\n      - {limit: %d, window: 1m}\n  - name: api\n    limits:\n      - {limit: 1000, window: 1s}\n", limit)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// node-2 runs other rules than node-0 and node-1: its hash is the
	// highlighted one.
	same, other := rulesFile("rules.yaml", 5), rulesFile("other.yaml", 6)
	ps := make([]*proc, 3)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", 40+i))
		ps[i].extra = []string{"--rules", same}
		if i == 2 {
			ps[i].extra = []string{"--rules", other}
		}
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)

	// Some keys on every node: 60 checks through node-0.
	c := dial(t, ps[0].grpc)
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Check(ctx, checkReq("api", fmt.Sprintf("user-%d", i), 1, 100, 60_000))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	// A light load through every node while the page is rendered, so that
	// checks/s shows something.
	ctx, stop := context.WithCancel(context.Background())
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		cs := []*client.Node{c, dial(t, ps[1].grpc), dial(t, ps[2].grpc)}
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			cs[i%3].Check(cctx, checkReq("api", fmt.Sprintf("user-%d", i%200), 1, 1000, 60_000))
			cancel()
		}
	}()
	defer func() { stop(); <-loaded }()
	page := "http://" + ps[0].http + "/"
	waitPageFigures(t, http.DefaultClient, page, len(ps))

	dom := runChromium(t, bin, "--dump-dom", page)
	if !strings.Contains(dom, `<svg id="ring-svg"`) {
		t.Fatalf("Chromium did not get the HTML page:\n%s", dom)
	}
	for _, p := range ps {
		row := regexp.MustCompile(`(?s)<tr class="member[^"]*" data-member="` + p.name + `">.*?</tr>`).FindString(dom)
		if row == "" {
			t.Errorf("no row for %s in the DOM", p.name)
			continue
		}
		for _, want := range []string{`class="name">` + p.name + "<", ">" + p.grpc + "<", `state-alive">alive<`} {
			if !strings.Contains(row, want) {
				t.Errorf("%s's row lacks %q: %s", p.name, want, row)
			}
		}
		if mis := strings.Contains(row, "mismatch"); mis != (p.name == "node-2") {
			t.Errorf("%s's rules hash highlighted: %v, want %v: %s", p.name, mis, p.name == "node-2", row)
		}
		arc := regexp.MustCompile(`<path class="arc" data-member="` + p.name + `" d="M[^"]+Z"`).FindString(dom)
		if arc == "" {
			t.Errorf("no ring arc for %s in the DOM", p.name)
		}
	}
	// The ring is drawn as the owner table lays it out: each member holds
	// many arcs, interleaved (three members on 7919 partitions make about
	// two hundred), and every arc is a member's.
	arcs := regexp.MustCompile(`<path class="arc" data-member="([^"]*)"`).FindAllStringSubmatch(dom, -1)
	for _, a := range arcs {
		if !slices.ContainsFunc(ps, func(p *proc) bool { return p.name == a[1] }) {
			t.Errorf("a ring arc of %q, who is not a member", a[1])
		}
	}
	if len(arcs) <= len(ps) || !strings.Contains(dom, `id="ring-note"`) {
		t.Errorf("%d ring arcs for %d members, or no ring note: want the owner table's interleaved arcs", len(arcs), len(ps))
	}
	t.Logf("%d ring arcs for %d members", len(arcs), len(ps))
	if !strings.Contains(dom, `id="rules-mismatch"`) {
		t.Error("no rules mismatch warning")
	}
	for _, p := range ps[1:] {
		if !regexp.MustCompile(`<td class="mono">` + p.name + `</td><td>joined</td>`).MatchString(dom) {
			t.Errorf("no join event of %s among the recent membership events", p.name)
		}
	}

	shot := filepath.Join(t.ArtifactDir(), "status-page.png")
	runChromium(t, bin, "--screenshot="+shot, page)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot is %v, want 1280x900", b)
	}
	if n := colors(img); n < 8 {
		t.Errorf("screenshot has %d colors: blank?", n)
	}
	t.Logf("screenshot: %s", shot)
}

// chromiumBinary is Debian's chromium (or chromium-browser), or "".
func chromiumBinary() string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// runChromium runs headless Chromium on url with a fresh profile and
// returns its standard output. It gets a minute; its process group is
// killed by PID when that runs out or the test ends.
func runChromium(t *testing.T, bin string, args ...string) string {
	t.Helper()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,900"}, args...)
	cmd := exec.Command(bin, all...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill := func() { syscall.Kill(-pid, syscall.SIGKILL) } // chromium and its helpers
	t.Cleanup(kill)
	select {
	case err := <-done:
		kill() // helpers that outlive the browser
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
	case <-time.After(time.Minute):
		kill()
		<-done
		t.Fatalf("chromium %v did not finish within a minute\n%s", args, stderr.String())
	}
	return stdout.String()
}

// waitPageFigures waits until the status page at url (its plain-text
// form) shows the own figures of n members: the node that serves it asked
// every other member, through whatever authentication the cluster uses.
func waitPageFigures(t *testing.T, c *http.Client, url string, n int) {
	t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	waitFor(t, 25*time.Second, "the status page shows every member's own figures", func() bool {
		body, err := httpGet(c, url+"?format=text")
		if err != nil {
			body = err.Error()
		}
		last = body
		ok := err == nil && strings.Count(body, "  keys ") == n && !strings.Contains(body, "keys -")
		if !ok && time.Now().After(deadline) {
			t.Fatalf("the status page lacks some member's own figures:\n%s", last)
		}
		return ok
	})
}

func httpGet(c *http.Client, url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// colors counts the distinct colors of img, up to 1000.
func colors(img image.Image) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y && len(seen) < 1000; y += 3 {
		for x := b.Min.X; x < b.Max.X && len(seen) < 1000; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
		}
	}
	return len(seen)
}
