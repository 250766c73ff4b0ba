package security

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

func testKey(b byte) []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func TestProofVerifies(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	p, err := NewProver([][]byte{testKey(1)}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req := &sluicev1.PullRequest{From: "a", Keys: []*sluicev1.CounterKey{{Name: "n", Key: "k"}}}
	const method = "/sluice.v1.Peer/Pull"
	sign := func(at time.Time) string {
		s, err := p.Sign(at, method, req)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := sign(now)
	if err := p.Verify(now.Add(3*time.Second), method, req, good); err != nil {
		t.Fatalf("fresh proof refused: %v", err)
	}
	tampered := &sluicev1.PullRequest{From: "a", Keys: []*sluicev1.CounterKey{{Name: "n", Key: "other"}}, Release: true}
	other, _ := NewProver([][]byte{testKey(2)}, 10*time.Second)
	otherProof, _ := other.Sign(now, method, req)
	cases := []struct {
		what   string
		at     time.Time
		method string
		req    any
		proof  string
		want   error
	}{
		{"replayed", now, method, req, good, ErrProofReplayed},
		{"missing", now, method, req, "", ErrProofMissing},
		{"another request", now, method, tampered, sign(now), ErrProofBadMAC},
		{"another method", now, "/sluice.v1.Peer/Replicate", req, sign(now), ErrProofBadMAC},
		{"another key", now, method, req, otherProof, ErrProofBadMAC},
		{"10.001 s old", now.Add(10*time.Second + time.Millisecond), method, req, sign(now), ErrProofStale},
		{"10.001 s ahead", now, method, req, sign(now.Add(10*time.Second + time.Millisecond)), ErrProofStale},
		{"three fields", now, method, req, "v1:1:00", ErrProofMalformed},
		{"version 2", now, method, req, strings.Replace(sign(now), "v1:", "v2:", 1), ErrProofMalformed},
		{"short nonce", now, method, req, fmt.Sprintf("v1:%d:00:%s", now.UnixMilli(), strings.Repeat("A", 43)), ErrProofMalformed},
		{"negative time", now, method, req, "v1:-5:" + strings.Repeat("0", 32) + ":" + strings.Repeat("A", 43), ErrProofMalformed},
		{"huge", now, method, req, strings.Repeat("v", 300), ErrProofMalformed},
	}
	for _, c := range cases {
		if err := p.Verify(c.at, c.method, c.req, c.proof); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	// At the edge of validity a proof still passes.
	if err := p.Verify(now.Add(10*time.Second), method, req, sign(now)); err != nil {
		t.Errorf("proof exactly 10 s old: %v", err)
	}
}

// A proof's nonce is remembered for as long as the proof could be valid,
// however the generations turn over.
func TestProofNeverReplayableWhileValid(t *testing.T) {
	t.Parallel()
	const v = 10 * time.Second
	p, _ := NewProver([][]byte{testKey(1)}, v)
	req := &sluicev1.StatusRequest{}
	const method = "/sluice.v1.Admin/Status"
	start := time.Unix(1_800_000_000, 0)
	// Proofs signed every 700 ms over five minutes, each verified once at
	// its time and then replayed at every later instant it is still valid.
	var proofs []struct {
		at    time.Time
		proof string
	}
	for at := start; at.Before(start.Add(5 * time.Minute)); at = at.Add(700 * time.Millisecond) {
		s, _ := p.Sign(at, method, req)
		if err := p.Verify(at, method, req, s); err != nil {
			t.Fatalf("fresh proof at %v: %v", at.Sub(start), err)
		}
		proofs = append(proofs, struct {
			at    time.Time
			proof string
		}{at, s})
		for _, old := range proofs {
			if at.Sub(old.at) > v {
				continue
			}
			if err := p.Verify(at, method, req, old.proof); !errors.Is(err, ErrProofReplayed) {
				t.Fatalf("proof of %v replayed at %v: %v, want a replay refusal", old.at.Sub(start), at.Sub(start), err)
			}
		}
	}
}

func TestProofKeyRotation(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	oldKey, newKey := testKey(1), testKey(7)
	sender, _ := NewProver([][]byte{oldKey}, 0)
	receiver, _ := NewProver([][]byte{newKey, oldKey}, 0)
	req := &sluicev1.StatusRequest{}
	s, _ := sender.Sign(now, "/m", req)
	if err := receiver.Verify(now, "/m", req, s); err != nil {
		t.Fatalf("proof of the old key during rotation: %v", err)
	}
	if err := receiver.SetKeys([][]byte{newKey}); err != nil {
		t.Fatal(err)
	}
	s, _ = sender.Sign(now, "/m", req)
	if err := receiver.Verify(now, "/m", req, s); !errors.Is(err, ErrProofBadMAC) {
		t.Fatalf("proof of a removed key: %v, want refusal", err)
	}
	for _, bad := range [][][]byte{nil, {make([]byte, 15)}, {testKey(1), make([]byte, 33)}} {
		if err := receiver.SetKeys(bad); err == nil {
			t.Errorf("SetKeys(%d keys of lengths %v) accepted", len(bad), lens(bad))
		}
	}
}

func lens(ks [][]byte) []int {
	var out []int
	for _, k := range ks {
		out = append(out, len(k))
	}
	return out
}

// FuzzProofVerify: no input makes Verify panic or accept a proof that was
// not signed with the key.
func FuzzProofVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	p, _ := NewProver([][]byte{testKey(1)}, 0)
	d, _ := requestDigest(&sluicev1.StatusRequest{})
	good := p.sign(now, "/m", d, [16]byte{1, 2, 3}) // the same in every fuzz worker
	f.Add(good)
	f.Add("v1:1800000000000:" + strings.Repeat("0", 32) + ":" + strings.Repeat("A", 43))
	f.Add("")
	f.Add("v1:::")
	f.Fuzz(func(t *testing.T, proof string) {
		v, _ := NewProver([][]byte{testKey(1)}, 0)
		err := v.Verify(now, "/m", &sluicev1.StatusRequest{}, proof)
		if err == nil && proof != good {
			t.Fatalf("accepted a proof nobody signed: %q", proof)
		}
	})
}
