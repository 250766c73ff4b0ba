package client

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// TLSFiles are the PEM files of a client's TLS material (the --tls-ca,
// --tls-cert, --tls-key and --tls-server-name flags of sluice check,
// status and bench).
type TLSFiles struct {
	// CA verifies the nodes; empty means the system's roots.
	CA string
	// Cert and Key, when set, are presented to the nodes (required by a
	// node with --client-ca, and for Admin calls to a node with --tls-ca).
	Cert, Key string
	// ServerName overrides the name the node's certificate must carry
	// (default: the host of the address dialled).
	ServerName string
}

// TLSConfig reads the files and builds a client's tls.Config: TLS 1.2 or
// later, TLS 1.2 only with ECDHE key exchange and AEAD ciphers. The error
// names the flag of the file that could not be used.
func (f TLSFiles) TLSConfig() (*tls.Config, error) {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
			tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
		ServerName: f.ServerName,
	}
	if f.CA != "" {
		b, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool, err := certPool(b)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca %s: %w", f.CA, err)
		}
		c.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s with --tls-key %s: %w", f.Cert, f.Key, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// certPool reads the certificates of a PEM file: at least one, nothing
// but CERTIFICATE blocks, and no trailing bytes (a truncated file).
func certPool(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		n++
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n, err)
		}
		pool.AddCert(c)
	}
	if len(bytes.TrimSpace(b)) != 0 {
		return nil, errors.New("trailing data that is not PEM (truncated or corrupt file?)")
	}
	if n == 0 {
		return nil, errors.New("no certificate in file")
	}
	return pool, nil
}
