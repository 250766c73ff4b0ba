// Package wiretest holds what the tests of transport and of the packages
// beneath it share: a fake decision of checks, valid requests, loopback
// listeners, a client of a node, waiting on a condition, and a certificate authority that
// issues certificates into a directory. Only those tests import it.
package wiretest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster/check"
)

// Decide answers every check of reqs in out as a test handler does: an
// invalid request gets its error, the others FakeDecide's answer for each
// limit (combined for several); every answer's owner is prefix + key.
func Decide(reqs []check.Request, out []check.Outcome, prefix string) {
	for i := range reqs {
		r := &reqs[i]
		if err := r.Validate(); err != nil {
			out[i] = check.Outcome{Err: err.Error(), Owner: prefix + r.Key}
			continue
		}
		if len(r.More) == 0 {
			out[i] = check.Outcome{Decision: FakeDecide(r.Limit, r.Hits), Owner: prefix + r.Key}
			continue
		}
		var ds []bucket.Decision
		if r.Limit != (bucket.Limit{}) {
			ds = append(ds, FakeDecide(r.Limit, r.Hits))
		}
		for _, l := range r.More {
			ds = append(ds, FakeDecide(l, r.Hits))
		}
		out[i] = check.Outcome{Decision: bucket.Combine(ds), Owner: prefix + r.Key}
	}
}

// FakeDecide is over the limit when hits > l.Limit.
func FakeDecide(l bucket.Limit, hits int64) bucket.Decision {
	if hits > l.Limit {
		return bucket.Decision{Status: bucket.OverLimit, Limit: l.Limit, ResetAfterMS: 11_200, RetryAfterMS: 1_500}
	}
	return bucket.Decision{Status: bucket.UnderLimit, Limit: l.Limit, Remaining: l.Limit - hits, ResetAfterMS: l.WindowMS}
}

// Req is a valid request for key k with the given hits against a limit of
// 10 per minute.
func Req(k string, hits int64) check.Request {
	return check.Request{Name: "api", Key: k, Hits: hits, Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000}}
}

// Keys is n requests of one hit, for keys prefix0 … prefix(n-1).
func Keys(prefix string, n int) []check.Request {
	rs := make([]check.Request, n)
	for i := range rs {
		rs[i] = Req(prefix+strconv.Itoa(i), 1)
	}
	return rs
}

// Listen listens on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// WaitFor polls cond until it holds or d passes.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond) // polling interval, not synchronisation
	}
}

// Dial connects to the node at addr with the Go client, closed with the
// test.
func Dial(t testing.TB, addr string) *client.Node {
	t.Helper()
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Ctx is a context that ends after 20 s or with the test.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// CA is a certificate authority that issues certificates into a directory.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	n    int64
}

// NewCA makes a CA and writes its certificate to dir/name.pem.
func NewCA(t *testing.T, dir, name string) *CA {
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
	ca := &CA{cert: c, key: key, dir: dir}
	WritePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	return ca
}

// Issue writes name.pem and name-key.pem for a leaf valid on 127.0.0.1.
func (ca *CA) Issue(t *testing.T, name string, usage ...x509.ExtKeyUsage) (cert, key string) {
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
	WritePEM(t, cert, "CERTIFICATE", der)
	WritePEM(t, key, "PRIVATE KEY", kb)
	return cert, key
}

// WritePEM writes der as one PEM block of type typ to path.
func WritePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Both is the use of a node's certificate: server and client.
var Both = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
