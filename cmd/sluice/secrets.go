package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/transport/security"
)

// maxKeyFile bounds a gossip key file: a few keys of one line each.
const maxKeyFile = 64 << 10

// parseGossipKeys reads a gossip key file: one base64 key (16, 24 or 32
// bytes: AES-128, -192 or -256) per line, the first encrypts and all
// decrypt; blank lines and lines starting with # are skipped. Errors name
// the file and line.
func parseGossipKeys(path string, b []byte) ([][]byte, error) {
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%s: %d bytes, more than a key file holds (%d)", path, len(b), maxKeyFile)
	}
	var keys [][]byte
	for i, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		k := make([]byte, base64.StdEncoding.DecodedLen(len(line)))
		n, err := base64.StdEncoding.Decode(k, line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: not base64: %v", path, i+1, err)
		}
		k = k[:n]
		if err := memberlist.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("%s:%d: key of %d bytes: want 16, 24 or 32 (AES-128, -192, -256)", path, i+1, n)
		}
		for j, prev := range keys {
			if bytes.Equal(prev, k) {
				return nil, fmt.Errorf("%s:%d: the same key as key %d", path, i+1, j+1)
			}
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no key (one base64 key per line; sluice keygen makes one)", path)
	}
	return keys, nil
}

func readGossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	return parseGossipKeys(path, b)
}

// keygen prints a new random 32-byte gossip key in base64.
func keygen(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q (keygen takes none)", args[0])
	}
	var k [32]byte
	rand.Read(k[:])
	_, err := fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(k[:]))
	return err
}

// secrets is a serving node's security material and its reloading: the
// TLS files (in security.TLS) and the gossip key file (memberlist's
// keyring and the Prover of peer calls). Each reload that finds a file
// changed and valid puts it in force; a bad file is refused with one log
// line per distinct content, and the material in force stays.
type secrets struct {
	log     *slog.Logger
	tls     *security.TLS // nil without --tls-cert
	keyFile string        // "" without --gossip-key-file
	keyring *memberlist.Keyring
	prover  *security.Prover
	keysSum [sha256.Size]byte // of the key file in force
	badTLS  string            // last TLS error logged
	badKeys [sha256.Size]byte // sum of the last refused key file
}

// loadSecrets loads the serve flags' TLS and gossip key files; any error
// stops the node from starting.
func loadSecrets(f *serveFlags, lg *slog.Logger) (*secrets, error) {
	s := &secrets{log: lg, keyFile: f.gossipKeyFile}
	if f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" || f.clientCA != "" {
		t, err := security.LoadTLS(security.TLSFiles{Cert: f.tlsCert, Key: f.tlsKey, CA: f.tlsCA, ClientCA: f.clientCA})
		if err != nil {
			return nil, err
		}
		s.tls = t
		if f.clientCA != "" && sameFile(f.clientCA, f.tlsCA) {
			lg.Warn("--client-ca is the node CA (--tls-ca): every API client certificate is then also a node identity that may call the internal RPCs; use a CA of its own for clients")
		}
	}
	if s.keyFile != "" {
		b, err := os.ReadFile(s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		keys, err := parseGossipKeys(s.keyFile, b)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		if s.keyring, err = memberlist.NewKeyring(keys, keys[0]); err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		if s.prover, err = security.NewProver(keys, 0); err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		s.keysSum = sha256.Sum256(b)
	}
	if s.tls == nil && s.keyring == nil {
		lg.Warn("no --tls-cert and no --gossip-key-file: this node trusts every caller that can reach its ports " +
			"(anyone who can reach them can read and reset counters and join the cluster; docs/security.md)")
	}
	return s, nil
}

func sameFile(a, b string) bool {
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// proverForPeers is the Prover peer calls are signed and checked with: only
// without TLS (with TLS, node certificates identify members).
func (s *secrets) proverForPeers() *security.Prover {
	if s.tls != nil {
		return nil
	}
	return s.prover
}

// watch reloads every interval until ctx ends.
func (s *secrets) watch(ctx context.Context, every time.Duration) {
	if s.tls == nil && s.keyFile == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reload()
		}
	}
}

// reload re-reads the files once.
func (s *secrets) reload() {
	if s.tls != nil {
		changed, err := s.tls.Reload()
		switch {
		case err != nil:
			if msg := err.Error(); msg != s.badTLS {
				s.badTLS = msg
				s.log.Error("refused new TLS files; the certificate in force stays", "err", err)
			}
		case changed:
			s.badTLS = ""
			leaf := s.tls.Leaf()
			s.log.Info("TLS files reloaded", "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
		default:
			s.badTLS = ""
		}
	}
	if s.keyFile != "" {
		if err := s.reloadKeys(); err != nil {
			s.log.Error("refused new gossip key file; the keys in force stay", "err", err)
		}
	}
}

// reloadKeys puts a changed, valid key file in force: new keys are added,
// the first becomes primary, keys no longer listed are removed.
func (s *secrets) reloadKeys() error {
	b, err := os.ReadFile(s.keyFile)
	if err != nil {
		if s.badKeys != [sha256.Size]byte{1} {
			s.badKeys = [sha256.Size]byte{1}
			return fmt.Errorf("--gossip-key-file: %w", err)
		}
		return nil
	}
	sum := sha256.Sum256(b)
	if sum == s.keysSum || sum == s.badKeys {
		return nil
	}
	keys, err := parseGossipKeys(s.keyFile, b)
	if err != nil {
		s.badKeys = sum
		return err
	}
	for _, k := range keys {
		if err := s.keyring.AddKey(k); err != nil {
			s.badKeys = sum
			return err
		}
	}
	if err := s.keyring.UseKey(keys[0]); err != nil {
		return err
	}
	for _, old := range append([][]byte(nil), s.keyring.GetKeys()...) {
		if !containsKey(keys, old) {
			if err := s.keyring.RemoveKey(old); err != nil {
				return err
			}
		}
	}
	if err := s.prover.SetKeys(keys); err != nil {
		return err
	}
	s.keysSum, s.badKeys = sum, [sha256.Size]byte{}
	s.log.Info("gossip keys reloaded", "keys", len(keys))
	return nil
}

func containsKey(keys [][]byte, k []byte) bool {
	for _, x := range keys {
		if bytes.Equal(x, k) {
			return true
		}
	}
	return false
}
