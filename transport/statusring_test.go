package transport

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// pageOwnerTable is an owner table of partitions owned by draws from owner.
func pageOwnerTable(partitions int, names []string, owner func(p int) uint32) *sluicev1.OwnersResponse {
	ot := &sluicev1.OwnersResponse{Node: names[0], Ready: true, Partitions: int64(partitions)}
	for _, n := range names {
		ot.Members = append(ot.Members, &sluicev1.OwnerMember{Name: n})
	}
	for p := range partitions {
		ot.Owners = append(ot.Owners, owner(p))
	}
	return ot
}

// pointOf is partition p's place on the circle as consistent hashing puts
// it, written out again here: XXH64 of p's eight little-endian bytes over
// 2^64.
func pointOf(p int) float64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(p))
	return float64(xxhash.Sum64(b[:])) / math.Exp2(64)
}

// TestRingSpansCoverTheCircleByOwner: the spans tile the circle once,
// neighbours have different owners, and every partition's point lies in a
// span of its owner.
func TestRingSpansCoverTheCircleByOwner(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		partitions int
		members    int
	}{{7919, 3}, {7919, 10}, {101, 2}, {2, 2}, {50, 1}} {
		names := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}[:c.members]
		ot := pageOwnerTable(c.partitions, names, func(int) uint32 { return uint32(rng.IntN(c.members)) })
		spans := ringSpans(ot)
		if len(spans) == 0 || len(spans) > c.partitions {
			t.Fatalf("%+v: %d spans", c, len(spans))
		}
		total := 0.0
		for i, sp := range spans {
			if !(sp.from < sp.to && sp.to <= sp.from+1) {
				t.Fatalf("%+v: span %d from %v to %v", c, i, sp.from, sp.to)
			}
			total += sp.to - sp.from
			next := spans[(i+1)%len(spans)]
			if i+1 < len(spans) && next.from != sp.to {
				t.Fatalf("%+v: span %d ends at %v, the next starts at %v", c, i, sp.to, next.from)
			}
			if len(spans) > 1 && next.owner == sp.owner {
				t.Fatalf("%+v: spans %d and %d both of member %d", c, i, (i+1)%len(spans), sp.owner)
			}
		}
		if math.Abs(total-1) > 1e-9 {
			t.Fatalf("%+v: spans cover %v of the circle, want 1", c, total)
		}
		// Every partition's point is in a span of its owner.
		in := func(x float64, sp ringSpan) bool {
			return (x >= sp.from && x < sp.to) || (x+1 >= sp.from && x+1 < sp.to)
		}
		for p, o := range ot.Owners {
			x, found := pointOf(p), false
			for _, sp := range spans {
				if in(x, sp) {
					if sp.owner != o {
						t.Fatalf("%+v: partition %d (at %v, owner %d) lies in a span of member %d", c, p, x, o, sp.owner)
					}
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("%+v: partition %d at %v is in no span", c, p, x)
			}
		}
		t.Logf("%d partitions, %d members: %d arcs", c.partitions, c.members, len(spans))
	}
	for _, bad := range []*sluicev1.OwnersResponse{
		nil,
		{Partitions: 3, Members: []*sluicev1.OwnerMember{{Name: "a"}}, Owners: []uint32{0, 0}},
		{Partitions: 2, Members: []*sluicev1.OwnerMember{{Name: "a"}}, Owners: []uint32{0, 1}},
	} {
		if s := ringSpans(bad); s != nil {
			t.Errorf("ringSpans(%v) = %v, want nil", bad, s)
		}
	}
}

// pageOwnerSource answers a fixed owner table.
type pageOwnerSource struct{ ot *sluicev1.OwnersResponse }

func (s pageOwnerSource) Owners(context.Context) (*sluicev1.OwnersResponse, error) { return s.ot, nil }

// TestStatusPageDrawsTheRing: with an owner table the page draws each
// member's arcs as the table lays them out, one path per span.
func TestStatusPageDrawsTheRing(t *testing.T) {
	t.Parallel()
	ot := pageOwnerTable(7919, []string{"node-a", `<script>alert("x")</script>`}, func(p int) uint32 { return uint32(p % 2) })
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Handler: &fakeHandler{},
		Status: pageStatus{}, Members: pageMembers{t: t}, Owners: pageOwnerSource{ot}})
	if err != nil {
		t.Fatal(err)
	}
	rec := getPage(t, s.httpHandler(), "/", browserAccept)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	body := rec.Body.String()
	arcs := regexp.MustCompile(`<path class="arc" data-member="([^"]*)" d="M[^"]+Z" fill="(#[0-9a-f]{6})"`).FindAllStringSubmatch(body, -1)
	spans := ringSpans(ot)
	if len(arcs) != len(spans) || len(arcs) < 100 {
		t.Fatalf("%d arcs on the page, want the %d spans of the table (at least 100 for two members on 7919 alternating partitions)", len(arcs), len(spans))
	}
	byMember := map[string]int{}
	for _, a := range arcs {
		byMember[a[1]]++
	}
	esc := `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`
	if byMember["node-a"] == 0 || byMember[esc] == 0 || len(byMember) != 2 {
		t.Errorf("arcs by member %v, want both members' arcs (names escaped)", byMember)
	}
	if !strings.Contains(body, `id="ring-note"`) || strings.Contains(body, "<script") {
		t.Errorf("page lacks the ring note, or carries an unescaped name")
	}
}
