package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// TestReserveThenSettleOnThreeNodes: an LLM-style flow on three real
// nodes, over HTTP: reserve 1,000 tokens of a token bucket, settle at 250,
// and 750 come back; `sluice check --reserve-ttl` and `--settle` do the
// same from the command line; a plain check's answer carries none of the
// reservation fields; and once the key's owner is SIGKILLed, a settle of
// its reservation is refused by the new owner and the reservation counts
// at its estimate.
func TestReserveThenSettleOnThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.36", 3)
	clients := clientsOf(t, ps)
	const limit = `"limit":"1000","window_ms":"86400000","algorithm":"ALGORITHM_TOKEN_BUCKET"`
	type answer struct {
		Status        string `json:"status"`
		Remaining     string `json:"remaining"`
		Error         string `json:"error"`
		Owner         string `json:"owner"`
		ReservationID string `json:"reservation_id"`
		Returned      string `json:"returned"`
		Charged       string `json:"charged"`
	}
	post := func(i int, item string) (answer, string) {
		t.Helper()
		resp, err := http.Post("http://"+ps[i].http+"/v1/check", "application/json", strings.NewReader(`{"requests":[{`+item+`}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out struct{ Responses []answer }
		if err := json.Unmarshal(b, &out); err != nil || len(out.Responses) != 1 {
			t.Fatalf("%s: %d %s (%v)", item, resp.StatusCode, b, err)
		}
		return out.Responses[0], string(b)
	}
	res, _ := post(0, `"name":"llm","key":"u1","hits":"1000","reserve_ttl_ms":"60000",`+limit)
	if res.Status != "STATUS_UNDER_LIMIT" || res.Remaining != "0" || res.ReservationID == "" {
		t.Fatalf("reserve 1000: %+v", res)
	}
	set, _ := post(1, fmt.Sprintf(`"name":"llm","key":"u1","hits":"0","reservation_id":%q,"actual":"250",`, res.ReservationID)+limit)
	if set.Error != "" || set.Returned != "750" || set.Remaining != "750" || set.Charged != "0" {
		t.Fatalf("settle at 250: %+v, want 750 returned and remaining", set)
	}
	if again, _ := post(2, fmt.Sprintf(`"name":"llm","key":"u1","hits":"0","reservation_id":%q,"actual":"0",`, res.ReservationID)+limit); !strings.Contains(again.Error, "settled already") {
		t.Fatalf("a second settle: %+v", again)
	}
	if _, body := post(2, `"name":"llm","key":"plain","hits":"1",`+limit); strings.Contains(body, "reservation_id") || strings.Contains(body, "returned") {
		t.Fatalf("a plain check's answer carries reservation fields: %s", body)
	}

	// The command line: reserve 400, settle at 100.
	flags := []string{"--name", "llm", "--key", "cli", "--limit", "1000", "--window", "24h", "--algorithm", "token_bucket"}
	out, code := runCLI(t, append([]string{"check", "--addr", ps[2].grpc, "--hits", "400", "--reserve-ttl", "1m"}, flags...)...)
	id := ""
	for _, line := range strings.Split(out, "\n") {
		if s, ok := strings.CutPrefix(line, "reservation: "); ok {
			id = s
		}
	}
	if code != 0 || id == "" {
		t.Fatalf("sluice check --reserve-ttl: exit %d: %s", code, out)
	}
	out, code = runCLI(t, append([]string{"check", "--addr", ps[0].grpc, "--settle", id, "--actual", "100"}, flags...)...)
	if code != 0 || !strings.Contains(out, "allowed: 900 of 1000 remaining") || !strings.Contains(out, "settled: 300 returned, 0 charged") {
		t.Fatalf("sluice check --settle: exit %d: %s", code, out)
	}

	// The Go client: Reserve, then Settle.
	gc, err := client.New([]string{ps[0].grpc, ps[1].grpc, ps[2].grpc})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lim := client.Request{Name: "llm", Key: "go", Hits: 1000, Limit: 1000, Window: 24 * time.Hour, Algorithm: client.TokenBucket}
	got, rid, err := gc.Reserve(ctx, lim, time.Minute)
	if err != nil || !got.Allowed || got.Remaining != 0 || rid == "" {
		t.Fatalf("client Reserve: %+v %q %v", got, rid, err)
	}
	settled, err := gc.Settle(ctx, lim, rid, 250)
	if err != nil || settled.Returned != 750 || settled.Remaining != 750 {
		t.Fatalf("client Settle: %+v %v", settled, err)
	}
	if _, err := gc.Settle(ctx, lim, rid, 250); err == nil || !strings.Contains(err.Error(), "settle refused: the reservation was settled already") {
		t.Fatalf("client Settle again: %v", err)
	}

	// The owner dies with a reservation open.
	res, _ = post(0, `"name":"llm","key":"u2","hits":"600","reserve_ttl_ms":"60000",`+limit)
	if res.ReservationID == "" {
		t.Fatalf("reserve 600: %+v", res)
	}
	waitSettled(t, clients)
	victim := -1
	for i, p := range ps {
		if p.name == res.Owner {
			victim = i
		}
	}
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	other := (victim + 1) % len(ps)
	waitFor(t, 20*time.Second, "a survivor deciding the key", func() bool {
		r := checkOne(t, clients[other], &sluicev1.RateLimitRequest{Name: "llm", Key: "u2", Hits: proto.Int64(0), Limit: 1000,
			WindowMs: 86_400_000, Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET})
		return r.Owner != res.Owner
	})
	late, _ := post(other, fmt.Sprintf(`"name":"llm","key":"u2","hits":"0","reservation_id":%q,"actual":"100",`, res.ReservationID)+limit)
	if !strings.Contains(late.Error, "not one this key's owner made") {
		t.Fatalf("settle after the owner's SIGKILL: %+v", late)
	}
	if r, _ := post(other, `"name":"llm","key":"u2","hits":"0",`+limit); r.Remaining != "400" {
		t.Fatalf("after the refused settle: %+v, want the reservation counted at its estimate (400 remaining)", r)
	}
}
