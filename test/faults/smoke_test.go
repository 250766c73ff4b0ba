//go:build faults && linux

package faults

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// TestHarness exercises every helper once on three hosts: start, a 1+2
// partition and its heal, one-way loss, SIGSTOP/SIGCONT, SIGKILL and a
// restart on the same data directory.
func TestHarness(t *testing.T) {
	c := New(t, 3)
	c.StartAll()
	a, b, d := c.Hosts[0], c.Hosts[1], c.Hosts[2]

	c.Partition([]*Host{a}, []*Host{b, d})
	took := c.WaitViews(30*time.Second, []*Host{a}, []*Host{b, d})
	t.Logf("1+2 partition: each side sees only itself after %v", took.Round(time.Millisecond))
	c.Heal()
	took = c.WaitViews(30*time.Second, c.Hosts)
	t.Logf("heal: every host sees all three after %v", took.Round(time.Millisecond))

	d.Pause()
	took = c.WaitViews(30*time.Second, []*Host{a, b})
	t.Logf("SIGSTOP: the others declare %s dead after %v", d.Name, took.Round(time.Millisecond))
	d.Resume()
	c.WaitViews(30*time.Second, c.Hosts)

	d.Kill9()
	c.WaitViews(30*time.Second, []*Host{a, b})
	d.Restart()
	took = c.WaitViews(30*time.Second, c.Hosts)
	t.Logf("kill -9 and restart: all three alive %v after the start", took.Round(time.Millisecond))
	if _, ok := d.Metric("sluice_ready"); !ok {
		t.Errorf("no sluice_ready on %s's /metrics", d.Name)
	}

	// Throttled, d's link carries at most rate bits per second after a
	// burst: its /metrics page (tens of KB, asked for uncompressed) cannot
	// arrive sooner than (size − burst) / rate; headers and retransmissions
	// only add to it.
	const rateBits, burst = 256_000, 4096
	c.Throttle(d, rateBits, burst)
	start := time.Now()
	code, body, err := getUncompressed(c, d, "/metrics")
	took = time.Since(start)
	if err != nil || code != 200 {
		t.Fatalf("/metrics through the throttled link: %d, %v", code, err)
	}
	if len(body) < 4*burst {
		t.Fatalf("/metrics is %d bytes, too small to see a %d-byte burst pass", len(body), burst)
	}
	least := time.Duration(float64(len(body)-burst) * 8 / rateBits * float64(time.Second))
	t.Logf("throttled to %d bit/s: %d bytes of /metrics took %v (no sooner than %v)", rateBits, len(body), took.Round(time.Millisecond), least.Round(time.Millisecond))
	if took < least {
		t.Errorf("%d bytes arrived in %v through a %d bit/s link, faster than %v", len(body), took, rateBits, least)
	}
	c.Heal()
	start = time.Now()
	if _, body, err = getUncompressed(c, d, "/metrics"); err != nil {
		t.Fatal(err)
	}
	t.Logf("after Heal: %d bytes of /metrics took %v", len(body), time.Since(start).Round(time.Millisecond))
}

// getUncompressed is Host.Get with the body sent as it is (no gzip), so
// that its length is what crossed the link.
func getUncompressed(c *Cluster, h *Host, path string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+h.HTTPAddr()+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
