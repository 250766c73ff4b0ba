package security

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
)

// ProofHeader is the gRPC metadata key carrying a call's proof of cluster
// membership when nodes authenticate each other with the gossip key rather
// than certificates.
const ProofHeader = "sluice-proof"

// DefaultProofValidity is how far a proof's time may be from the receiver's
// clock, either way: nodes' clocks must agree to within it.
const DefaultProofValidity = 10 * time.Second

// MaxProofNonces bounds the replay cache of a Prover: at most this many
// proofs are remembered; past it, new proofs are refused until old ones
// expire (a node under such a load should use TLS).
const MaxProofNonces = 1 << 20

// proofVersion starts every proof.
const proofVersion = "v1"

// Prover signs and verifies proofs of cluster membership for peer and admin
// calls: an HMAC-SHA256, under a key derived from the cluster's gossip
// keys, of the method, a time, a random nonce and the SHA-256 of the
// request's deterministic encoding. A proof is valid for Validity either
// side of the receiver's clock and only once (the receiver remembers the
// nonces it has accepted for as long as they are valid).
//
// The first key signs; every key verifies, so keys rotate as memberlist's
// do. Safe for concurrent use.
type Prover struct {
	keys     atomic.Pointer[[][]byte] // derived; [0] signs
	validity time.Duration

	mu    sync.Mutex
	cur   map[[16]byte]struct{} // nonces accepted in the current generation
	prev  map[[16]byte]struct{}
	genAt time.Time // when cur began
}

// NewProver returns a Prover for the gossip keys (16, 24 or 32 bytes each,
// the first is primary); validity 0 means DefaultProofValidity.
func NewProver(gossipKeys [][]byte, validity time.Duration) (*Prover, error) {
	if validity <= 0 {
		validity = DefaultProofValidity
	}
	p := &Prover{validity: validity, cur: map[[16]byte]struct{}{}, prev: map[[16]byte]struct{}{}}
	if err := p.SetKeys(gossipKeys); err != nil {
		return nil, err
	}
	return p, nil
}

// SetKeys replaces the keys (rotation): the first signs, all verify.
func (p *Prover) SetKeys(gossipKeys [][]byte) error {
	if len(gossipKeys) == 0 {
		return errors.New("no gossip key")
	}
	ks := make([][]byte, len(gossipKeys))
	for i, k := range gossipKeys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return fmt.Errorf("gossip key %d is %d bytes, want 16, 24 or 32", i+1, n)
		}
		// A key of its own for proofs, so that the gossip cipher's key is
		// never used for anything else.
		m := hmac.New(sha256.New, k)
		m.Write([]byte("sluice peer proof v1"))
		ks[i] = m.Sum(nil)
	}
	p.keys.Store(&ks)
	return nil
}

// requestDigest is the SHA-256 of msg's deterministic encoding.
func requestDigest(msg any) ([sha256.Size]byte, error) {
	pm, ok := msg.(proto.Message)
	if !ok {
		return [sha256.Size]byte{}, fmt.Errorf("request of type %T is not a protobuf message", msg)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pm)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}

func proofMAC(key []byte, method string, ms int64, nonce []byte, digest [sha256.Size]byte) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s\n%s\n%d\n", proofVersion, method, ms)
	m.Write(nonce)
	m.Write(digest[:])
	return m.Sum(nil)
}

