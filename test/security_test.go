package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
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
	tc, err := transport.ClientTLSFiles{CA: ca, Cert: cert, Key: key}.ClientConfig()
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
func spend(t *testing.T, clients []*transport.Client, key string, n int, limit int64) int {
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
func remaining(t *testing.T, c *transport.Client, key string, limit int64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, exactReq(key, 0, limit))
	if err != nil {
		t.Fatalf("peek %s: %v", key, err)
	}
	return resp.Responses[0].Remaining
}

// resetAttack is what the issue's attacker sent with grpcurl: a handoff of
// key with a fresh state and a huge version, which an open node installs.
// The cluster name is no secret (it is the gossip label), so the attacker
// sends the right one.
func resetAttack(t *testing.T, key string) *sluicev1.ReplicateRequest {
	fresh := transport.CounterToProto(bucket.Counter{Name: "sec", Key: key, State: bucket.State{Algorithm: bucket.SlidingLog}, Version: 1 << 62})
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
	if got := spend(t, []*transport.Client{c}, "victim", 12, limit); got != limit {
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
	var clients []*transport.Client
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
		c, err := transport.Dial(target, opts...)
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
	_, attempts["Admin/Status"] = sluicev1.NewAdminClient(apiConn).Status(ctx, &sluicev1.StatusRequest{})
	for what, err := range attempts {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with an API client certificate: %v, want PermissionDenied", what, err)
		}
	}

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
	tc, err := transport.ClientTLSFiles{CA: ca, Cert: cert, Key: key}.ClientConfig()
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

// TestGossipKeyProofs runs three nodes that authenticate each other by the
// gossip key alone (no TLS): their own peer calls work, and a call without
// a proof, with a proof of another key, a stale one or a replayed one is
// refused and changes nothing; a node with another gossip key cannot join.
func TestGossipKeyProofs(t *testing.T) {
	t.Parallel()
	const base, k = 34, 3
	key := gossipKey(t)
	ps := startNodes(t, k, base, func(int) []string { return []string{"--gossip-key-file", key} })
	waitMembersProof(t, ps, key)

	var clients []*transport.Client
	for _, pr := range ps {
		clients = append(clients, dial(t, pr.grpc))
	}
	const limit = 10
	if got := spend(t, clients, "victim", 15, limit); got != limit {
		t.Fatalf("admitted %d of 15 through three nodes (forwards signed with the gossip key), want exactly %d", got, limit)
	}
	// The status page asks each member for its own figures with proofs.
	waitPageFigures(t, http.DefaultClient, "http://"+ps[0].http+"/", len(ps))

	right := prover(t, key)
	wrong := prover(t, gossipKey(t))
	peerRPC := sluicev1.NewPeerClient(clients[0].Conn())
	replicate := func(p *transport.Prover, at time.Time, proof string) error {
		req := resetAttack(t, "victim")
		if p != nil {
			var err error
			if proof, err = p.Sign(at, "/sluice.v1.Peer/Replicate", req); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if proof != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, transport.ProofHeader, proof)
		}
		_, err := peerRPC.Replicate(ctx, req)
		return err
	}
	for what, err := range map[string]error{
		"no proof":       replicate(nil, time.Time{}, ""),
		"another key":    replicate(wrong, time.Now(), ""),
		"a minute old":   replicate(right, time.Now().Add(-time.Minute), ""),
		"a minute early": replicate(right, time.Now().Add(time.Minute), ""),
		"malformed":      replicate(nil, time.Time{}, "v1:1:zz:zz"),
	} {
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("Peer/Replicate with %s: %v, want Unauthenticated", what, err)
		}
	}
	// A proof is good once: a valid, harmless call (a Pull without
	// release) goes through, the same proof again is refused.
	pull := &sluicev1.PullRequest{From: "node-x", Cluster: t.Name(), Keys: []*sluicev1.CounterKey{{Name: "sec", Key: "other"}}}
	proof, err := right.Sign(time.Now(), "/sluice.v1.Peer/Pull", pull)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []codes.Code{codes.OK, codes.Unauthenticated} {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), transport.ProofHeader, proof), 5*time.Second)
		_, err := peerRPC.Pull(ctx, pull)
		cancel()
		if status.Code(err) != want {
			t.Errorf("Pull with a proof, use %d: %v, want %v", i+1, err, want)
		}
	}
	for i, c := range clients {
		if got := remaining(t, c, "victim", limit); got != 0 {
			t.Errorf("after the refused calls node %d says %d remain, want 0", i, got)
		}
	}
	if _, err := clients[0].Status(context.Background()); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Admin/Status without a proof: %v, want Unauthenticated", err)
	}

	// A fourth node with another gossip key cannot join, says so once, and
	// the cluster stays at three.
	x := newProc(t, 3, fmt.Sprintf("127.0.0.%d", base+3))
	x.join = []string{ps[0].gossip}
	x.extra = []string{"--gossip-key-file", gossipKey(t), "--join-retry", "100ms"}
	x.start(t)
	waitFor(t, 30*time.Second, "the fourth node has retried its join three times", func() bool {
		return countLines(x.log.String(), "join failed again") >= 3
	})
	if n := countLines(x.log.String(), "cannot join: the seeds do not share this node's gossip key"); n != 1 {
		t.Errorf("the wrong-key node said why it cannot join %d times, want once:\n%s", n, x.log.String())
	}
	st, err := dial(t, ps[1].grpc, transport.WithProofs(right)).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	alive := 0
	for _, m := range st.Members {
		if m.Name == x.name {
			t.Errorf("the node with another gossip key is a member: %v", m)
		}
		if m.State == "alive" {
			alive++
		}
	}
	if alive != k {
		t.Errorf("%d members alive after the wrong-key node tried to join, want %d", alive, k)
	}
}

