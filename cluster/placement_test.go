package cluster

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
)

// A node's metadata carries its placement only when it differs from the
// defaults, so that a default node's metadata stays byte for byte what
// releases before the placement sent; placements that ring.Config refuses,
// or that spell out the defaults, are refused.
func TestMetadataPlacement(t *testing.T) {
	t.Parallel()
	def := ring.DefaultConfig()
	if p := placementOf(def); p != (placement{}) {
		t.Fatalf("placementOf(defaults) = %+v, want zero", p)
	}
	plain := meta{grpcAddr: "h:1", ready: true, boot: 7}
	if got, want := len(encodeMeta(plain)), 3+len("h:1")+8; got != want {
		t.Fatalf("default metadata is %d bytes, want %d (as before placements)", got, want)
	}
	big := def
	big.Partitions, big.Load = 65521, 1.25
	m := plain
	m.place = placementOf(big)
	b := encodeMeta(m)
	got, err := decodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("round trip of %+v: %+v %v", m, got, err)
	}
	if got.place.String() != "65521 partitions, load 1.25, 100 virtual nodes" {
		t.Errorf("placement reads %q", got.place.String())
	}
	// Every bad placement is refused, with the field named.
	for _, tc := range []struct {
		place placement
		want  string
	}{
		{placement{partitions: 0, load: 1.25, vnodes: 100}, "Partitions = 0"},
		{placement{partitions: 65521, load: 1, vnodes: 100}, "Load = 1"},
		{placement{partitions: 65521, load: 1.25, vnodes: 0}, "VirtualNodes = 0"},
		{placement{partitions: 7919, load: 1.05, vnodes: 100}, "holds the defaults"},
	} {
		bad := plain
		bad.place = tc.place
		if _, err := decodeMeta(encodeMeta(bad)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("placement %+v: err %v, want one naming %q", tc.place, err, tc.want)
		}
	}
	// A flagged placement cut short is refused, not read past the end.
	if _, err := decodeMeta(b[:len(b)-1]); err == nil {
		t.Error("metadata one byte short of its placement accepted")
	}
}

// Two nodes whose rings place partitions differently would each own keys
// the other owns: both would count them. A node whose placement differs
// from this one's stays in the gossip membership but out of the ring,
// with a warning that names both placements; the nodes that agree form
// their ring as if it were not there.
func TestNodesOfAnotherPlacementStayOutOfTheRing(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	logs := &logRecorder{}
	cfgs := make([]Config, 2)
	for i := range cfgs {
		cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
	}
	cfgs[0].Log = slog.New(logs)
	nodes := StartNodes(t, cfgs, func(i int) Peers { return net.Peers(memAddr(i)) })
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	odd := NodeConfig(t, "odd", memAddr(2))
	odd.Ring.Partitions, odd.Ring.Load = 65521, 1.25
	oddLogs := &logRecorder{}
	odd.Log = slog.New(oddLogs)
	on := StartNode(t, odd, net.Peers(memAddr(2)), nodes[0].GossipAddr())
	net.Register(memAddr(2), on)

	leftOut := func(l *logRecorder, member, theirs, ours string) func() bool {
		return func() bool {
			for _, a := range l.attrs(slog.LevelWarn) {
				if a["member"].String() == member && a["theirs"].String() == theirs && a["ours"].String() == ours {
					return true
				}
			}
			return false
		}
	}
	const dflt, other = "7919 partitions, load 1.05, 100 virtual nodes", "65521 partitions, load 1.25, 100 virtual nodes"
	WaitFor(t, 20*time.Second, "n0 leaves odd out of its ring", leftOut(logs, "odd", other, dflt))
	WaitFor(t, 20*time.Second, "odd leaves n0 out of its ring", leftOut(oddLogs, "n0", dflt, other))
	for _, n := range nodes {
		if names := memberNames(n.Ring().Table()); !slices.Equal(names, []string{"n0", "n1"}) {
			t.Errorf("%s's ring holds %v, want [n0 n1]", n.Name(), names)
		}
	}
	if names := memberNames(on.Ring().Table()); !slices.Equal(names, []string{"odd"}) {
		t.Errorf("odd's ring holds %v, want [odd]", names)
	}
	// The warning is said once per member and reason, not at every
	// rebuild: a rolling deploy rebuilds the ring hundreds of times.
	for range 3 {
		nodes[0].rebuild()
	}
	warned := 0
	for _, a := range logs.attrs(slog.LevelWarn) {
		if a["member"].String() == "odd" && a["theirs"].String() == other {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("n0 warned %d times that odd is left out, want once", warned)
	}
}

func memberNames(t *ring.Table) []string {
	var out []string
	for _, m := range t.Members() {
		out = append(out, m.Name)
	}
	return out
}
