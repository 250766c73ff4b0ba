package main

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func b64(n int, fill byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, n))
}

func TestParseGossipKeys(t *testing.T) {
	t.Parallel()
	good := "# rotation in progress\n" + b64(32, 1) + "\n\n  " + b64(16, 2) + "  \n" + b64(24, 3) + "\n"
	keys, err := parseGossipKeys("k", []byte(good))
	if err != nil || len(keys) != 3 || len(keys[0]) != 32 || len(keys[1]) != 16 || len(keys[2]) != 24 {
		t.Fatalf("parse: %d keys, %v", len(keys), err)
	}
	for _, c := range []struct{ in, want string }{
		{"", "k: no key"},
		{"# only a comment\n", "k: no key"},
		{b64(32, 1) + "\nnot base64!\n", "k:2: not base64"},
		{b64(20, 1), "k:1: key of 20 bytes"},
		{b64(32, 1) + "\n" + b64(32, 1), "k:2: the same key as key 1"},
		{strings.Repeat("A", maxKeyFile+1), "more than a key file holds"},
	} {
		if _, err := parseGossipKeys("k", []byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %.30q: %v, want %q", c.in, err, c.want)
		}
	}
}

func FuzzParseGossipKeys(f *testing.F) {
	f.Add([]byte(b64(32, 1) + "\n" + b64(16, 2)))
	f.Add([]byte("#\n\n" + b64(24, 9)))
	f.Add([]byte("===="))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := parseGossipKeys("f", b)
		if err != nil {
			return
		}
		if len(keys) == 0 {
			t.Fatal("no error and no key")
		}
		for _, k := range keys {
			if memberlist.ValidateKey(k) != nil {
				t.Fatalf("accepted a key of %d bytes", len(k))
			}
		}
	})
}

// Rewriting the key file rotates memberlist's keyring in place: the new
// first key encrypts, listed keys decrypt, unlisted ones go; a bad file
// changes nothing.
func TestGossipKeyRotation(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gossip.key")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := b64(32, 1), b64(32, 2), b64(16, 3)
	write(a + "\n")
	var logs bytes.Buffer
	s, err := loadSecrets(&serveFlags{gossipKeyFile: path}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	primary := func() string { return base64.StdEncoding.EncodeToString(s.keyring.GetPrimaryKey()) }
	count := func() int { return len(s.keyring.GetKeys()) }

	write(b + "\n" + a + "\n") // step 1: new key first, old still decrypts
	s.reload()
	if primary() != b || count() != 2 {
		t.Fatalf("after adding b: primary %s, %d keys", primary(), count())
	}
	write(b + "\n") // step 2: old key removed
	s.reload()
	if primary() != b || count() != 1 {
		t.Fatalf("after removing a: primary %s, %d keys", primary(), count())
	}
	write(c + "\n" + "garbage!!\n") // a bad file is refused whole
	s.reload()
	s.reload() // and logged once
	if primary() != b || count() != 1 {
		t.Fatalf("after a bad file: primary %s, %d keys", primary(), count())
	}
	if n := strings.Count(logs.String(), "refused new gossip key file"); n != 1 {
		t.Errorf("bad key file logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestCertsCommand(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pki")
	var out bytes.Buffer
	if err := certs([]string{"--out", dir, "--nodes", "a,b", "--hosts", "10.1.2.3,sluice.example"}, &out, &out); err != nil {
		t.Fatalf("certs: %v\n%s", err, out.String())
	}
	read := func(name string) *x509.Certificate {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	roots := func(c *x509.Certificate) *x509.CertPool { p := x509.NewCertPool(); p.AddCert(c); return p }
	nodeCA, clientCA := read("node-ca.pem"), read("client-ca.pem")
	for _, n := range []string{"a", "b"} {
		leaf := read(n + ".pem")
		for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots(nodeCA), DNSName: "sluice.example", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("%s.pem for usage %v: %v", n, u, err)
			}
		}
		if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("10.1.2.3")) || !strings.Contains(strings.Join(leaf.DNSNames, ","), n) {
			t.Errorf("%s.pem SANs: %v %v", n, leaf.IPAddresses, leaf.DNSNames)
		}
		if leaf.NotAfter.Before(time.Now().AddDate(0, 0, 364)) {
			t.Errorf("%s.pem expires %v, want a year", n, leaf.NotAfter)
		}
	}
	if _, err := read("admin.pem").Verify(x509.VerifyOptions{Roots: roots(nodeCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin.pem: %v", err)
	}
	if _, err := read("client.pem").Verify(x509.VerifyOptions{Roots: roots(clientCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client.pem: %v", err)
	}
	if _, err := read("client.pem").Verify(x509.VerifyOptions{Roots: roots(nodeCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("client.pem verifies against the node CA: API clients would be nodes")
	}
	if fi, err := os.Stat(filepath.Join(dir, "a-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a-key.pem mode: %v %v", fi.Mode(), err)
	}
	if err := certs([]string{"--out", dir, "--nodes", "a"}, &out, &out); err == nil {
		t.Error("certs overwrote existing files")
	}
}