func prover(t *testing.T, keyFile string) *transport.Prover {
	t.Helper()
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := transport.NewProver([][]byte{k}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitMembersProof is waitMembers for nodes whose Admin calls need a proof.
func waitMembersProof(t *testing.T, ps []*proc, keyFile string) {
	t.Helper()
	waitMembers(t, ps, transport.WithProofs(prover(t, keyFile)))
}

// servedSerial is the serial number of the certificate a new TLS
// connection to addr is shown.
func servedSerial(t *testing.T, addr, ca string) string {
	t.Helper()
	tc, err := transport.ClientTLSFiles{CA: ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	tc.NextProtos = []string{"h2"}
	tc.ServerName = strings.Split(addr, ":")[0]
	conn, err := tls.DialWithDialer(&netDialer, "tcp", addr, tc)
	if err != nil {
		return "dial error: " + err.Error()
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestCertificateRotationUnderLoad replaces a node's certificate the way a
// Kubernetes secret is updated (an atomic swap of the ..data symlink) while
// checks run through it: new connections get the new certificate and no
// check fails; then a truncated certificate is refused and the last good
// one stays in force.
func TestCertificateRotationUnderLoad(t *testing.T) {
	t.Parallel()
	const base, k = 37, 3
	p := makePKI(t, names(k), ips(base, k))
	// node-0 reads its files through a secret-style directory.
	secret := t.TempDir()
	mount := func(gen string, cert, key []byte) {
		t.Helper()
		dir := filepath.Join(secret, gen)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.crt"), cert, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(secret, "..data_tmp")
		if err := os.Symlink(gen, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(secret, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(p.f(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mount("..gen1", read("node-0.pem"), read("node-0-key.pem"))
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(secret, f)); err != nil {
			t.Fatal(err)
		}
	}
	ps := startNodes(t, k, base, func(i int) []string {
		cert, key := p.f(fmt.Sprintf("node-%d.pem", i)), p.f(fmt.Sprintf("node-%d-key.pem", i))
		if i == 0 {
			cert, key = filepath.Join(secret, "tls.crt"), filepath.Join(secret, "tls.key")
		}
		return []string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", p.f("node-ca.pem")}
	})
	admin := tlsDial(t, p.f("node-ca.pem"), p.f("admin.pem"), p.f("admin-key.pem"))
	waitMembers(t, ps, admin)
	first := servedSerial(t, ps[0].grpc, p.f("node-ca.pem"))

	// Load through every node until told to stop (bounded in count and
	// time); every tenth call on a new connection, so handshakes happen
	// throughout the rotation.
	api := tlsDial(t, p.f("node-ca.pem"), "", "")
	stop := make(chan struct{})
	// calls counts the checks answered so far, so that each step of the
	// rotation happens with load running through it, not before it starts.
	var calls atomic.Int64
	type result struct {
		calls, errs int
		first       error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		deadline := time.Now().Add(60 * time.Second)
		var clients []*transport.Client
		for _, pr := range ps {
			c, err := transport.Dial(pr.grpc, api)
			if err != nil {
				r.errs, r.first = 1, err
				done <- r
				return
			}
			defer c.Close()
			clients = append(clients, c)
		}
		for i := 0; i < 50_000 && time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			c := clients[i%len(clients)]
			if i%10 == 0 {
				fresh, err := transport.Dial(ps[0].grpc, api)
				if err != nil {
					r.errs++
					continue
				}
				c = fresh
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.Check(ctx, exactReq(fmt.Sprint("k", i%100), 1, 1<<30))
			cancel()
			if i%10 == 0 {
				c.Close()
			}
			r.calls++
			calls.Add(1)
			if err != nil {
				r.errs++
				if r.first == nil {
					r.first = err
				}
			}
		}
		done <- r
	}()

	// Each step waits for this many more checks (a tenth of them on new
	// connections to node-0), so that every phase runs under load.
	const perPhase = 200
	loadRuns := func(phase string) int64 {
		t.Helper()
		from := calls.Load()
		waitFor(t, 30*time.Second, fmt.Sprintf("%d checks %s", perPhase, phase), func() bool {
			select {
			case r := <-done: // the load ended early: report it
				done <- r
				t.Fatalf("the load stopped %s after %d checks, %d failed (first: %v)", phase, r.calls, r.errs, r.first)
			default:
			}
			return calls.Load() >= from+perPhase
		})
		return calls.Load() - from
	}
	before := loadRuns("before the rotation")

	// A new certificate for node-0 from the same CA.
	newCert, newKey := issue(t, p, "node-0", ips(base, k))
	mount("..gen2", newCert, newKey)
	var second string
	waitFor(t, 30*time.Second, "node-0 serves its new certificate", func() bool {
		second = servedSerial(t, ps[0].grpc, p.f("node-ca.pem"))
		return second != first && !strings.HasPrefix(second, "dial error")
	})
	during := loadRuns("with the new certificate")
	// A truncated certificate is refused; the new one stays.
	mount("..gen3", newCert[:len(newCert)/2], newKey)
	waitFor(t, 30*time.Second, "node-0 refuses the truncated certificate", func() bool {
		return strings.Contains(ps[0].log.String(), "refused new TLS files")
	})
	after := loadRuns("after the truncated certificate")
	if got := servedSerial(t, ps[0].grpc, p.f("node-ca.pem")); got != second {
		t.Errorf("after a truncated certificate node-0 serves %s, want the last good one %s", got, second)
	}
	close(stop)
	r := <-done
	if r.errs != 0 || r.calls < 3*perPhase {
		t.Fatalf("%d of %d checks failed during the rotation (first: %v)", r.errs, r.calls, r.first)
	}
	t.Logf("%d checks during the rotation (%d before, %d with the new certificate, %d after the truncated one), none failed; serial %s → %s",
		r.calls, before, during, after, first, second)
}

var netDialer = net.Dialer{Timeout: 5 * time.Second}

// issue makes a new certificate and key for node name, signed by p's node
// CA, valid for hosts.
func issue(t *testing.T, p pki, name string, hosts []string) (certPEM, keyPEM []byte) {
	t.Helper()
	ca, err := tls.LoadX509KeyPair(p.f("node-ca.pem"), p.f("node-ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(h))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, key.Public(), ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})
}
