package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// certs makes a development PKI for a cluster (docs/security.md):
//
//	DIR/node-ca.pem, node-ca-key.pem      the node CA (--tls-ca)
//	DIR/<node>.pem, <node>-key.pem        one certificate per --nodes name (--tls-cert, --tls-key)
//	DIR/admin.pem, admin-key.pem          an operator's certificate of the node CA (sluice status)
//	DIR/client-ca.pem, client-ca-key.pem  the API clients' CA (--client-ca)
//	DIR/client.pem, client-key.pem        an API client's certificate
//
// Node certificates carry every --hosts entry as a DNS or IP SAN, plus the
// node's name, and allow server and client auth (they serve and call
// peers). Existing files are never overwritten.
func certs(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("out", "", "directory to write the PEM files to (created; existing files are not overwritten)")
	nodes := fs.String("nodes", "node", "comma-separated node names: one certificate each")
	hosts := fs.String("hosts", "localhost,127.0.0.1,::1", "comma-separated DNS names and IP addresses every node certificate is valid for")
	days := fs.Int("days", 365, "validity of the certificates in days")
	if err := parseWithEnv(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *dir == "" {
		return errors.New("--out DIR is required")
	}
	if *days < 1 || *days > 3650 {
		return fmt.Errorf("--days %d: want 1..3650", *days)
	}
	var names []string
	for _, n := range strings.Split(*nodes, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if strings.ContainsAny(n, `/\`) || n == "." || n == ".." || strings.HasSuffix(n, "-ca") || n == "admin" || n == "client" {
			return fmt.Errorf("--nodes: %q cannot name a file of its own here", n)
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return errors.New("--nodes: no name")
	}
	var dns []string
	var ips []net.IP
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	now := time.Now()
	notAfter := now.AddDate(0, 0, *days)
	w := pkiWriter{dir: *dir, out: stdout}

	nodeCA, nodeKey, err := w.ca("node-ca", "sluice node CA", now, notAfter)
	if err != nil {
		return err
	}
	for _, n := range names {
		tmpl := leafTemplate(n, now, notAfter, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
		tmpl.DNSNames, tmpl.IPAddresses = append(append([]string(nil), dns...), n), ips
		if err := w.leaf(n, tmpl, nodeCA, nodeKey); err != nil {
			return err
		}
	}
	if err := w.leaf("admin", leafTemplate("sluice admin", now, notAfter, x509.ExtKeyUsageClientAuth), nodeCA, nodeKey); err != nil {
		return err
	}
	clientCA, clientKey, err := w.ca("client-ca", "sluice client CA", now, notAfter)
	if err != nil {
		return err
	}
	return w.leaf("client", leafTemplate("sluice client", now, notAfter, x509.ExtKeyUsageClientAuth), clientCA, clientKey)
}

func leafTemplate(cn string, from, to time.Time, usage ...x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"sluice"}},
		NotBefore:    from.Add(-time.Hour),
		NotAfter:     to,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// pkiWriter writes certificates and keys under dir, never over a file.
type pkiWriter struct {
	dir string
	out io.Writer
}

func (w pkiWriter) ca(file, cn string, from, to time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"sluice"}},
		NotBefore:             from.Add(-time.Hour),
		NotAfter:              to,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, w.write(file, der, key)
}

func (w pkiWriter) leaf(file string, tmpl, ca *x509.Certificate, caKey crypto.Signer) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	return w.write(file, der, key)
}

func (w pkiWriter) write(file string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	certPath := filepath.Join(w.dir, file+".pem")
	keyPath := filepath.Join(w.dir, file+"-key.pem")
	if err := writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(w.out, "wrote %s and %s\n", certPath, keyPath)
	return nil
}

// writeNew writes b to a file that must not exist yet.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
