package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/internal/wiretest"
	"github.com/sluicehq/sluice/transport/security"
)

// The certificate authority of the transport tests (wiretest).
var (
	newTestCA = wiretest.NewCA
	both      = wiretest.Both
)

// An API client certificate gets Check but not the internal RPCs; a node
// certificate gets both; no certificate gets nothing when a client CA is set.
func TestTLSServerAuthorizesByCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nodeCA := newTestCA(t, dir, "node-ca")
	clientCA := newTestCA(t, dir, "client-ca")
	cert, key := nodeCA.Issue(t, "n1", both...)
	m, err := security.LoadTLS(security.TLSFiles{Cert: cert, Key: key, CA: filepath.Join(dir, "node-ca.pem"), ClientCA: filepath.Join(dir, "client-ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &fakeHandler{}, func(c *ServerConfig) { c.TLS = m; c.Status = fakeStatus{} })
	apiCert, apiKey := clientCA.Issue(t, "api", x509.ExtKeyUsageClientAuth)
	conn := func(cert, key string) *client.Node {
		tc, err := client.TLSFiles{CA: filepath.Join(dir, "node-ca.pem"), Cert: cert, Key: key}.TLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{Name: "n", Key: "k", Limit: 1, WindowMs: 1000}}}
	api := conn(apiCert, apiKey)
	if _, err := api.Check(ctx, req); err != nil {
		t.Errorf("Check with an API certificate: %v", err)
	}
	if _, err := api.Status(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Status with an API certificate: %v, want PermissionDenied", err)
	}
	node := conn(cert, key)
	if _, err := node.Status(ctx); err != nil {
		t.Errorf("Status with a node certificate: %v", err)
	}
	if _, err := conn("", "").Check(ctx, req); err == nil {
		t.Error("Check without a client certificate answered, with a client CA set")
	}
	if got := s.AuthRefused(); got != 1 {
		t.Errorf("AuthRefused = %d, want 1", got)
	}
	// TLS 1.1 is refused.
	tc := &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}
	if c, err := tls.Dial("tcp", s.GRPCAddr(), tc); err == nil {
		c.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
}
