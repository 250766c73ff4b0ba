package cluster

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/writeback"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 30, 0, time.UTC)

func memCluster(t *testing.T, k int, mutate func(*Config)) ([]*Node, *MemNetwork) {
	t.Helper()
	net := NewMemNetwork()
	cfgs := make([]Config, k)
	for i := range cfgs {
		cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
		cfgs[i].Now = FixedClock(t0)
		if mutate != nil {
			mutate(&cfgs[i])
		}
	}
	nodes := StartNodes(t, cfgs, func(i int) Peers { return net.Peers(memAddr(i)) })
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	t.Cleanup(net.Heal) // runs before the nodes shut down
	return nodes, net
}

func req(name, key string, hits, limit int64) check.Request {
	return check.Request{Name: name, Key: key, Hits: hits, Limit: bucket.Limit{Limit: limit, WindowMS: 60_000}}
}

func check1(n *Node, r check.Request) check.Outcome {
	out := make([]check.Outcome, 1)
	n.Check(context.Background(), []check.Request{r}, out)
	return out[0]
}

func TestMetadataRoundTripAndRefusal(t *testing.T) {
	t.Parallel()
	for _, m := range []meta{{grpcAddr: "127.0.0.1:8081"}, {grpcAddr: "[::1]:9", leaving: true}, {grpcAddr: "h:1", ready: true, leaving: true},
		{grpcAddr: "h:2", sec: Security{TLS: true, ClientAuth: true}}, {grpcAddr: "h:3", ready: true, sec: Security{GossipEncrypted: true}}} {
		got, err := decodeMeta(encodeMeta(m))
		if err != nil || got != m {
			t.Fatalf("round trip of %+v: %+v %v", m, got, err)
		}
	}
	for _, b := range [][]byte{nil, {1}, {1, 0}, {2, 0, 1, 'x'}, {1, 0, 5, 'x'}, {1, 0, 0}, {1, 32, 1, 'x'}, {1, 128, 1, 'x'}} {
		if _, err := decodeMeta(b); err == nil {
			t.Errorf("decodeMeta(%v) accepted", b)
		}
	}
}

// TestMetadataExtensionsAreSkipped: extension records a later release may
// append after the boot id (and placement) are skipped, whatever their
// tags; a record cut short is refused, saying where.
func TestMetadataExtensionsAreSkipped(t *testing.T) {
	t.Parallel()
	for _, m := range []meta{{grpcAddr: "h:1", boot: 7, ready: true},
		{grpcAddr: "h:2", boot: 8, place: placement{partitions: 65521, load: 1.25, vnodes: 100}}} {
		for _, ext := range [][]byte{{}, {1, 0}, {9, 3, 'a', 'b', 'c'}, {1, 2, 0, 0, 255, 1, 'z', 200, 0}} {
			b := append(encodeMeta(m), ext...)
			got, err := decodeMeta(b)
			if err != nil || got != m {
				t.Errorf("%+v with extensions %v: decoded %+v, %v; want it unchanged", m, ext, got, err)
			}
		}
		for _, c := range []struct {
			ext  []byte
			want string
		}{
			{[]byte{1}, "extension at byte 0: 1 byte(s) left"},
			{[]byte{1, 3, 'a', 'b'}, "extension 1 at byte 0: 3 bytes long, only 2 left"},
			{[]byte{1, 0, 4, 1}, "extension 4 at byte 2: 1 bytes long, only 0 left"},
		} {
			if _, err := decodeMeta(append(encodeMeta(m), c.ext...)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v with extensions %v: err %v, want one saying %q", m, c.ext, err, c.want)
			}
		}
	}
	// What this release sends has no extension area: the previous
	// release, which refuses one, reads it.
	if b := encodeMeta(meta{grpcAddr: "h:1", boot: 1}); len(b) != 3+3+8 {
		t.Errorf("metadata without placement is %d bytes, want %d (no extension area)", len(b), 3+3+8)
	}
}

