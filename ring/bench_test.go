package ring

import (
	"fmt"
	"testing"

	"github.com/buraksezer/consistent"
)

// benchKeys returns 1024 distinct keys and their hashes, so lookups touch the
// whole table rather than one cache line.
func benchKeys() (keys []string, hashes []uint64) {
	keys = make([]string, 1024)
	hashes = make([]uint64, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i*7919)
		hashes[i] = Hash("api.create_url", keys[i])
	}
	return keys, hashes
}

func benchRing(b *testing.B, n int) *Ring {
	b.Helper()
	r, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	if err := r.SetMembers(members(nil, n)); err != nil {
		b.Fatal(err)
	}
	return r
}

func BenchmarkHash(b *testing.B) {
	b.ReportAllocs()
	keys, _ := benchKeys()
	var sink uint64
	i := 0
	for b.Loop() {
		sink ^= Hash("api.create_url", keys[i&1023])
		i++
	}
	_ = sink
}

func BenchmarkOwner(b *testing.B) {
	b.ReportAllocs()
	r := benchRing(b, 16)
	_, hashes := benchKeys()
	i := 0
	for b.Loop() {
		if _, ok := r.Owner(hashes[i&1023]); !ok {
			b.Fatal("no owner")
		}
		i++
	}
}

// BenchmarkHashOwner is the whole routing step: hash the key, find the owner.
func BenchmarkHashOwner(b *testing.B) {
	b.ReportAllocs()
	r := benchRing(b, 16)
	keys, _ := benchKeys()
	i := 0
	for b.Loop() {
		if _, ok := r.Owner(Hash("api.create_url", keys[i&1023])); !ok {
			b.Fatal("no owner")
		}
		i++
	}
}

func BenchmarkReplicas(b *testing.B) {
	b.ReportAllocs()
	r := benchRing(b, 16)
	_, hashes := benchKeys()
	dst := make([]Member, 0, r.Config().ReplicationFactor)
	i := 0
	for b.Loop() {
		dst = r.Replicas(hashes[i&1023], dst[:0])
		i++
	}
}

// BenchmarkLocateKeyConsistent is the library's own lookup, for comparison:
// it hashes the key bytes, takes a read lock and reads a map. "prejoined"
// hashes bytes built before the loop (compare with BenchmarkOwner plus the
// cost of one xxhash.Sum64); "join" also builds name+"\x00"+key per lookup,
// as a caller holding name and key must (compare with BenchmarkHashOwner).
func BenchmarkLocateKeyConsistent(b *testing.B) {
	ms := members(nil, 16)
	cms := make([]consistent.Member, len(ms))
	for i, m := range ms {
		cms[i] = cmember(m.Name)
	}
	c := consistent.New(cms, consistentConfig(DefaultConfig()))
	keys, _ := benchKeys()
	b.Run("prejoined", func(b *testing.B) {
		b.ReportAllocs()
		bkeys := make([][]byte, len(keys))
		for i, k := range keys {
			bkeys[i] = []byte("api.create_url\x00" + k)
		}
		i := 0
		for b.Loop() {
			if c.LocateKey(bkeys[i&1023]) == nil {
				b.Fatal("no owner")
			}
			i++
		}
	})
	b.Run("join", func(b *testing.B) {
		b.ReportAllocs()
		name := "api.create_url"
		i := 0
		for b.Loop() {
			if c.LocateKey([]byte(name+"\x00"+keys[i&1023])) == nil {
				b.Fatal("no owner")
			}
			i++
		}
	})
}

func BenchmarkSetMembers(b *testing.B) {
	for _, n := range []int{3, 16} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			r, err := New(DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			ms := members(nil, n)
			for b.Loop() {
				if err := r.SetMembers(ms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
