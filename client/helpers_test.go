package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// fakeNode is a node of the public API with no memory: a valid item is
// over its limit when its hits exceed the limit. Each answer names as its
// decider the key (no ring) or the ring's owner of the key, so tests can
// tell which answer belongs to which item and whether the client routed
// by owner.
type fakeNode struct {
	sluicev1.UnimplementedRateLimiterServer
	name     string
	ring     *fakeRing // nil: Owners is unimplemented, Owner is the key
	notReady atomic.Bool
	slow     atomic.Bool  // Check answers only when the call's context ends
	calls    atomic.Int64 // Check calls
	checks   atomic.Int64 // items received
	forwards atomic.Int64 // items whose owner in the ring is another node

	mu   sync.Mutex
	last *sluicev1.CheckRequest

	srv  *grpc.Server
	addr string
}

func (n *fakeNode) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	n.calls.Add(1)
	if len(req.Requests) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "%d items, at most %d", len(req.Requests), MaxBatch)
	}
	if n.slow.Load() {
		<-ctx.Done()
	}
	n.mu.Lock()
	n.last = proto.CloneOf(req)
	n.mu.Unlock()
	resp := &sluicev1.CheckResponse{}
	for _, r := range req.Requests {
		n.checks.Add(1)
		a := fakeDecide(r)
		if n.ring != nil {
			a.Owner = n.ring.ownerOf(r.Name, r.Key)
			if a.Owner != n.name {
				n.forwards.Add(1)
			}
		}
		resp.Responses = append(resp.Responses, a)
	}
	return resp, nil
}

func fakeDecide(r *sluicev1.RateLimitRequest) *sluicev1.RateLimitResponse {
	hits := int64(1)
	if r.Hits != nil {
		hits = *r.Hits
	}
	switch {
	case r.Name == "":
		return &sluicev1.RateLimitResponse{Error: "name is empty"}
	case r.Key == "":
		return &sluicev1.RateLimitResponse{Error: "key is empty"}
	case hits > r.Limit:
		return &sluicev1.RateLimitResponse{Status: sluicev1.Status_STATUS_OVER_LIMIT, Limit: r.Limit, ResetAfterMs: 11_200, RetryAfterMs: 1_500, Owner: r.Key}
	}
	return &sluicev1.RateLimitResponse{Status: sluicev1.Status_STATUS_UNDER_LIMIT, Limit: r.Limit, Remaining: r.Limit - hits, ResetAfterMs: r.WindowMs, Owner: r.Key}
}

func (n *fakeNode) Owners(context.Context, *sluicev1.OwnersRequest) (*sluicev1.OwnersResponse, error) {
	if n.ring == nil {
		return nil, status.Error(codes.Unimplemented, "no ring")
	}
	r := proto.CloneOf(n.ring.resp.Load())
	r.Node, r.Ready = n.name, !n.notReady.Load()
	return r, nil
}

// lastRequest is a copy of the last call's request.
func (n *fakeNode) lastRequest() *sluicev1.CheckRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

// stop stops the node at once: its calls fail with UNAVAILABLE.
func (n *fakeNode) stop() { n.srv.Stop() }

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startNode serves n on a loopback port until the test ends.
func startNode(t testing.TB, n *fakeNode, opts ...grpc.ServerOption) *fakeNode {
	t.Helper()
	l := listen(t)
	n.srv = grpc.NewServer(opts...)
	sluicev1.RegisterRateLimiterServer(n.srv, n)
	n.addr = l.Addr().String()
	go n.srv.Serve(l)
	t.Cleanup(n.srv.Stop)
	return n
}

// closedAddr is a loopback address where nothing listens: a call there
// fails with UNAVAILABLE.
func closedAddr(t testing.TB) string {
	t.Helper()
	l := listen(t)
	addr := l.Addr().String()
	l.Close()
	return addr
}

func newClient(t testing.TB, addrs []string, opts ...Option) *Client {
	t.Helper()
	c, err := New(addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond) // polling interval, not synchronisation
	}
}

// testCA is a certificate authority written to dir/name.pem.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	path string
}

func newTestCA(t testing.TB, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, dir: dir, path: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.path, "CERTIFICATE", der)
	return ca
}

// issue writes a certificate for 127.0.0.1 with the given usages and its
// key, and returns their paths.
func (ca *testCA) issue(t testing.TB, name string, usage ...x509.ExtKeyUsage) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(t, certPath, "CERTIFICATE", der)
	writePEM(t, keyPath, "EC PRIVATE KEY", kb)
	return certPath, keyPath
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// mtlsServer is the server option of a node whose certificate nodeCA
// signed and that requires callers to present one clientCA signed.
func mtlsServer(t testing.TB, nodeCA, clientCA *testCA) grpc.ServerOption {
	t.Helper()
	certPath, keyPath := nodeCA.issue(t, "node", x509.ExtKeyUsageServerAuth)
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	callers := x509.NewCertPool()
	callers.AddCert(clientCA.cert)
	return grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    callers,
		MinVersion:   tls.VersionTLS12,
	}))
}
