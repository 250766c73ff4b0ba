package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
)

// memTracing is a tracingSetup that records every node's spans in exp,
// each node's resource naming it (service.instance.id).
func memTracing(exp *tracetest.InMemoryExporter) tracingSetup {
	return func(_ context.Context, name string, _ *slog.Logger) (*transport.Tracing, func(context.Context) error, error) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.instance.id", name))))
		return &transport.Tracing{Provider: tp, Propagator: propagation.TraceContext{}}, tp.Shutdown, nil
	}
}

// nodeOf is the node that recorded span s.
func nodeOf(s tracetest.SpanStub) string {
	for _, kv := range s.Resource.Attributes() {
		if kv.Key == "service.instance.id" {
			return kv.Value.AsString()
		}
	}
	return "?"
}

func describeSpans(ss tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "\n  %s on %s: trace %s span %s parent %s (remote %v) kind %v",
			s.Name, nodeOf(s), s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID(), s.Parent.IsRemote(), s.SpanKind)
	}
	return b.String()
}

// find returns the one span named name recorded by node (any node when
// node is ""), failing when there is not exactly one.
func find(t *testing.T, ss tracetest.SpanStubs, name, node string) tracetest.SpanStub {
	t.Helper()
	var got []tracetest.SpanStub
	for _, s := range ss {
		if s.Name == name && (node == "" || nodeOf(s) == node) {
			got = append(got, s)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d spans %q on %q, want 1; spans:%s", len(got), name, node, describeSpans(ss))
	}
	return got[0]
}

// TestTracingAcrossThreeNodes runs three nodes in this process, each with
// an in-memory span exporter, and checks through the one that does not own
// the key: gRPC Check and HTTP /v1/check each make one trace that goes from
// the entry node's API span through its forward (a client span) to the
// owner's server span, parent to child across the peer call.
// Long on purpose: one story (three nodes, two traced checks), read top to bottom.
func TestTracingAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tracing := memTracing(exp)
	n1 := startServeWith(t, tracing, "--node-name", "n1")
	n2 := startServeWith(t, tracing, "--node-name", "n2", "--join", n1.gossip)
	n3 := startServeWith(t, tracing, "--node-name", "n3", "--join", n1.gossip)
	nodes := []*servedNode{n1, n2, n3}
	clients := make([]*client.Node, len(nodes))
	for i, n := range nodes {
		c, err := client.Dial(n.grpc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	waitUntil(t, time.Now().Add(30*time.Second), "every node sees three alive members", func() bool {
		for _, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx)
			cancel()
			if err != nil {
				return false
			}
			alive := 0
			for _, m := range st.Members {
				if m.State == "alive" && m.Share > 0 {
					alive++
				}
			}
			if alive != 3 {
				return false
			}
		}
		return true
	})

	// spansOf waits until trace id has want spans (the owner's server
	// span may end just after the entry node has answered) and returns them.
	spansOf := func(id trace.TraceID, want int) tracetest.SpanStubs {
		var ss tracetest.SpanStubs
		waitUntil(t, time.Now().Add(10*time.Second), fmt.Sprintf("trace %s has %d spans", id, want), func() bool {
			ss = nil
			for _, s := range exp.GetSpans() {
				if s.SpanContext.TraceID() == id {
					ss = append(ss, s)
				}
			}
			return len(ss) >= want
		})
		return ss
	}

	// A key n1 does not own: its answer names another owner.
	var key, owner string
	for i := 0; owner == "" || owner == "n1"; i++ {
		if i == 100 {
			t.Fatal("n1 owns 100 keys in a row")
		}
		key = fmt.Sprintf("user:%d", i)
		resp, err := clients[0].Check(context.Background(), &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
			Name: "traced", Key: key, Hits: proto.Int64(0), Limit: 10, WindowMs: 60_000}}})
		if err != nil {
			t.Fatal(err)
		}
		owner = resp.Responses[0].Owner
	}
	t.Logf("key %s is owned by %s; checks go to n1", key, owner)

	// gRPC: a check without trace context starts a trace at n1.
	exp.Reset()
	resp, err := clients[0].Check(context.Background(), &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
		Name: "traced", Key: key, Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}}})
	if err != nil || resp.Responses[0].Owner != owner {
		t.Fatalf("check: %v, %v; want an answer from %s", resp, err, owner)
	}
	var entry tracetest.SpanStub
	waitUntil(t, time.Now().Add(10*time.Second), "n1 exports its Check span", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "sluice.v1.RateLimiter/Check" && nodeOf(s) == "n1" {
				entry = s
				return true
			}
		}
		return false
	})
	ss := spansOf(entry.SpanContext.TraceID(), 3)
	if entry.Parent.IsValid() || entry.SpanKind != trace.SpanKindServer {
		t.Errorf("entry span: parent %v, kind %v; want a root server span", entry.Parent, entry.SpanKind)
	}
	checkForwardChain(t, ss, entry, owner)
	if n := len(exp.GetSpans()); n != len(ss) {
		t.Errorf("%d spans exported, %d in the check's trace: want one trace; all spans:%s", n, len(ss), describeSpans(exp.GetSpans()))
	}

	// HTTP, continuing the caller's trace from its traceparent header.
	exp.Reset()
	callerTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	callerSpan, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	body := fmt.Sprintf(`{"requests":[{"name":"traced","key":%q,"hits":1,"limit":10,"window_ms":60000}]}`, key)
	req, _ := http.NewRequest("POST", "http://"+n1.http+"/v1/check", bytes.NewBufferString(body))
	req.Header.Set("traceparent", fmt.Sprintf("00-%s-%s-01", callerTrace, callerSpan))
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/check: %s", hr.Status)
	}
	ss = spansOf(callerTrace, 3)
	httpSpan := find(t, ss, "POST /v1/check", "n1")
	if httpSpan.Parent.SpanID() != callerSpan || !httpSpan.Parent.IsRemote() {
		t.Errorf("HTTP span's parent %v, want the caller's span %s", httpSpan.Parent, callerSpan)
	}
	checkForwardChain(t, ss, httpSpan, owner)
}

