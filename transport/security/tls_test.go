package security

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/transport/internal/wiretest"
)

// The certificate authority of the transport tests (wiretest).
var (
	newTestCA = wiretest.NewCA
	both      = wiretest.Both
)

func TestLoadTLSRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nodeCA := newTestCA(t, dir, "node-ca")
	otherCA := newTestCA(t, dir, "other-ca")
	cert, key := nodeCA.Issue(t, "n1", both...)
	foreign, foreignKey := otherCA.Issue(t, "x", both...)
	serverOnly, serverOnlyKey := nodeCA.Issue(t, "s", x509.ExtKeyUsageServerAuth)
	_, key2 := nodeCA.Issue(t, "n2", both...)
	ca := filepath.Join(dir, "node-ca.pem")
	certPEM, _ := os.ReadFile(cert)
	truncated := filepath.Join(dir, "truncated.pem")
	os.WriteFile(truncated, certPEM[:len(certPEM)/2], 0o600)
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, append(append([]byte{}, certPEM...), "trailing junk"...), 0o600)

	if _, err := LoadTLS(TLSFiles{Cert: cert, Key: key, CA: ca}); err != nil {
		t.Fatalf("good files refused: %v", err)
	}
	for _, c := range []struct {
		what  string
		files TLSFiles
		want  string
	}{
		{"no CA", TLSFiles{Cert: cert, Key: key}, "--tls-ca"},
		{"no key", TLSFiles{Cert: cert, CA: ca}, "--tls-key"},
		{"another CA's certificate", TLSFiles{Cert: foreign, Key: foreignKey, CA: ca}, "not a node certificate"},
		{"server-auth only", TLSFiles{Cert: serverOnly, Key: serverOnlyKey, CA: ca}, "client auth"},
		{"mismatched key", TLSFiles{Cert: cert, Key: key2, CA: ca}, "private key does not match"},
		{"truncated certificate", TLSFiles{Cert: truncated, Key: key, CA: ca}, "--tls-cert"},
		{"CA with trailing junk", TLSFiles{Cert: cert, Key: key, CA: garbage}, "trailing data"},
		{"missing client CA", TLSFiles{Cert: cert, Key: key, CA: ca, ClientCA: filepath.Join(dir, "nope.pem")}, "--client-ca"},
	} {
		if _, err := LoadTLS(c.files); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error mentioning %q", c.what, err, c.want)
		}
	}
}

func TestTLSReloadKeepsLastGoodMaterial(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nodeCA := newTestCA(t, dir, "node-ca")
	cert, key := nodeCA.Issue(t, "n1", both...)
	m, err := LoadTLS(TLSFiles{Cert: cert, Key: key, CA: filepath.Join(dir, "node-ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := m.Reload(); changed || err != nil {
		t.Fatalf("reload of unchanged files: changed=%v err=%v", changed, err)
	}
	first := m.Leaf().SerialNumber.Int64()
	nodeCA.Issue(t, "n1", both...) // new serial, same paths
	if changed, err := m.Reload(); !changed || err != nil {
		t.Fatalf("reload of a new certificate: changed=%v err=%v", changed, err)
	}
	second := m.Leaf().SerialNumber.Int64()
	if second == first {
		t.Fatal("serial did not change")
	}
	b, _ := os.ReadFile(cert)
	os.WriteFile(cert, b[:len(b)/3], 0o600)
	if changed, err := m.Reload(); changed || err == nil {
		t.Fatalf("reload of a truncated certificate: changed=%v err=%v", changed, err)
	}
	if got := m.Leaf().SerialNumber.Int64(); got != second {
		t.Fatalf("after a refused reload serial %d is in force, want %d", got, second)
	}
}

// FuzzParseCerts: the CA file parser never panics, and accepts only input
// that is nothing but CERTIFICATE blocks.
func FuzzParseCerts(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<31, 0), IsCA: true, BasicConstraintsValid: true}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	good := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	f.Add(good)
	f.Add(append(append([]byte{}, good...), good...))
	f.Add(good[:len(good)/2])
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := parseCerts(b)
		if err != nil {
			return
		}
		if len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
		rest := b
		for {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			if blk.Type != "CERTIFICATE" {
				t.Fatalf("accepted a %q block", blk.Type)
			}
		}
	})
}
