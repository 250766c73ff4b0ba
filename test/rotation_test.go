package test

// Certificate rotation under load: a node picks up a renewed certificate
// without a restart while checks run through it, and keeps the last good
// one when the new one is broken.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
)

// servedSerial is the serial number of the certificate a new TLS
// connection to addr is shown.
func servedSerial(t *testing.T, addr, ca string) string {
	t.Helper()
	tc, err := client.TLSFiles{CA: ca}.TLSConfig()
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
// Long on purpose: one story (load, rotate, break the certificate), in order.
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
		var clients []*client.Node
		for _, pr := range ps {
			c, err := client.Dial(pr.grpc, api)
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
				fresh, err := client.Dial(ps[0].grpc, api)
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
