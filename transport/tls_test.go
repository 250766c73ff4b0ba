package transport

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
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/security"
)

// testCA is a CA that issues certificates into a directory.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	n    int64
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: c, key: key, dir: dir}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	return ca
}

// issue writes name.pem and name-key.pem for a leaf valid on 127.0.0.1.
func (ca *testCA) issue(t *testing.T, name string, usage ...x509.ExtKeyUsage) (cert, key string) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(100 + ca.n), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, k.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalPKCS8PrivateKey(k)
	cert, key = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(t, cert, "CERTIFICATE", der)
	writePEM(t, key, "PRIVATE KEY", kb)
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

var both = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// An API client certificate gets Check but not the internal RPCs; a node
// certificate gets both; no certificate gets nothing when a client CA is set.
func TestTLSServerAuthorizesByCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nodeCA := newTestCA(t, dir, "node-ca")
	clientCA := newTestCA(t, dir, "client-ca")
	cert, key := nodeCA.issue(t, "n1", both...)
	m, err := security.LoadTLS(security.TLSFiles{Cert: cert, Key: key, CA: filepath.Join(dir, "node-ca.pem"), ClientCA: filepath.Join(dir, "client-ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &fakeHandler{}, func(c *ServerConfig) { c.TLS = m; c.Status = fakeStatus{} })
	apiCert, apiKey := clientCA.issue(t, "api", x509.ExtKeyUsageClientAuth)
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