// checkForwardChain checks the forward under entry in ss: n1's client span
// of Peer/Forward is entry's child, and the owner's server span of
// Peer/Forward is that client span's child (a remote parent).
func checkForwardChain(t *testing.T, ss tracetest.SpanStubs, entry tracetest.SpanStub, owner string) {
	t.Helper()
	var fwd tracetest.SpanStub
	for _, s := range ss {
		if s.Name == "sluice.v1.Peer/Forward" && s.SpanKind == trace.SpanKindClient && nodeOf(s) == "n1" {
			fwd = s
		}
	}
	if !fwd.SpanContext.IsValid() {
		t.Fatalf("no client span of the forward on n1; spans:%s", describeSpans(ss))
	}
	if fwd.Parent.SpanID() != entry.SpanContext.SpanID() {
		t.Errorf("forward span's parent %s, want the API span %s; spans:%s", fwd.Parent.SpanID(), entry.SpanContext.SpanID(), describeSpans(ss))
	}
	var got tracetest.SpanStub
	for _, s := range ss {
		if s.Name == "sluice.v1.Peer/Forward" && s.SpanKind == trace.SpanKindServer {
			got = s
		}
	}
	if nodeOf(got) != owner {
		t.Fatalf("the owner's server span of the forward is on %q, want %s; spans:%s", nodeOf(got), owner, describeSpans(ss))
	}
	if got.Parent.SpanID() != fwd.SpanContext.SpanID() || !got.Parent.IsRemote() {
		t.Errorf("owner's span parent %s (remote %v), want n1's forward span %s", got.Parent.SpanID(), got.Parent.IsRemote(), fwd.SpanContext.SpanID())
	}
}

// TestTracingWanted: off unless the OTEL_* variables ask for it, as the
// package comment of tracing.go says.
func TestTracingWanted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env     map[string]string
		on      bool
		proto   string
		wantErr string
	}{
		{env: nil},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, on: true, proto: "http/protobuf"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, on: true, proto: "http/protobuf"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, proto: "grpc"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, on: true, proto: "http/protobuf"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `OTEL_TRACES_EXPORTER="zipkin"`},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`},
	} {
		proto, on, err := tracingWanted(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantErr)
			}
		case err != nil || on != tc.on || proto != tc.proto:
			t.Errorf("%v: on %v proto %q err %v; want on %v proto %q", tc.env, on, proto, err, tc.on, tc.proto)
		}
	}
	// Off: no Tracing at all, so nothing is installed.
	tr, stop, err := tracingFromEnv(func(string) (string, bool) { return "", false })(context.Background(), "n", slog.New(slog.DiscardHandler))
	if tr != nil || stop != nil || err != nil {
		t.Errorf("no OTEL_* variables: tracing %v, stop %v, err %v; want all nil", tr, stop != nil, err)
	}
}