// FuzzDecodeMeta: whatever is accepted is this release's metadata followed
// by whole extension records, and re-encodes to that metadata.
func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(meta{grpcAddr: "127.0.0.1:8081"}))
	f.Add(encodeMeta(meta{grpcAddr: "h:1", boot: 9, place: placement{partitions: 65521, load: 1.25, vnodes: 100}}))
	f.Add(append(encodeMeta(meta{grpcAddr: "h:1", boot: 9, ready: true}), 1, 2, 'x', 'y', 7, 0))
	f.Add(append(encodeMeta(meta{grpcAddr: "h:1", place: placement{partitions: 65521, load: 1.25, vnodes: 100}}), 3, 1))
	f.Add([]byte{1, 1, 3, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		enc := encodeMeta(m)
		if !bytes.HasPrefix(b, enc) {
			t.Fatalf("accepted %v does not start with its re-encoding %v", b, enc)
		}
		if err := skipMetaExtensions(b[len(enc):]); err != nil {
			t.Fatalf("accepted %v, whose bytes after the metadata are not whole records: %v", b, err)
		}
		if again, err := decodeMeta(enc); err != nil || again != m {
			t.Fatalf("re-encoding of %v decodes to %+v, %v; want %+v", b, again, err, m)
		}
	})
}

func TestOwnerDecisionAllocatesNothing(t *testing.T) {
	cfg := NodeConfig(t, "solo", "127.0.0.1:1")
	n, err := New(cfg, NoPeers{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	reqs := []check.Request{req("api", "user:1", 1, 1<<40)}
	out := make([]check.Outcome, 1)
	n.Check(context.Background(), reqs, out) // load the key
	if a := testing.AllocsPerRun(1000, func() { n.Check(context.Background(), reqs, out) }); a != 0 {
		t.Fatalf("a decision on the owner allocates %v times", a)
	}
}

func TestElasticLimitFollowsTheNodesLoad(t *testing.T) {
	t.Parallel()
	var load atomic.Uint64 // percent
	cfg := NodeConfig(t, "solo", "127.0.0.1:1")
	cfg.Now = FixedClock(t0)
	cfg.Load = func() float64 { return float64(load.Load()) / 100 }
	n, err := New(cfg, NoPeers{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	elastic := func(key string) check.Request {
		r := req("api", key, 1, 2)
		r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, 4, 50
		return r
	}
	count := func(key string) int {
		got := 0
		for range 10 {
			o := check1(n, elastic(key))
			if o.Err != "" {
				t.Fatal(o.Err)
			}
			if o.Allowed() {
				got++
			}
		}
		return got
	}
	load.Store(10)
	if got := count("idle"); got != 4 {
		t.Fatalf("at 10%% load an elastic limit of 2 (ceiling 4 below 50%%) admitted %d, want 4", got)
	}
	load.Store(90)
	if got := count("busy"); got != 2 {
		t.Fatalf("at 90%% load it admitted %d, want the limit 2", got)
	}
}

func TestInvalidRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	cfg := NodeConfig(t, "solo", "127.0.0.1:1")
	n, err := New(cfg, NoPeers{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	bad := []check.Request{
		{Name: "", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a\x00b", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a", Key: "", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a", Key: "k", Hits: -1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: bucket.MaxLimit + 1, WindowMS: 1000}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: bucket.MaxWindowMS + 1}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000, Burst: -1}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000, Algorithm: 99}},
		{Name: "a", Key: "k", Hits: 1}, // no limit, no rules
		{Name: strings.Repeat("n", bucket.MaxNameLen+1), Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a", Key: strings.Repeat("k", bucket.MaxKeyLen+1), Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: -1, WindowMS: 1000}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 0}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: -1000}},
		{Name: "a", Key: "k", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}, More: make([]bucket.Limit, bucket.MaxLimitsPerRequest+1)},
	}
	good := req("a", "ok", 1, 5)
	reqs := append(append([]check.Request{}, bad...), good)
	out := make([]check.Outcome, len(reqs))
	n.Check(context.Background(), reqs, out)
	for i := range bad {
		if out[i].Err == "" || out[i].Status != bucket.StatusUnspecified {
			t.Errorf("bad item %d answered %+v", i, out[i])
		}
	}
	if last := out[len(bad)]; last.Err != "" || !last.Allowed() {
		t.Fatalf("the valid item among bad ones answered %+v", last)
	}
	if err := n.Cache().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored := 0
	n.Cache().RangeStored(time.Now().UnixNano(), func(writeback.Record) bool { stored++; return true })
	if l := n.Cache().Len(); l != 1 || stored != 1 {
		t.Fatalf("after %d bad items and 1 good: %d keys in memory, %d stored; want 1 and 1", len(bad), l, stored)
	}
}
