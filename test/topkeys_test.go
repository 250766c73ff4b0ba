package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"google.golang.org/protobuf/proto"
)

// TestTopKeysAcrossThreeNodes: checks spread over three real nodes, with
// one key taking most admitted hits and another most refused ones. `sluice
// keys top` merges the members' lists into exact counts (few keys: the
// summaries are exact), by admitted and by refused; the owner's metric and
// status page name the keys; and once a node is SIGKILLed the command
// still answers from the others, naming the one that did not answer.
func TestTopKeysAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.32", 3)
	clients := clientsOf(t, ps)
	check := func(node int, key string, limit int64) *sluicev1.RateLimitResponse {
		return checkOne(t, clients[node], &sluicev1.RateLimitRequest{Name: "top", Key: key, Hits: proto.Int64(1), Limit: limit, WindowMs: 3_600_000})
	}
	owners := map[string]string{}
	for i := range 30 {
		owners["hot"] = check(i%3, "hot", 1000).Owner
	}
	for i := range 25 {
		owners["tight"] = check(i%3, "tight", 10).Owner // 10 admitted, 15 refused
	}
	for i := range 5 {
		check(i%3, fmt.Sprint("cold-", i), 1000)
	}

	type line struct {
		Name     string `json:"name"`
		Key      string `json:"key"`
		Admitted int64  `json:"admitted"`
		Refused  int64  `json:"refused"`
	}
	top := func(args ...string) []line {
		t.Helper()
		out, code := runCLI(t, append([]string{"keys", "top", "--addr", ps[0].grpc, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("sluice keys top %v exited %d: %s", args, code, out)
		}
		var ls []line
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &ls); err != nil {
			t.Fatalf("sluice keys top %v: %v in %q", args, err, out)
		}
		return ls
	}
	byAdmitted := top("--limit", "3")
	want := []line{{"top", "hot", 30, 0}, {"top", "tight", 10, 15}, {"top", "cold-0", 1, 0}}
	if fmt.Sprint(byAdmitted) != fmt.Sprint(want) {
		t.Fatalf("by admitted: %v, want %v", byAdmitted, want)
	}
	if got := top("--by", "refused"); len(got) != 1 || got[0] != (line{"top", "tight", 10, 15}) {
		t.Fatalf("by refused: %v, want only tight, 10 admitted and 15 refused", got)
	}
	if out, code := runCLI(t, "keys", "top", "--addr", ps[0].grpc, "--by", "most"); code != 2 || !strings.Contains(out, `--by "most"`) {
		t.Fatalf("--by most: exit %d, %s", code, out)
	}

	// The nodes' metrics and the owner's status page show hot.
	var owner *proc
	for _, p := range ps {
		if p.name == owners["hot"] {
			owner = p
		}
	}
	if owner == nil {
		t.Fatalf("owner %q of hot is not a node", owners["hot"])
	}
	// A node answering hot from a quota lease counts those hits itself
	// (hot keys, 200 a second from one node by default): the nodes' series
	// add up to the 30.
	var hot float64
	for _, p := range ps {
		hot += scrape(t, "http://"+p.http+"/metrics")[`sluice_top_key_hits{by="admitted",key="hot",name="top"}`]
	}
	if hot != 30 {
		t.Fatalf("sluice_top_key_hits of hot, added over the nodes: %v, want 30", hot)
	}
	resp, err := http.Get("http://" + owner.http + "/?format=text")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `"top"                    "hot"                    admitted `) {
		t.Fatalf("status page of %s does not list hot:\n%s", owner.name, page)
	}

	// A node dies: the others still answer, and the command says whose
	// keys are missing.
	victim := 1
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	out, code := runCLI(t, "keys", "top", "--addr", ps[0].grpc, "--timeout", "2s")
	if code != 0 || !strings.Contains(out, "NAME") {
		t.Fatalf("after %s was killed: exit %d: %s", ps[victim].name, code, out)
	}
	if strings.Contains(out, "3 of 3 members answered") {
		t.Fatalf("after %s was killed, every member answered: %s", ps[victim].name, out)
	}
	if !strings.Contains(out, ps[victim].name+" did not answer") && !strings.Contains(out, "2 of 2 members answered") {
		t.Fatalf("after %s was killed: neither named as silent nor gone from the members: %s", ps[victim].name, out)
	}
	t.Logf("after the kill:\n%s", out)
}
