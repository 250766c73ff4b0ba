package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// BenchmarkLeasedDecision is a check decided from a lease on the node that
// holds it (Table.Take: the key's entry, the slice, the decision), the
// path a hot key's checks take instead of a forward; compare
// cluster's BenchmarkOwnerDecision, the owner's decision of an owned key.
// With 1 key the table holds one hot key; with 1,000, a thousand.
func BenchmarkLeasedDecision(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprint("keys=", n), func(b *testing.B) {
			t := NewTable()
			lim := bucket.Limit{Limit: 1 << 40, WindowMS: 60_000, Algorithm: bucket.FixedWindow}
			keys := make([]Key, n)
			now := int64(1_800_000_000_000_000_000)
			put := func(k Key) {
				if !t.Put(k, Grant{Tokens: MaxTokens, TTL: 10 * time.Second, GrantedAt: now}, 1, now, 10_000, 10*time.Second) {
					b.Fatal("lease not kept")
				}
			}
			for i := range keys {
				keys[i] = Key{Name: "api", Key: fmt.Sprint("tenant:", i), Limit: lim}
				put(keys[i])
			}
			var d bucket.Decision
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i == n {
					i = 0
				}
				if !t.Take(keys[i], 1, now, &d) {
					put(keys[i]) // spent: 2^20 checks of it
					continue
				}
				if !d.Allowed() {
					b.Fatal(d)
				}
			}
		})
	}
}
