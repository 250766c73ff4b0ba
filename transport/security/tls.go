package security

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// TLSFiles names the PEM files of a node's TLS material (sluice serve
// --tls-cert, --tls-key, --tls-ca, --client-ca). Cert and Key go together;
// CA is required with them (peers verify each other against it); ClientCA is
// optional.
type TLSFiles struct {
	// Cert and Key are the node's certificate (chain, leaf first) and
	// private key. The certificate is served on gRPC and HTTP and presented
	// on calls to peers, so it needs both the serverAuth and clientAuth
	// extended key usages (or none).
	Cert, Key string
	// CA holds the certificates of the CA that signs node certificates.
	// Peer and Admin calls must present a client certificate that chains to
	// it; peers' server certificates are verified against it.
	CA string
	// ClientCA, when set, holds the CA certificates of API callers: every
	// caller must then present a certificate signed by it (or by CA).
	ClientCA string
}

// TLS holds a node's TLS material and swaps it atomically when Reload finds
// the files changed and valid. Connections already made keep the material
// they were made with; new handshakes use the newest. Safe for concurrent
// use.
type TLS struct {
	files TLSFiles
	mu    sync.Mutex // serialises Reload
	cur   atomic.Pointer[tlsMaterial]
}

// tlsMaterial is one consistent set of loaded files.
type tlsMaterial struct {
	cert     tls.Certificate
	leaf     *x509.Certificate
	nodeCAs  *x509.CertPool      // verifies peers and node callers
	nodeRaw  []*x509.Certificate // nodeCAs' certificates, to tell a node caller
	callers  *x509.CertPool      // nodeCAs plus the client CA: what a handshake accepts
	required bool                // a client certificate is required (ClientCA set)
	sum      [sha256.Size]byte   // of every file's bytes, to skip unchanged reloads
}

// LoadTLS reads files and returns their material, or an error naming the
// file and what is wrong with it.
func LoadTLS(files TLSFiles) (*TLS, error) {
	switch {
	case files.Cert == "" || files.Key == "":
		return nil, errors.New("TLS needs both a certificate and a key (--tls-cert, --tls-key)")
	case files.CA == "":
		return nil, errors.New("--tls-cert needs --tls-ca: the CA that signs node certificates, against which peers verify each other")
	}
	t := &TLS{files: files}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload re-reads the files. It reports whether new material is now in
// force; on an error (a missing, truncated or mismatched file) the material
// in force stays and the error says which file is wrong.
func (t *TLS) Reload() (changed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, err := loadTLSMaterial(t.files)
	if err != nil {
		return false, err
	}
	if old := t.cur.Load(); old != nil && old.sum == m.sum {
		return false, nil
	}
	t.cur.Store(m)
	return true, nil
}

// Files returns the paths t reads.
func (t *TLS) Files() TLSFiles { return t.files }

// ClientAuthRequired reports whether every caller must present a
// certificate (ClientCA set).
func (t *TLS) ClientAuthRequired() bool { return t.files.ClientCA != "" }

// Leaf returns the certificate in force, for logs and tests.
func (t *TLS) Leaf() *x509.Certificate { return t.cur.Load().leaf }

func loadTLSMaterial(f TLSFiles) (*tlsMaterial, error) {
	h := sha256.New()
	read := func(flag, path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		fmt.Fprintf(h, "%s %d\n", flag, len(b))
		h.Write(b)
		return b, nil
	}
	certPEM, err := read("--tls-cert", f.Cert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := read("--tls-key", f.Key)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s with --tls-key %s: %w", f.Cert, f.Key, err)
	}
	m := &tlsMaterial{cert: cert, leaf: cert.Leaf}
	caPEM, err := read("--tls-ca", f.CA)
	if err != nil {
		return nil, err
	}
	if m.nodeRaw, err = parseCerts(caPEM); err != nil {
		return nil, fmt.Errorf("--tls-ca %s: %w", f.CA, err)
	}
	m.nodeCAs, m.callers = x509.NewCertPool(), x509.NewCertPool()
	for _, c := range m.nodeRaw {
		m.nodeCAs.AddCert(c)
		m.callers.AddCert(c)
	}
	if f.ClientCA != "" {
		clientPEM, err := read("--client-ca", f.ClientCA)
		if err != nil {
			return nil, err
		}
		cs, err := parseCerts(clientPEM)
		if err != nil {
			return nil, fmt.Errorf("--client-ca %s: %w", f.ClientCA, err)
		}
		for _, c := range cs {
			m.callers.AddCert(c)
		}
		m.required = true
	}
	// The node's own certificate must be one its peers accept.
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := m.leaf.Verify(x509.VerifyOptions{Roots: m.nodeCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("--tls-cert %s is not a node certificate of --tls-ca %s (it must be signed by it and allow client auth): %w", f.Cert, f.CA, err)
	}
	h.Sum(m.sum[:0])
	return m, nil
}

// parseCerts returns every CERTIFICATE block of b; it refuses input with
// none, with other blocks, or with bytes that are not PEM.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for n := 1; ; n++ {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n, err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(b)) != 0 {
		return nil, errors.New("trailing data that is not PEM (truncated or corrupt file?)")
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate in file")
	}
	return out, nil
}

// Cipher suites for TLS 1.2: ECDHE key exchange with AEAD ciphers only
// (TLS 1.3 suites are not configurable and all modern).
var tls12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// ServerConfig returns the tls.Config of a listener (transport.Server's
// gRPC and HTTP) advertising protos by ALPN; each handshake takes the
// material in force at that moment.
func (t *TLS) ServerConfig(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := t.cur.Load()
			auth := tls.VerifyClientCertIfGiven
			if m.required {
				auth = tls.RequireAndVerifyClientCert
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				CipherSuites: tls12Suites,
				Certificates: []tls.Certificate{m.cert},
				ClientAuth:   auth,
				ClientCAs:    m.callers,
				NextProtos:   protos,
			}, nil
		},
	}
}

// PeerClientConfig returns the tls.Config of calls to peers: it presents
// the node's certificate and accepts a server whose certificate chains to
// the node CA. The host name is not checked: a peer is dialled at the
// address it gossips, and what makes it a peer is a certificate of the node
// CA (docs/security.md).
func (t *TLS) PeerClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: tls12Suites,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := t.cur.Load().cert
			return &c, nil
		},
		// Verification is done by VerifyConnection against the node CA in
		// force, which Go's built-in check cannot take per handshake.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyChain(cs.PeerCertificates, t.cur.Load().nodeCAs, x509.ExtKeyUsageServerAuth)
		},
	}
}

// verifyChain checks that certs (leaf first) chain to roots for usage.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// isNode reports whether one of the verified chains of a handshake ends at
// a node CA certificate in force: the caller is a node (or an operator
// holding a node CA certificate).
func (t *TLS) isNode(chains [][]*x509.Certificate) bool {
	m := t.cur.Load()
	for _, ch := range chains {
		if len(ch) == 0 {
			continue
		}
		root := ch[len(ch)-1]
		for _, ca := range m.nodeRaw {
			if root.Equal(ca) {
				return true
			}
		}
	}
	return false
}
