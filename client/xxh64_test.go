package client

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestXXH64MatchesTheReference checks the client's XXH64 against
// cespare/xxhash (the nodes' hash) on random inputs of every length from 0
// to 300 bytes, written whole and in random pieces (the stripe buffer's
// every fill level), and on the specification's empty-input value.
func TestXXH64MatchesTheReference(t *testing.T) {
	t.Parallel()
	d := newXXH64()
	if got := d.sum(); got != 0xEF46DB3751D8E999 {
		t.Fatalf("XXH64 of nothing: %x, want ef46db3751d8e999", got)
	}
	rng := rand.New(rand.NewPCG(24, 1))
	for n := 0; n <= 300; n++ {
		for range 20 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			want := xxhash.Sum64(b)
			d := newXXH64()
			d.writeString(string(b))
			if got := d.sum(); got != want {
				t.Fatalf("%d bytes %x in one write: %x, want %x", n, b, got, want)
			}
			d = newXXH64()
			for rest := string(b); len(rest) > 0; {
				k := rng.IntN(len(rest) + 1)
				d.writeString(rest[:k])
				rest = rest[k:]
			}
			if got := d.sum(); got != want {
				t.Fatalf("%d bytes %x in pieces: %x, want %x", n, b, got, want)
			}
		}
	}
}

// TestOwnerKeyHashIsXXH64OfTheJoinedKey: name, a zero byte, then key, for
// keys short and long.
func TestOwnerKeyHashIsXXH64OfTheJoinedKey(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "user:42", strings.Repeat("k", 31), strings.Repeat("k", 300)} {
		if got, want := OwnerKeyHash("api", key), xxhash.Sum64String("api\x00"+key); got != want {
			t.Errorf("OwnerKeyHash(api, %d B key) = %x, want %x", len(key), got, want)
		}
	}
}

func TestOwnerKeyHashAllocatesNothing(t *testing.T) {
	long := strings.Repeat("k", 300)
	if a := testing.AllocsPerRun(100, func() { OwnerKeyHash("api", long); OwnerKeyHash("api", "user:42") }); a != 0 {
		t.Errorf("OwnerKeyHash allocates %v times", a)
	}
}

func BenchmarkOwnerKeyHash(b *testing.B) {
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		sink += OwnerKeyHash("api", "user:1234567")
	}
	_ = sink
}