// Sign returns the proof of a call of method with request msg at now.
func (p *Prover) Sign(now time.Time, method string, msg any) (string, error) {
	d, err := requestDigest(msg)
	if err != nil {
		return "", err
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	return p.sign(now, method, d, nonce), nil
}

func (p *Prover) sign(now time.Time, method string, d [sha256.Size]byte, nonce [16]byte) string {
	ms := now.UnixMilli()
	mac := proofMAC((*p.keys.Load())[0], method, ms, nonce[:], d)
	return proofVersion + ":" + strconv.FormatInt(ms, 10) + ":" + hex.EncodeToString(nonce[:]) + ":" +
		base64.RawURLEncoding.EncodeToString(mac)
}

// Errors of Verify; each says why a proof was refused.
var (
	ErrProofMissing   = errors.New("no proof of cluster membership (sluice-proof)")
	ErrProofMalformed = errors.New("malformed proof")
	ErrProofStale     = errors.New("proof outside its validity (stale, or the clocks disagree)")
	ErrProofBadMAC    = errors.New("proof does not verify with any cluster key")
	ErrProofReplayed  = errors.New("proof already used (replay)")
	ErrProofCapacity  = errors.New("too many proofs to remember; refused")
)

// parsedProof is a proof's fields.
type parsedProof struct {
	ms    int64
	nonce [16]byte
	mac   []byte
}

// parseProof splits a proof, refusing anything not exactly in its one
// canonical form (so a proof has one spelling).
func parseProof(s string) (parsedProof, error) {
	var pp parsedProof
	if s == "" {
		return pp, ErrProofMissing
	}
	if len(s) > 200 {
		return pp, fmt.Errorf("%w: %d bytes", ErrProofMalformed, len(s))
	}
	parts := strings.Split(s, ":")
	if len(parts) != 4 || parts[0] != proofVersion {
		return pp, fmt.Errorf("%w: want %s:<unix ms>:<nonce>:<mac>", ErrProofMalformed, proofVersion)
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ms < 0 || strconv.FormatInt(ms, 10) != parts[1] {
		return pp, fmt.Errorf("%w: time %q", ErrProofMalformed, parts[1])
	}
	if len(parts[2]) != 32 {
		return pp, fmt.Errorf("%w: nonce of %d hex digits, want 32", ErrProofMalformed, len(parts[2]))
	}
	if _, err := hex.Decode(pp.nonce[:], []byte(parts[2])); err != nil || hex.EncodeToString(pp.nonce[:]) != parts[2] {
		return pp, fmt.Errorf("%w: nonce is not 32 lower-case hex digits", ErrProofMalformed)
	}
	mac, err := base64.RawURLEncoding.Strict().DecodeString(parts[3])
	if err != nil || len(mac) != sha256.Size {
		return pp, fmt.Errorf("%w: mac", ErrProofMalformed)
	}
	pp.ms, pp.mac = ms, mac
	return pp, nil
}

// Verify checks proof for a call of method with request msg received at
// now, and remembers its nonce so the same proof is refused next time. The
// error wraps one of the ErrProof values.
func (p *Prover) Verify(now time.Time, method string, msg any, proof string) error {
	pp, err := parseProof(proof)
	if err != nil {
		return err
	}
	skew := now.Sub(time.UnixMilli(pp.ms))
	if skew > p.validity || skew < -p.validity {
		return fmt.Errorf("%w: %v from this node's clock", ErrProofStale, skew.Round(time.Millisecond))
	}
	d, err := requestDigest(msg)
	if err != nil {
		return err
	}
	ok := false
	for _, k := range *p.keys.Load() {
		if hmac.Equal(proofMAC(k, method, pp.ms, pp.nonce[:], d), pp.mac) {
			ok = true
			break
		}
	}
	if !ok {
		return ErrProofBadMAC
	}
	return p.remember(now, pp.nonce)
}

// remember records nonce as used. Nonces live in two generations of
// 2×validity each: a nonce accepted at t is remembered until at least
// t + 2×validity, past the end of any proof's validity window.
func (p *Prover) remember(now time.Time, nonce [16]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if span := 3 * p.validity; p.genAt.IsZero() || now.Sub(p.genAt) >= span {
		if now.Sub(p.genAt) >= 2*span {
			p.prev = map[[16]byte]struct{}{}
		} else {
			p.prev = p.cur
		}
		p.cur = map[[16]byte]struct{}{}
		p.genAt = now
	}
	if _, seen := p.cur[nonce]; seen {
		return ErrProofReplayed
	}
	if _, seen := p.prev[nonce]; seen {
		return ErrProofReplayed
	}
	if len(p.cur)+len(p.prev) >= MaxProofNonces {
		return ErrProofCapacity
	}
	p.cur[nonce] = struct{}{}
	return nil
}
