package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// TestPrometheusScrapesACluster starts a real Prometheus (Debian's
// prometheus package) with its own configuration, storage and loopback
// port, lets it scrape a 3-node cluster under a short, bounded load, and
// reads the check counters, the latency histogram and the peer metrics
// back through its HTTP API. Skipped where prometheus is not installed.
// Long on purpose: one story (load, scrape, query), read top to bottom.
func TestPrometheusScrapesACluster(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (apt-get install prometheus)")
	}
	ps := startCluster(t, 3)
	prom := startPrometheus(t, bin, ps)

	// The load: 3 clients, one per node, each 40 calls of 3 checks on
	// keys that every node owns a share of; a limit of 10 per key makes
	// some of them over. Counted here as the nodes answer them.
	const calls, perCall, limit = 40, 3, 10
	var mu sync.Mutex
	var under, over int
	var wg sync.WaitGroup
	for i, p := range ps {
		c := dial(t, p.grpc)
		wg.Go(func() {
			for j := range calls {
				req := &sluicev1.CheckRequest{}
				for k := range perCall {
					req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{
						Name: "prom", Key: fmt.Sprintf("k%d", (i*7+j*3+k)%20), Limit: limit, WindowMs: 600_000})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := c.Check(ctx, req)
				cancel()
				if err != nil {
					t.Errorf("check through %s: %v", p.name, err)
					return
				}
				mu.Lock()
				for _, o := range resp.Responses {
					switch o.Status {
					case sluicev1.Status_STATUS_UNDER_LIMIT:
						under++
					case sluicev1.Status_STATUS_OVER_LIMIT:
						over++
					default:
						t.Errorf("answer %v", o)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if under != 20*limit || over != 3*calls*perCall-20*limit {
		t.Fatalf("%d under and %d over: want %d under (20 keys × %d), the rest over", under, over, 20*limit, limit)
	}

	// Prometheus has the cluster's counts once it has scraped every node
	// after the load.
	waitFor(t, 30*time.Second, "Prometheus has scraped the counts of the load", func() bool {
		u, ok1 := prom.value(t, `sum(sluice_checks_total{job="sluice", api="grpc", result="under"})`)
		o, ok2 := prom.value(t, `sum(sluice_checks_total{job="sluice", api="grpc", result="over"})`)
		return ok1 && ok2 && int(u) == under && int(o) == over
	})
	want := map[string]float64{
		`count(up{job="sluice"} == 1)`:                                       3,
		`sum(sluice_check_duration_seconds_count{job="sluice", api="grpc"})`: 3 * calls,
		`count(sluice_members_alive{job="sluice"} == 3)`:                     3,
		`count(count by (hash) (sluice_rules_info{job="sluice"}))`:           1,
		`sum(sluice_checks_total{job="sluice", result="error"})`:             0,
	}
	for q, v := range want {
		if got, ok := prom.value(t, q); !ok || got != v {
			t.Errorf("%s = %v (answered %v), want %v", q, got, ok, v)
		}
	}
	// The histogram answers a quantile; forwards were timed per peer.
	if p99, ok := prom.value(t, `histogram_quantile(0.99, sum by (le) (sluice_check_duration_seconds_bucket{job="sluice", api="grpc"}))`); !ok || !(p99 > 0 && p99 <= 5) {
		t.Errorf("p99 of gRPC checks = %v (answered %v), want a duration in (0, 5s]", p99, ok)
	}
	fwd, _ := prom.value(t, `sum(sluice_forwarded_total{job="sluice"})`)
	timed, _ := prom.value(t, `sum(sluice_peer_rpc_duration_seconds_count{job="sluice", rpc="forward"})`)
	if fwd == 0 || timed == 0 {
		t.Errorf("forwarded %v checks in %v timed calls: want both above 0 (every node owns a share of the keys)", fwd, timed)
	}
	if peers, _ := prom.value(t, `count(count by (instance, peer) (sluice_peer_rpc_duration_seconds_count{job="sluice"}))`); peers < 2 || peers > 6 {
		t.Errorf("%v (node, peer) pairs with peer metrics: want 2..6 in a cluster of 3", peers)
	}
}

// promServer is a running Prometheus.
type promServer struct {
	addr string
}

// startPrometheus runs bin scraping every node of ps each 500 ms, with
// its storage in a temporary directory, until the test ends (stopped by
// its PID).
func startPrometheus(t *testing.T, bin string, ps []*proc) *promServer {
	t.Helper()
	dir := t.TempDir()
	var targets []string
	for _, p := range ps {
		targets = append(targets, strconv.Quote(p.http))
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: sluice
    static_configs:
      - targets: [%s]
`, strings.Join(targets, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t, "127.0.0.1", false)
	log := &logBuf{}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	p := &promServer{addr: addr}
	waitFor(t, 30*time.Second, "Prometheus is ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", log.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

// value runs an instant query and returns the value of its single
// result; ok is false when the query answered no result (or several).
func (p *promServer) value(t *testing.T, query string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatalf("query %s: %v", query, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %s: %v", query, err)
	}
	if r.Status != "success" {
		t.Fatalf("query %s: %s", query, r.Error)
	}
	if len(r.Data.Result) != 1 {
		return 0, false
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("query %s: value %q: %v", query, s, err)
	}
	return v, true
}
