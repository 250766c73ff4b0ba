package test

// Security of real nodes: the counter reset an open node accepts, and an
// mTLS cluster that refuses every way in without the right certificate;
// with the PKI and node helpers the gossip key and rotation tests share.

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// pki is a development PKI made by `sluice certs`.
type pki struct{ dir string }

func (p pki) f(name string) string { return filepath.Join(p.dir, name) }

// makePKI runs `sluice certs` for nodes valid on hosts.
func makePKI(t *testing.T, nodes []string, hosts []string) pki {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command(sluiceBinary(t), "certs", "--out", dir, "--nodes", strings.Join(nodes, ","),
		"--hosts", strings.Join(hosts, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice certs: %v\n%s", err, out)
	}
	return pki{dir: dir}
}

// gossipKey writes a new key made by `sluice keygen` to a file.
func gossipKey(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(sluiceBinary(t), "keygen").Output()
	if err != nil {
		t.Fatalf("sluice keygen: %v", err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(out)))
	if err != nil || len(k) != 32 {
		t.Fatalf("sluice keygen printed %q: want base64 of 32 bytes (%v)", out, err)
	}
	path := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsDial is the dial option of a TLS client with the given files.
func tlsDial(t *testing.T, ca, cert, key string) grpc.DialOption {
	t.Helper()
	tc, err := client.TLSFiles{CA: ca, Cert: cert, Key: key}.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(tc))
}

// startNodes starts k nodes on 127.0.0.<base+i>, each joining the first,
// with args(i) added to its flags.
func startNodes(t *testing.T, k, base int, args func(i int) []string) []*proc {
	t.Helper()
	ps := make([]*proc, k)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", base+i))
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].extra = append(ps[i].extra, "--secrets-interval", "100ms")
		ps[i].extra = append(ps[i].extra, args(i)...)
		ps[i].start(t)
	}
	return ps
}

func ips(base, k int) []string {
	var out []string
	for i := range k {
		out = append(out, fmt.Sprintf("127.0.0.%d", base+i))
	}
	return out
}

func names(k int) []string {
	var out []string
	for i := range k {
		out = append(out, fmt.Sprintf("node-%d", i))
	}
	return out
}

// exactReq is one check of an exact algorithm (sliding log) on key.
func exactReq(key string, hits, limit int64) *sluicev1.CheckRequest {
	r := checkReq("sec", key, hits, limit, int64(10*time.Minute/time.Millisecond))
	r.Requests[0].Algorithm = sluicev1.Algorithm_ALGORITHM_SLIDING_LOG
	return r
}

// spend sends n checks of key round-robin through clients and returns how
// many were admitted; any error fails the test.
func spend(t *testing.T, clients []*client.Node, key string, n int, limit int64) int {
	t.Helper()
	admitted := 0
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := clients[i%len(clients)].Check(ctx, exactReq(key, 1, limit))
		cancel()
		if err != nil {
			t.Fatalf("check %d through node %d: %v", i, i%len(clients), err)
		}
		r := resp.Responses[0]
		if r.Error != "" {
			t.Fatalf("check %d: %s", i, r.Error)
		}
		if r.Status == sluicev1.Status_STATUS_UNDER_LIMIT {
			admitted++
		}
	}
	return admitted
}

// remaining peeks (hits 0) at key through c.
func remaining(t *testing.T, c *client.Node, key string, limit int64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, exactReq(key, 0, limit))
	if err != nil {
		t.Fatalf("peek %s: %v", key, err)
	}
	return resp.Responses[0].Remaining
}

// resetAttack is what the attacker sent with grpcurl: a handoff of
// key with a fresh state and a huge version, which an open node installs.
// The cluster name is no secret (it is the gossip label), so the attacker
// sends the right one.
func resetAttack(t *testing.T, key string) *sluicev1.ReplicateRequest {
	fresh := peer.CounterToProto(bucket.Counter{Name: "sec", Key: key, State: bucket.State{Algorithm: bucket.SlidingLog}, Version: 1 << 62})
	return &sluicev1.ReplicateRequest{From: "attacker", Cluster: t.Name(), Kind: sluicev1.ReplicateRequest_KIND_HANDOFF, Counters: []*sluicev1.Counter{fresh}}
}

