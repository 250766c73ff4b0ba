package transport

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// hits is optional on the wire: absent means 1, an explicit 0 peeks.
func TestHitsAbsentMeansOne(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		hits *int64
		want int64
	}{{nil, 1}, {proto.Int64(0), 0}, {proto.Int64(7), 7}} {
		if got := peer.RequestFromProto(&sluicev1.RateLimitRequest{Hits: c.hits}).Hits; got != c.want {
			t.Errorf("hits %v: %d, want %d", c.hits, got, c.want)
		}
	}
	// What goes to a peer says hits explicitly, 0 included.
	if m := peer.RequestToProto(peer.RequestFromProto(&sluicev1.RateLimitRequest{Hits: proto.Int64(0)})); m.Hits == nil || *m.Hits != 0 {
		t.Fatalf("a peek to a peer: %v", m.Hits)
	}

	s := startServer(t, &memHandler{})
	url := "http://" + s.HTTPAddr() + "/v1/check"
	remaining := func(body string) float64 {
		t.Helper()
		r := do(t, "POST", url, body)
		if r.code != http.StatusOK {
			t.Fatalf("%s: %d %s", body, r.code, r.body)
		}
		var got struct {
			Responses []struct {
				Remaining string `json:"remaining"` // protojson writes int64 as a string
			} `json:"responses"`
		}
		if err := json.Unmarshal(r.body, &got); err != nil || len(got.Responses) != 1 {
			t.Fatalf("%s: %v", r.body, err)
		}
		f, err := strconv.ParseFloat(got.Responses[0].Remaining, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	const req = `{"requests":[{"name":"n","key":"k","limit":3,"window_ms":3600000,"algorithm":"ALGORITHM_FIXED_WINDOW"%s}]}`
	for i, c := range []struct {
		hits string
		want float64
	}{{"", 2}, {`,"hits":0`, 2}, {`,"hits":"0"`, 2}, {"", 1}, {`,"hits":1`, 0}} {
		if got := remaining(fmt.Sprintf(req, c.hits)); got != c.want {
			t.Fatalf("call %d (hits%s): remaining %v, want %v", i, c.hits, got, c.want)
		}
	}
}
