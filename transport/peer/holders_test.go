package peer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// holdingPeer answers every pull of a key starting with "h" with holders:
// as many as the key's digits say, at addresses 10.0.0.<i>:7000, the odd
// ones with release.
type holdingPeer struct{ fakePeer }

func (h *holdingPeer) Pull(ctx context.Context, from, fromAddr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) {
	h.fakePeer.Pull(ctx, from, fromAddr, keys, release, ttl, ans)
	for i := range keys {
		var n int
		if _, err := fmt.Sscanf(keys[i].Key, "h%d", &n); err != nil {
			continue
		}
		for j := range n {
			ans[i].Holders = append(ans[i].Holders, keymove.Holder{Addr: fmt.Sprintf("10.0.0.%d:7000", j), Release: j%2 == 1})
		}
	}
}

// A pull's holders travel with the answer to the key they belong to, also
// when the pull goes in several calls, and at most keymove.MaxHolders per
// key.
func TestPullCarriesHolders(t *testing.T) {
	t.Parallel()
	h := &holdingPeer{}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b", MaxCounters: 2})
	defer pc.Close()
	ks := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api", Key: "h2"}, {Name: "api", Key: "h0"},
		{Name: "api", Key: "h3"}, {Name: "api", Key: fmt.Sprint("h", keymove.MaxHolders+5)}}
	ans := make([]keymove.PullAnswer, len(ks))
	if err := pc.Pull(testCtx(t), s.GRPCAddr(), ks, true, time.Second, ans); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0, 2, 0, 3, keymove.MaxHolders} {
		if len(ans[i].Holders) != want {
			t.Fatalf("key %s: %d holders, want %d", ks[i].Key, len(ans[i].Holders), want)
		}
		for j, hd := range ans[i].Holders {
			if hd.Addr != fmt.Sprintf("10.0.0.%d:7000", j) || hd.Release != (j%2 == 1) {
				t.Fatalf("key %s holder %d: %+v", ks[i].Key, j, hd)
			}
		}
	}
}

// Malformed holders refuse the whole answer, naming what is wrong, and
// nothing of it is installed.
func TestPeerClientRefusesMalformedHolders(t *testing.T) {
	t.Parallel()
	ok := CounterToProto(counter("x", 3, 9))
	ok2 := CounterToProto(counter("y", 3, 9))
	many := make([]*sluicev1.PullHolder, keymove.MaxHolders+1)
	for i := range many {
		many[i] = &sluicev1.PullHolder{Index: 1, Addr: fmt.Sprintf("10.0.0.%d:1", i)}
	}
	tooMany := make([]*sluicev1.PullHolder, 2*keymove.MaxHolders+1)
	for i := range tooMany {
		tooMany[i] = &sluicev1.PullHolder{Index: 0, Addr: "h:1"}
	}
	for _, tt := range []struct {
		name    string
		holders []*sluicev1.PullHolder
		want    string
	}{
		{"index out of range", []*sluicev1.PullHolder{{Index: 2, Addr: "h:1"}}, "holder 0 names key 2 of 2"},
		{"no address", []*sluicev1.PullHolder{{Index: 0}}, "holder 0: address of 0 bytes"},
		{"not host:port", []*sluicev1.PullHolder{{Index: 0, Addr: "h:1"}, {Index: 1, Addr: "nohost"}}, `holder 1: address "nohost" is not host:port`},
		{"long address", []*sluicev1.PullHolder{{Index: 0, Addr: strings.Repeat("a", 300) + ":1"}}, "holder 0: address of 302 bytes"},
		{"too many for a key", many, fmt.Sprintf("more than %d holders for key 1", keymove.MaxHolders)},
		{"too many in all", tooMany, fmt.Sprintf("%d holders for 2 keys", len(tooMany))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := startBogusPeer(t, &bogusPeer{pull: &sluicev1.PullResponse{Counters: []*sluicev1.Counter{ok, ok2}, Holders: tt.holders}})
			pc := NewPeerClient(PeerConfig{NodeName: "b", Timeout: time.Minute})
			defer pc.Close()
			ks := []bucket.Counter{{Name: "api", Key: "x"}, {Name: "api", Key: "y"}}
			ans := make([]keymove.PullAnswer, len(ks))
			err := pc.Pull(testCtx(t), addr, ks, false, 0, ans)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want an error with %q", err, tt.want)
			}
			if ks[0].Version != 0 || ks[1].Version != 0 || ans[0].Holders != nil || ans[1].Holders != nil {
				t.Fatalf("a refused answer was installed: %+v %+v", ks, ans)
			}
		})
	}
}

// FuzzDecodeHolders: any pull answer's holders are decoded or refused,
// never a panic; what is accepted names keys asked, with host:port
// addresses, at most keymove.MaxHolders per key, and a refused answer adds
// nothing.
func FuzzDecodeHolders(f *testing.F) {
	seed := &sluicev1.PullResponse{Holders: []*sluicev1.PullHolder{{Index: 0, Addr: "10.0.0.1:7000", Release: true}, {Index: 1, Addr: "[::1]:1"}}}
	b, _ := proto.Marshal(seed)
	f.Add(b, uint8(2))
	f.Add([]byte{0x1a, 0x03, 0x08, 0x05, 0x12}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		var resp sluicev1.PullResponse
		if proto.Unmarshal(data, &resp) != nil {
			return
		}
		got := make([]keymove.PullAnswer, int(n%8)+1)
		err := decodeHolders(resp.GetHolders(), got)
		for i, c := range got {
			if err != nil && c.Holders != nil {
				t.Fatalf("refused (%v), yet key %d got holders", err, i)
			}
			if len(c.Holders) > keymove.MaxHolders {
				t.Fatalf("key %d: %d holders", i, len(c.Holders))
			}
			for _, h := range c.Holders {
				if checkHostPort(h.Addr) != nil {
					t.Fatalf("accepted holder address %q", h.Addr)
				}
			}
		}
	})
}
