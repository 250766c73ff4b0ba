package cluster

import (
	"testing"

	"github.com/sluicehq/sluice/ring"
)

// Two nodes that point a check at each other (each table names the other
// the key's owner) get the same stand-in whichever of them a sender asked
// first: the one with the lower address, pulling from the other. A chain
// that points on to a third node keeps the second receiver as the stand-in.
func TestMutualPointingPicksOneStandIn(t *testing.T) {
	t.Parallel()
	const a, b, c = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
	cases := []struct {
		name             string
		from, owner, to  string // first receiver, second receiver, where the second points
		wantTo, wantFrom string // the stand-in, and where it pulls from
	}{
		{"a asked first, b points back", a, b, a, a, b},
		{"b asked first, a points back", b, a, b, a, b},
		{"a then b, b points on to c", a, b, c, b, a},
		{"b then a, a points on to c", b, a, c, a, b},
	}
	for _, tc := range cases {
		got := standInRoutes([]routed{{i: 0, from: tc.from, owner: ring.Member{Addr: tc.owner}, to: tc.to}})
		if got[0].owner.Addr != tc.wantTo || got[0].from != tc.wantFrom || got[0].to != "" {
			t.Errorf("%s: stand-in %s pulling from %s (to %q), want %s pulling from %s", tc.name, got[0].owner.Addr, got[0].from, got[0].to, tc.wantTo, tc.wantFrom)
		}
	}
}