// countLines counts the lines of s that contain every one of subs.
func countLines(s string, subs ...string) int {
	n := 0
	for _, line := range strings.Split(s, "\n") {
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(line, sub)
		}
		if ok {
			n++
		}
	}
	return n
}

// TestOpenNodeAcceptsCounterReset shows the attack the secure modes stop: a
// node started with no security flags installs a forged handoff that gives
// an exhausted key its full quota back, and says at start that it trusts
// every caller.
func TestOpenNodeAcceptsCounterReset(t *testing.T) {
	t.Parallel()
	ps := startNodes(t, 1, 40, func(int) []string { return nil })
	waitMembers(t, ps)
	c := dial(t, ps[0].grpc)
	const limit = 10
	if got := spend(t, []*client.Node{c}, "victim", 12, limit); got != limit {
		t.Fatalf("admitted %d of 12, want %d", got, limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sluicev1.NewPeerClient(c.Conn()).Replicate(ctx, resetAttack(t, "victim")); err != nil {
		t.Fatalf("open node refused the forged handoff: %v", err)
	}
	if got := remaining(t, c, "victim", limit); got != limit {
		t.Fatalf("after the forged handoff %d remain, want the reset to %d (the attack this test shows)", got, limit)
	}
	if n := countLines(ps[0].log.String(), "trusts every caller"); n != 1 {
		t.Errorf("the warning that the node trusts every caller appears %d times, want 1", n)
	}
}

// TestMTLSCluster runs three nodes with mTLS between nodes, client
// certificates for API callers and encrypted gossip: checks through every
// node admit exactly the limit, and every way in without the right
// certificate is refused without changing the counter.
// Long on purpose: one story (exhaust a key, then each way in that must fail).
func TestMTLSCluster(t *testing.T) {
	t.Parallel()
	const base, k = 30, 3
	p := makePKI(t, names(k), ips(base, k))
	other := makePKI(t, names(1), ips(base, k))
	key := gossipKey(t)
	ps := startNodes(t, k, base, func(i int) []string {
		return []string{"--tls-cert", p.f(fmt.Sprintf("node-%d.pem", i)), "--tls-key", p.f(fmt.Sprintf("node-%d-key.pem", i)),
			"--tls-ca", p.f("node-ca.pem"), "--client-ca", p.f("client-ca.pem"), "--gossip-key-file", key}
	})
	admin := tlsDial(t, p.f("node-ca.pem"), p.f("admin.pem"), p.f("admin-key.pem"))
	waitMembers(t, ps, admin)

	st, err := dial(t, ps[1].grpc, admin).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if !m.Tls || !m.ClientAuth || !m.GossipEncrypted {
			t.Errorf("member %s: tls=%v client_auth=%v gossip_encrypted=%v, want all true", m.Name, m.Tls, m.ClientAuth, m.GossipEncrypted)
		}
	}

	api := tlsDial(t, p.f("node-ca.pem"), p.f("client.pem"), p.f("client-key.pem"))
	var clients []*client.Node
	for _, pr := range ps {
		clients = append(clients, dial(t, pr.grpc, api))
	}
	const limit = 10
	if got := spend(t, clients, "victim", 15, limit); got != limit {
		t.Fatalf("admitted %d of 15 through three nodes, want exactly %d", got, limit)
	}

	// Ways in that must fail. Each is tried against node 0.
	target := ps[0].grpc
	call := func(opts ...grpc.DialOption) error {
		c, err := client.Dial(target, opts...)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = c.Check(ctx, exactReq("victim", 1, limit))
		return err
	}
	if err := call(grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		t.Error("a plaintext call to a TLS node was answered")
	}
	if err := call(tlsDial(t, p.f("node-ca.pem"), other.f("client.pem"), other.f("client-key.pem"))); err == nil {
		t.Error("a client certificate of another CA was accepted")
	}
	if err := call(tlsDial(t, p.f("node-ca.pem"), "", "")); err == nil {
		t.Error("a call without a client certificate was accepted by a node with --client-ca")
	}
	if err := call(tlsDial(t, p.f("node-ca.pem"), other.f("node-0.pem"), other.f("node-0-key.pem"))); err == nil {
		t.Error("a node certificate of another cluster's CA was accepted")
	}

	// An API client's certificate (signed by --client-ca) gets the API, not
	// the internal RPCs.
	apiConn := dial(t, target, api).Conn()
	peerRPC := sluicev1.NewPeerClient(apiConn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	attempts := map[string]error{}
	_, attempts["Peer/Replicate"] = peerRPC.Replicate(ctx, resetAttack(t, "victim"))
	_, attempts["Peer/Pull"] = peerRPC.Pull(ctx, &sluicev1.PullRequest{From: "attacker", Cluster: t.Name(), Keys: []*sluicev1.CounterKey{{Name: "sec", Key: "victim"}}, Release: true, ReleaseTtlMs: 60000})
	_, attempts["Peer/Forward"] = peerRPC.Forward(ctx, &sluicev1.ForwardRequest{From: "attacker", Cluster: t.Name(), StandIn: true, Requests: exactReq("victim", 1, 1000).Requests})
	adminRPC := sluicev1.NewAdminClient(apiConn)
	_, attempts["Admin/Status"] = adminRPC.Status(ctx, &sluicev1.StatusRequest{})
	_, attempts["Admin/TopKeys"] = adminRPC.TopKeys(ctx, &sluicev1.TopKeysRequest{})
	_, attempts["Admin/InspectKey"] = adminRPC.InspectKey(ctx, &sluicev1.KeyRequest{Request: exactReq("victim", 1, limit).Requests[0]})
	_, attempts["Admin/DrainKey"] = adminRPC.DrainKey(ctx, &sluicev1.KeyRequest{Request: exactReq("other", 1, limit).Requests[0]})
	for what, err := range attempts {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with an API client certificate: %v, want PermissionDenied", what, err)
		}
	}

	// With a certificate of the node CA, a drain is answered, and the audit
	// line names the certificate.
	drained, err := sluicev1.NewAdminClient(dial(t, ps[0].grpc, admin).Conn()).DrainKey(ctx, &sluicev1.KeyRequest{Request: exactReq("drained", 1, limit).Requests[0]})
	if err != nil || drained.Drained != limit {
		t.Fatalf("DrainKey with a node CA certificate: %v, %v; want %d drained", drained, err, limit)
	}
	// The node writes its log through a pipe: the line may reach the test
	// a moment after the answer.
	waitFor(t, 10*time.Second, "the drain's audit line naming the certificate in node-0's log", func() bool {
		return strings.Contains(ps[0].log.String(), `msg="audit: key drained" name=sec key=drained caller="certificate CN=`)
	})

	// The operator pages need a node certificate; pprof is off by default.
	hc := httpsClient(t, p.f("node-ca.pem"), p.f("client.pem"), p.f("client-key.pem"))
	if code := get(t, hc, "https://"+ps[0].http+"/"); code != http.StatusForbidden {
		t.Errorf("status page with an API certificate: %d, want 403", code)
	}
	if code := get(t, hc, "https://"+ps[0].http+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof: %d, want 404", code)
	}
	if code := get(t, httpsClient(t, p.f("node-ca.pem"), p.f("admin.pem"), p.f("admin-key.pem")), "https://"+ps[0].http+"/"); code != http.StatusOK {
		t.Errorf("status page with a node CA certificate: %d, want 200", code)
	}
	// The page asks each member for its own figures with the node's
	// certificate.
	waitPageFigures(t, httpsClient(t, p.f("node-ca.pem"), p.f("admin.pem"), p.f("admin-key.pem")), "https://"+ps[0].http+"/", len(ps))

	// Nothing changed: every node still sees the key exhausted.
	for i, c := range clients {
		if got := remaining(t, c, "victim", limit); got != 0 {
			t.Errorf("after the refused calls node %d says %d remain, want 0", i, got)
		}
	}
	log := ps[0].log.String()
	if n := countLines(log, "refused call from a caller that is not a cluster member", "caller=127.0.0.1:"); n != 1 {
		t.Errorf("refusals from 127.0.0.1 logged %d times, want once per caller host:\n%s", n, log)
	}
	if m := scrapeWith(t, hc, "https://"+ps[0].http+"/metrics")["sluice_auth_refused_total"]; m < 5 {
		t.Errorf("sluice_auth_refused_total = %v, want at least the 5 refusals made here", m)
	}
	if strings.Contains(log, "trusts every caller") {
		t.Error("a node with TLS and a gossip key logged that it trusts every caller")
	}
}

func httpsClient(t *testing.T, ca, cert, key string) *http.Client {
	t.Helper()
	tc, err := client.TLSFiles{CA: ca, Cert: cert, Key: key}.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func get(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
